"""graphpass: graph rewrites for exported training graphs.

The data path: ``load`` -> :class:`Graph` -> analyses -> passes -> lowering ->
``save``. ``run_passes`` is what ``graphpass rewrite`` calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from graphpass.errors import GraphpassError
from graphpass.ir.dialects import register_format

if TYPE_CHECKING:
    from graphpass.analysis.step_location import load
    from graphpass.formats.dispatch import save
    from graphpass.ir.graph import Graph, Node, Tensor
    from graphpass.options import PipelineOptions

__version__ = "0.1.0"

#: Public names imported on first use: ``graphpass --help`` (which imports this
#: package) must not pay for networkx, numpy or a runtime.
_LAZY = {"load": "graphpass.analysis.step_location", "save": "graphpass.formats.dispatch",
         "Graph": "graphpass.ir.graph", "Node": "graphpass.ir.graph",
         "Tensor": "graphpass.ir.graph"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphpass' has no attribute {name!r}")


def _tf_dialect():
    from graphpass.dialects.tf import TFDialect

    return TFDialect()


def _tf_state():
    from graphpass.formats.tf_state import TFState

    return TFState()


def _onnx_dialect():
    from graphpass.dialects.onnx import ONNXDialect

    return ONNXDialect()


def _onnx_state():
    from graphpass.formats.onnx_state import ONNXState

    return ONNXState()


# The formats graphpass reads, registered with the IR (which cannot import them):
# every import of a graphpass module runs this package's code first.
register_format("tf", _tf_dialect, _tf_state)
register_format("onnx", _onnx_dialect, _onnx_state)


def run_passes(graph: Graph, options: Mapping | PipelineOptions,
               instruments: Sequence = (), *, estimates: bool = True,
               profiler=None) -> list:
    """Run the passes ``options`` ask for on ``graph`` in place; returns one
    ``PassResult`` per pass. ``options`` is a :class:`PipelineOptions` or a mapping
    keyed like the CLI's long options, with underscores (validated the same way).
    Region overrides (``loss``, ``train_op``, ``global_step``) are checked against
    the graph even when no requested pass reads regions. ``estimates=False``:
    passes skip the memory estimates that only their reports show. ``profiler``
    (``--profile``, ``graphpass.inspect.profile``): runs the step to measure what
    the planner estimates; None (the default) runs nothing."""
    from graphpass.options import PipelineOptions, pipeline_options
    from graphpass.passes import PassContext, Pipeline, build_passes

    if not isinstance(options, PipelineOptions):
        options = pipeline_options(options)
    ctx = PassContext.from_options(options, instruments, estimates=estimates,
                                   profiler=profiler)
    if options.regions:
        ctx.analyses.regions(graph)
    return Pipeline(build_passes(options)).run(graph, ctx)


def analyze(graph: Graph, **overrides):
    """Region analysis (loss, gradients, optimizer, global_step); see
    ``graphpass.analysis.regions``."""
    from graphpass.analysis.regions import analyze as _analyze

    return _analyze(graph, **overrides)


__all__ = ["Graph", "GraphpassError", "Node", "Tensor", "analyze", "load", "run_passes", "save"]
