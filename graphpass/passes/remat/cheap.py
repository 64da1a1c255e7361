"""The ``cheap`` remat policy: recompute only what costs little time, chosen by one
minimum cut.

Cheap is defined by cost (``analysis.cost``'s roofline), not by op kind: an op
may be recomputed when it is memory bound (running it again costs about reading
its inputs and writing its outputs once more: elementwise ops, activations,
normalisations, copies), never where its arithmetic dominates (matmuls and
convolutions of any size that matters). Which values to keep is one minimum cut
over tensor bytes (networkx max-flow), as PyTorch's min-cut partitioner does for
its joint graphs: the source feeds every value that may not be recomputed, every
value a gradient op reads drains to the sink, each value is an edge of capacity
its bytes. The recomputed values are grouped per unit of the forward chain, so
each group is recomputed when its own gradient arrives. Then the step's time
decides: where the groups' copies would add more than ``CHEAP_TIME`` of the
step's predicted time, the groups releasing the most bytes per unit of time are
kept, in that order, up to it (a CNN's batch norms, recomputed per group that
needs them, cost more than their bytes suggest).
"""

from __future__ import annotations

from graphpass.analysis.cost import StepTime
from graphpass.analysis.forward import ForwardChain
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import RuntimeModel

#: A value this many times smaller than its op's inputs is not worth recomputing.
REDUCTION = 4
#: Peak (a fraction of the step's as written without a segment) the policy gives up
#: to recompute each value once rather than once per group that needs it (see
#: :func:`cheap_groups`).
SHARED_COPY_ALLOWANCE = 0.01
#: The most the cheap policy's copies may add to the step's predicted time.
CHEAP_TIME = 0.05


def cheap_keep(graph: Graph, chain: ForwardChain, sizes, runtime: RuntimeModel) -> set[Tensor]:
    """The forward values to keep when only cheap ops may be recomputed: one minimum
    cut (source: values that must be computed in the forward pass; sink: values
    gradient ops read; capacity: bytes). Values computed from shapes and stored
    values alone (a layer norm's ``ones(Shape(x))``) are kept as they are: they
    are small, and Grappler folds them in the original but not in a copy that
    waits on a trigger, which changes the arithmetic. A value much smaller than
    what its op reads (a layer norm's mean and variance) is kept too: releasing it
    saves little and recomputes the whole op (PyTorch's partitioner bans such
    reductions by the same 4x rule)."""
    import networkx as nx

    members = set(chain.order)
    saved = {v.tensor for v in chain.saved}
    static = _static(graph, chain.order)
    flow = nx.DiGraph()
    for name in chain.order:
        banned = name in static or not runtime.recomputable(graph, name) or \
            not sizes.memory_bound(name, runtime) or _folds_constant(graph, name, runtime)
        inputs = [t for t in graph.inputs(name) if t.node in members]
        read = sum(sizes.bytes(t) for t in graph.inputs(name))
        for port in graph.used_ports(name):
            tensor = Tensor(name, port)
            flow.add_edge(("in", tensor), ("out", tensor), capacity=sizes.bytes(tensor))
            if banned or REDUCTION * sizes.bytes(tensor) < read:
                flow.add_edge("source", ("in", tensor))
            for source in inputs:
                flow.add_edge(("out", source), ("in", tensor))
            if tensor in saved:
                flow.add_edge(("out", tensor), "sink")
    if "source" not in flow or "sink" not in flow:
        return set(saved)
    _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    return {t for t in saved if ("in", t) in reachable and ("out", t) not in reachable} | \
        {Tensor(n, p) for n in static for p in graph.used_ports(n)}


def _folds_constant(graph: Graph, name: str, runtime: RuntimeModel) -> bool:
    """A product with a constant factor: Grappler's arithmetic optimizer folds and
    pushes such constants across neighbouring products, and does so differently
    once the original's other readers (gradient ops) have moved to the copy, so
    the copy would not compute the original's bits (seen on tf_keras's GELU)."""
    dialect = graph.dialect
    return graph.node(name).op in runtime.constant_folded_ops and any(
        dialect.is_source(graph, t.node) and not dialect.is_variable_value(graph, t.node)
        and t.node not in dialect.step.graph_inputs(graph) for t in graph.inputs(name))


