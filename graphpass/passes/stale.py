"""Stale-gradient dropping: the graph-level ``tf.contrib.opt.DropStaleGradientOptimizer``.

Long because the pass is one plan-then-rewrite over a train op (snapshot,
check, conditional apply, counter) whose steps share the plan's invariants,
described below once; the sections (analysis, rewrite, counter) follow them.

For every training step (train op) of a TF graph:

* **Snapshot.** ``local_step = global_step + 0`` is read on global_step's device
  (the ``+ 0`` copies the value: a ref variable's read aliases its buffer, which
  the step's own increment would change). It becomes a control input of every
  *entry* of the step's gradient computation: the computed backward nodes that
  read nothing else computed in the backward pass (``Shape(loss)``, the seed's
  ``Fill``, shape reads of forward values). Every gradient is computed from
  those, so every gradient depends on the snapshot, even when the graph seeds
  its gradients from constants and never reads the loss (TF 1.15 wraps the loss
  in an Identity instead, which only orders gradients that read the loss). The
  snapshot inherits the entries' control inputs, so whatever the graph orders
  before its gradients (a queue dequeue) also comes before the snapshot.
* **Check.** Once every gradient the apply ops read exists (clipped, all-reduced:
  whatever they read), ``staleness = global_step - local_step`` is read,
  inheriting the control inputs of the apply ops, and compared with STALENESS.
* **Conditional apply.** The *apply unit* (the apply ops, the global-step
  increment, the optimizer's finishing updates such as Adam's beta powers, and
  the grouping ops up to the train op) runs only if ``staleness <= STALENESS``;
  otherwise a float ``stale_counter`` variable is incremented by 1.0. A dropped
  step does not increment global_step. The train op keeps its name and
  completes either way; ops the graph ran after the apply unit (a queue
  enqueue) run after the conditional instead, in both cases.

The conditional is v1 ``Switch``/``Merge`` for ``--target tf`` (the unit's first
ops get a control input on the Switch's true side, so on a drop they and all
that follows them are dead and do not run) and a functional ``If`` whose branch
functions hold the unit and the counter increment for ``--target xla`` (XLA
compiles ``If``, not Switch/Merge; it needs resource variables).

What it never touches: the forward and backward computations (the backward
entries only gain a control input), devices of existing nodes, an existing
Saver (checkpoints of the original graph restore into the rewritten one; the
counter is initialised by the graph's init op). A graph it already rewrote is
refused: dropping twice would nest the checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphpass.analysis.regions import Regions, TrainStep, gradient_computation
from graphpass.dialects.capabilities import ConditionalBuilder
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.options import StaleOptions
from graphpass.passes.base import Pass
from graphpass.passes.context import PassContext

if TYPE_CHECKING:
    from graphpass.dialects.capabilities import ResourceVariable

SCOPE = "graphpass/drop_stale"
DEFAULT_COUNTER = "graphpass/stale_counter"
GATE_ATTR = "_graphpass_stale_gate"
SUMMARY_TAG = "Gradient_staleness_percentage"
_RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})


@dataclass
class _StepPlan:
    """What one train op's rewrite does, decided before the graph is touched."""

    train_op: str
    unit: list[str]  # the apply unit, in graph order
    entries: list[str]  # the snapshot becomes their control input
    snapshot_after: list[str]  # control inputs the snapshot inherits
    check_after: list[str]  # the staleness read waits for these
    exits: list[str]  # outside nodes with control inputs from the unit


