"""graphpass: graph rewrites for exported training graphs.

The data path: ``load`` -> :class:`Graph` -> analyses -> passes -> lowering ->
``save``. ``run_passes`` is what ``graphpass rewrite`` calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphpass.errors import GraphpassError

if TYPE_CHECKING:
    from graphpass.ir.formats import load, save
    from graphpass.ir.graph import Graph, Node, Tensor

__version__ = "0.1.0"

#: Public names imported on first use: ``graphpass --help`` (which imports this
#: package) must not pay for networkx, numpy or a runtime.
_LAZY = {"load": "graphpass.ir.formats", "save": "graphpass.ir.formats",
         "Graph": "graphpass.ir.graph", "Node": "graphpass.ir.graph",
         "Tensor": "graphpass.ir.graph"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphpass' has no attribute {name!r}")


def run_passes(graph: Graph, settings: dict, instruments: list | None = None) -> list:
    """Run the passes ``settings`` ask for (keys as the CLI's long options, with
    underscores) on ``graph`` in place; returns one ``PassResult`` per pass."""
    from graphpass.passes import Pipeline, build_passes

    return Pipeline(build_passes(settings), instruments or []).run(graph)


def analyze(graph: Graph, **overrides):
    """Region analysis (loss, gradients, optimizer, global_step); see ``graphpass.ir.regions``."""
    from graphpass.ir.regions import analyze as _analyze

    return _analyze(graph, **overrides)


__all__ = ["Graph", "GraphpassError", "Node", "Tensor", "analyze", "load", "run_passes", "save"]
