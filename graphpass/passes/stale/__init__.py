"""Stale-gradient dropping: the graph-level ``tf.contrib.opt.DropStaleGradientOptimizer``.

The pass plans every train op first (``plan``), then rewrites each (``gate``)
and adds the drop counter (``counter``); the invariants they share:

For every training step (train op) of a TF graph:

* **Snapshot.** ``local_step = global_step + 0`` is read on global_step's device
  (the ``+ 0`` copies the value: a ref variable's read aliases its buffer, which
  the step's own increment would change). It becomes a control input of the
  *entries* of the step's gradient computation the loss's gradient starts from:
  of the computed backward nodes that read nothing else computed in the backward
  pass, those that read the loss or no forward value (``Shape(loss)``, the seed's
  ``Fill``), where every gradient descends from them; else of every entry (shape
  reads and ``pow(x, 2)`` of forward values too). So every gradient depends on the
  snapshot, even when the graph seeds its gradients from constants and never
  reads the loss (TF 1.15 wraps the loss in an Identity instead, which only
  orders gradients that read the loss), and the entries Grappler shares with the
  forward pass gain no control input. The snapshot inherits every entry's
  control inputs, so whatever the graph orders before its gradients (a queue
  dequeue) also comes before the snapshot.
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
compiles ``If``, not Switch/Merge; it needs resource variables) and in a TF2
function body, where TF's executor lowers and inlines it before Grappler.

The gate is kept only if the target runtime computes every gradient and update
as in the original (``exactness_check``); else the pass refuses it.

What it never touches: the forward and backward computations (the backward
entries only gain a control input), devices of existing nodes, an existing
Saver (checkpoints of the original graph restore into the rewritten one; the
counter is initialised by the graph's init op). A graph it already rewrote is
refused: dropping twice would nest the checks.
"""

from __future__ import annotations

from graphpass.dialects.capabilities import ConditionalBuilder
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph
from graphpass.options import StaleOptions
from graphpass.passes.base import Pass
from graphpass.passes.context import PassContext
from graphpass.passes.exactness import (
    added_nodes,
    checked_json,
    checked_line,
    differences_json,
    exactness_check,
    inexact_allowed,
    inexact_lines,
)
from graphpass.passes.stale.counter import add_summary, initialise, make_counter
from graphpass.passes.stale.gate import (
    GATE_ATTR,
    SCOPE,
    TrainOp,
    check_not_rewritten,
    detach_exits,
    gate_with_if,
    gate_with_switch,
    snapshot,
    staleness_check,
)
from graphpass.passes.stale.plan import (
    StepPlan,
    check_one_step_per_train_op,
    check_plans,
    global_step_of,
    plan_step,
)
from graphpass.runtimes import Difference, ExactnessCheck

__all__ = ["GATE_ATTR", "StalePass"]


class StalePass(Pass):
    """Drop stale gradients (graph-level DropStaleGradientOptimizer)."""

    name = "stale"

    options: StaleOptions
    requires = (ConditionalBuilder,)

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        """The gate, kept only where the target runtime computes the gradients and
        the updates as in the original (``exactness_check``): a gate that moves
        the update math where the runtime compiles it otherwise is refused."""
        opts = self.options
        check_not_rewritten(graph)
        regions = ctx.analyses.regions(graph)
        check_one_step_per_train_op(regions)
        global_step = global_step_of(graph, regions)
        plans = [plan_step(graph, step, global_step) for step in regions.steps]
        check_plans(graph, plans, ctx.target)
        check = exactness_check(ctx, graph, regions.fetches)
        original = graph.copy() if check is not None and not check.unchecked else None
        counter = make_counter(graph, opts, global_step)
        init_ops = initialise(graph, counter) if counter else []
        # A function body takes the functional If whatever the target.
        xla = ctx.target == "xla" or graph.dialect.step.in_function_body(graph)
        inlined = ctx.runtime(graph).inlines_conditionals
        steps = [
            self._rewrite_step(graph, plan, global_step, counter and counter.handle, xla,
                               inlined)
            for plan in plans
        ]
        inexact = _inexact(graph, original, check, inexact_allowed(ctx)) \
            if original is not None else []
        summary = add_summary(graph, counter, global_step) if opts.summary else None
        self.report = {
            "staleness": opts.staleness,
            "target": ctx.target,
            "global_step": global_step,
            "counter": counter and counter.handle,
            "counter_read": counter and f"{counter.read.node}:{counter.read.port}",
            "init_ops": init_ops,
            "summary_op": summary,
            "steps": steps,
            "summary": _summary_lines(steps, counter and counter.handle, init_ops)
            + checked_line(check, "the gradients and updates compute otherwise" if inexact
                           else "the gradients and updates compute what the original's do")
            + (inexact_lines(inexact) if inexact else []),
            "exactness": {**checked_json(check), **(
                {"inexact": differences_json(inexact)} if original is not None else {})},
        }
        return True

    def _rewrite_step(self, graph: Graph, plan: StepPlan, global_step: str,
                      counter: str | None, xla: bool, inlined: bool) -> dict:
        scope = graph.unique_name(f"{SCOPE}/{plan.train_op}")
        device = graph.node(global_step).device
        local_step = snapshot(graph, scope, global_step, plan)
        pred = staleness_check(graph, scope, global_step, local_step, plan,
                                self.options.staleness)
        exits = detach_exits(graph, plan)
        train = TrainOp.detach(graph, plan, keep_value=not xla)
        if xla:
            done = gate_with_if(graph, scope, pred, train.unit, counter, device, inlined)
        else:
            done = gate_with_switch(graph, scope, pred, train.unit, counter, device,
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


def _inexact(graph: Graph, original: Graph, check: ExactnessCheck,
             allowed: bool) -> list[Difference]:
    """What the runtime computes otherwise in the gated step than in the original:
    nothing, or (``allowed``) what the summary names; else the gate is undone and
    the pass stops (nothing is written)."""
    found = check.differences(graph, added_nodes(graph, original))
    if not found or allowed:
        return found
    graph.restore(original)
    raise GraphpassError(
        f"--drop-stale: TF would compute the gated step otherwise than the original "
        f"({found[0].describe()}{f'; {len(found) - 1} more' if len(found) > 1 else ''}), "
        "so its numbers would differ; nothing written (--exactness allow-inexact writes "
        "it and measures the difference)")


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
