"""What ``--recompute auto`` decided and the figure each budget verdict stands on.

A budget is judged on one figure, and the summary names it: the measured peak
of the written plan where ``--profile`` ran the step (the CPU allocator's own
peak where it keeps statistics, else the kernels' allocation records plus the
fed values), else the estimate. The planner aims lower than the budget when it
has only the estimate (``target_bytes``: the budget less the dialect's
``allocator_headroom``, what TF's allocator fragments beyond the requests the
estimate counts); a plan whose estimate meets the budget but not that target is
still written, and the summary says the allowance is not met. A budget is
refused only when the lowest figure any plan reached misses the budget itself;
the refusal names that figure, the plan, and the budget that plan would meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphpass.analysis.measured import StepMeasurement
from graphpass.units import format_bytes


@dataclass
class AutoPlan:
    """What the planner decided, for the report."""

    policy: str
    budget_bytes: int | None
    units: int
    cut_width: int
    solver: str
    gap: float | None
    estimate_before: int
    estimate: int
    model_offset: int
    segments: list[dict] = field(default_factory=list)
    rounds: int = 1
    seconds: float = 0.0
    #: the dialect's ``allocator_headroom``: a budget is planned to ``target_bytes``
    headroom: float = 0.0
    #: ``--profile``: the original step and the written plan, measured (None: not run)
    measured_before: StepMeasurement | None = None
    measured: StepMeasurement | None = None
    #: how many steps ``--profile`` ran (the original's included)
    profile_runs: int = 0
    notes: list[str] = field(default_factory=list)
    #: forward loops whose bodies the planner does not plan into, one note each
    loops: list[str] = field(default_factory=list)
    #: the step's predicted time (``analysis.cost.StepTime``), what each segment's
    #: ``recompute_cost`` is a share of
    step_cost: float = 0.0

    @property
    def target_bytes(self) -> int | None:
        """What the estimate is planned to, so the allocator's peak meets the budget."""
        return None if self.budget_bytes is None else \
            int(self.budget_bytes / (1 + self.headroom))

    @property
    def judged_on(self) -> str:
        """The figure budgets are judged on: ``measured (<source>)`` or ``estimate``."""
        return "estimate" if self.measured is None else f"measured ({self.measured.source})"

    @property
    def judged_bytes(self) -> int:
        return self.estimate if self.measured is None else self.measured.peak_bytes

    @property
    def met(self) -> bool | None:
        """Whether the judged figure meets the budget (None: no budget)."""
        return None if self.budget_bytes is None else self.judged_bytes <= self.budget_bytes

    @property
    def within_allowance(self) -> bool | None:
        """Whether the estimate meets the budget less the allocator's headroom."""
        target = self.target_bytes
        return None if target is None else self.estimate <= target

    def to_json(self) -> dict:
        measured = {} if self.measured is None else {
            "measured_before": self.measured_before.to_json(),
            "measured": self.measured.to_json(),
            "measured_peak_bytes_before": self.measured_before.peak_bytes,
            "measured_peak_bytes": self.measured.peak_bytes,
            "profile_runs": self.profile_runs}
        return {"policy": self.policy, "budget_bytes": self.budget_bytes,
                "budget_met": self.met, "budget_judged_on": self.judged_on,
                "estimate_within_allowance": self.within_allowance,
                "allocator_headroom": self.headroom,
                "planned_budget_bytes": self.target_bytes,
                "units": self.units, "cut_width": self.cut_width,
                "solver": self.solver, "gap": self.gap,
                "estimated_peak_bytes_before": self.estimate_before,
                "estimated_peak_bytes": self.estimate, "model_offset_bytes": self.model_offset,
                **measured, "notes": self.notes,
                "segments": self.segments, "rounds": self.rounds,
                "planning_seconds": round(self.seconds, 3),
                "step_cost": round(self.step_cost),
                "loops_not_planned_into": self.loops}

    def summary(self) -> list[str]:
        """One line for the plan, one for the budget's verdict, the notes, one per
        recomputed segment, then one per loop not planned into."""
        gap = "n/a" if self.gap is None else f"{self.gap:.1%}"
        measured = "" if self.measured is None else \
            f"; measured {format_bytes(self.measured_before.peak_bytes)} -> " \
            f"{format_bytes(self.measured.peak_bytes)} ({self.measured.source})"
        lines = [f"auto ({self.policy}): {len(self.segments)} segments recomputed of "
                 f"{self.units} units (cut width {self.cut_width}); estimate "
                 f"{format_bytes(self.estimate_before)} -> {format_bytes(self.estimate)}"
                 f"{measured}; solver {self.solver}, gap {gap}; {self.seconds:.1f} s"]
        if self.budget_bytes is not None:
            lines.append(self.verdict())
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  {s['label']}: saves ~{format_bytes(s['estimated_bytes_saved'])}, "
                  f"recomputes {s['recompute_flops'] / 1e6:.1f} MFLOP" for s in self.segments]
        lines += [f"  loop body not planned into: {note}" for note in self.loops]
        return lines

    def verdict(self) -> str:
        """``budget X: met|NOT met by the <figure> (<bytes>)`` and, judged on the
        estimate, whether it left the allocator its allowance."""
        state = "met" if self.met else "NOT met"
        figure = f"estimated peak ({format_bytes(self.estimate)})" if self.measured is None \
            else f"measured peak ({format_bytes(self.measured.peak_bytes)}, " \
            f"{self.measured.source})"
        line = f"budget {format_bytes(self.budget_bytes)}: {state} by the {figure}"
        if self.measured is None and self.headroom:
            line += self.allowance()
            if self.met and not self.within_allowance:
                line += ", which this plan does not meet (the allocator's peak may " \
                        "exceed the budget: measure it with --profile)"
        return line

    def allowance(self) -> str:
        """``, planned to <fraction>x of it (<bytes>) for the allocator's
        fragmentation``, or nothing where the dialect declares no headroom."""
        if not self.headroom or self.budget_bytes is None:
            return ""
        return (f", planned to {1 / (1 + self.headroom):.2f}x of it "
                f"({format_bytes(self.target_bytes)}) for the allocator's fragmentation")


def over_budget_message(option: str, plan: AutoPlan, best: int, labels: list[str],
                        judged: str = "estimated") -> str:
    """The exit-2 line: the budget, the best ``judged`` (estimated or measured) peak
    any plan reaches, that plan, and the budget that would take it."""
    shown = ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")
    budget = plan.budget_bytes
    before = plan.estimate_before if plan.measured_before is None else \
        plan.measured_before.peak_bytes
    return (f"{option} {budget} ({format_bytes(budget)}) cannot be met: the best {judged} "
            f"peak reached is {best} bytes ({format_bytes(best)}, from "
            f"{format_bytes(before)}), recomputing {len(labels)} segments "
            f"({shown or 'none'}); raise the budget to at least that "
            f"(--memory-budget-bytes {best}), or drop it: --recompute auto alone "
            f"writes that plan")
