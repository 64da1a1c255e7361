"""The ``load``/``save`` dispatch: each format's reader or writer, chosen by the
container a path holds (``container.detect``). It must not analyse what it reads:
where only analysis can answer a question (which function body is the step), the
caller passes the answer in.

Writes are atomic: a temporary file (or directory) beside the target, renamed
over it only once complete, so a failure never leaves a partial or clobbered
output (``files.atomic_output``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.container import detect
from graphpass.formats.files import ONNX
from graphpass.installed import ONNX as ONNX_RUNTIME
from graphpass.installed import installed, require_onnx, require_tensorflow
from graphpass.ir.graph import Graph


def load(path: str | os.PathLike, *, tag: str | None = None, signature: str | None = None,
         shapes: bool = False, holds_step: Callable[[Graph], bool] | None = None) -> Graph:
    """Read a TF GraphDef / MetaGraphDef / SavedModel or an ONNX model into a Graph;
    ``signature`` picks the TF2 signature whose function holds the training step.
    ``shapes``: infer a TF graph's shapes while reading it, for a command that will
    read them all (``tf_io.graph_from_graph_def``: less memory than inferring later;
    analyses that read a few ask for those alone). ``holds_step(body)`` answers,
    for a GraphDef whose top level only calls functions, which body is the step:
    the reader cannot tell without analysis, so the caller decides
    (``graphpass.load`` asks region analysis); without it the top level is read."""
    path = Path(path)
    kind, is_text = detect(path)
    if kind == ONNX:
        require_onnx("reading")
        from graphpass.formats import onnx_io

        return onnx_io.read_onnx(path)
    require_tensorflow("reading")
    from graphpass.formats import tf_io

    return tf_io.read_tf(path, kind, is_text, tag=tag, signature=signature, shapes=shapes,
                         holds_step=holds_step)


def save(graph: Graph, path: str | os.PathLike, *, output_format: str | None = None) -> None:
    """Write ``graph`` in its own format; ``output_format`` ("pb"/"pbtxt") for TF."""
    path = Path(path)
    if graph.format == "onnx":
        if output_format not in (None, "onnx"):
            raise GraphpassError(
                f"--output-format {output_format} is for TF graphs; ONNX is written as .onnx"
            )
        require_onnx("writing")
        from graphpass.formats import onnx_io

        onnx_io.write_onnx(graph, path)
        return
    require_tensorflow("writing")
    from graphpass.formats import tf_io

    tf_io.write_tf(graph, path, output_format=output_format)


def data_files(path: str | os.PathLike) -> list[Path]:
    """The files a model at ``path`` reads besides itself: an ONNX model's external
    data (a SavedModel's ``variables/`` lie inside it). None where the model cannot
    be read: reading it says why."""
    try:
        kind, _ = detect(Path(path))
    except GraphpassError:
        return []
    if kind != ONNX or not installed(ONNX_RUNTIME):
        return []
    from graphpass.formats import onnx_data

    return onnx_data.data_files_of(Path(path))


def owns_beside(output: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether writing a graph to ``output`` may create or remove ``path``: the
    names its ONNX external data files are given (``onnx_data``)."""
    from graphpass.formats import onnx_data

    return onnx_data.owns(Path(output), Path(path))
