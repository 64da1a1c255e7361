"""Topological orders of the IR's multigraph: Kahn's algorithm with ties broken by
insertion order, the one-sweep proof that an order is topological, and the
placement of a pass's new nodes into an order that was topological before it.

Pure functions of a ``networkx.MultiDiGraph``, read through networkx's public API
(node iteration, ``adjacency()``, ``successors()``). They never edit the graph and
keep no state: ``Graph`` owns the caches (the current order, the last order known
to be acyclic) and decides when to call which.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import networkx as nx

#: ``ignore_edge(src, dst)``: an edge an order need not respect (a loop's back-edge).
EdgeFilter = Callable[[str, str], bool]


def is_topological(g: nx.MultiDiGraph, order: list[str],
                   ignore_edge: EdgeFilter | None = None) -> bool:
    """Whether ``order`` holds every node once and every edge (but those
    ``ignore_edge`` drops) goes forward in it: one sweep over the edges."""
    index = {name: i for i, name in enumerate(order)}
    if len(index) != len(g) or len(order) != len(g):
        return False
    for src, users in g.adjacency():
        at = index.get(src)
        if at is None:
            return False
        for dst in users:
            if index[dst] <= at and (ignore_edge is None or not ignore_edge(src, dst)):
                return False
    return True


def kahn_order(g: nx.MultiDiGraph, ignore_edge: EdgeFilter | None = None) -> list[str]:
    """Kahn's algorithm, the ready nodes in a heap of their insertion indexes. Where
    the insertion order is itself topological (a file as its exporter wrote it) that
    is the order Kahn's gives (the next node in it is always ready, and the least
    index), so it is returned after one sweep over the edges proves it. Raises
    ``ValueError`` naming a node on a cycle if there is one."""
    names = list(g)
    if is_topological(g, names, ignore_edge):
        return names
    index = {name: i for i, name in enumerate(names)}
    indegree = dict.fromkeys(names, 0)
    successors: dict[str, list[tuple[str, int]]] = {}
    for src, users in g.adjacency():
        kept = [(dst, len(keyed)) for dst, keyed in users.items()
                if ignore_edge is None or not ignore_edge(src, dst)]
        successors[src] = kept
        for dst, edges in kept:
            indegree[dst] += edges
    ready = [i for i, name in enumerate(names) if indegree[name] == 0]  # sorted: a heap
    order = []
    while ready:
        name = names[heapq.heappop(ready)]
        order.append(name)
        for dst, edges in successors[name]:
            indegree[dst] -= edges
            if indegree[dst] == 0:
                heapq.heappush(ready, index[dst])
    if len(order) != len(names):
        stuck = next(n for n, deg in indegree.items() if deg > 0)
        raise ValueError(f"the graph has a cycle through {stuck!r}")
    return order


def placed_order(g: nx.MultiDiGraph, base: list[str]) -> list[str]:
    """``base`` less the nodes removed since, with every node it lacks placed just
    before the earliest of its readers (after them all if it has none), placing the
    nodes in reverse insertion order so that a reader is placed first."""
    position = {name: i for i, name in enumerate(base) if name in g}
    end = len(base)
    key: dict[str, tuple[int, int]] = {}
    new = [name for name in g if name not in position]
    for name in reversed(new):
        first = (end, 0)
        for user in g.successors(name):
            at = (position[user], 0) if user in position else key.get(user)
            if at is not None and at < first:
                first = at
        key[name] = (first[0], first[1] - 1)
    before: dict[int, list[str]] = {}
    for name in sorted(new, key=key.__getitem__):  # stable: ties in insertion order
        before.setdefault(key[name][0], []).append(name)
    order: list[str] = []
    for i, name in enumerate(base):
        order.extend(before.get(i, ()))
        if name in position:
            order.append(name)
    order.extend(before.get(end, ()))
    return order


def first_cycle(calls: dict[Hashable, list]) -> list | None:
    """A cycle of a call graph (``{caller: callees}``) as ``[f, g, ..., f]``, or None:
    an iterative depth-first search, so a deep chain cannot exhaust the stack."""
    state: dict[Hashable, int] = {}  # 1: on the current path, 2: done
    for root in calls:
        if root in state:
            continue
        path, stack = [root], [iter(calls[root])]
        state[root] = 1
        while stack:
            callee = next(stack[-1], None)
            if callee is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(callee) == 1:
                return path[path.index(callee):] + [callee]
            elif callee not in state:
                state[callee] = 1
                path.append(callee)
                stack.append(iter(calls[callee]))
    return None
