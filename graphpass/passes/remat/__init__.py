"""Rematerialization: the graph-level ``recompute_grad``.

For each marked *segment* of the forward pass, the segment's internal
activations are no longer kept for the backward pass: the recomputable part of
the segment is copied into the backward pass and its own gradient ops read the
copies instead. The copies are *triggered per segment*: they depend on the
gradient flowing into that segment, so each segment is recomputed when the
backward pass reaches it (not all at once, which is why Grappler's MANUAL mode
saves nothing on a chain of blocks).

What it never touches: stateful nodes (variable updates, random ops: their
outputs stay checkpoints, so a recomputed dropout uses the same mask), fed or
stored values (placeholders, variables, constants), a segment's *boundary*
outputs (values other forward nodes read: they are kept anyway as the next
segment's checkpoint), and anything graphpass generated (names under
``graphpass/``), which is what makes a second run a no-op. The optimizer is
touched only by ``defer``, which rewires its reads of the gradients.

The package: ``marks`` (patterns, ``_recompute_hint`` attributes -> segments),
``auto`` (``--recompute auto``: the planner ``plan`` on this graph, a plan
estimated on a rewritten copy), ``rewrite`` (per segment: plan, copies,
rewires), ``order`` (copies after the trigger by control or data
dependencies; ``--tupleize-grads``) and ``defer`` (a step that returns its
updates, as ONNX's does, runs them after the last gradient where the estimate
says that lowers the peak). ``RematPass`` here ties them together.

Ordering: ``control`` mode gives the copies control inputs on the trigger;
``data`` mode ties their float inputs to it as ``recompute_grad(use_data_dep=True)``
does (see ``order``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from graphpass.analysis.cost import StepTime
from graphpass.analysis.measured import StepMeasurement
from graphpass.analysis.memory import MemoryProfile
from graphpass.analysis.runtime_memory import (
    follow_runtime_order,
    runtime_memory_profile,
    runtime_view,
)
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.options import RematOptions
from graphpass.passes.base import Pass
from graphpass.passes.context import PassContext
from graphpass.passes.exactness import checks_exactness, exactness_check, inexact_allowed
from graphpass.passes.remat.auto import auto_plan
from graphpass.passes.remat.defer import defer_updates
from graphpass.passes.remat.exactness import (
    EXACTNESS_ROUNDS,
    Exactness,
    stands_for_in,
)
from graphpass.passes.remat.marks import marked_segments
from graphpass.passes.remat.pin import (
    SHOWN_ABOVE,
    Pinned,
    held_counts,
    held_is_higher,
    held_updates_peak,
    pin_updates,
    state_math_after_gradients,
    worst_case,
)
from graphpass.passes.remat.report import Figures, remat_report
from graphpass.passes.remat.rewrite import Step, rewrite_segments
from graphpass.passes.remat.trials import step_estimator
from graphpass.passes.remat.verdict import AutoPlan

if TYPE_CHECKING:
    from graphpass.analysis.runtime_memory import RuntimeGraph
    from graphpass.runtimes import RuntimeModel

__all__ = ["RematPass"]


class RematPass(Pass):
    """Recompute marked forward segments in the backward pass (graph-level recompute_grad)."""

    name = "remat"

    options: RematOptions

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        """The rewrite, proven exact where the runtime can be asked: a rewrite in
        which the runtime computes some copy otherwise is undone and made again
        without copying what those copies stand for (kept instead), at most
        ``EXACTNESS_ROUNDS`` times; then with nothing copied; else not at all. With
        ``--exactness allow-inexact`` the first rewrite is kept, what differs named."""
        step = self._analyze(graph, ctx)
        step.runtime.ask_ahead(graph, step.fetches, oracle=self.estimates_memory(ctx),
                               exactness=checks_exactness(ctx))
        check = exactness_check(ctx, graph, step.fetches)
        if check is None or check.unchecked:
            edited = self._rewrite(graph, ctx, step, proven=False)
            self.report["summary"].extend(Exactness(check).summary() if edited else [])
            self.report["exactness"] = Exactness(check).to_json()
            return edited
        original, exactness = graph.copy(), Exactness(check)
        for attempt in range(EXACTNESS_ROUNDS + 1):
            edited = self._rewrite(graph, ctx, step, proven=True)
            found = check.differences(
                graph, stands_for_in(graph, self.report["segments"])) if edited else []
            if not found:
                break
            if inexact_allowed(ctx):
                exactness.written_anyway = found
                break
            graph.restore(original)
            causes = _with_forward_readers(
                original, step, exactness.keep(found, last=attempt == EXACTNESS_ROUNDS - 1))
            causes -= step.runtime.computed_otherwise
            if attempt == EXACTNESS_ROUNDS or not causes and exactness.copying_nothing:
                self.report = remat_report([], [], step.dependency)
                exactness.refused = True
                edited = False
                break
            if not causes:  # nothing to blame: the ordering alone, then
                causes, exactness.copying_nothing = step.forward, True
            step = replace(step, runtime=step.runtime.knowing_computed_otherwise(causes))
        self.report["summary"].extend(exactness.summary())
        self.report["exactness"] = exactness.to_json()
        return edited

    def _rewrite(self, graph: Graph, ctx: PassContext, step: Step, proven: bool) -> bool:
        """One rewrite of ``graph``; ``proven``: the runtime's exactness check judges
        it after (the summary needs no caveat of what the runtime might fuse)."""
        batch = self.options.batch_size
        estimate = self.estimates_memory(ctx)
        # Every estimate from here on (the planner's included) runs the nodes in
        # the order of the graph the runtime runs, where it can be asked.
        view = runtime_view(graph, step.fetches, step.runtime) \
            if estimate and step.runtime.has_oracle else None
        step = replace(step, runtime=follow_runtime_order(graph, view, step.runtime))
        runtime = step.runtime
        own_order = _unfollowed_order(view, runtime)
        before = _profile_before(graph, ctx, step, batch) if estimate else None
        low = before.peak_bytes if before else None
        held = held_updates_peak(graph, step, batch, step_estimator(step)) \
            if estimate and runtime.holds_updates else None
        # The original as its runtime runs it in its worse processes; the rewrite
        # is pinned.
        time = StepTime(graph, step.fetches, batch, runtime) if estimate else None
        counted = held_counts(graph)
        peak_before = (worst_case(low, held) if counted else low) if estimate else None
        asked = _runtime_peak(graph, step, batch, view) \
            if view is not None and (ctx.estimates or own_order) else None
        shown = [asked] if ctx.estimates and asked else None
        # Where the planner's model cannot follow the runtime's own order of the
        # original, that order's figure is the original's: what a plan must gain
        # against, what a relative budget is of, and what the summary shows.
        planned_before = peak_before
        if own_order:
            low = peak_before = asked.peak_bytes
        auto = measured = None
        if self.options.auto:
            auto, segments = auto_plan(graph, step, self.options, planned_before,
                                       ctx.profiler, peak_before if own_order else None)
            skipped = []
        else:
            segments, skipped = marked_segments(graph, self.options, step.forward,
                                                step.backward)
            if ctx.profiler is not None:  # --profile: the marks' rewrite measured too
                measured = [ctx.profiler(graph, step.fetches)]
        ran_before = measured[0] if measured else auto and auto.measured_before
        replayed = [_replayed_peak(graph, step, batch, ran_before, view)] \
            if ran_before and runtime.has_oracle else None
        entries = rewrite_segments(graph, segments, step, self.options.tupleize_grads,
                                   released_bytes=estimate, batch_size=batch)
        changed = any(e["copied"] for e in entries)
        extra_time = time.extra([o for e in entries for o in e["recomputes"]]) if time else None
        # As every plan was weighed: values that wait for their gradients, updates
        # pinned; not where they are all the rewrite would do, for nothing.
        ordered = changed or (auto is not None and _ordering_pays(auto, low, held))
        waiting = state_math_after_gradients(graph, step) if ordered else 0
        pinned = Pinned(pin_updates(graph, step) if ordered else 0, held, low, waiting,
                        counted)
        # The figures shown are of the graph as written, in the order of its own
        # runtime graph (the planner placed its copies by rule: it cannot ask per plan).
        final = runtime_view(graph, step.fetches, runtime) \
            if shown is not None and (changed or pinned.changed) else None
        step = replace(step, runtime=follow_runtime_order(graph, final, runtime))
        peak_after = _peak_after(graph, step, batch, changed or waiting > 0, low,
                                 None if final else auto) if estimate else None
        # auto's estimate already has the updates deferred where that is lower.
        # Deferring is part of the rewrite, so it is decided (estimated) when the
        # figures are not shown too: the output never depends on --quiet.
        deferred = defer_updates(graph, step, batch, None if auto else peak_after)
        edited = changed or deferred is not None or pinned.changed
        # The runtime's graph of the step as written, where asked already (the
        # updates deferred after ``final`` was asked: not that one).
        written = (None if deferred else final) if edited else view
        if shown is not None:
            shown.append(_runtime_peak(graph, step, batch, written) if edited else shown[0])
        if measured is not None:
            measured.append(ctx.profiler(graph, step.fetches))
        elif auto is not None and auto.measured is not None:
            measured = [auto.measured_before, auto.measured]
        if replayed is not None and measured is not None:
            replayed.append(_replayed_peak(graph, step, batch, measured[1], written))
        figures = Figures(peak_before, peak_after, before,
                          planned_before if own_order else None, deferred, measured, shown,
                          replayed, extra_time)
        self.report = remat_report(entries, skipped, step.dependency, figures, auto, pinned,
                                   runtime, caveats=not proven)
        return edited

    def estimates_memory(self, ctx: PassContext) -> bool:
        return ctx.estimates or self.options.auto

    def _analyze(self, graph: Graph, ctx: PassContext) -> Step:
        """Dependency mode, regions and fetches, once: the planner's trial rewrites
        of copies of the graph reuse them (node names are the same there)."""
        modes = graph.dialect.dependency_modes
        runtime = ctx.runtime(graph)
        dependency = self.options.dependency or runtime.dependency or \
            graph.dialect.step.default_dependency(graph)
        if refused := runtime.refuses_dependency(dependency):
            raise GraphpassError(f"--dependency {dependency} cannot survive --target "
                                 f"{runtime.name}: {refused}")
        if dependency not in modes:
            raise GraphpassError(
                f"--dependency {dependency} is not possible for {graph.format} graphs "
                f"(they support: {', '.join(modes)})"
            )
        return Step.of(ctx.analyses.regions(graph), dependency, runtime,
                       self.options.loop_trips)


def _unfollowed_order(view: RuntimeGraph | None, runtime: RuntimeModel) -> bool:
    """The runtime gave its own order of the step (``view``) and the planner's model
    does not follow it (``RuntimeModel.following``)."""
    return view is not None and bool(view.order) and not runtime.follows


def _with_forward_readers(graph: Graph, step: Step, originals: set[str]) -> set[str]:
    """``originals`` and the forward nodes reading them: a value kept instead of
    recomputed gets the copies of its readers as readers more, which the runtime
    may compile it otherwise by (the value and what reads it go together)."""
    return originals | {c for o in originals if o in graph for p in graph.used_ports(o)
                        for c, _ in graph.consumers(Tensor(o, p)) if c in step.forward}


def _profile_before(graph: Graph, ctx: PassContext, step: Step,
                    batch: int | None) -> MemoryProfile:
    """The estimate of the original step (shared with other passes without a batch
    or loop trips: the analysis manager caches it)."""
    if batch is None and step.loop_trips is None:
        return ctx.analyses.profile(graph, step.fetches, step.runtime)
    return step_estimator(step)(graph, step.fetches, batch)


def _ordering_pays(auto: AutoPlan, low: int, held: MemoryProfile | None) -> bool:
    """Whether pinning the updates and making state math wait is worth writing where
    ``auto`` recomputes nothing: the original runs in a held mode above ``low``
    in some processes (pinning removes it), or the planner estimated its plan of
    no segments (pinned, waiting) lower than the original. Else the edges would
    only move work in TF's schedule for no estimated saving, and the graph is
    written as it was read."""
    return held_is_higher(low, held) or auto.estimate < (1 - SHOWN_ABOVE) * low


def _peak_after(graph: Graph, step: Step, batch: int | None, changed: bool,
                unchanged: int, auto: AutoPlan | None) -> int:
    """The estimate after the rewrite (``unchanged``: the estimate where nothing was
    recomputed, the original's with its updates run as their gradients appear, as
    pinned). The planner estimated this very rewrite (the same segments,
    rewritten the same way on a copy), so its figure is reused: a second
    estimate of a large graph would cost as much as the first."""
    if not changed:
        return unchanged
    if auto is not None:
        return auto.estimate
    return step_estimator(step)(graph, step.fetches, batch).peak_bytes


def _runtime_peak(graph: Graph, step: Step, batch: int | None,
                  view: RuntimeGraph | None = None) -> MemoryProfile:
    """The estimate of the graph the runtime really runs (``analysis.runtime_memory``:
    TF's Grappler output; ``view`` where already asked), for the figures the user
    reads. The planner weighs its candidates under the fast hand model instead
    (in the runtime graph's node order): asking TF costs a Grappler run of the
    whole step each time."""
    return runtime_memory_profile(graph, step.fetches, batch, step.loop_trips, view,
                                  runtime=step.runtime)


def _replayed_peak(graph: Graph, step: Step, batch: int | None, ran: StepMeasurement,
                   view: RuntimeGraph | None) -> int:
    """The estimate of the graph the runtime runs (``view``, where asked already) in
    the order TF started the nodes of a measured step (``--profile``): the model
    of the buffers on this process's schedule, so its distance from the records is
    the model's, and the estimate's distance from it the schedule's (TF's executor
    runs one graph in different orders from process to process)."""
    return runtime_memory_profile(graph, step.fetches, batch, step.loop_trips, view,
                                  replay=ran.order, runtime=step.runtime).peak_bytes