class StalePass(Pass):
    """Drop stale gradients (graph-level DropStaleGradientOptimizer)."""

    name = "stale"

    options: StaleOptions
    requires = (ConditionalBuilder,)

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        opts = self.options
        _check_not_rewritten(graph)
        regions = ctx.analyses.regions(graph)
        _check_one_step_per_train_op(regions)
        global_step = _global_step(graph, regions)
        plans = [_plan(graph, step, global_step) for step in regions.steps]
        _check_plans(graph, plans, ctx.target)
        counter = _make_counter(graph, opts, global_step)
        init_ops = _initialise(graph, counter) if counter else []
        # A function body takes the functional If whatever the target.
        xla = ctx.target == "xla" or graph.dialect.in_function_body(graph)
        steps = [
            self._rewrite_step(graph, plan, global_step, counter and counter.handle, xla)
            for plan in plans
        ]
        summary = _add_summary(graph, counter, global_step) if opts.summary else None
        self.report = {
            "staleness": opts.staleness,
            "target": ctx.target,
            "global_step": global_step,
            "counter": counter and counter.handle,
            "counter_read": counter and f"{counter.read.node}:{counter.read.port}",
            "init_ops": init_ops,
            "summary_op": summary,
            "steps": steps,
            "summary": _summary_lines(steps, counter and counter.handle, init_ops),
        }
        return True

    def _rewrite_step(self, graph: Graph, plan: _StepPlan, global_step: str,
                      counter: str | None, xla: bool) -> dict:
        scope = graph.unique_name(f"{SCOPE}/{plan.train_op}")
        device = graph.node(global_step).device
        local_step = _snapshot(graph, scope, global_step, plan)
        pred = _staleness_check(graph, scope, global_step, local_step, plan,
                                self.options.staleness)
        exits = _detach_exits(graph, plan)
        train = _TrainOp.detach(graph, plan, keep_value=not xla)
        if xla:
            done = _gate_with_if(graph, scope, pred, train.unit, counter, device)
        else:
            done = _gate_with_switch(graph, scope, pred, train.unit, counter, device,
                                     train.accepted if train.value_out else None)
        for name in exits:
            graph.add_control_input(name, done.node)
        train.recreate(graph, done)
        return {
            "train_op": plan.train_op,
            "snapshot": local_step.node,
            "entries": len(plan.entries),
            "gate": done.node,
            "gated": len(plan.unit),
            "form": "If" if xla else "Switch/Merge",
        }


@dataclass
class _TrainOp:
    """The train op while its step is rewritten. When it is part of the apply unit
    (an increment or a grouping NoOp: the usual case) it moves to ``<name>/accepted``
    inside the unit, and a new op of the old name follows the conditional."""

    name: str
    device: str
    unit: list[str]
    accepted: str | None = None
    value_out: bool = False  # a ref update returning the new value (``AssignAdd``)

    @classmethod
    def detach(cls, graph: Graph, plan: _StepPlan, keep_value: bool) -> _TrainOp:
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


# -- options -------------------------------------------------------------------


def _check_not_rewritten(graph: Graph) -> None:
    for node in graph.nodes():
        if GATE_ATTR in node.attrs:
            raise GraphpassError(
                f"the graph already drops stale gradients (node {node.name!r}, train op "
                f"{graph.dialect.get_attr(graph, node.name, GATE_ATTR)!r}); run the stale pass "
                "on the original graph, not on its output")


# -- analysis --------------------------------------------------------------------


def _check_one_step_per_train_op(regions: Regions) -> None:
    """The conditional apply gates a train op; a function that returns after two
    training steps (two losses) has one train op for both."""
    losses: dict[str, list[str]] = {}
    for step in regions.steps:
        losses.setdefault(step.train_op, []).append(str(step.loss))
    for train_op, found in losses.items():
        if len(found) > 1:
            raise GraphpassError(
                f"train op {train_op!r} runs {len(found)} training steps (losses "
                f"{', '.join(found)}); dropping stale gradients gates one step per train "
                "op: export each step as a function of its own, or gate them as one with --loss "
                "and --global-step")


def _global_step(graph: Graph, regions: Regions) -> str:
    if not regions.steps:
        raise GraphpassError("found no train op downstream of the apply ops (a train op ends "
                             "in an update or a NoOp); name it with --train-op")
    name = regions.global_step
    if name is None:
        raise GraphpassError(
            "found no global_step: no integer variable is incremented by the optimizer; "
            "the stale check compares global_step before and after the gradients, so name "
            "it with --global-step")
    dialect = graph.dialect
    if not dialect.is_variable(graph, name) or \
            dialect.variable_dtype(graph, name) not in ("int32", "int64"):
        raise GraphpassError(f"--global-step {name!r} is a {graph.node(name).op}, not an "
                             "integer variable")
    return name


