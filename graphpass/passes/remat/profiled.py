"""``--profile``: the plan checked by running it, and a budget judged on what ran.

The step has run once as it is (``before``: its measured peak). The planner
still plans on the estimate, which sees every candidate plan at no cost; the
profile calibrates it and checks its answer:

* **residual scale**: the original's measured peak over its estimate. A budget
  is mapped onto the estimate by it (the estimate must meet
  ``budget * estimate / measured``), which replaces the dialect's fixed
  allocator headroom: the measured figure already holds what the allocator
  adds to the requests, and what the estimate misses on this graph;
* **closed loop**: the chosen plan is rewritten as the pass writes it and run
  the same way. Where it measures over the budget, the estimate's target is
  lowered by the miss (the plan's estimate times budget over measured) and the
  chain solved again, ``PROFILE_ROUNDS`` runs at most; where no budget plan
  meets it, the lowest-peak plan is measured too. The cheapest plan that meets
  the budget when measured is written; if none does, the budget is refused,
  naming the lowest measured peak and its plan.

A plan without a budget (``min-peak``, ``cheap``) is measured once; where it
measures no lower than the original, nothing is recomputed and a note says so.
A plan that recomputes nothing is run too: the step as written is not the
original (its updates pinned, optimizer values waiting for their gradients).
"""

from __future__ import annotations

from collections.abc import Callable

from graphpass.analysis.measured import StepMeasurement
from graphpass.errors import GraphpassError
from graphpass.options import BUDGET, CHEAP, MIN_PEAK
from graphpass.passes.remat.marks import Segment
from graphpass.passes.remat.verdict import AutoPlan, over_budget_message
from graphpass.units import format_bytes

#: Plans measured at most while searching for one that meets a budget.
PROFILE_ROUNDS = 3

PlanAt = Callable[[int | None, str | None], tuple[AutoPlan, list[Segment]]]
Measure = Callable[[list[Segment]], StepMeasurement]
_Tried = tuple[StepMeasurement, AutoPlan, list[Segment]]


def profiled_plan(plan_at: PlanAt, measure: Measure, before: StepMeasurement,
                  option: str) -> tuple[AutoPlan, list[Segment]]:
    """The plan to write, measured (module docstring). ``plan_at(target, policy)``
    plans with the estimate's target (None: the options') and policy (None: the
    options'); ``measure(segments)`` runs the step rewritten with them."""
    plan, segments = plan_at(None, None)
    if plan.budget_bytes is None:
        return _checked(plan, segments, measure, before)
    scale = before.peak_bytes / max(plan.estimate_before, 1)
    tried = _budget_rounds(plan_at, measure, before, plan.budget_bytes, scale)
    budget = plan.budget_bytes
    for policy in (MIN_PEAK, CHEAP):  # the planner's other plans, where none met it
        if any(m.peak_bytes <= budget for m, _, _ in tried):
            break
        other, other_segments = plan_at(None, policy)
        if all(_labels(other) != _labels(p) for _, p, _ in tried):
            tried.append((measure(other_segments), other, other_segments))
    runs = len(tried) + 1
    met = [t for t in tried if t[0].peak_bytes <= budget]
    if not met:
        measured, best, _ = min(tried, key=lambda t: t[0].peak_bytes)
        best.measured_before, best.measured = before, measured
        raise GraphpassError(over_budget_message(option, best, measured.peak_bytes,
                                                 _labels(best), judged="measured"))
    measured, chosen, segments = min(met, key=lambda t: (_cost(t[1]), t[0].peak_bytes))
    chosen.policy = BUDGET
    _record(chosen, before, measured, runs)
    chosen.notes.append(f"the original measured {format_bytes(before.peak_bytes)} against "
                        f"an estimate of {format_bytes(chosen.estimate_before)}: the budget "
                        f"was planned on the estimate scaled by {scale:.2f}, and checked "
                        f"by running {runs - 1} plan(s)")
    return chosen, segments


def _budget_rounds(plan_at: PlanAt, measure: Measure, before: StepMeasurement,
                   budget: int, scale: float) -> list[_Tried]:
    """Budget plans measured until one meets ``budget``: the first planned to the
    budget mapped by ``scale``, each next to the last one's estimate lowered by
    its miss; stops where the planner returns a plan it already tried or its
    lowest plan (whose estimate misses the target)."""
    tried: list[_Tried] = []
    target = int(budget / scale)
    for _ in range(PROFILE_ROUNDS):
        plan, segments = plan_at(target, BUDGET)
        if any(_labels(plan) == _labels(p) for _, p, _ in tried):
            break
        measured = measure(segments)
        tried.append((measured, plan, segments))
        if measured.peak_bytes <= budget or plan.estimate > target or not segments:
            break
        target = min(target - 1, int(plan.estimate * budget / measured.peak_bytes))
    return tried


def _checked(plan: AutoPlan, segments: list[Segment], measure: Measure,
             before: StepMeasurement) -> tuple[AutoPlan, list[Segment]]:
    """A plan without a budget, measured; nothing recomputed where it saves nothing."""
    measured = measure(segments)
    runs = 2
    if segments and measured.peak_bytes >= before.peak_bytes:
        plan.notes.append(f"the plan measured {format_bytes(measured.peak_bytes)}, no lower "
                          f"than the original's {format_bytes(before.peak_bytes)}: nothing "
                          f"recomputed")
        plan.segments, plan.estimate, segments, measured = [], plan.estimate_before, [], before
    _record(plan, before, measured, runs)
    return plan, segments


def _record(plan: AutoPlan, before: StepMeasurement, measured: StepMeasurement,
            runs: int) -> None:
    plan.measured_before, plan.measured, plan.profile_runs = before, measured, runs


def _labels(plan: AutoPlan) -> list[str]:
    return [s["label"] for s in plan.segments]


def _cost(plan: AutoPlan) -> int:
    return sum(s["recompute_cost"] for s in plan.segments)
