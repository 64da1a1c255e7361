"""Stale-gradient dropping, the rewrite of one train op: the step snapshot, the
staleness check, and the conditional that runs the apply unit only when the
gradients are fresh (v1 Switch/Merge, or a functional If), the train op
recreated after it.

It edits the graph as a ``StepPlan`` says, through the dialect's
``ConditionalBuilder``; it decides nothing the plan did not.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.passes.stale.plan import StepPlan

SCOPE = "graphpass/drop_stale"
#: Marks the gate, so that a graph already rewritten is refused.
GATE_ATTR = "_graphpass_stale_gate"


def check_not_rewritten(graph: Graph) -> None:
    for node in graph.nodes():
        if GATE_ATTR in node.attrs:
            raise GraphpassError(
                f"the graph already drops stale gradients (node {node.name!r}, train op "
                f"{graph.dialect.get_attr(graph, node.name, GATE_ATTR)!r}); run the stale pass "
                "on the original graph, not on its output")


@dataclass
class TrainOp:
    """The train op while its step is rewritten. When it is part of the apply unit
    (an increment or a grouping NoOp: the usual case) it moves to ``<name>/accepted``
    inside the unit, and a new op of the old name follows the conditional."""

    name: str
    device: str
    unit: list[str]
    accepted: str | None = None
    value_out: bool = False  # a ref update returning the new value (``AssignAdd``)

    @classmethod
    def detach(cls, graph: Graph, plan: StepPlan, keep_value: bool) -> TrainOp:
        node = graph.node(plan.train_op)
        train = cls(plan.train_op, node.device, list(plan.unit))
        if plan.train_op in plan.unit:
            train.value_out = keep_value and graph.dialect.has_outputs(graph, node.name)
            train.accepted = _rename(graph, node.name,
                                     graph.unique_name(f"{node.name}/accepted"))
            train.unit[train.unit.index(node.name)] = train.accepted
        return train

    def recreate(self, graph: Graph, done: Tensor) -> None:
        """The train op again, under its own name, after the conditional: it completes
        on both branches, and fetching ``name`` (or ``name:0``) keeps working."""
        if self.accepted is None:
            return
        dialect = graph.dialect
        if self.value_out:
            created = dialect.identity(graph, self.name, done).node
        else:
            created = dialect.noop(graph, self.name, [done.node])
        graph.node(created).device = self.device


def snapshot(graph: Graph, scope: str, global_step: str, plan: StepPlan) -> Tensor:
    dialect = graph.dialect
    device = graph.node(global_step).device
    read = dialect.read_variable(graph, f"{scope}/local_step/read", global_step,
                                 control_inputs=plan.snapshot_after)
    zero = dialect.constant(graph, f"{scope}/local_step/zero", 0,
                            dialect.variable_dtype(graph, global_step), device)
    local_step = dialect.binary(graph, f"{scope}/local_step", "add", read, zero)
    dialect.colocate(graph, local_step.node, global_step)
    for entry in plan.entries:
        graph.add_control_input(entry, local_step.node)
    return local_step


def staleness_check(graph: Graph, scope: str, global_step: str, local_step: Tensor,
                     plan: StepPlan, staleness: int) -> Tensor:
    dialect = graph.dialect
    device = graph.node(global_step).device
    now = dialect.read_variable(graph, f"{scope}/staleness/read", global_step,
                                control_inputs=plan.check_after)
    delta = dialect.binary(graph, f"{scope}/staleness", "sub", now, local_step)
    limit = dialect.constant(graph, f"{scope}/max_staleness", staleness,
                             dialect.variable_dtype(graph, global_step), device)
    return dialect.binary(graph, f"{scope}/accept", "less_equal", delta, limit)


def detach_exits(graph: Graph, plan: StepPlan) -> list[str]:
    """Cut the control edges from the unit to what follows it (they are re-attached to
    the end of the conditional, which completes on both branches)."""
    members = set(plan.unit)
    for name in plan.exits:
        for src in graph.control_inputs(name):
            if src in members:
                graph.remove_control_input(name, src)
    return plan.exits


def _rename(graph: Graph, old: str, new: str) -> str:
    """Move node ``old`` to the name ``new`` with its inputs and users."""
    graph.dialect.renamed_copy(graph, old, new)
    for slot, tensor in enumerate(graph.inputs(old)):
        graph.set_input(new, slot, tensor)
    for src in graph.control_inputs(old):
        graph.add_control_input(new, src)
    for port in graph.used_ports(old):
        graph.replace_uses(Tensor(old, port), Tensor(new, port))
    for user in graph.control_users(old):
        graph.remove_control_input(user, old)
        graph.add_control_input(user, new)
    graph.remove_node(old)
    return new


def _unit_sinks(graph: Graph, unit: list[str]) -> list[str]:
    members = set(unit)
    return [n for n in unit if not set(graph.users(n)) & members]


def gate_with_switch(graph: Graph, scope: str, pred: Tensor, unit: list[str], counter: str,
                      device: str, value_of: str | None) -> Tensor:
    """v1 form: the unit's roots wait on the Switch's true side, the counter increment
    on its false side; a Merge of one marker per side ends the conditional.

    ``value_of``: a ref update that was the train op (``AssignAdd`` returns the new
    step); its value, or the variable's unchanged value on a drop, is merged instead
    of the markers so the recreated train op can return it.
    """
    dialect = graph.dialect
    members = set(unit)
    dropped, accepted = dialect.switch(graph, f"{scope}/switch", pred, pred, device)
    dialect.set_attr(graph, dropped.node, GATE_ATTR, scope)
    accept = dialect.identity(graph, f"{scope}/switch_t", accepted)
    drop = dialect.identity(graph, f"{scope}/switch_f", dropped)
    for name in unit:
        if not set(graph.producers(name)) & members:
            graph.add_control_input(name, accept.node)
    one = dialect.constant(graph, f"{scope}/one", 1.0, "float32", device)
    count = dialect.assign_add_variable(graph, f"{scope}/count_drop", counter, one, [drop.node])
    sinks = _unit_sinks(graph, unit)
    if value_of is None:
        applied = dialect.identity(graph, f"{scope}/applied", accept, sinks)
        kept = dialect.identity(graph, f"{scope}/dropped", drop, [count])
    else:
        applied = dialect.identity(graph, f"{scope}/applied", Tensor(value_of, 0), sinks)
        kept = dialect.identity(graph, f"{scope}/dropped", graph.inputs(value_of)[0], [count])
    return dialect.merge(graph, f"{scope}/merge", [applied, kept], device)


def gate_with_if(graph: Graph, scope: str, pred: Tensor, unit: list[str],
                  counter: str | None, device: str, inlined: bool) -> Tensor:
    """XLA form: the unit becomes the then-branch function, the counter increment (if
    there is a counter) the else-branch one; the If returns 0.0 (applied) or 1.0
    (dropped). ``inlined``: the runtime compiles the branches with the step (the
    update math as in the original), as TF's executor does with an If marked so."""
    dialect = graph.dialect
    one = dialect.constant(graph, f"{scope}/one", 1.0, "float32", device)
    dropped = [one.node]
    if counter is not None:
        dropped.append(dialect.assign_add_variable(graph, f"{scope}/count_drop", counter, one))
    gate = dialect.functional_if(graph, f"{scope}/if", pred, (unit, dropped),
                                 results=(0.0, 1.0), device=device, inlined=inlined)
    dialect.set_attr(graph, gate.node, GATE_ATTR, scope)
    return gate
