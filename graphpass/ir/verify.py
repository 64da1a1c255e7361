"""IR invariant checks, run by the pipeline at its start and after every pass
that changed something (as XLA's HloVerifier runs between passes).

They never mutate. A failure after a pass is a bug in that pass, so it raises
:class:`InvariantError` (an internal error that keeps its traceback), naming the
pass and the node. A failure in the input graph is the file's fault, not the
code's: it raises :class:`MalformedGraphError`, a user error (exit 2).
"""

from __future__ import annotations

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph

#: TF stores an output port as an int32; 2^31 and up wraps (2^32 reads as port 0).
MAX_PORT = 2**31 - 1

#: What every node's data holds (``Graph.add_node``).
_NODE_KEYS = ("op", "attrs", "device", "meta")
_NODE_KEY_SET = frozenset(_NODE_KEYS)


class InvariantError(AssertionError):
    """The IR is malformed: a pass broke an invariant."""


class MalformedGraphError(GraphpassError):
    """The graph read from a file breaks an invariant (a cycle, a port it lacks)."""


def verify(graph: Graph, after: str = "input") -> None:
    """Check: acyclic (loop back-edges aside), ports valid, node data complete."""
    is_input = after == "input"
    where = "in the input graph" if is_input else f"after pass {after!r}"
    error = MalformedGraphError if is_input else InvariantError
    fix = "; the file is malformed: re-export it or fix that node" if is_input else ""
    problem = _node_problem(graph) or port_problem(graph)
    if problem:
        raise error(f"{where}: {problem}{fix}")
    try:
        _check_acyclic(graph)
    except ValueError as exc:
        raise error(f"{where}: {exc}{fix}") from None


def _node_problem(graph: Graph) -> str | None:
    """The first node, in graph order, missing node data or with bad input slots.

    The slots come from one sweep over the edges (a data edge's key is its slot)
    rather than a slot map per node: on a 65k-node graph that halved the time
    of the whole check, which runs after every pass."""
    slots: dict[str, list[int]] = {}
    for _, dst, slot, _ in graph.data_edges():
        slots.setdefault(dst, []).append(slot)
    gaps_allowed = graph.dialect.allows_empty_input_slots
    for node in graph.nodes():
        if not node._data.keys() >= _NODE_KEY_SET:
            missing = next(key for key in _NODE_KEYS if key not in node._data)
            return f"node {node.name!r} has no {missing!r}"
        used = slots.get(node.name)
        if not used:
            continue
        used.sort()
        if used[0] < 0:
            return f"node {node.name!r} has a negative input slot"
        if not gaps_allowed and used[-1] != len(used) - 1 or len(set(used)) != len(used):
            return f"node {node.name!r} has gaps in its input slots {used}"
    return None


def _check_acyclic(graph: Graph) -> None:
    """Raise ``ValueError`` on a cycle other than through loop back-edges. The
    order over all edges is tried first: it is the one passes ask for, and the
    graph keeps it until its structure changes; only a graph with loops needs
    the order without their back-edges."""
    try:
        graph.topological_order()
    except ValueError:
        graph.topological_order(
            ignore_edge=lambda s, d: graph.dialect.is_back_edge(graph, s, d))


def port_problem(graph: Graph) -> str | None:
    """The first input that reads an output port its producer does not have.

    Checked per producer (the highest port read from it against its output
    count, from one sweep over the edges); only a graph that fails is scanned
    reader by reader, to name the first."""
    highest: dict[str, int] = {}
    for src, _, _, port in graph.data_edges():
        if port < 0 or port > MAX_PORT:
            return _first_bad_read(graph)
        if port >= highest.get(src, 0):
            highest[src] = port
    num_outputs = graph.dialect.num_outputs
    for src, port in highest.items():
        limit = num_outputs(graph, src)
        if limit is not None and port >= limit:
            return _first_bad_read(graph)
    return None


def _first_bad_read(graph: Graph) -> str | None:
    dialect = graph.dialect
    for node in graph.nodes():
        for tensor in graph.inputs(node.name):
            if tensor.port < 0 or tensor.port > MAX_PORT:
                return f"node {node.name!r} reads {tensor}, an output port out of range"
            limit = dialect.num_outputs(graph, tensor.node)
            if limit is not None and tensor.port >= limit:
                return (f"node {node.name!r} reads {tensor}, but {tensor.node!r} "
                        f"has only {limit} output{'s' if limit != 1 else ''}")
    return None
