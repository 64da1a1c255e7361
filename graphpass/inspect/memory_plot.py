"""A picture of what a rewrite did to memory: live bytes along the training step.

One chart holds a line per graph (the original and the rewritten): at each
computed node of the step's schedule, the estimated live bytes (the simulation
of ``graphpass.analysis.memory``: the runtime's order, buffer forwarding,
aliasing, folded constants). Each line's peak is marked with its value and the
op where it happens, the backward pass is shaded, and a measured peak
(``graphpass verify``) is drawn as a dotted level beside its estimate. Where a
graph's step is estimated higher with every optimizer update held to the end of
the step (TF's executor runs it so in some processes: ``passes/remat/pin``, the
figure ``rewrite`` gives as the original's), that schedule is drawn dashed beside
it, with its peak. Verify
measures the kernels' allocations, which leave out the fed values the estimate
counts (TF holds them over the whole step), so the level adds them back.

The SVG is deterministic, so a dump of the same input is byte-identical: the
figure uses matplotlib's non-interactive Agg canvas, a fixed ``svg.hashsalt``
(element ids), no date in the metadata, text kept as text (``svg.fonttype``
none, so labels are searchable) and a fixed font family.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graphpass.analysis.estimate import step_profile
from graphpass.analysis.memory import format_bytes
from graphpass.analysis.runtime_memory import follow_runtime_order, runtime_view
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph
from graphpass.options import RegionOptions, RuntimeConfig
from graphpass.runtimes import RuntimeModel, runtime_for

#: matplotlib settings that make the SVG the same bytes on every run.
_DETERMINISTIC_SVG = {
    "svg.hashsalt": "graphpass",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
}
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


@dataclass(frozen=True)
class MemoryTimeline:
    """One graph's step: ``(node, live bytes)`` in schedule order, where its backward
    pass starts (an index into ``points``, None without one) and, when a run
    measured it, the step's measured peak: the kernels' allocations plus the
    ``fed_bytes`` the estimate counts in every point."""

    label: str
    points: list[tuple[str, int]]
    backward_start: int | None
    measured_peak_bytes: int | None = None
    fed_bytes: int = 0
    #: The step with every update held to the end, where that peaks higher.
    held_points: list[tuple[str, int]] | None = None

    @property
    def held_peak_bytes(self) -> int | None:
        return max(live for _, live in self.held_points) if self.held_points else None

    @property
    def peak(self) -> tuple[int, str, int]:
        """``(index, node, bytes)`` of the first highest point."""
        index = max(range(len(self.points)), key=lambda i: (self.points[i][1], -i))
        return index, *self.points[index]


def step_timeline(graph: Graph, label: str, regions: RegionOptions | None = None,
                  measured_peak_bytes: int | None = None,
                  batch_size: int | None = None, loop_trips: int | None = None,
                  runtime: RuntimeModel | None = None) -> MemoryTimeline:
    """The estimated live bytes of ``graph``'s training step, node by node, on
    ``runtime`` (default: the format's runtime under the default configuration).

    The step is what region analysis finds (with the user's overrides); a graph
    without one is the caller's error, said in one line. ``batch_size`` stands
    in for unknown batch dimensions (else their tensors count as zero bytes),
    ``loop_trips`` for the trip count of loops the graph does not fix.
    """
    from graphpass.analysis.manager import AnalysisManager
    from graphpass.analysis.regions import BACKWARD

    try:
        step = AnalysisManager(regions).regions(graph)
    except GraphpassError as exc:
        raise GraphpassError(f"no memory plot for {label}: it needs the training step "
                             f"({exc})") from None
    runtime = runtime or runtime_for(graph)
    # The order of the graph the runtime runs, as the remat pass estimates it.
    runtime = follow_runtime_order(graph, runtime_view(graph, step.fetches, runtime), runtime)
    profile = step_profile(graph, step.fetches, batch_size, loop_trips, runtime)
    points = profile.timeline
    if not points:
        raise GraphpassError(f"no memory plot for {label}: its training step computes nothing")
    backward = [i for i, (name, _) in enumerate(points) if step.label(name) == BACKWARD]
    if measured_peak_bytes is not None:
        measured_peak_bytes += profile.fed_bytes
    return MemoryTimeline(label, points, backward[0] if backward else None,
                          measured_peak_bytes, profile.fed_bytes,
                          _held_mode(graph, step, profile, batch_size, loop_trips, runtime))


def _held_mode(graph: Graph, regions, profile, batch_size: int | None,
               loop_trips: int | None, runtime: RuntimeModel) -> list[tuple[str, int]] | None:
    """The step's schedule with every update held to the end of the step, where it
    is the original's figure in ``rewrite``'s summary (``pin.worst_case``, where
    ``pin.held_counts``); None where it is not, or the updates cannot be held."""
    from graphpass.passes.remat.pin import held_counts, held_is_higher, held_updates_peak
    from graphpass.passes.remat.rewrite import Step
    from graphpass.passes.remat.trials import step_estimator

    if not held_counts(graph) or not runtime.holds_updates:
        return None
    step = Step.of(regions, "control", runtime, loop_trips)
    held = held_updates_peak(graph, step, batch_size, step_estimator(step))
    return held.timeline if held_is_higher(profile.peak_bytes, held) else None


def write_memory_plot(timelines: list[MemoryTimeline], path: Path, title: str) -> Path:
    """Draw ``timelines`` on one chart and write it to ``path`` as SVG (atomically)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from graphpass.formats.files import atomic_output

    path = Path(path)
    with matplotlib.rc_context(_DETERMINISTIC_SVG):
        figure = Figure(figsize=(9, 4.8))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        scale, unit = _unit(timelines)
        _shade_backward(axes, timelines)
        for k, timeline in enumerate(timelines):
            _draw(axes, timeline, k, scale)
        top = max(max(t.peak[2], t.measured_peak_bytes or 0, t.held_peak_bytes or 0)
                  for t in timelines) / scale
        axes.set_ylim(0, top * (1.25 + 0.1 * len(timelines)) or 1)
        axes.set_xlim(0, max(len(t.points) for t in timelines) - 1 or 1)
        axes.set_xlabel("position in the step's schedule (computed ops, in execution order)")
        axes.set_ylabel(f"live bytes ({unit})")
        axes.set_title(title)
        axes.legend(loc="upper left", frameon=False)
        figure.tight_layout()
        with atomic_output(path) as tmp:
            figure.savefig(tmp, format="svg", metadata={"Date": None})
    return path


def peak_label(timeline: MemoryTimeline) -> str:
    """The text that marks a line's peak: value and op."""
    _, node, peak = timeline.peak
    return f"{timeline.label} peak {format_bytes(peak)} at {node}"


def measured_label(timeline: MemoryTimeline) -> str:
    fed = f" (fed inputs {format_bytes(timeline.fed_bytes)} included)" \
        if timeline.fed_bytes else ""
    return f"{timeline.label} measured peak {format_bytes(timeline.measured_peak_bytes)}{fed}"


def held_label(timeline: MemoryTimeline) -> str:
    return (f"{timeline.label}, every update held to the end of the step (TF's executor "
            f"in some processes): peak {format_bytes(timeline.held_peak_bytes)}")


def _unit(timelines: list[MemoryTimeline]) -> tuple[int, str]:
    """MiB, or KiB when every peak is below one MiB (small test graphs)."""
    if max(t.peak[2] for t in timelines) >= 2**20:
        return 2**20, "MiB"
    return 2**10, "KiB"


def _shade_backward(axes, timelines: list[MemoryTimeline]) -> None:
    """Shade the first graph's backward pass; mark another graph's start if it differs."""
    starts = [(t, t.backward_start) for t in timelines if t.backward_start is not None]
    if not starts:
        return
    first, start = starts[0]
    end = max(len(t.points) for t in timelines) - 1
    axes.axvspan(start, end, color="#000000", alpha=0.07, linewidth=0,
                 label=f"backward pass ({first.label})")
    for timeline, other in starts[1:]:
        if other != start:
            axes.axvline(other, color="#555555", linestyle="--", linewidth=0.8,
                         label=f"backward pass starts ({timeline.label})")


def _draw(axes, timeline: MemoryTimeline, k: int, scale: int) -> None:
    """The line, its peak (dot and an arrowed label) and the measured level, if any."""
    colour = _COLOURS[k % len(_COLOURS)]
    values = [live / scale for _, live in timeline.points]
    axes.plot(range(len(values)), values, color=colour, linewidth=1.2,
              label=f"{timeline.label} (estimate)")
    index, _, peak = timeline.peak
    axes.plot([index], [peak / scale], marker="o", color=colour)
    axes.annotate(peak_label(timeline), xy=(index, peak / scale),
                  xytext=(0.99, 0.97 - 0.07 * k), textcoords="axes fraction",
                  ha="right", va="top", color=colour,
                  arrowprops={"arrowstyle": "->", "color": colour, "linewidth": 0.8})
    if timeline.measured_peak_bytes is not None:
        axes.axhline(timeline.measured_peak_bytes / scale, color=colour, linestyle=":",
                     linewidth=1.2, label=measured_label(timeline))
    if timeline.held_points:
        held = [live / scale for _, live in timeline.held_points]
        axes.plot(range(len(held)), held, color=colour, linestyle="--", linewidth=1.0,
                  label=held_label(timeline))


def write_step_plot(graphs: list[tuple[str, Graph, int | None]], path: Path, title: str,
                    regions: RegionOptions | None = None, batch_size: int | None = None,
                    loop_trips: int | None = None,
                    config: RuntimeConfig | None = None) -> Path:
    """``(label, graph, measured peak or None)`` per line: estimate each step on its
    format's runtime under ``config`` (default: the documented one) and draw."""
    timelines = [step_timeline(graph, label, regions, measured, batch_size, loop_trips,
                               runtime_for(graph, config=config))
                 for label, graph, measured in graphs]
    return write_memory_plot(timelines, path, title)
