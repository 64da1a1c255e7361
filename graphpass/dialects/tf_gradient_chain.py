"""Which value an optimizer's write of one variable applies as its gradient, when
the walk back from the write (``tf_updates``) meets several: Adam reads ``g`` and
``square(g)``, an embedding's Adam the ``UnsortedSegmentSum`` of the
``IndexedSlices`` values and of their squares, TF 1.x Adam ``g * (1 - beta1)``
and ``g * g * (1 - beta2)``. They are all computed from one tensor, alone or
with constants: that tensor is the gradient, counted once.

It reads the graph through the dialect; it must not decide what an update is.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph, Tensor


def one_gradient(graph: Graph, found: list[Tensor], forward: set[str],
                  constants: dict[str, bool]) -> list[Tensor]:
    """The one tensor every value in ``found`` (what one variable's write applies) is
    computed from, alone or with constants: the first tensor on the first value's
    chain (:func:`_chain`) that lies on every other chain; ``found`` when there is
    none (the values come from separate computations)."""
    if len(found) < 2:
        return found
    chains = [_chain(graph, t, forward, constants) for t in found]
    others = [set(chain) for chain in chains[1:]]
    for tensor in chains[0]:
        if all(tensor in chain for chain in others):
            return [tensor]
    return found


def _chain(graph: Graph, tensor: Tensor, forward: set[str],
           constants: dict[str, bool]) -> list[Tensor]:
    """``tensor`` and, while its producer computes from one float value only (the
    others constants or integers: ``square(g)``, ``g * (1 - beta1)``, an
    ``UnsortedSegmentSum`` of ``IndexedSlices`` values), that value, upstream,
    outside the forward pass."""
    chain = [tensor]
    while True:
        values = {t for t in graph.inputs(tensor.node)
                  if graph.dialect.is_float(graph, t) and not is_constant(graph, t.node, constants)}
        if len(values) != 1:
            return chain
        tensor = values.pop()
        if tensor.node in forward or tensor in chain:
            return chain
        chain.append(tensor)


def is_constant(graph: Graph, name: str, memo: dict[str, bool]) -> bool:
    """Computed from ``Const`` ops alone (``1 - beta1``)."""
    stack, visiting = [name], set()
    while stack:
        current = stack[-1]
        if current in memo:
            stack.pop()
            continue
        producers = [t.node for t in graph.inputs(current)]
        if graph.node(current).op in ("Const", "HostConst") or not producers \
                or graph.dialect.is_stateful(graph, current):
            memo[stack.pop()] = graph.node(current).op in ("Const", "HostConst")
            continue
        pending = [p for p in producers if p not in memo]
        if pending and current not in visiting:  # a loop's cycle is not constant
            visiting.add(current)
            stack.extend(pending)
            continue
        memo[stack.pop()] = all(memo.get(p, False) for p in producers)
    return memo[name]