def _plan(graph: Graph, step: TrainStep, global_step: str) -> _StepPlan:
    unit = _apply_unit(graph, step, global_step)
    depths = graph.dialect.frame_depths(graph)
    entries, front = _gradient_entries(graph, step, depths)
    inherited = _outside_control_inputs(graph, front, set(front))
    downstream = graph.descendants(entries)
    gradient_ops = [t.node for t in step.gradients]
    check_after = list(dict.fromkeys(gradient_ops + _outside_control_inputs(graph, unit, unit)))
    exits = [u for n in unit for u in graph.users(n) if u not in unit]
    return _StepPlan(
        train_op=step.train_op,
        unit=[n for n in graph if n in unit],
        entries=entries,
        snapshot_after=[c for c in inherited if c not in downstream and depths[c] == 0],
        check_after=check_after,
        exits=list(dict.fromkeys(exits)),
    )


def _apply_unit(graph: Graph, step: TrainStep, global_step: str) -> set[str]:
    """The ops that must run only when the step's gradients are accepted.

    Start from the apply ops and the global-step increments the train op runs;
    keep what lies between them and the train op *and* leads to an update or a
    grouping op (an ``ends_train_step`` op). So Adam's beta-power updates, the
    ``update`` NoOp and the increment are in; a queue enqueue the graph runs after
    the optimizer (and a read feeding it) is not: it runs after the conditional.
    """
    dialect = graph.dialect
    upstream = graph.ancestors([step.train_op]) | {step.train_op}
    increments = {inc for inc, var in dialect.step_increments(graph) if var == global_step}
    # Optimizer math before the apply ops: slot updates made of plain ops (Keras:
    # ``m = m * momentum - g * lr`` before ``w += m``) run only if the step is applied.
    seeds = set(step.applies) | (increments & upstream) | \
        dialect.update_math(graph, step.applies)
    between = (graph.descendants(seeds) | seeds) & upstream
    # A function's result is produced whether or not the step is applied.
    updates = {n for n in between if dialect.ends_train_step(graph, n)
               and not dialect.is_fetch(graph, n)}
    return between & (updates | graph.ancestors(updates))


def _gradient_entries(graph: Graph, step: TrainStep,
                      depths: dict[str, int]) -> tuple[list[str], list[str]]:
    """Where the gradient computation starts: ``(entries, front)``.

    The backward computation is what the gradients are computed from by *data*
    (so ops the graph orders before the gradients with control edges, such as a
    queue dequeue, stay outside) minus the forward pass. Entries are its
    computed nodes in the root frame that read no other computed backward node
    (loop back-edges aside: a gradient loop is entered from the root frame, and
    the snapshot cannot send control edges into a loop); ``front`` adds the
    backward sources (constants), whose control inputs the snapshot inherits too
    (TF gives a ``grad_ys`` constant the same control inputs as the first gradient
    ops; constants inside a gradient loop only have the loop's own).
    """
    dialect = graph.dialect
    forward = graph.ancestors([step.loss.node]) | {step.loss.node}
    producers = {t.node for t in step.gradients}
    backward = gradient_computation(graph, producers, forward)
    computed = {n for n in backward if not dialect.is_source(graph, n)}
    entries = [
        n for n in graph if n in computed and depths[n] == 0 and not any(
            p in computed and not dialect.is_back_edge(graph, p, n) for p in graph.producers(n))
    ]
    if not entries:  # the gradients are constants or forward values
        entries = [n for n in graph if n in producers]
    sources = [n for n in graph if n in backward and n not in computed]
    return entries, entries + sources


def _outside_control_inputs(graph: Graph, names, inside: set[str]) -> list[str]:
    found = [c for n in names for c in graph.control_inputs(n) if c not in inside]
    return list(dict.fromkeys(found))


