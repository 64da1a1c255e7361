"""The automatic remat planner behind ``--recompute auto``.

It decides *what* to recompute; the rewrite is the remat pass's. It plans on
the forward pass's structure (``graphpass.analysis.forward``: units between
narrow cuts, the values the backward pass keeps), never on names, with an
incremental model instead of trial rewrites:

* a run of units ``a..e`` recomputed keeps only what crosses its ends (its
  input, which its copies read, and its output if the backward reads it) and
  what no copy can recompute (stateful producers); while its gradient runs,
  everything the backward reads inside it is live again. So with ``P`` the
  bytes kept before it, the step needs ``P + input + saved(a..e)`` at that
  point, and ``P + kept(a..e)`` after it; a kept unit keeps what the backward
  reads of it;
  a gradient op's kernel temporaries (``Unit.scratch_bytes``: onnxruntime's
  ``Where``) come on top of what is live when it runs: at unit ``u``'s gradient
  the run's values from ``a`` to ``u`` (those after ``u`` have been read), so
  of two equally narrow ends the one that keeps less live there wins;
  and while it runs, what the step returns (an ONNX step's updated parameters
  and state) allocated by the gradients of the units after it is live too;
  the model's peak is the largest such figure (Chen et al.'s chain model) plus
  a constant for what the model does not see (gradients, temporaries):
  the gap between the calibrated estimate of the original step
  (``analysis.memory.estimated_peak_bytes``) and the model's own figure for it.
* the cost of a segment is the time its recomputable ops take again, by
  ``analysis.cost``'s roofline (FLOPs or bytes moved, whichever dominates), not
  their FLOPs alone: a batch norm moves far more than it computes.

Policies (``--recompute-policy``):

* ``min-peak`` (the default without a budget): the lowest peak the chain
  model reaches, and the least recompute among plans reaching it.
* ``budget`` (``--memory-budget-bytes N`` or ``--memory-budget 0.6x``): the
  least recompute whose peak meets the budget. Solved exactly by a dynamic
  program over the chain of units (states: bytes kept so far and recompute so
  far, Pareto-pruned), so the optimality gap on the model is 0. The plan is
  then rewritten once and estimated; if the estimate misses the budget the
  model's budget is lowered by the miss and the chain solved again (at most
  ``ROUNDS`` times). The estimate must meet the budget less the dialect's
  ``allocator_headroom`` (TF's: what its allocator fragments beyond the
  step's own requests), so the allocator's peak meets it.
* ``cheap``: one minimum cut over tensor bytes (``remat/cheap.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from graphpass.analysis.forward import ForwardChain, Unit

#: How often a budget plan is re-solved after its rewrite missed the budget.
ROUNDS = 4
#: Byte resolution of the chain program: the budget in this many quanta.
RESOLUTION = 2000



@dataclass(frozen=True)
class ChainPlan:
    """Recomputed runs of units, ``(first, last)`` inclusive, and their model figures."""

    runs: tuple[tuple[int, int], ...]
    cost: int
    peak: int
    #: proven optimality gap of ``cost`` on the model (0.0: optimal; None: not proven)
    gap: float | None = 0.0


@dataclass
class Runs:
    """Which runs ``(first, last)`` the rewrite can write (``remat/writable.py``),
    asked only of the runs a solution holds: a solution holding one it cannot is
    solved again without it. What was asked is remembered across solves."""

    writable: Callable[[int, int], bool]
    known: dict[tuple[int, int], bool] = field(default_factory=dict)

    def unwritable(self, runs: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
        for run in runs:
            if run not in self.known:
                self.known[run] = self.writable(*run)
        return [run for run in runs if not self.known[run]]

    @property
    def banned(self) -> set[tuple[int, int]]:
        return {run for run, ok in self.known.items() if not ok}


# -- the chain model ---------------------------------------------------------


class _Prefix:
    """Prefix sums over the units, so every run's figures cost O(1)."""

    def __init__(self, units: list[Unit]) -> None:
        self.units = units
        self.saved = _prefix(u.saved_bytes for u in units)
        self.pinned = _prefix(u.pinned_bytes for u in units)
        self.costs = _prefix(u.cost for u in units)
        self.flops = _prefix(u.flops for u in units)
        self.returned = _prefix(u.returned_bytes for u in units)
        # what a run from unit 0 holds at unit u's gradient: its values up to u, u's scratch
        self.busiest = _RangeMax([self.saved[i + 1] + u.scratch_bytes
                                  for i, u in enumerate(units)])

    def entry(self, first: int) -> int:
        """Bytes crossing into a run from the unit before that the backward does not
        read: kept only because the run's copies read them."""
        return self.units[first - 1].cut_free_bytes if first else 0

    def live(self, first: int, last: int) -> int:
        """Bytes live while the run's gradient runs: all of it recomputed (at its
        busiest unit: what is recomputed up to it and its gradient's scratch), its
        input, and the values returned by the gradients of the units after it."""
        return self.busiest(first, last) - self.saved[first] + self.entry(first) + \
            self.returned[-1] - self.returned[last + 1]

    def kept(self, first: int, last: int) -> int:
        """Bytes the run keeps from the forward pass when recomputed: its input, its
        output if the backward reads it, what no copy can recompute."""
        return (self.pinned[last + 1] - self.pinned[first] + self.units[last].cut_saved_bytes
                + self.entry(first))

    def cost(self, first: int, last: int) -> int:
        return self.costs[last + 1] - self.costs[first]


