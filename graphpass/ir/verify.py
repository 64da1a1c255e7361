"""IR invariant checks, run by the pipeline at its start and after every pass
that changed something (as XLA's HloVerifier runs between passes).

After a pass only the nodes it added or rewired are checked node by node
(``Graph.take_edited``), and the whole graph for cycles; the TF reader vouches
for the nodes it built (whole by construction, their ports checked), so a file
read and handed straight to the pipeline is checked for cycles alone.

They never mutate. A failure after a pass is a bug in that pass, so it raises
:class:`InvariantError` (an internal error that keeps its traceback), naming the
pass and the node. A failure in the input graph is the file's fault, not the
code's: it raises :class:`MalformedGraphError`, a user error (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

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


def verify(graph: Graph, after: str = "input", nodes: Iterable[str] | None = None,
           checks: Sequence[Callable[[Graph], str | None]] = ()) -> None:
    """Check: acyclic (loop back-edges aside), ports valid, node data complete, and
    after a pass the ``checks`` the target's runtime model adds (its merged
    kernels on no path: ``RuntimeModel.ir_checks``); the IR knows no runtime.

    ``nodes``: check the data, slots and ports of those alone (the nodes a pass
    added or rewired, ``Graph.take_edited``: nothing else can have broken them);
    acyclicity is checked over the whole graph either way. ``checks`` run after
    passes only: an input graph is as its exporter made it."""
    is_input = after == "input"
    where = "in the input graph" if is_input else f"after pass {after!r}"
    error = MalformedGraphError if is_input else InvariantError
    fix = "; the file is malformed: re-export it or fix that node" if is_input else ""
    names = list(graph) if nodes is None else [n for n in nodes if n in graph]
    problem = _node_problem(graph, names) or _first_bad_read(graph, names)
    if problem:
        raise error(f"{where}: {problem}{fix}")
    try:
        _check_acyclic(graph)
    except ValueError as exc:
        raise error(f"{where}: {exc}{fix}") from None
    for check in () if is_input else checks:
        problem = check(graph)
        if problem:
            raise error(f"{where}: {problem}")


def _node_problem(graph: Graph, names: list[str]) -> str | None:
    """The first of ``names`` missing node data or with bad input slots."""
    gaps_allowed = graph.dialect.allows_empty_input_slots
    for name in names:
        data = graph.node(name)._data
        if not data.keys() >= _NODE_KEY_SET:
            missing = next(key for key in _NODE_KEYS if key not in data)
            return f"node {name!r} has no {missing!r}"
        slots = sorted(graph.input_slots(name))
        if slots and slots[0] < 0:
            return f"node {name!r} has a negative input slot"
        if not gaps_allowed and slots and slots[-1] != len(slots) - 1:
            return f"node {name!r} has gaps in its input slots {slots}"
    return None


def _check_acyclic(graph: Graph) -> None:
    """Raise ``ValueError`` on a cycle other than through loop back-edges. All
    edges are tried first (``Graph.check_acyclic``: linear where the last proven
    order still holds, with a pass's new nodes placed); only a graph with loops
    needs the order without their back-edges."""
    try:
        graph.check_acyclic()
    except ValueError:
        graph.topological_order(
            ignore_edge=lambda s, d: graph.dialect.is_back_edge(graph, s, d))


def port_problem(graph: Graph) -> str | None:
    """The first input that reads an output port its producer does not have (the
    readers' check of a whole file).

    Checked per producer (the highest port read from it against its output
    count, from one sweep over the edges); only a graph that fails is scanned
    reader by reader, to name the first."""
    highest: dict[str, int] = {}
    for src, _, _, port in graph.data_edges():
        if port < 0 or port > MAX_PORT:
            return _first_bad_read(graph, graph)
        if port >= highest.get(src, 0):
            highest[src] = port
    num_outputs = graph.dialect.num_outputs
    for src, port in highest.items():
        limit = num_outputs(graph, src)
        if limit is not None and port >= limit:
            return _first_bad_read(graph, graph)
    return None


def _first_bad_read(graph: Graph, names: Iterable[str]) -> str | None:
    """The first input of ``names`` that reads a port its producer does not have."""
    dialect = graph.dialect
    for name in names:
        for tensor in graph.inputs(name):
            if tensor.port < 0 or tensor.port > MAX_PORT:
                return f"node {name!r} reads {tensor}, an output port out of range"
            limit = dialect.num_outputs(graph, tensor.node)
            if limit is not None and tensor.port >= limit:
                return (f"node {name!r} reads {tensor}, but {tensor.node!r} "
                        f"has only {limit} output{'s' if limit != 1 else ''}")
    return None
