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
from graphpass.analysis.measured import ALLOCATOR, StepMeasurement
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
from graphpass.passes.exactness import exactness_check, inexact_allowed
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
from graphpass.passes.remat.rewrite import Step, rewrite_segments
from graphpass.passes.remat.trials import step_estimator
from graphpass.passes.remat.verdict import AutoPlan
from graphpass.runtimes import RuntimeModel

if TYPE_CHECKING:
    from graphpass.analysis.runtime_memory import RuntimeGraph

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
                self.report = _report([], [], step.dependency, None, None)
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
        before = _profile_before(graph, ctx, step, batch) if estimate else None
        low = before.peak_bytes if before else None
        held = held_updates_peak(graph, step, batch, step_estimator(step)) \
            if estimate and runtime.holds_updates else None
        # The original as its runtime runs it in its worse processes; the rewrite
        # is pinned.
        time = StepTime(graph, step.fetches, batch, runtime) if estimate else None
        counted = held_counts(graph)
        peak_before = (worst_case(low, held) if counted else low) if estimate else None
        shown = [_runtime_peak(graph, step, batch, view)] \
            if ctx.estimates and runtime.has_oracle else None
        auto = measured = None
        if self.options.auto:
            auto, segments = auto_plan(graph, step, self.options, peak_before, ctx.profiler)
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
        self.report = _report(entries, skipped, step.dependency, peak_before, peak_after,
                              auto, deferred, measured, shown, pinned, replayed, runtime,
                              caveats=not proven, before=before, extra_time=extra_time)
        return edited

    def estimates_memory(self, ctx: PassContext) -> bool:
        return ctx.estimates or self.options.auto

    def _analyze(self, graph: Graph, ctx: PassContext) -> Step:
        """Dependency mode, regions and fetches, once: the planner's trial rewrites
        of copies of the graph reuse them (node names are the same there)."""
        modes = graph.dialect.dependency_modes
        runtime = ctx.runtime(graph)
        dependency = self.options.dependency or runtime.dependency or \
            graph.dialect.default_dependency(graph)
        if dependency not in modes:
            raise GraphpassError(
                f"--dependency {dependency} is not possible for {graph.format} graphs "
                f"(they support: {', '.join(modes)})"
            )
        return Step.of(ctx.analyses.regions(graph), dependency, runtime,
                       self.options.loop_trips)


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


#: How far the planner's original may be from the runtime's own before the summary says so.
MODELS_APART = 0.05


def _orders_summary(first: MemoryProfile, last: MemoryProfile) -> list[str]:
    """Where the step is a function whose caller decides TF's order
    (``RuntimeGraph.node_orders``) and the orders' estimates differ: each."""
    peaks = [p.order_peaks for p in (first, last)]
    if not all(len(p) == 2 for p in peaks) or \
            all(max(p) <= (1 + SHOWN_ABOVE) * min(p) for p in peaks):
        return []
    (own_before, called_before), (own_after, called_after) = peaks
    return [f"the step is a function, and the order TF's executor runs it in depends on "
            f"the graph that calls it, which the file does not hold: estimated "
            f"{own_before / 2**20:.1f} -> {own_after / 2**20:.1f} MiB in the function's own "
            f"order, {called_before / 2**20:.1f} -> {called_after / 2**20:.1f} MiB as a "
            f"session calls it; each figure above is the higher"]