def model_peak(units: list[Unit], runs: tuple[tuple[int, int], ...]) -> int:
    """The chain model's peak for recomputing ``runs`` (without the offset)."""
    sums = _Prefix(units)
    start = {first: last for first, last in runs}
    kept = peak = 0
    unit = 0
    while unit < len(units):
        if unit in start:
            last = start[unit]
            peak = max(peak, kept + sums.live(unit, last))
            kept += sums.kept(unit, last)
            unit = last + 1
        else:
            kept += units[unit].saved_bytes
            peak = max(peak, kept + units[unit].scratch_bytes)
            unit += 1
    return max(peak, kept)


def solve_budget(units: list[Unit], budget: int, quantum: int | None = None,
                 runs: Runs | None = None) -> ChainPlan | None:
    """The least recompute whose model peak is at most ``budget``; None if none is.

    A dynamic program over chain positions whose state is the bytes kept so far,
    counted in ``quantum``-byte steps (``budget / RESOLUTION`` by default). Run
    with every byte figure rounded up, it yields a plan that truly meets the
    budget; run rounded down, it relaxes the problem, and its cost bounds the
    optimum from below: the reported gap is proven, not guessed. ``runs``: only
    runs the rewrite can write.
    """
    quantum = quantum or _quantum(units, budget)
    found = _cheapest(units, budget, quantum, runs)
    if found is None or _divides(quantum, units):  # no rounding anywhere: optimal
        return found
    bound = _chain_dp(units, budget, quantum, up=False,
                      banned=runs.banned if runs else set())
    lower = bound[0] if bound else found.cost
    gap = 0.0 if found.cost <= lower or found.cost == 0 else (found.cost - lower) / found.cost
    return ChainPlan(found.runs, found.cost, found.peak, gap)


def _cheapest(units: list[Unit], budget: int, quantum: int,
              runs: Runs | None = None) -> ChainPlan | None:
    """The budget program rounded up (a plan that truly meets ``budget``), or None;
    its gap, 0.0, holds only where no figure is rounded (``solve_budget`` proves it).
    With ``runs``, solved again while the plan holds a run the rewrite cannot write."""
    while True:
        found = _chain_dp(units, budget, quantum, up=True,
                          banned=runs.banned if runs else set())
        if found is None:
            return None
        cost, chosen = found
        if runs is None or not runs.unwritable(chosen):
            return ChainPlan(chosen, cost, model_peak(units, chosen), 0.0)


def solve_min_peak(units: list[Unit], runs: Runs | None = None) -> ChainPlan:
    """The lowest model peak (bisection over the budget program's feasibility, to
    one quantum), and the least recompute reaching it, of ``runs`` the rewrite can
    write. Its gap is on the peak: the bisection's resolution, relative to the
    peak found."""
    high = model_peak(units, ())
    quantum = _quantum(units, high)
    # Feasibility alone decides each step: the cost's lower bound (``solve_budget``'s
    # second program) would be computed only to be thrown away.
    best = _cheapest(units, high, quantum, runs) or ChainPlan((), 0, high)
    low = 0
    while high - low > quantum:
        middle = (low + high) // 2
        found = _cheapest(units, middle, quantum, runs)
        if found is None:
            low = middle
        else:
            high, best = min(middle, found.peak), found
    gap = 0.0 if _divides(quantum, units) else quantum / max(best.peak, 1)
    return ChainPlan(best.runs, best.cost, best.peak, gap)


