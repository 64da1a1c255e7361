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


class InvariantError(AssertionError):
    """The IR is malformed: a pass broke an invariant."""


class MalformedGraphError(GraphpassError):
    """The graph read from a file breaks an invariant (a cycle, a port it lacks)."""


def verify(graph: Graph, after: str = "input") -> None:
    """Check: acyclic (loop back-edges aside), ports valid, node data complete."""
    dialect = graph.dialect
    is_input = after == "input"
    where = "in the input graph" if is_input else f"after pass {after!r}"
    error = MalformedGraphError if is_input else InvariantError
    fix = "; the file is malformed: re-export it or fix that node" if is_input else ""
    for node in graph.nodes():
        for key in ("op", "attrs", "device", "meta"):
            if key not in node._data:
                raise error(f"{where}: node {node.name!r} has no {key!r}{fix}")
        slots = sorted(graph.input_slots(node.name))
        if slots and slots[0] < 0:
            raise error(f"{where}: node {node.name!r} has a negative input slot{fix}")
        if not dialect.allows_empty_input_slots and slots != list(range(len(slots))):
            raise error(f"{where}: node {node.name!r} has gaps in its input slots {slots}{fix}")
    problem = port_problem(graph)
    if problem:
        raise error(f"{where}: {problem}{fix}")
    try:
        _check_acyclic(graph)
    except ValueError as exc:
        raise error(f"{where}: {exc}{fix}") from None


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

    Checked per producer (the ports read from it against its output count);
    only a graph that fails is scanned reader by reader, to name the first."""
    if all(_ports_in_range(graph, name) for name in graph):
        return None
    return _first_bad_read(graph)


def _ports_in_range(graph: Graph, name: str) -> bool:
    ports = graph.used_ports(name)
    if not ports:
        return True
    if ports[0] < 0 or ports[-1] > MAX_PORT:
        return False
    limit = graph.dialect.num_outputs(graph, name)
    return limit is None or ports[-1] < limit


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
