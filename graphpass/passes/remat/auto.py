"""``--recompute auto``: the planner (``plan``) run on this graph's forward chain,
its segments rewritten on a copy of the graph and estimated, never per candidate;
with ``--profile`` (a profiler in the context) measured as well (``profiled``).
"""

from __future__ import annotations

import time

from graphpass.analysis.cost import Sizes, StepTime
from graphpass.analysis.forward import ForwardChain, computed_forward, forward_chain
from graphpass.analysis.measured import Profiler
from graphpass.analysis.memory import (
    check_batch_size,
    format_bytes,
    step_loop_facts,
)
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor, gc_paused
from graphpass.options import BUDGET, CHEAP, RematOptions
from graphpass.passes.remat.cheap import (
    CHEAP_TIME,
    SHARED_COPY_ALLOWANCE,
    cheap_groups,
    cheap_keep,
    within_time,
)
from graphpass.passes.remat.defer import defer_updates
from graphpass.passes.remat.marks import SCOPE, Segment, is_generated, unique
from graphpass.passes.remat.pin import (
    pin_updates,
    state_math_after_gradients,
)
from graphpass.passes.remat.plan import (
    ROUNDS,
    ChainPlan,
    Runs,
    describe_runs,
    model_peak,
    solve_budget,
)
from graphpass.passes.remat.profiled import profiled_plan
from graphpass.passes.remat.refine import refine_min_peak
from graphpass.passes.remat.rewrite import Step, rewrite_segments
from graphpass.passes.remat.timed import within_extra_time, worth_its_time
from graphpass.passes.remat.trials import Trials
from graphpass.passes.remat.verdict import AutoPlan, over_budget_message
from graphpass.passes.remat.writable import (
    chain_left_out,
    left_out_note,
    orderable,
    orderable_chain,
    writable_runs,
)
from graphpass.units import MAX_BYTES


def auto_plan(graph: Graph, step: Step, options: RematOptions, before: int,
              profiler: Profiler | None = None, runtime_before: int | None = None
              ) -> tuple[AutoPlan, list[Segment]]:
    """The planner (``plan``) on the forward chain; a plan is rewritten on a copy
    of the graph and estimated once (on the step's runtime), never per candidate.
    ``before``: the planner's own estimate of the step as written, which its chain
    model is calibrated on; ``runtime_before``: the estimate in the order the
    runtime itself gave for the step, where the planner's model cannot follow
    that order (``RuntimeModel.following``): what a plan must gain
    against and a relative budget is of. With a
    ``profiler`` (``--profile``) the original step and the plans are measured too, and the
    budget judged on the measured figure (``profiled``). The cyclic collector
    is paused meanwhile: the trial copies and their estimates are millions of
    containers and no cycles (a trial is freed when its last reference goes),
    so the collector's scans of them would be pure cost."""
    with gc_paused():
        if profiler is not None:
            measured = profiler(graph, step.fetches)
            return profiled_plan(
                lambda target, policy: _auto_plan(graph, step, options, before, target, policy,
                                                  measured.peak_bytes, runtime_before),
                lambda segments: profiler(written(graph, step, options, segments),
                                          step.fetches),
                measured, budget_option(options))
        plan, segments = _auto_plan(graph, step, options, before,
                                    runtime_before=runtime_before)
        if plan.met is False:  # the lowest chain plan misses the budget: the cheap one?
            cheap, cheap_segments = _auto_plan(graph, step, options, before, policy=CHEAP,
                                               runtime_before=runtime_before)
            if cheap.met:
                cheap.policy = BUDGET
                cheap.notes.append(f"no chain plan meets the budget (lowest estimate "
                                   f"{format_bytes(plan.estimate)}); the cheap policy's does")
                return cheap, cheap_segments
            best = min((plan, cheap), key=lambda p: p.estimate)
            raise GraphpassError(over_budget_message(
                budget_option(options), best, best.estimate,
                [s["label"] for s in best.segments]))
        return plan, segments


def written(graph: Graph, step: Step, options: RematOptions,
            segments: list[Segment]) -> Graph:
    """A copy of ``graph`` rewritten as the pass writes ``segments`` (updates
    deferred where the estimate says so, pinned next to their gradients): what
    ``--profile`` measures must be the graph written, not one whose updates may
    wait to the end of the step."""
    copy = graph.copy()
    rewrite_segments(copy, segments, step, options.tupleize_grads)
    state_math_after_gradients(copy, step)
    defer_updates(copy, step, options.batch_size)
    pin_updates(copy, step)
    return copy


