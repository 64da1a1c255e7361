"""The min-peak plan checked against the estimate, and solved again where the
chain model was wrong about it.

The chain model (``plan``) assumes a recomputed run's copies are freed once its
gradient ops have read them. The runtime's schedule can hold them longer: TF's
executor runs an op that becomes ready beside another expensive one later, newest
work first, so a copy only a weight gradient reads (a Keras 3 attention's
``softmax @ value``, recomputed for its output projection's weight gradient)
waits to the end of the step, and with it the copies it reads (the softmax).
Where a run *ends* decides this: its gradient reaches the end first.
Gradients starve the same way (bias gradients and layer-norm ``Sum`` reductions
hold their inputs to the end), and more, shorter runs leave more of them
waiting.

So the planner rewrites the plan on a copy and simulates it (``estimate``), and
while the estimate misses the model's figure, it

* charges each run's *leftovers* (bytes of its copies still held when the
  backward pass starts recomputing the next run) to runs ending at the same
  unit, so the solver looks for other ends;
* once no run leaves anything new behind, spreads the rest of the miss over
  the runs as a cost per run, so the solver prefers fewer, longer runs;

and solves the chain again, at most ``ROUNDS`` estimates in all, keeping the plan
with the lowest estimate. A plan the model got right (within ``TOLERANCE``)
costs one estimate, as it would without this check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from graphpass.analysis.forward import Unit
from graphpass.analysis.memory import MemoryProfile, tensor_bytes
from graphpass.ir.graph import Graph, Tensor
from graphpass.passes.remat.plan import ROUNDS, ChainPlan, Runs, model_peak, solve_min_peak
from graphpass.runtimes import RuntimeModel

#: The estimate may exceed the model's figure by this fraction before it is refined.
TOLERANCE = 0.05

#: ``trial(runs)``: the rewritten copy, the copies of each run (in run order) and
#: the simulated step.
Trial = Callable[[tuple[tuple[int, int], ...]], tuple[Graph, list[list[str]], MemoryProfile]]


def refine_min_peak(units: list[Unit], offset: int, trial: Trial, runtime: RuntimeModel,
                    batch_size: int | None = None, enough: int | None = None,
                    runs: Runs | None = None) -> tuple[ChainPlan, int, int]:
    """The min-peak plan with the lowest estimate found (module docstring); its
    estimate and how many estimates it took. ``offset``: what the model does not
    see of the original step (its estimate less the model's figure); ``enough``:
    an estimate that ends the search (a budget: the plan only has to meet it);
    ``runs``: the runs the rewrite can write (``plan.Runs``)."""
    leftovers: dict[int, int] = {}
    per_run = 0
    best: tuple[int, ChainPlan] | None = None
    tried: set[tuple[tuple[int, int], ...]] = set()
    rounds = 0
    while rounds < ROUNDS:
        chosen = solve_min_peak(_charged(units, leftovers, per_run), runs)
        if chosen.runs in tried:
            break
        tried.add(chosen.runs)
        rounds += 1
        graph, copies, profile = trial(chosen.runs)
        estimated = profile.peak_bytes
        # the plan's own figures, not the charged ones
        chosen = replace(chosen, peak=model_peak(units, chosen.runs))
        if best is None or estimated < best[0]:
            best = (estimated, chosen)
        miss = estimated - chosen.peak - offset
        if not chosen.runs or miss <= TOLERANCE * estimated or \
                (enough is not None and best[0] <= enough):
            break
        found = _leftovers(graph, chosen.runs, copies, profile, batch_size, runtime)
        new = {last: held for last, held in found.items() if held > leftovers.get(last, 0)}
        leftovers.update(new)
        if not new:
            per_run += miss // len(chosen.runs)
    assert best is not None
    return best[1], best[0], rounds


def _charged(units: list[Unit], leftovers: dict[int, int], per_run: int) -> list[Unit]:
    """The units with what a run ending at each is charged added to what it keeps
    (``cut_saved_bytes`` counts only for the last unit of a recomputed run)."""
    if not leftovers and not per_run:
        return units
    return [replace(u, cut_saved_bytes=u.cut_saved_bytes + per_run + leftovers.get(i, 0))
            for i, u in enumerate(units)]


def _leftovers(graph: Graph, runs: tuple[tuple[int, int], ...], copies: list[list[str]],
               profile: MemoryProfile, batch_size: int | None,
               runtime: RuntimeModel) -> dict[int, int]:
    """Per run (by its last unit): bytes of its copies computed before the backward
    pass starts recomputing the run before it and read after that."""
    position = {name: i for i, (name, _) in enumerate(profile.timeline)}
    found = {}
    for k in range(1, len(runs)):
        starts = [position[c] for c in copies[k - 1] if c in position]
        if not starts:
            continue
        boundary = min(starts)
        held = 0
        for copy in copies[k]:
            if position.get(copy, boundary) >= boundary:
                continue
            for port in graph.used_ports(copy):
                if runtime.output_alias(graph, copy, port) is not None:
                    continue
                tensor = Tensor(copy, port)
                if any(position.get(c, -1) > boundary for c, _ in graph.consumers(tensor)):
                    held += tensor_bytes(graph, tensor, batch_size) or 0
        found[runs[k][1]] = held
    return found