def _check_plans(graph: Graph, plans: list[_StepPlan], target: str) -> None:
    """Refuse what the rewrite cannot do, before anything is edited."""
    owner: dict[str, str] = {}
    for plan in plans:
        for name in plan.unit:
            if name in owner:
                raise GraphpassError(
                    f"train ops {owner[name]!r} and {plan.train_op!r} share the update "
                    f"{name!r}; rewrite one of them (--train-op)")
            owner[name] = plan.train_op
    unit_of = {name: plan for plan in plans for name in plan.unit}
    for name, plan in unit_of.items():
        for consumer in graph.data_users(name):
            if consumer not in plan.unit:
                raise GraphpassError(
                    f"{consumer!r} reads the output of {name!r}, which runs only when the "
                    f"gradients of train op {plan.train_op!r} are applied; make it depend "
                    "on the train op by a control edge instead")
        if target == "xla":
            for tensor in graph.inputs(name):
                if tensor.node not in plan.unit and graph.dialect.is_ref(graph, tensor):
                    raise GraphpassError(
                        f"--target xla needs resource variables, but {name!r} updates the ref "
                        f"variable {tensor.node!r}; re-export with resource variables or use "
                        "--target tf")


# -- rewrite ---------------------------------------------------------------------


def _snapshot(graph: Graph, scope: str, global_step: str, plan: _StepPlan) -> Tensor:
    dialect = graph.dialect
    device = graph.node(global_step).device
    read = dialect.read_variable(graph, f"{scope}/local_step/read", global_step,
                                 control_inputs=plan.snapshot_after)
    zero = dialect.constant(graph, f"{scope}/local_step/zero", 0,
                            dialect.variable_dtype(graph, global_step), device)
    local_step = dialect.binary(graph, f"{scope}/local_step", "add", read, zero)
    dialect.set_attr(graph, local_step.node, "_class", [f"loc:@{global_step}"])
    for entry in plan.entries:
        graph.add_control_input(entry, local_step.node)
    return local_step


def _staleness_check(graph: Graph, scope: str, global_step: str, local_step: Tensor,
                     plan: _StepPlan, staleness: int) -> Tensor:
    dialect = graph.dialect
    device = graph.node(global_step).device
    now = dialect.read_variable(graph, f"{scope}/staleness/read", global_step,
                                control_inputs=plan.check_after)
    delta = dialect.binary(graph, f"{scope}/staleness", "sub", now, local_step)
    limit = dialect.constant(graph, f"{scope}/max_staleness", staleness,
                             dialect.variable_dtype(graph, global_step), device)
    return dialect.binary(graph, f"{scope}/accept", "less_equal", delta, limit)


def _detach_exits(graph: Graph, plan: _StepPlan) -> list[str]:
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
    graph.dialect.copy_node(graph, old, new)
    extras = graph.node(old).meta.get("tf_extras")
    if extras:
        graph.node(new).meta["tf_extras"] = extras
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


