"""Stale-gradient dropping, planned: per train op, what the rewrite will gate (the
apply unit), where the gradient computation starts (the snapshot's entries) and
what each new node waits for, all decided and checked before the graph is touched.

It reads regions and the dialect; it must not edit the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphpass.analysis.regions import Regions, TrainStep, gradient_computation
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph


@dataclass
class StepPlan:
    """What one train op's rewrite does, decided before the graph is touched."""

    train_op: str
    unit: list[str]  # the apply unit, in graph order
    entries: list[str]  # the snapshot becomes their control input
    snapshot_after: list[str]  # control inputs the snapshot inherits
    check_after: list[str]  # the staleness read waits for these
    exits: list[str]  # outside nodes with control inputs from the unit



def check_one_step_per_train_op(regions: Regions) -> None:
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


def global_step_of(graph: Graph, regions: Regions) -> str:
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


def plan_step(graph: Graph, step: TrainStep, global_step: str) -> StepPlan:
    unit = _apply_unit(graph, step, global_step)
    ordered = [n for n in graph if n in unit]  # the graph's order: the output is the same
    depths = graph.dialect.frame_depths(graph)
    entries, front = _gradient_entries(graph, step, depths)
    inherited = _outside_control_inputs(graph, front, set(front))
    downstream = graph.descendants(entries)
    gradient_ops = [t.node for t in step.gradients]
    check_after = list(dict.fromkeys(gradient_ops + _outside_control_inputs(graph, ordered,
                                                                            unit)))
    exits = [u for n in ordered for u in graph.users(n) if u not in unit]
    return StepPlan(
        train_op=step.train_op,
        unit=ordered,
        entries=_seeds(graph, entries, step),
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
    Stateless readers of the unit that nothing reads are in too.
    """
    dialect = graph.dialect
    upstream = graph.ancestors([step.train_op]) | {step.train_op}
    increments = {inc for inc, var in dialect.step.counter_increments(graph) if var == global_step}
    # Optimizer math before the apply ops: slot updates made of plain ops (Keras:
    # ``m = m * momentum - g * lr`` before ``w += m``) run only if the step is applied.
    seeds = set(step.applies) | (increments & upstream) | \
        dialect.step.update_math(graph, step.applies)
    between = (graph.descendants(seeds) | seeds) & upstream
    # A function's result is produced whether or not the step is applied.
    updates = {n for n in between if dialect.step.ends_train_step(graph, n)
               and not dialect.step.is_fetch(graph, n)}
    # What the gradients wait for runs before the check whatever it decides (the
    # optimizer state the remat pass pins ahead of the backward pass).
    gradients = {t.node for t in step.gradients}
    feeds_gradients = graph.ancestors(gradients) | gradients
    unit = (between & (updates | graph.ancestors(updates))) - feeds_gradients
    # A value of the unit that nothing reads on (Keras 3's sparse Adagrad leaves an
    # output of its cond unread) goes with it: nothing outside waits for it.
    unread = {u for n in unit for u in graph.data_users(n)
              if u not in unit and not graph.users(u) and not dialect.is_stateful(graph, u)}
    return unit | unread


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


def _seeds(graph: Graph, entries: list[str], step: TrainStep) -> list[str]:
    """The entries the loss's gradient starts from (they read the loss or no
    forward value at all), where every gradient descends from them: ordering those
    orders every gradient, and the entries that read forward values only (the
    ``pow(x, 2)`` of a GELU's gradient) gain no control input, which would stop
    Grappler from sharing them with the forward pass (it merges equal nodes only
    with equal control inputs) and so change how it groups the forward's
    arithmetic. Else every entry."""
    loss = step.loss.node
    forward = graph.ancestors([loss])
    producers = {t.node for t in step.gradients}
    seeds = [e for e in entries
             if all(p == loss or p not in forward for p in graph.producers(e))]
    if seeds and producers <= graph.descendants(seeds) | set(seeds):
        return seeds
    return entries


def _outside_control_inputs(graph: Graph, names, inside: set[str]) -> list[str]:
    found = [c for n in names for c in graph.control_inputs(n) if c not in inside]
    return list(dict.fromkeys(found))


def check_plans(graph: Graph, plans: list[StepPlan], target: str) -> None:
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

