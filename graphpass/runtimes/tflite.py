"""TensorFlow Lite as a :class:`~graphpass.runtimes.base.RuntimeModel`: the
converter's op order, TF's aliasing and folding as the converter applies them,
and a static arena (``ARENA``: ``analysis/arena`` packs it as TFLite's
``ArenaPlanner`` does). The converter drops control edges, so a rewrite orders
work by data dependencies; no process holds updates, as the interpreter runs
the converted order as it is.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph
from graphpass.runtimes.base import ARENA, Execution
from graphpass.runtimes.tf_executor import TFKernelFacts


class TFLiteModel(TFKernelFacts):
    name = "litert"
    title = "TFLite's arena"
    dependency = "data"
    heap = ARENA

    def executions(self, graph: Graph, nodes: set[str], known: frozenset[str],
                   fetched: frozenset[str]) -> list[Execution]:
        return [Execution(converted_order(graph, nodes))]

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        return ()  # the arena gives every output a tensor of its own


def converted_order(graph: Graph, needed: set[str]) -> list[str]:
    """The converter's op order as far as it matters to the arena: each op as
    soon as its inputs are there, the most recently readied first (a depth-first
    list schedule; ties in the graph's order). The converter hoists what does not
    wait for the gradients (variable reads, a momentum times its slot, the masks
    of activation gradients) next to what it reads, which this reproduces; the
    graph's own order would keep activations alive until their gradient's turn."""
    order = [n for n in graph.topological_order() if n in needed]
    position = {n: i for i, n in enumerate(order)}
    waiting = {n: sum(1 for p in set(graph.producers(n)) if p in position) for n in order}
    ready = [n for n in reversed(order) if not waiting[n]]
    scheduled = []
    while ready:
        name = ready.pop()
        scheduled.append(name)
        users = [u for u in set(graph.users(name)) if u in position]
        for user in sorted(users, key=position.get, reverse=True):
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
    return scheduled
