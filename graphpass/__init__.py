"""graphpass: graph rewrites for exported training graphs.

The data path: ``load`` -> :class:`Graph` -> analyses -> passes -> lowering ->
``save``. ``run_passes`` is what ``graphpass rewrite`` calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from graphpass.errors import GraphpassError

if TYPE_CHECKING:
    import os

    from graphpass.formats.dispatch import save
    from graphpass.ir.graph import Graph, Node, Tensor
    from graphpass.options import PipelineOptions

__version__ = "0.1.0"

#: Public names imported on first use: ``graphpass --help`` (which imports this
#: package) must not pay for networkx, numpy or a runtime.
_LAZY = {"save": "graphpass.formats.dispatch",
         "Graph": "graphpass.ir.graph", "Node": "graphpass.ir.graph",
         "Tensor": "graphpass.ir.graph"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphpass' has no attribute {name!r}")


def load(path: str | os.PathLike, *, tag: str | None = None, signature: str | None = None,
          shapes: bool = False) -> Graph:
    """Read a TF GraphDef / MetaGraphDef / SavedModel or an ONNX model into a Graph
    (``graphpass.formats.dispatch.load``). ``signature`` picks the TF2 signature whose
    function holds the training step; where a GraphDef's top level only calls
    functions, the body with optimizer updates is the step, which only analysis can
    tell, so it is asked here and the reader stays free of it. ``shapes``: infer a TF
    graph's shapes while reading it, for a command that reads them all."""
    from graphpass.formats.dispatch import load as read

    return read(path, tag=tag, signature=signature, shapes=shapes,
                holds_step=_holds_updates)


def _holds_updates(body: Graph) -> bool:
    """Whether a function body holds the training step: its dialect finds optimizer
    updates in it (region analysis's first question)."""
    return bool(body.dialect.optimizer_applies(body))


def run_passes(graph: Graph, options: Mapping | PipelineOptions,
               instruments: Sequence = (), *, estimates: bool = True) -> list:
    """Run the passes ``options`` ask for on ``graph`` in place; returns one
    ``PassResult`` per pass. ``options`` is a :class:`PipelineOptions` or a mapping
    keyed like the CLI's long options, with underscores (validated the same way).
    Region overrides (``loss``, ``train_op``, ``global_step``) are checked against
    the graph even when no requested pass reads regions. ``estimates=False``:
    passes skip the memory estimates that only their reports show."""
    from graphpass.options import PipelineOptions, pipeline_options
    from graphpass.passes import PassContext, Pipeline, build_passes

    if not isinstance(options, PipelineOptions):
        options = pipeline_options(options)
    ctx = PassContext.from_options(options, instruments, estimates=estimates)
    if options.regions:
        ctx.analyses.regions(graph)
    return Pipeline(build_passes(options)).run(graph, ctx)


def analyze(graph: Graph, **overrides):
    """Region analysis (loss, gradients, optimizer, global_step); see
    ``graphpass.analysis.regions``."""
    from graphpass.analysis.regions import analyze as _analyze

    return _analyze(graph, **overrides)


__all__ = ["Graph", "GraphpassError", "Node", "Tensor", "analyze", "load", "run_passes", "save"]
