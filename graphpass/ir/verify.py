"""IR invariant checks, run by the pipeline at its start and after every pass
that changed something (as XLA's HloVerifier runs between passes).

They never mutate. A failure after a pass is a bug in that pass, so it raises
:class:`InvariantError` (an internal error that keeps its traceback), naming the
pass and the node.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph


class InvariantError(AssertionError):
    """The IR is malformed: a pass (or a reader) broke an invariant."""


def verify(graph: Graph, after: str = "input") -> None:
    """Check: acyclic (loop back-edges aside), ports valid, node data complete."""
    dialect = graph.dialect
    where = f"after pass {after!r}" if after != "input" else "in the input graph"
    for node in graph.nodes():
        for key in ("op", "attrs", "device", "meta"):
            if key not in node._data:
                raise InvariantError(f"{where}: node {node.name!r} has no {key!r}")
        slots = sorted(graph.input_slots(node.name))
        if slots and slots[0] < 0:
            raise InvariantError(f"{where}: node {node.name!r} has a negative input slot")
        if not dialect.allows_empty_input_slots and slots != list(range(len(slots))):
            raise InvariantError(
                f"{where}: node {node.name!r} has gaps in its input slots {slots}"
            )
        for tensor in graph.inputs(node.name):
            if tensor.port < 0:
                raise InvariantError(
                    f"{where}: node {node.name!r} reads {tensor}, a negative output port"
                )
            limit = dialect.num_outputs(graph, tensor.node)
            if limit is not None and tensor.port >= limit:
                raise InvariantError(
                    f"{where}: node {node.name!r} reads {tensor}, but {tensor.node!r} "
                    f"has only {limit} outputs"
                )
    try:
        graph.topological_order(ignore_edge=lambda s, d: dialect.is_back_edge(graph, s, d))
    except ValueError as exc:
        raise InvariantError(f"{where}: {exc}") from None