def _auto_plan(graph: Graph, step: Step, options: RematOptions, before: int,
               target: int | None = None, policy: str | None = None,
               measured_before: int | None = None, runtime_before: int | None = None
               ) -> tuple[AutoPlan, list[Segment]]:
    """The plan of ``policy`` (default: the options'); ``target``: what the estimate
    must meet in place of the budget less the allocator's headroom (``--profile``
    maps the budget onto the estimate by what it measured); ``measured_before``:
    the original's measured peak, which a relative budget (``0.6x``) is then of;
    ``runtime_before``: as :func:`auto_plan`'s."""
    start = time.perf_counter()
    policy = policy or options.policy
    check_batch_size(graph, step.fetches, options.batch_size)
    sizes = Sizes(graph, options.batch_size)
    chain = orderable_chain(graph, forward_chain(
        graph, computed_forward(graph, step.forward), step.backward, sizes,
        ignore_reader=is_generated, runtime=step.runtime), step)
    budget = options.memory_budget_bytes
    original = runtime_before or before
    if options.memory_budget_fraction is not None:
        budget = min(int(options.memory_budget_fraction * (measured_before or original)),
                     MAX_BYTES)
    time_model = StepTime(graph, step.fetches, options.batch_size, step.runtime, sizes)
    trials = Trials(graph, step, options, chain, time_model)
    written = trials.unplanned(before)
    plan = AutoPlan(policy, budget, len(chain.units), chain.width, "none", 0.0,
                    original, written, max(0, written - model_peak(chain.units, ())),
                    headroom=step.runtime.allocator_headroom,
                    loops=_loop_notes(graph, step, options), step_cost=time_model.total)
    if policy != BUDGET:
        target = None
    elif target is None:
        target = plan.target_bytes

    if any(n.startswith(SCOPE) for n in graph):
        plan.solver = "none (already rematerialized by graphpass)"
        segments = []
    elif policy == CHEAP:
        segments = _plan_cheap(graph, chain, sizes, plan, trials)
    else:
        runs = writable_runs(graph, chain, step)
        segments = _plan_chain(plan, target, options, trials, runs)
        if note := left_out_note(graph, step, chain_left_out(chain, runs)):
            plan.notes.append(note)
    if segments and plan.estimate > NO_GAIN * original:
        plan.notes.append(f"no segment recomputed: the best plan's estimate "
                          f"({format_bytes(plan.estimate)}) is not below {NO_GAIN}x the "
                          f"step's ({format_bytes(original)}), so recomputing would cost time "
                          "for no memory")
        plan.estimate, plan.segments, segments = written, [], []
    if segments and not segments[0].in_turn:
        plan.notes.append("segments not recomputed in turn: the estimate is lower with each "
                          "waiting only for its own trigger")
    plan.seconds = time.perf_counter() - start
    return plan, segments


#: Why the lowest plan recomputes nothing, where it does not.
NOTHING_RELEASED = ("no segment recomputed: no plan of the chain is estimated below the step "
                    "as written (what is live at its peak is nothing recomputing releases)")
#: A plan is written only if its estimate is below this share of the step's: the
#: estimate's own error is of this order, and recomputing costs time.
NO_GAIN = 0.98


def _loop_notes(graph: Graph, step: Step, options: RematOptions) -> list[str]:
    """The forward loops, in graph order: the planner segments the step around a
    loop, never inside its body (what the body stacks per iteration stays), and the
    user should know that, and whether the estimate knew the trip count."""
    notes = []
    running = step.forward | step.backward | step.optimizer
    for name in graph:
        facts = step_loop_facts(graph, name, running, options.batch_size, options.loop_trips) \
            if name in step.forward else None
        if facts is None:
            continue
        if facts.trips is None:
            notes.append(f"{name} (trip count unknown: what it stacks per iteration counts "
                         "as zero in the estimate; give --loop-trips N)")
        else:
            source = "from the graph" if facts.trips_from == "graph" else "from --loop-trips"
            notes.append(f"{name} ({facts.trips} trips {source}, stacks "
                         f"{format_bytes(facts.stacked_bytes())} per iteration)")
    return notes


