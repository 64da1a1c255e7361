"""The automatic checkpoint planner behind ``--recompute auto``.

It only decides *which* segments to recompute; the rewrite is the remat pass's,
exactly as if the chosen scopes had been given as ``--recompute`` patterns.

* **Candidates** are forward name scopes: the scopes one level below the
  deepest scope holding every forward node that a gradient op reads (``tower0/``
  holding ``tower0/block1/`` ... gives the blocks; a flat model gives its
  top-level scopes, ``block1/`` ... ``block8/``).
* **Cost model**: the caller's ``estimate(scopes)``, the liveness estimate of
  the step with those scopes rewritten (on a copy of the graph). Copies and the
  small ordering ops record their shapes when they are built, so an estimate
  never re-runs shape inference.
* **Search**, a greedy heuristic (not an optimum): each candidate is estimated
  alone; those that lower the peak are taken in order of saving per recomputed
  byte, best first, until the estimate is within the budget. Peak memory is not
  additive, so each step re-estimates the whole selection. Without a budget
  every candidate that saves on its own is taken (the least memory it reaches).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from graphpass.errors import GraphpassError
from graphpass.units import format_bytes


@dataclass
class AutoPlan:
    """What the planner decided, and the estimates it decided on."""

    budget_bytes: int | None
    candidates: list[str]
    estimate_before: int
    #: ``(scope added, estimated peak bytes with everything chosen so far)``
    steps: list[tuple[str, int]] = field(default_factory=list)
    #: candidates that cannot be rewritten alone, with the reason
    unusable: dict[str, str] = field(default_factory=dict)

    @property
    def chosen(self) -> list[str]:
        """The chosen scopes, in graph order (the order the rewrite applies them)."""
        added = {scope for scope, _ in self.steps}
        return [c for c in self.candidates if c in added]

    @property
    def estimate(self) -> int:
        return self.steps[-1][1] if self.steps else self.estimate_before

    def to_json(self) -> dict:
        return {
            "budget_bytes": self.budget_bytes,
            "candidates": self.candidates,
            "chosen": self.chosen,
            "steps": [{"added": s, "estimated_peak_bytes": e} for s, e in self.steps],
            "unusable": self.unusable,
            "estimated_peak_bytes": self.estimate,
        }

    def summary(self) -> str:
        """One line: the greedy steps and the final estimate against the budget."""
        steps = "".join(f", +{s} {format_bytes(e)}" for s, e in self.steps)
        verdict = ("" if self.budget_bytes is None
                   else f" (budget {format_bytes(self.budget_bytes)})")
        unusable = f"; {len(self.unusable)} not recomputable alone: " \
            f"{', '.join(self.unusable)}" if self.unusable else ""
        return (f"auto: {len(self.chosen)} of {len(self.candidates)} candidate segments "
                f"chosen; estimate {format_bytes(self.estimate_before)}{steps} -> "
                f"{format_bytes(self.estimate)}{verdict}{unusable}")


def candidate_scopes(names: list[str]) -> list[str]:
    """Scopes one level below the deepest scope that holds all of ``names`` (the
    forward nodes a gradient op reads, in graph order); in graph order."""
    prefix = ""
    while True:
        scopes: dict[str, None] = {}
        for name in names:
            rest = name[len(prefix):]
            if name.startswith(prefix) and "/" in rest:
                scopes[prefix + rest.split("/", 1)[0] + "/"] = None
        if len(scopes) != 1:
            return list(scopes)
        prefix = next(iter(scopes))


def choose_scopes(candidates: list[str], estimate: Callable[[list[str]], int],
         cost: Callable[[str], int], budget_bytes: int | None) -> AutoPlan:
    """Choose candidates greedily until ``estimate(chosen) <= budget_bytes``.

    ``estimate`` gets scopes in candidate order; ``cost(scope)`` is what
    recomputing it costs (bytes recomputed). Raises when even the whole
    selection stays over the budget.
    """
    result = AutoPlan(budget_bytes, candidates, estimate([]))
    if _within(result.estimate_before, budget_bytes):
        return result
    savings = _solo_savings(candidates, estimate, result)
    ranked = sorted(savings, key=lambda c: (-savings[c] / max(cost(c), 1),
                                            candidates.index(c)))
    chosen: list[str] = []
    for scope in ranked:
        chosen.append(scope)
        result.steps.append((scope, estimate([c for c in candidates if c in chosen])))
        if _within(result.estimate, budget_bytes):
            return result
    if budget_bytes is not None:
        raise GraphpassError(_over_budget_message(result))
    return result


def _solo_savings(candidates: list[str], estimate: Callable[[list[str]], int],
                  result: AutoPlan) -> dict[str, int]:
    """Bytes each candidate saves alone; only those that save something. A candidate
    the rewrite refuses (data mode, no float input) is recorded as unusable."""
    savings = {}
    for scope in candidates:
        try:
            saving = result.estimate_before - estimate([scope])
        except GraphpassError as exc:
            result.unusable[scope] = str(exc)
            continue
        if saving > 0:
            savings[scope] = saving
    return savings


def _within(estimate: int, budget_bytes: int | None) -> bool:
    return budget_bytes is not None and estimate <= budget_bytes


def _over_budget_message(result: AutoPlan) -> str:
    best = min([result.estimate_before] + [e for _, e in result.steps])
    return (f"--memory-budget-bytes {result.budget_bytes} ({format_bytes(result.budget_bytes)}) "
            f"cannot be met: the best estimated peak reached is {best} bytes "
            f"({format_bytes(best)}), recomputing {len(result.steps)} of "
            f"{len(result.candidates)} candidate segments "
            f"(estimate before: {format_bytes(result.estimate_before)}); raise the budget")
