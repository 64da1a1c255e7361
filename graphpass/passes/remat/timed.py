"""What a min-peak plan may cost in time (``--max-extra-time``): the lowest peak
whose copies add at most the limit to the step's predicted time
(``analysis.cost.StepTime``), and no plan that saves less of the peak than half
the time it adds. The chain program's run costs count every op of a run, more
than the rewrite copies, so each plan is checked on what the rewrite copies
(``extra_time``: a rewrite of a copy of the graph), and the search aims lower
where it missed.
"""

from __future__ import annotations

from graphpass.passes.remat.plan import ChainPlan, Runs, model_peak, solve_budget
from graphpass.passes.remat.verdict import AutoPlan


def within_extra_time(units: list, plan: AutoPlan, chosen: ChainPlan, estimated: int,
                      limit: float, estimate, extra_time, runs: Runs | None
                      ) -> tuple[ChainPlan, int]:
    """The min-peak plan, or where its copies would add more than ``limit`` of the
    step's predicted time (``extra_time(plan)``: ``StepTime.extra`` of what the
    rewrite copies), the lowest model peak whose cheapest plan stays within it
    (bisection over the budget program, whose run costs count every op of a run:
    scaled to what the min-peak plan really copies), estimated. A peak is worth
    only so much time: a plan that saves little and costs much is not chosen
    (``--max-extra-time``). A plan estimated no lower than the step as written is
    left for the caller to drop, with no note: it is not a lower peak."""
    if not chosen.runs or not plan.step_cost or chosen.cost <= limit * plan.step_cost:
        return chosen, estimated  # within it by the runs' own costs, which bound it
    if estimated >= plan.estimate:  # no lower than the step as written
        return chosen, estimated
    extra = extra_time(chosen)
    if extra <= limit:
        return chosen, estimated
    plan.notes.append(f"the lowest peak would add ~{extra:.0%} to the step's predicted "
                      f"time, over --max-extra-time {limit:.0%}: the plan is the lowest "
                      f"peak within it")
    allowed = chosen.cost * limit / extra
    for _ in range(TIME_ROUNDS):
        best = _lowest_within(units, chosen.peak, allowed, runs)
        if best is None:
            break
        extra = extra_time(best)
        if extra <= limit:
            return best, estimate(best)
        # what it copies costs more than its runs said: aim lower, below this plan
        allowed = min(allowed * limit / extra, best.cost - 1)
    plan.notes.append("no segment recomputed: no plan found within --max-extra-time lowers "
                      "the peak ('none' writes the lowest peak)")
    return ChainPlan((), 0, 0), plan.estimate


#: A min-peak plan must lower the peak by at least this share of what it adds to the
#: step's time (a fifth of the step for a tenth of the peak; where it saves more
#: than ``WORTH * --max-extra-time``, the time limit alone guarantees it).
WORTH = 0.5


def worth_its_time(plan: AutoPlan, chosen: ChainPlan, saving: float, limit: float,
                    extra_time) -> bool:
    """Whether ``chosen`` saves enough of the peak for the time its copies add
    (``WORTH``); a note says why where it does not."""
    if not chosen.runs or saving >= WORTH * limit:
        return True
    extra = extra_time(chosen)
    if saving >= WORTH * extra:
        return True
    plan.notes.append(f"no segment recomputed: the plan saves {saving:.0%} of the peak for "
                      f"~{extra:.0%} more step time (a plan must save at least half as "
                      f"much as it adds; --max-extra-time none writes the lowest peak)")
    return False


#: Searches for the lowest peak within ``--max-extra-time``, each checked on what the
#: rewrite copies.
TIME_ROUNDS = 3


def _lowest_within(units, lowest: int, allowed: float, runs: Runs | None) -> ChainPlan | None:
    """The lowest model peak (above ``lowest``, to 0.5%) whose cheapest plan costs at
    most ``allowed``: bisection over the budget program; None where only the empty
    plan does."""
    low, high = lowest, model_peak(units, ())
    best = None
    while high - low > max(high // 200, 1):
        middle = (low + high) // 2
        found = solve_budget(units, middle, runs=runs)
        if found is not None and found.cost <= allowed:
            best, high = found, middle
        else:
            low = middle
    return best if best is not None and best.runs else None
