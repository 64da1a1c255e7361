"""graphpass: graph rewrites for exported training graphs.

The data path: ``load`` -> :class:`Graph` -> analyses -> passes -> lowering ->
``save``. ``run_passes`` is what ``graphpass rewrite`` calls.
"""

from __future__ import annotations

from graphpass.errors import GraphpassError
from graphpass.formats.detect import load, save
from graphpass.ir.graph import Graph, Node, Tensor

__version__ = "0.1.0"


def run_passes(graph: Graph, settings: dict, instruments: list | None = None) -> list:
    """Run the passes ``settings`` ask for (keys as the CLI's long options, with
    underscores) on ``graph`` in place; returns one ``PassResult`` per pass."""
    from graphpass.passes import Pipeline, build_passes

    return Pipeline(build_passes(settings), instruments or []).run(graph)


def analyze(graph: Graph, **overrides):
    """Region analysis (loss, gradients, optimizer, global_step); see
    ``graphpass.analysis.regions``."""
    from graphpass.analysis.regions import analyze as _analyze

    return _analyze(graph, **overrides)


__all__ = ["Graph", "GraphpassError", "Node", "Tensor", "analyze", "load", "run_passes", "save"]