def _plan_chain(plan: AutoPlan, budget: int | None, options: RematOptions,
                trials: Trials, runs: Runs | None) -> list[Segment]:
    """``min-peak`` or ``budget``: solve the chain for the lowest peak, checked
    against the estimate (``refine``: rounds where the model was wrong). A
    budget plan is searched by bisection over the model's budget, between the
    lowest plan (known to fit) and the budget less the model's offset, keeping
    the cheapest plan whose estimate fits; ``ROUNDS`` estimates at most.
    ``budget`` is what the estimate must meet (the user's less the runtime's
    allocator headroom: the estimate counts requests, the allocator's peak is
    what must meet the budget); where the lowest plan misses it, that plan is
    the answer, and the caller judges it (``verdict``). Only ``runs`` the rewrite
    can write are taken (``writable``)."""
    units, unplanned = trials.chain.units, plan.estimate  # the step as written, no segment
    chosen, estimated, plan.rounds = refine_min_peak(units, plan.model_offset,
                                                     trials.chain_trial, trials.step.runtime,
                                                     options.batch_size, budget, runs)
    if not chosen.runs or estimated >= unplanned:
        plan.notes.append(NOTHING_RELEASED)
    if budget is None and options.max_extra_time is not None:
        chosen, estimated = within_extra_time(
            units, plan, chosen, estimated, options.max_extra_time, trials.chain_estimate,
            trials.extra_time, runs)
    in_turn = True
    deferrable = trials.deferrable
    if estimated < unplanned and (deferrable or len(chosen.runs) > 1):
        # the plan as written: its updates deferred where that is lower (the
        # refinement's figure is the plan without), its segments in turn where
        # that is lower
        segments, estimated = trials.turns(trials.segments(chosen),
                                           None if deferrable else estimated)
        in_turn = all(s.in_turn for s in segments)
    if estimated >= unplanned:  # the model was wrong: recompute nothing
        chosen, estimated = ChainPlan((), 0, 0), unplanned
    if budget is None and options.max_extra_time is not None and \
            not worth_its_time(plan, chosen, 1 - estimated / unplanned,
                                options.max_extra_time, trials.extra_time):
        chosen, estimated = ChainPlan((), 0, 0), unplanned
    if budget is not None and estimated <= budget:
        low, high = chosen.peak, budget - plan.model_offset
        target = high
        for plan.rounds in range(1, ROUNDS + 1):
            found = solve_budget(units, target, runs=runs)
            if found is None or found.cost >= chosen.cost:
                break
            peak = trials.estimate(trials.segments(found, in_turn))
            if peak <= budget:
                chosen, estimated, low = found, peak, target
            else:
                high = target
            if high - low <= budget // 100:
                break
            target = (low + high) // 2
    plan.solver, plan.gap = "chain dp", chosen.gap
    plan.estimate = estimated
    plan.segments = describe_runs(trials.chain, chosen.runs)
    return trials.segments(chosen, in_turn)


def _plan_cheap(graph: Graph, chain: ForwardChain, sizes: Sizes, plan: AutoPlan,
                trials: Trials) -> list[Segment]:
    """``cheap``: keep what one min cut says; recompute the rest per unit, each value
    once where that costs at most ``SHARED_COPY_ALLOWANCE`` of the peak (a shared
    copy lives from the first group's trigger to the last reader; estimated both
    ways), and only the groups the step's time allows (``cheap.within_time``). A
    group whose copies cannot be ordered (``writable``) stays as it is."""
    step, time_model = trials.step, trials.time_model
    keep = frozenset(cheap_keep(graph, chain, sizes, step.runtime))

    left_out: set[str] = set()
    too_slow: dict[str, float] = {}

    def grouped(share: bool) -> list[tuple[str, list[Tensor]]]:
        groups = []
        for label, released in cheap_groups(graph, chain, keep, share):
            if orderable(graph, Segment(label, [], released, keep), step):
                groups.append((label, released))
            else:
                left_out.add(label)
        groups, slow = within_time(graph, chain, groups, keep, time_model, sizes)
        too_slow.update(slow)
        return groups

    def segments_of(groups) -> list[Segment]:
        return [Segment(label, [], released, keep) for label, released in groups]

    groups, shared = grouped(False), grouped(True)
    if note := left_out_note(graph, step, sorted(left_out)):
        plan.notes.append(note)
    if too_slow:
        plan.notes.append(_too_slow_note(too_slow))
    unplanned = plan.estimate  # the step as written, no segment
    segments, plan.estimate = trials.turns(segments_of(groups))
    if shared != groups:
        shared_segments, shared_estimate = trials.turns(segments_of(shared))
        if shared_estimate <= plan.estimate + SHARED_COPY_ALLOWANCE * unplanned:
            groups, segments, plan.estimate = shared, shared_segments, shared_estimate
    plan.solver, plan.gap = "min cut (networkx max-flow)", 0.0
    if plan.estimate >= unplanned:  # saves nothing: recompute nothing
        plan.estimate = unplanned
        return []
    plan.segments = [{
        "label": label, "nodes": len(unique(t.node for t in released)),
        "estimated_bytes_saved": sum(sizes.bytes(t) for t in released),
        "recompute_flops": sum(sizes.flops(n) for n in unique(t.node for t in released)),
        "recompute_cost": round(sum(time_model.sizes.work(n, time_model.runtime)
                                    for n in unique(t.node for t in released)))}
        for label, released in groups]
    return segments


def _too_slow_note(too_slow: dict[str, float]) -> str:
    """Why ``cheap`` left groups out: their time, over what the policy allows."""
    shown = ", ".join(sorted(too_slow)[:3]) + \
        (f" and {len(too_slow) - 3} more" if len(too_slow) > 3 else "")
    return (f"{len(too_slow)} groups not recomputed: with the others their copies would "
            f"add more than {CHEAP_TIME:.0%} of the step's predicted time (~"
            f"{sum(too_slow.values()):.0%} together): {shown}; the min-peak policy or a "
            f"budget weighs memory against time instead")

# -- rewrite -------------------------------------------------------------

def budget_option(options: RematOptions) -> str:
    return "--memory-budget" if options.memory_budget_fraction is not None \
        else "--memory-budget-bytes"