def _quantum(units: list[Unit], budget: int) -> int:
    """The byte step of the chain program: the greatest common divisor of every
    unit's figures when that keeps the states few (then rounding loses nothing),
    else ``budget / RESOLUTION``."""
    divisor = 0
    for unit in units:
        for value in _figures(unit):
            divisor = math.gcd(divisor, value)
    if divisor and budget // divisor <= 4 * RESOLUTION:
        return divisor
    return max(1, budget // RESOLUTION)


def _figures(unit: Unit) -> tuple[int, ...]:
    return (unit.saved_bytes, unit.pinned_bytes, unit.cut_saved_bytes, unit.cut_free_bytes,
            unit.returned_bytes, unit.scratch_bytes)


def _divides(quantum: int, units: list[Unit]) -> bool:
    """Every byte figure is a multiple of ``quantum``: the program rounds nothing."""
    return all(value % quantum == 0 for unit in units for value in _figures(unit))


def _chain_dp(units: list[Unit], budget: int, quantum: int, up: bool,
              banned: set[tuple[int, int]]) -> tuple[int, tuple[tuple[int, int], ...]] | None:
    """Least cost and its runs with byte figures in quanta, rounded up (``up``) or down.

    ``cost[i][k]``: the least recompute that has placed units ``0..i-1`` keeping
    ``k`` quanta. From each reached position ``first`` the program keeps unit
    ``first`` (one step) or recomputes a run ``first..last``; the runs from one
    position all land on different positions, so they are relaxed together
    (``_relax_runs``), in numpy, as a loop over them would relax them; ``banned``
    runs are never taken."""
    import numpy as np

    count, cap = len(units), budget // quantum if up else -(-budget // quantum)
    if cap < 0:  # a budget under nothing: no plan meets it
        return None
    figures = _RunFigures(units, quantum, up, banned)
    infinite = np.iinfo(np.int64).max // 4
    cost = np.full((count + 1, cap + 1), infinite, dtype=np.int64)
    # back[i][k] = (first unit of the last step, its last unit or -1 if kept, bucket before)
    back = np.full((count + 1, cap + 1, 3), -1, dtype=np.int64)
    cost[0][0] = 0
    for first in range(count):
        reached = np.flatnonzero(cost[first] < infinite)
        if not len(reached):
            continue
        kept = units[first].saved_bytes
        _relax(cost, back, first, first + 1, figures.steps(kept),
               cap - figures.steps(kept + units[first].scratch_bytes), 0, (first, -1))
        _relax_runs(cost, back, first, *figures.runs_from(first, int(reached[0]), cap))
    if cost[count].min() >= infinite:
        return None
    bucket = int(np.argmin(cost[count]))
    best = int(cost[count][bucket])
    runs = []
    position = count
    while position:
        first, last, bucket = (int(v) for v in back[position][bucket])
        if last >= 0:
            runs.append((first, last))
        position = first
    return best, tuple(sorted(runs))


class _RunFigures:
    """``_Prefix``'s run figures for every run from one unit at once, in quanta."""

    def __init__(self, units: list[Unit], quantum: int, up: bool,
                 banned: set[tuple[int, int]]) -> None:
        import numpy as np

        sums = _Prefix(units)
        self.quantum, self.up = quantum, up
        self.saved, self.pinned, self.costs, self.returned = (
            np.array(values, dtype=np.int64)
            for values in (sums.saved, sums.pinned, sums.costs, sums.returned))
        self.cut_saved = np.array([u.cut_saved_bytes for u in units], dtype=np.int64)
        self.busiest = np.array([sums.saved[i + 1] + u.scratch_bytes
                                 for i, u in enumerate(units)], dtype=np.int64)
        self.entry = [sums.entry(first) for first in range(len(units))]
        self.tie_start = np.array([u.tie_start for u in units], dtype=np.int64)
        self.banned: dict[int, list[int]] = {}
        for first, last in banned:
            self.banned.setdefault(first, []).append(last)

    def steps(self, value):
        """Bytes in quanta, rounded up or down (ints or arrays)."""
        return -(-value // self.quantum) if self.up else value // self.quantum

    def runs_from(self, first: int, lowest: int, cap: int):
        """For the runs ``first..last`` the program may take from ``first`` (those
        whose own values fit in ``cap`` above the ``lowest`` reached bucket): their
        last units, the quanta each keeps (the shift), how many buckets of
        ``first`` each relaxes (those leaving room for its live bytes), its cost."""
        import numpy as np

        over = lowest + self.steps(self.saved[first + 1:] - self.saved[first]) > cap
        lasts = np.arange(first, first + (int(np.argmax(over)) if over.any() else len(over)))
        entry = self.entry[first]
        kept = self.pinned[lasts + 1] - self.pinned[first] + self.cut_saved[lasts] + entry
        busiest = np.maximum.accumulate(self.busiest[first:first + len(lasts)])
        live = busiest - self.saved[first] + entry + self.returned[-1] - self.returned[lasts + 1]
        shift = self.steps(kept)
        size = np.minimum(cap - self.steps(live) + 1, cap + 1 - shift)
        # only runs the rewrite can order: a unit of the run reads a value from
        # before ``first`` it can tie its copies by (``Unit.tie_start``)
        size[np.minimum.accumulate(self.tie_start[lasts]) > first] = 0
        size[[last - first for last in self.banned.get(first, ()) if last - first < len(size)]] = 0
        return lasts, shift, size, self.costs[lasts + 1] - self.costs[first]


#: Buckets relaxed per numpy step of ``_relax_runs`` (bounds its temporary arrays).
_RELAX_CHUNK = 2**20


def _relax_runs(cost, back, first: int, lasts, shift, size, extra) -> None:
    """``_relax`` of every run ``first..lasts[j]``: ``cost[lasts[j] + 1][k + shift[j]]
    = min(., cost[first][k] + extra[j])`` for ``k < size[j]``, as one fancy-indexed
    minimum (each run lands on its own row, so none sees another's update)."""
    import numpy as np

    keep = size > 0
    lasts, shift, size, extra = lasts[keep], shift[keep], size[keep], extra[keep]
    per_chunk = max(1, _RELAX_CHUNK // cost.shape[1])
    for start in range(0, len(lasts), per_chunk):
        part = slice(start, start + per_chunk)
        sizes = size[part]
        k = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        rows = np.repeat(lasts[part] + 1, sizes)
        cols = np.repeat(shift[part], sizes) + k
        candidate = cost[first][k] + np.repeat(extra[part], sizes)
        better = candidate < cost[rows, cols]
        if better.any():
            rows, cols = rows[better], cols[better]
            cost[rows, cols] = candidate[better]
            back[rows, cols, 0] = first
            back[rows, cols, 1] = np.repeat(lasts[part], sizes)[better]
            back[rows, cols, 2] = k[better]


def _relax(cost, back, source: int, target: int, shift: int, limit: int,
           extra: int, step: tuple[int, int]) -> None:
    """``cost[target][k + shift] = min(., cost[source][k] + extra)`` for ``k <= limit``."""
    import numpy as np

    size = min(limit + 1, len(cost[target]) - shift)
    if size <= 0:
        return
    candidate = cost[source][:size] + extra
    window = cost[target][shift:shift + size]
    better = candidate < window
    if better.any():
        window[better] = candidate[better]
        rows = back[target][shift:shift + size]
        rows[better, 0], rows[better, 1] = step
        rows[better, 2] = np.flatnonzero(better)


class _RangeMax:
    """The largest of ``values[first..last]`` in O(1) (a sparse table: row ``k``
    holds the maxima of the windows of ``2**k`` values)."""

    def __init__(self, values: list[int]) -> None:
        self.rows = [values]
        width = 1
        while 2 * width <= len(values):
            row = self.rows[-1]
            self.rows.append([max(row[i], row[i + width]) for i in range(len(row) - width)])
            width *= 2

    def __call__(self, first: int, last: int) -> int:
        level = (last - first + 1).bit_length() - 1
        row = self.rows[level]
        return max(row[first], row[last - (1 << level) + 1])


def _prefix(values) -> list[int]:
    sums = [0]
    for value in values:
        sums.append(sums[-1] + value)
    return sums


def describe_runs(chain: ForwardChain, runs: tuple[tuple[int, int], ...]) -> list[dict]:
    """The report's entry per recomputed run: label, ops, model bytes saved, FLOPs
    and the cost the planner weighed (``Unit.cost``)."""
    sums = _Prefix(chain.units)
    return [{"label": chain.label(first, last), "units": [first, last],
             "nodes": len(chain.nodes(first, last)),
             "estimated_bytes_saved": max(0, sums.saved[last + 1] - sums.saved[first]
                                          - sums.kept(first, last)),
             "recompute_flops": sums.flops[last + 1] - sums.flops[first],
             "recompute_cost": sums.cost(first, last)} for first, last in runs]
