"""The ``load``/``save`` entry points: each format's reader or writer, chosen by
the container a path holds (``container.detect``, re-exported here with
``check_regular_file`` for existing callers).

Writes are atomic: a temporary file (or directory) beside the target, renamed
over it only once complete, so a failure never leaves a partial or clobbered
output (``files.atomic_output``).
"""

from __future__ import annotations

import os
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.container import check_regular_file, detect
from graphpass.formats.files import GRAPHDEF, METAGRAPH, ONNX, SAVEDMODEL
from graphpass.ir.graph import Graph

__all__ = ["GRAPHDEF", "METAGRAPH", "ONNX", "SAVEDMODEL", "check_regular_file", "detect",
           "load", "save"]


def load(path: str | os.PathLike, *, tag: str | None = None,
         signature: str | None = None, shapes: bool = False) -> Graph:
    """Read a TF GraphDef / MetaGraphDef / SavedModel or an ONNX model into a Graph;
    ``signature`` picks the TF2 signature whose function holds the training step.
    ``shapes``: infer a TF graph's shapes while reading it, for a command that will
    read them all (``tf_io.graph_from_graph_def``: less memory than inferring later;
    analyses that read a few ask for those alone). For a GraphDef whose top level
    calls its step, the entry point (not the reader) asks the dialect which
    function body holds optimizer updates (``_holds_updates``)."""
    path = Path(path)
    kind, is_text = detect(path)
    if kind == ONNX:
        from graphpass.formats import onnx_io

        return onnx_io.read_onnx(path)
    from graphpass.formats import tf_io

    return tf_io.read_tf(path, kind, is_text, tag=tag, signature=signature, shapes=shapes,
                         holds_step=_holds_updates)


def _holds_updates(graph: Graph) -> bool:
    """Whether a function body holds the training step: its dialect finds optimizer
    updates in it (region analysis's first question)."""
    return bool(graph.dialect.optimizer_applies(graph))


def save(graph: Graph, path: str | os.PathLike, *, output_format: str | None = None) -> None:
    """Write ``graph`` in its own format; ``output_format`` ("pb"/"pbtxt") for TF."""
    path = Path(path)
    if graph.format == "onnx":
        if output_format not in (None, "onnx"):
            raise GraphpassError(
                f"--output-format {output_format} is for TF graphs; ONNX is written as .onnx"
            )
        from graphpass.formats import onnx_io

        onnx_io.write_onnx(graph, path)
        return
    from graphpass.formats import tf_io

    tf_io.write_tf(graph, path, output_format=output_format)
