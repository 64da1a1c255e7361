"""Remat's report: what the pass did to each segment and the figures it estimated
and measured, for ``--report`` and the summary a user reads.

The figures come in one :class:`Figures` record from ``RematPass``; the summary's
lines keep one order (the segments, the planner's figures, the runtime's own,
the measured), so a user comparing two runs reads them in the same places.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from graphpass.analysis.measured import ALLOCATOR, StepMeasurement
from graphpass.analysis.memory import MemoryProfile
from graphpass.passes.remat.pin import SHOWN_ABOVE, Pinned
from graphpass.passes.remat.verdict import AutoPlan
from graphpass.runtimes import RuntimeModel


@dataclass
class Figures:
    """One rewrite's figures, each None where not made. ``before``/``after``: the
    step's estimates (None when not estimated, ``PassContext.estimates``);
    ``profile``: the original's estimate, whose values of unknown size it names;
    ``planned_before``: the planner's own model of the original, where the
    runtime's own order of it stands for it in ``before``; ``deferred``: the
    estimates without and with the updates deferred (``defer``); ``measured``:
    the step before and after, run (``--profile``); ``shown``: the estimates
    before and after of the graph the runtime runs (not shown, or a target with
    a model of its own: None); ``replayed``: the estimates before and after in
    the order TF ran the measured steps; ``extra_time``: the step time the
    copies add, a fraction of the step's (``analysis.cost.StepTime``)."""

    before: int | None = None
    after: int | None = None
    profile: MemoryProfile | None = None
    planned_before: int | None = None
    deferred: tuple[int, MemoryProfile] | None = None
    measured: list[StepMeasurement] | None = None
    shown: list[MemoryProfile] | None = None
    replayed: list[int] | None = None
    extra_time: float | None = None


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


def remat_report(entries: list[dict], skipped: list[str], dependency: str,
                 figures: Figures | None = None, auto: AutoPlan | None = None,
                 pinned: Pinned | None = None, runtime: RuntimeModel | None = None,
                 caveats: bool = True) -> dict:
    """The pass's report. ``pinned``: the updates' reads pinned before the backward
    pass (``pin``); ``caveats``: say what the runtime might fuse otherwise (not
    where its exactness check judges the rewrite)."""
    figures = figures or Figures()
    if figures.deferred is not None:  # the step as written: its updates deferred
        figures = replace(figures, after=figures.deferred[1].peak_bytes)
    summary = (auto.summary() if auto else []) + _segment_lines(entries, skipped, runtime,
                                                                  caveats)
    summary += _planned_lines(figures, runtime)
    extra = {"auto": auto.to_json()} if auto else {}
    if runtime is not None:
        extra["runtime"] = runtime.describe()
    if pinned is not None:
        summary.extend(pinned.summary(figures.after))
        extra.update(pinned.to_json())
    if figures.shown is not None and figures.shown[0].model:
        lines, extra["runtime_estimate"] = _runtime_lines(figures, pinned)
        summary += lines
    if figures.measured is not None:
        summary += _measured_summary(*figures.measured, figures.replayed)
        extra.update(_measured_json(figures))
    return {
        **extra,
        "dependency": dependency,
        "deferred_updates": figures.deferred is not None,
        "estimated_peak_bytes_before": figures.before,
        "estimated_peak_bytes_after": figures.after,
        "estimated_extra_step_time": None if figures.extra_time is None
        else round(figures.extra_time, 4),
        "unsized_tensors": [] if figures.profile is None else figures.profile.unsized,
        "segments": entries,
        "skipped_marks": skipped,
        "nodes_added": sum(e["copied"] for e in entries),
        # nodes that keep TF's view of each value and copy (see rewrite._keep_readers)
        "readers_kept": sum(e["readers_kept"] for e in entries),
        "ordering_reads": sum(e["ordering_reads"] for e in entries),
        "segment_order_edges": sum(e.get("waits_for_gradients", 0) for e in entries),
        "released_bytes": None if figures.before is None
        else sum(e["released_bytes"] for e in entries),
        "summary": summary,
    }


def _segment_lines(entries: list[dict], skipped: list[str], runtime: RuntimeModel | None,
                   caveats: bool) -> list[str]:
    """A line per segment (and what the runtime might fuse otherwise in it), then
    what the segments as a whole did and skipped."""
    summary = []
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
    return summary


def _planned_lines(figures: Figures, runtime: RuntimeModel | None) -> list[str]:
    """The estimates the plan was made by: deferred updates, the peak before and
    after (and what the original's figure is where the runtime's own order gave
    it), the runtime configuration they are for, the step time the copies add."""
    lines = []
    before, after = figures.before, figures.after
    if figures.deferred is not None:
        lines.append(f"updates deferred to the end of the step (each gated on every "
                     f"gradient): estimated {figures.deferred[0] / 2**20:.1f} MiB -> "
                     f"{after / 2**20:.1f} MiB")
    if not before:
        return lines
    lines.append(f"estimated peak {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB "
                 f"({after / before:.2f}x)")
    if figures.profile is not None and figures.profile.unsized_note():
        lines.append(f"  {figures.profile.unsized_note()}")
    if figures.planned_before is not None and figures.shown and runtime is not None:
        lines.append(f"  the original in {figures.shown[0].model}; {runtime.hand_model}, "
                     f"which plans are weighed in, puts it at "
                     f"{figures.planned_before / 2**20:.1f} MiB and gives the rewrite's figure")
    if runtime is not None and runtime.reads_config:
        lines.append(f"  for {runtime.title}, {runtime.config} (the target's runtime "
                     f"configuration: --onednn, --intra-op-threads; not this machine's)")
    if figures.extra_time is not None:
        lines.append(f"estimated step time +{figures.extra_time:.1%} (the copies' FLOPs and "
                     f"bytes against the step's, one op at a time)")
    return lines


def _runtime_lines(figures: Figures, pinned: Pinned | None) -> tuple[list[str], dict]:
    """The estimates of the graph the runtime runs, before and after; where the
    planner's figure of the original is far from it, which to size a job by."""
    first, last = figures.shown
    # The original in its worse processes there too, as the planner's figure.
    original = first.peak_bytes if pinned is None else pinned.original(first.peak_bytes)
    lines = [f"estimated peak on {first.model}: {original / 2**20:.1f} MiB -> "
             f"{last.peak_bytes / 2**20:.1f} MiB ({last.peak_bytes / max(original, 1):.2f}x)"]
    before = figures.before
    if before and original and abs(before / original - 1) > MODELS_APART:
        lines.append(f"  the planner's model puts the original at {before / original:.2f}x "
                     f"this: size a job by these figures")
    lines += _orders_summary(first, last)
    return lines, {"model": first.model, "peak_bytes_before": original,
                   "peak_bytes_after": last.peak_bytes,
                   "order_peaks_before": list(first.order_peaks),
                   "order_peaks_after": list(last.order_peaks)}


def _measured_json(figures: Figures) -> dict:
    first, last = figures.measured
    extra = {} if not figures.replayed else {
        "replayed_peak_bytes_before": figures.replayed[0],
        "replayed_peak_bytes_after": figures.replayed[1]}
    return {**extra, "measured_peak_bytes_before": first.peak_bytes,
            "measured_peak_bytes_after": last.peak_bytes, "measured_source": last.source,
            "measured_records_peak_bytes_before": first.records_peak_bytes,
            "measured_records_peak_bytes_after": last.records_peak_bytes}
