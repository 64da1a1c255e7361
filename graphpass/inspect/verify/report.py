"""What ``graphpass verify`` was asked to do and what it found: the options, the
per-step report of both graphs, and the printed table with its verdict line.

Default tolerance is exact (``rtol = atol = 0``): the passes reorder and
recompute but must not change arithmetic. The original runs twice on the same
inputs; when its two runs differ (unseeded dropout, nondeterministic kernels),
nothing can be verified: the verdict says so and names the first differing
value (``nondeterministic``), and the rewrite is not reported as a mismatch.

Peak memory is reported only where it was measured: a step's figure is None
where the runner could not measure it, ``memory`` says what measured the
others and ``memory_not_measured`` why some were not; a graph's median and the
ratio need every step of it measured. Never a 0 B that means "not seen".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from graphpass.analysis.memory import format_bytes


@dataclass(frozen=True)
class VerifyOptions:
    """How to run the comparison; ``feeds`` maps tensor names (``x:0``) to arrays."""

    steps: int = 3
    xla: bool = False
    feeds: dict = field(default_factory=dict)
    loss: str | None = None
    train_ops: tuple[str, ...] = ()
    init: str | None = None
    rtol: float = 0.0
    atol: float = 0.0
    seed: int = 0
    tag: str | None = None
    quiet: bool = False
    signature: str | None = None
    batch_size: int | None = None
    #: onnxruntime training artifacts: the checkpoint (default: beside the original).
    checkpoint: str | None = None


@dataclass
class StepReport:
    """One step: the losses of each graph, the worst error and each graph's peak memory."""

    step: int
    losses: tuple[list[float], list[float]]
    max_abs: float
    max_rel: float
    worst: str
    peak_bytes: tuple[int | None, int | None]
    mismatches: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    format: str
    compared: list[str]
    only_original: list[str]
    only_rewritten: list[str]
    steps: list[StepReport] = field(default_factory=list)
    failure: str | None = None
    #: The first value two runs of the original differ in (``NAME at step N``).
    nondeterministic: str | None = None
    #: What measured the steps' peaks (None: nothing did).
    memory: str | None = None
    #: Why some step's peak is None (not measured).
    memory_not_measured: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.nondeterministic is None \
            and not any(s.mismatches for s in self.steps)

    @property
    def verdict(self) -> str:
        """``MATCH``, ``MISMATCH``, or why nothing could be compared."""
        if self.failure:
            return f"FAILED: {self.failure}"
        if self.nondeterministic:
            return ("cannot verify: the original is not deterministic (first differing "
                    f"output: {self.nondeterministic}); two runs of it on the same inputs "
                    "differ: seed its random ops (dropout) or compare with --rtol/--atol")
        return "MATCH" if self.ok else "MISMATCH"

    def median_peaks(self) -> tuple[int | None, int | None]:
        """Median per-step peak of each graph: single steps are noisy (thread pools);
        None unless every step of that graph was measured."""
        def median(values: list) -> int | None:
            return int(np.median(values)) if values and None not in values else None

        return (median([s.peak_bytes[0] for s in self.steps]),
                median([s.peak_bytes[1] for s in self.steps]))

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(ok=self.ok, median_peak_bytes=list(self.median_peaks()),
                    deterministic=self.nondeterministic is None, verdict=self.verdict)
        return data



def format_report(report: VerifyReport, original: str, rewritten: str,
                  options: VerifyOptions) -> str:
    """The per-step table and a verdict line."""
    what = {"tf": "variables", "onnx training": "values"}.get(report.format, "outputs")
    lines = [f"verify {original} vs {rewritten}: {report.format}, {options.steps} steps, "
             f"XLA {'on' if options.xla else 'off'}, {len(report.compared)} {what} compared, "
             f"rtol {options.rtol:g} atol {options.atol:g}"]
    if report.only_original or report.only_rewritten:
        lines.append(f"  not compared: only in original {report.only_original or '-'}; "
                     f"only in rewritten {report.only_rewritten or '-'}")
    lines.append(f"  {'step':>4}  {'loss (orig)':>14}  {'loss (rewr)':>14}  {'max abs':>9}  "
                 f"{'max rel':>9}  {'peak orig':>12}  {'peak rewr':>12}  worst")
    for s in report.steps:
        lines.append(f"  {s.step:>4}  {_first(s.losses[0]):>14}  {_first(s.losses[1]):>14}  "
                     f"{s.max_abs:>9.3g}  {s.max_rel:>9.3g}  {_peak(s.peak_bytes[0]):>12}  "
                     f"{_peak(s.peak_bytes[1]):>12}  {s.worst}")
        lines += [f"        MISMATCH {m}" for m in s.mismatches[:10]]
        if len(s.mismatches) > 10:
            lines.append(f"        ... {len(s.mismatches) - 10} more mismatches")
    lines += _memory_lines(report)
    lines.append(report.verdict)
    return "\n".join(lines)


def _memory_lines(report: VerifyReport) -> list[str]:
    """The medians and their ratio where both were measured; what measured them;
    why what was not measured was not."""
    if not report.steps:
        return []
    peaks, lines = report.median_peaks(), []
    if None not in peaks:
        ratio = f" (ratio {peaks[1] / peaks[0]:.2f})" if peaks[0] else ""
        lines.append(f"  peak memory, median over steps: original {format_bytes(peaks[0])}, "
                     f"rewritten {format_bytes(peaks[1])}{ratio}")
    elif any(p is not None for s in report.steps for p in s.peak_bytes):
        lines.append("  peak memory: no median or ratio, not every step was measured")
    if report.memory and any(p is not None for s in report.steps for p in s.peak_bytes):
        lines.append(f"  peak memory measured from: {report.memory}")
    if report.memory_not_measured:
        lines.append(f"  peak memory not measured: {report.memory_not_measured}")
    return lines


def _peak(count: int | None) -> str:
    return "not measured" if count is None else format_bytes(count)


def _first(losses: list[float]) -> str:
    return f"{losses[0]:.8g}" if losses else "-"