def _gate_with_switch(graph: Graph, scope: str, pred: Tensor, unit: list[str], counter: str,
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


def _gate_with_if(graph: Graph, scope: str, pred: Tensor, unit: list[str],
                  counter: str | None, device: str) -> Tensor:
    """XLA form: the unit becomes the then-branch function, the counter increment (if
    there is a counter) the else-branch one; the If returns 0.0 (applied) or 1.0
    (dropped)."""
    dialect = graph.dialect
    one = dialect.constant(graph, f"{scope}/one", 1.0, "float32", device)
    dropped = [one.node]
    if counter is not None:
        dropped.append(dialect.assign_add_variable(graph, f"{scope}/count_drop", counter, one))
    gate = dialect.functional_if(graph, f"{scope}/if", pred, (unit, dropped),
                                 results=(0.0, 1.0), device=device)
    dialect.set_attr(graph, gate.node, GATE_ATTR, scope)
    return gate


# -- the counter -------------------------------------------------------------------


def _make_counter(graph: Graph, opts: StaleOptions,
                  global_step: str) -> ResourceVariable | None:
    """The drop counter; None in a function body, which cannot gain a variable (its
    variables are the captured arguments its SavedModel passes): the If's result
    says whether a step was dropped there."""
    dialect = graph.dialect
    requested = opts.counter
    if dialect.in_function_body(graph):
        if requested or opts.summary:
            raise GraphpassError(
                "--stale-counter and --staleness-summary need a variable the rewrite adds, "
                "and a function body (a TF2 train signature) cannot gain one; leave them out")
        return None
    if requested is not None and requested in graph:
        raise GraphpassError(f"--stale-counter {requested!r} names an existing node; choose a "
                             "new name")
    name = requested or graph.unique_name(DEFAULT_COUNTER)
    counter = dialect.resource_variable(graph, name, 0.0, "float32",
                                        device=graph.node(global_step).device)
    dialect.set_attr(graph, counter.handle, "_class", [f"loc:@{global_step}"])
    dialect.register_global_variable(graph, counter)
    return counter


def _initialise(graph: Graph, counter: ResourceVariable) -> list[str]:
    """Make the graph's init op(s) initialise the counter too; returns their names."""
    groups = _init_groups(graph)
    for name in groups:
        graph.add_control_input(name, counter.initializer)
    return groups


def _init_groups(graph: Graph) -> list[str]:
    """Sink NoOps that group variable initializers (``global_variables_initializer``),
    possibly through per-device NoOps; a Saver's restore op does not count."""
    verdict: dict[str, bool] = {}

    def groups_initializers(name: str) -> bool:
        if name not in verdict:
            verdict[name] = False
            deps = graph.control_inputs(name)
            verdict[name] = bool(deps) and all(
                _is_initializer(graph, d) or (graph.node(d).op == "NoOp" and
                                              groups_initializers(d)) for d in deps)
        return verdict[name]

    return [n.name for n in graph.nodes()
            if n.op == "NoOp" and not graph.users(n.name) and groups_initializers(n.name)]


def _is_initializer(graph: Graph, name: str) -> bool:
    node = graph.node(name)
    inputs = graph.inputs(name)
    if node.op not in ("Assign", "AssignVariableOp") or len(inputs) < 2 or \
            not graph.dialect.is_variable(graph, inputs[0].node):
        return False
    value = inputs[1].node
    while graph.node(value).op == "Identity" and graph.inputs(value):
        value = graph.inputs(value)[0].node
    return graph.node(value).op not in _RESTORE_OPS


def _add_summary(graph: Graph, counter: ResourceVariable, global_step: str) -> str:
    """``stale_counter / (global_step + 1)``, as TF's optimizer summarises it."""
    dialect = graph.dialect
    scope = f"{SCOPE}/summary"
    device = graph.node(global_step).device
    step = dialect.read_variable(graph, f"{scope}/global_step", global_step)
    one = dialect.constant(graph, f"{scope}/one", 1, dialect.get_attr(graph, global_step,
                                                                          "dtype"), device)
    steps = dialect.cast(graph, f"{scope}/steps", dialect.binary(graph, f"{scope}/plus_one",
                                                                  "add", step, one), "float32")
    ratio = dialect.binary(graph, f"{scope}/ratio", "div", counter.read, steps)
    summary = dialect.scalar_summary(graph, f"{scope}/{SUMMARY_TAG}", SUMMARY_TAG, ratio)
    dialect.add_to_collection(graph, "summaries", summary)
    return summary.node


def _summary_lines(steps: list[dict], counter: str | None, init_ops: list[str]) -> list[str]:
    lines = [
        f"{s['train_op']}: snapshot {s['snapshot']} before {s['entries']} gradient entry "
        f"op(s); {s['gated']} apply-unit ops gated by {s['gate']} ({s['form']})" for s in steps
    ]
    if counter is None:
        lines.append("drops are not counted (a function body cannot gain a variable)")
        return lines
    where = ", ".join(init_ops) if init_ops else "no init op found: run its Assign yourself"
    lines.append(f"drops counted in {counter} (initialised by {where})")
    return lines