def _measured_summary(first: StepMeasurement, last: StepMeasurement,
                      replayed: list[int] | None = None) -> list[str]:
    """The step measured before and after (``--profile``), and where a figure is the
    allocator's and runs above the allocation records, the records beside it: the
    estimate simulates the records, while the allocator counts each chunk it hands
    out whole (it splits a chunk only when it is at least twice the request), so a
    plan's measured ratio can sit above its estimate's by chunks alone.
    ``replayed``: the estimates in the order TF ran each measured step."""
    lines = [f"measured peak {first.peak_bytes / 2**20:.1f} MiB -> "
             f"{last.peak_bytes / 2**20:.1f} MiB "
             f"({last.peak_bytes / max(first.peak_bytes, 1):.2f}x, {last.source})"]
    if any(m.source == ALLOCATOR and m.peak_bytes > (1 + SHOWN_ABOVE) * m.records_peak_bytes
           for m in (first, last)):
        before, after = first.records_peak_bytes, last.records_peak_bytes
        lines.append(f"  its allocation records, which the estimate simulates: "
                     f"{before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB "
                     f"({after / max(before, 1):.2f}x); the allocator counts each chunk it "
                     f"hands out whole, splitting only one at least twice the request")
    if replayed:
        before, after = replayed
        lines.append(f"  the estimate replayed in the order TF ran each measured step: "
                     f"{before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB; TF's executor "
                     f"orders one graph differently from process to process, and the "
                     f"estimate above is of the order it models")
    return lines