def _static(graph: Graph, order: list[str]) -> set[str]:
    """Ops of ``order`` (topological) computed from shapes, constants and variables
    only (not from fed values)."""
    dialect = graph.dialect
    members = set(order)
    fed = set(dialect.step.graph_inputs(graph))
    static: set[str] = set()
    for name in order:
        if dialect.is_shape_only(graph, name) or all(
                t.node in static or (t.node not in members and t.node not in fed)
                for t in graph.inputs(name)):
            static.add(name)
    return static


def cheap_groups(graph: Graph, chain: ForwardChain, keep: set[Tensor],
                 share: bool = True) -> list[tuple[str, list[Tensor]]]:
    """The values to recompute (saved, not kept), one group per unit producing them,
    so each group is recomputed when the gradient reaches its own unit.

    With ``share``, a value that a group triggered earlier (a later unit: the
    backward pass reaches it first) recomputes anyway on the way to its own values
    joins that group, and its readers read that copy: a layer norm's output that
    the next layer's weight gradient needs too is computed once in the backward
    pass, not once per group (a transformer's duplicated norms would dominate its
    recompute time). The shared copy lives longer, so whether
    to share is the caller's trade (``auto._plan_cheap``)."""
    unit_of = {}
    for index, unit in enumerate(chain.units):
        for name in chain.order[unit.start:unit.end]:
            unit_of[name] = index
    by_unit: dict[int, list[Tensor]] = {}
    for value in chain.saved:
        if value.tensor not in keep and value.recomputable:
            by_unit.setdefault(unit_of[value.tensor.node], []).append(value.tensor)
    groups: dict[int, list[Tensor]] = {}
    recomputed_by: dict[str, int] = {}  # node -> the earliest-triggered group copying it
    for index in sorted(by_unit, reverse=True):  # the order the backward pass reaches them
        for tensor in by_unit[index]:
            groups.setdefault(recomputed_by.get(tensor.node, index), []).append(tensor)
        if not share:
            continue
        for name in _recompute_closure(graph, groups.get(index, []), keep, unit_of):
            recomputed_by.setdefault(name, index)
    return [(chain.label(index, index), sorted(groups[index])) for index in sorted(groups)]


def within_time(graph: Graph, chain: ForwardChain, groups: list[tuple[str, list[Tensor]]],
                keep: set[Tensor], time: StepTime, sizes
                ) -> tuple[list[tuple[str, list[Tensor]]], dict[str, float]]:
    """``groups`` whose copies add at most ``CHEAP_TIME`` of the step's predicted
    time: all where they fit, else those releasing the most bytes per unit of
    time first, each that still fits (each group's copies counted as its own: a
    copy two groups share counts twice, which errs towards keeping). Also the
    groups left out, each with its share of the step's time."""
    members = set(chain.order)
    cost = {label: time.extra(sorted(_recompute_closure(graph, released, keep, members)))
            for label, released in groups}
    if sum(cost.values()) <= CHEAP_TIME:
        return groups, {}
    saved = {label: sum(sizes.bytes(t) for t in released) for label, released in groups}
    chosen, spent = set(), 0.0
    for label in sorted(cost, key=lambda g: (-saved[g] / max(cost[g], 1e-12), g)):
        if spent + cost[label] <= CHEAP_TIME:
            chosen.add(label)
            spent += cost[label]
    return ([(label, released) for label, released in groups if label in chosen],
            {label: share for label, share in cost.items() if label not in chosen})


def _recompute_closure(graph: Graph, released: list[Tensor], keep: set[Tensor],
                       members) -> set[str]:
    """The forward ops a copy of ``released`` runs: their producers and, back to
    kept values and values from outside the chain, theirs."""
    closure: set[str] = set()
    stack = [t.node for t in released]
    while stack:
        name = stack.pop()
        if name in closure:
            continue
        closure.add(name)
        stack.extend(t.node for t in graph.inputs(name) if t not in keep and t.node in members)
    return closure