def _report(entries: list[dict], skipped: list[str], dependency: str,
            peak_before: int | None, peak_after: int | None,
            auto: AutoPlan | None = None,
            deferred: tuple[int, MemoryProfile] | None = None,
            measured: list[StepMeasurement] | None = None,
            shown: list[MemoryProfile] | None = None,
            pinned: Pinned | None = None, replayed: list[int] | None = None,
            runtime: RuntimeModel | None = None, caveats: bool = True,
            before: MemoryProfile | None = None,
            extra_time: float | None = None) -> dict:
    """The pass's report; the peaks are None when not estimated
    (``PassContext.estimates``); ``before``: the original's estimate, whose values
    of unknown size it names; ``deferred``: the estimates without and with the
    updates deferred (``defer``), None if they were not; ``measured``: the step
    before and after, run (``--profile``), None if it was not; ``shown``: the
    estimates before and after of the graph the runtime runs, None where not made
    (not shown, or a target with a model of its own); ``pinned``: the updates'
    reads pinned before the backward pass (``pin``); ``replayed``: the estimates
    before and after in the order TF ran the measured steps, None where none ran;
    ``caveats``: say what the runtime might fuse otherwise (not where its exactness
    check judges the rewrite); ``extra_time``: the step time the copies add, a
    fraction of the step's (``analysis.cost.StepTime``), None where not estimated."""
    summary = auto.summary() if auto else []
    for e in entries:
        line = f"segment {e['segment']}: "
        if e["copied"]:
            size = "" if e["released_bytes"] is None else \
                f" (~{e['released_bytes'] / 2**20:.1f} MiB)"
            line += (f"{e['copied']} nodes recomputed, {len(e['released'])} tensors no longer "
                     f"kept{size}, trigger {', '.join(e['triggers'][:3])}")
        else:
            line += e["note"]
            if e.get("outputs_read"):
                read = ", ".join(e["outputs_read"][:3])
                line += f"; the backward reads only its outputs ({read})"
        summary.append(line)
        caveat = runtime.read_once_caveat(e["read_once"]) if runtime and caveats else None
        if caveat:
            summary.append(f"  {caveat}")
    if entries and not any(e["copied"] for e in entries) and \
            any(e.get("outputs_read") for e in entries):
        summary.append(
            "nothing recomputed: each matched scope is a segment of its own, and a segment's "
            "outputs stay kept (forward ops after it read them), so a segment whose "
            "internal values no gradient reads holds nothing to release; mark groups of "
            "blocks as segments (one _recompute_hint value per group, with "
            "--recompute-hints: the outputs inside a group are recomputed) or use "
            "--recompute auto, which picks such groups")
    in_turn = sum(e.get("waits_for_gradients", 0) for e in entries)
    if in_turn:
        summary.append(f"segments recomputed in turn: each waits for the weight gradients "
                       f"computed from the segment recomputed before it ({in_turn} control "
                       f"edges); TF's executor would otherwise leave them to the end of "
                       f"the backward pass, holding every segment's copies at once")
    if skipped:
        summary.append(f"{len(skipped)} marked gradient ops were skipped (only forward "
                       f"nodes are recomputed) "
                       f"(e.g. {', '.join(skipped[:3])})")
    if deferred is not None:
        summary.append(f"updates deferred to the end of the step (each gated on every "
                       f"gradient): estimated {deferred[0] / 2**20:.1f} MiB -> "
                       f"{deferred[1].peak_bytes / 2**20:.1f} MiB")
        peak_after = deferred[1].peak_bytes
    if peak_before:
        summary.append(f"estimated peak {peak_before / 2**20:.1f} MiB -> "
                       f"{peak_after / 2**20:.1f} MiB ({peak_after / peak_before:.2f}x)")
        if before is not None and before.unsized_note():
            summary.append(f"  {before.unsized_note()}")
        if runtime is not None and runtime.reads_config:
            summary.append(f"  for {runtime.title}, {runtime.config} (the target's runtime "
                           f"configuration: --onednn, --intra-op-threads; not this machine's)")
    if extra_time is not None and peak_before:
        summary.append(f"estimated step time +{extra_time:.1%} (the copies' FLOPs and bytes "
                       f"against the step's, one op at a time)")
    extra = {"auto": auto.to_json()} if auto else {}
    if runtime is not None:
        extra["runtime"] = runtime.describe()
    if pinned is not None:
        summary.extend(pinned.summary(peak_after))
        extra.update(pinned.to_json())
    if shown is not None and shown[0].model:
        first, last = shown
        # The original in its worse processes there too, as the planner's figure.
        original = first.peak_bytes if pinned is None else pinned.original(first.peak_bytes)
        summary.append(f"estimated peak on {first.model}: "
                       f"{original / 2**20:.1f} MiB -> {last.peak_bytes / 2**20:.1f} "
                       f"MiB ({last.peak_bytes / max(original, 1):.2f}x)")
        if peak_before and original and abs(peak_before / original - 1) > MODELS_APART:
            summary.append(f"  the planner's model puts the original at "
                           f"{peak_before / original:.2f}x this: size a job by these figures")
        extra["runtime_estimate"] = {"model": first.model,
                                     "peak_bytes_before": original,
                                     "peak_bytes_after": last.peak_bytes,
                                     "order_peaks_before": list(first.order_peaks),
                                     "order_peaks_after": list(last.order_peaks)}
        summary.extend(_orders_summary(first, last))
    if measured is not None:
        first, last = measured
        summary.extend(_measured_summary(first, last, replayed))
        if replayed:
            extra.update(replayed_peak_bytes_before=replayed[0],
                         replayed_peak_bytes_after=replayed[1])
        extra.update(measured_peak_bytes_before=first.peak_bytes,
                     measured_peak_bytes_after=last.peak_bytes, measured_source=last.source,
                     measured_records_peak_bytes_before=first.records_peak_bytes,
                     measured_records_peak_bytes_after=last.records_peak_bytes)
    return {
        **extra,
        "dependency": dependency,
        "deferred_updates": deferred is not None,
        "estimated_peak_bytes_before": peak_before,
        "estimated_peak_bytes_after": peak_after,
        "estimated_extra_step_time": None if extra_time is None else round(extra_time, 4),
        "unsized_tensors": [] if before is None else before.unsized,
        "segments": entries,
        "skipped_marks": skipped,
        "nodes_added": sum(e["copied"] for e in entries),
        # nodes that keep TF's view of each value and copy (see rewrite._keep_readers)
        "readers_kept": sum(e["readers_kept"] for e in entries),
        "ordering_reads": sum(e["ordering_reads"] for e in entries),
        "segment_order_edges": in_turn,
        "released_bytes": None if peak_before is None
        else sum(e["released_bytes"] for e in entries),
        "summary": summary,
    }
