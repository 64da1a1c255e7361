"""Peak memory of onnxruntime training steps for ``verify``, each model measured
in a process of its own.

In the verifying process the figures would be false: ORT's CPU arena keeps what
the first step took (later steps read 0 B), and the models share one heap, so
one model's step reuses memory another freed. Here each training model runs in a fresh process
(``python -m graphpass.inspect.verify.ort_memory SPEC``) with the arena off, so
every tensor is its own allocation, freed when ORT's plan says it dies, and
glibc's mmap threshold fixed at 64 KiB, so a freed buffer leaves the resident
set. After a warm-up call (gradients reset, no update) it trains on verify's
batches; a step's peak is the rise of the resident set during the training
model's call (``VmHWM``, reset before the call, minus ``VmRSS`` before it).
The optimizer's step, the same model for both, is not measured.

The resident set resolves only large steps: page granularity and the heap's
reuse of freed buffers under the threshold decide a rise under
:data:`RESOLVED_BYTES`, so such a step is not measured (None, with the reason
in the report), as is every step where ``/proc`` cannot say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Below this rise a step's figure is noise: the same small step reads from
#: nothing to twice its size from run to run.
RESOLVED_BYTES = 1 << 20
MMAP_THRESHOLD_BYTES = 64 * 1024
SOURCE = ("resident set of the training model's call, each model in a process of its "
          "own, ORT's CPU arena off")


@dataclass(frozen=True)
class Artifacts:
    """What trains a training model besides it: the checkpoint and optimizer model."""

    checkpoint: Path
    optimizer: Path


def ort_reason(exc: Exception) -> str:
    """The useful last clause of one of onnxruntime's error messages."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[-1].rpartition(" was false. ")[2]


def fill_peaks(report, paths: tuple[Path, Path], artifacts: Artifacts,
               batches: list[list[np.ndarray]]) -> None:
    """Set each of ``report``'s steps' peaks (original, rewritten), measured on
    ``batches`` (one per step, in the models' input order), and say how, or why not."""
    report.memory = SOURCE
    with tempfile.TemporaryDirectory(prefix="graphpass-verify-") as work:
        feeds = Path(work) / "batches.npz"
        np.savez(feeds, **{f"s{i}_{j}": value for i, batch in enumerate(batches)
                           for j, value in enumerate(batch)})
        measured = []
        for path in paths:
            spec = {"model": str(path), "checkpoint": str(artifacts.checkpoint),
                    "optimizer": str(artifacts.optimizer), "batches": str(feeds),
                    "steps": len(batches), "inputs": len(batches[0])}
            peaks, failure = _run_worker(spec)
            if failure:
                report.memory_not_measured = f"measuring {path.name} failed: {failure}"
            measured.append(peaks)
    small = False
    for i, step in enumerate(report.steps):
        pair = [m[i] if i < len(m) else None for m in measured]
        small = small or any(p is not None and p < RESOLVED_BYTES for p in pair)
        step.peak_bytes = tuple(p if p is not None and p >= RESOLVED_BYTES else None
                                for p in pair)
    if small and report.memory_not_measured is None:
        report.memory_not_measured = (
            f"a step whose resident set rose less than {RESOLVED_BYTES >> 20} MiB is not "
            "resolved (page granularity, the heap's reuse of small freed buffers); a "
            "larger --batch-size measures it")
    elif report.memory_not_measured is None and \
            any(None in s.peak_bytes for s in report.steps):
        report.memory_not_measured = ("this system does not let a process read or reset its "
                                      "resident-set peak (/proc/self/status, clear_refs)")


def _run_worker(spec: dict) -> tuple[list, str | None]:
    """This module's :func:`main` on ``spec`` in a fresh process: the peaks, and why
    there are none."""
    root = str(Path(__file__).resolve().parents[3])  # the graphpass running now
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD_BYTES),
               PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        done = subprocess.run([sys.executable, "-m", __name__, json.dumps(spec)], env=env,
                              capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return [], lines[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])["peaks"], None


def measure(spec: dict) -> list[int | None]:
    """In the measuring process: each step's peak bytes (module docstring)."""
    import onnxruntime as ort
    from onnxruntime.training import api

    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    state = api.CheckpointState.load_checkpoint(spec["checkpoint"])
    module = api.Module(spec["model"], state, None, session_options=options)
    optimizer = api.Optimizer(spec["optimizer"], module)
    module.train()
    with np.load(spec["batches"]) as data:
        batches = [[data[f"s{i}_{j}"] for j in range(spec["inputs"])]
                   for i in range(spec["steps"])]
    module(*batches[0])  # warm-up: kernels, first-run caches; no update
    module.lazy_reset_grad()
    peaks = []
    for batch in batches:
        before = _status_kib("VmRSS")
        reset = _reset_high_water_mark()
        module(*batch)
        peak = _status_kib("VmHWM")
        known = reset and None not in (peak, before)
        peaks.append((peak - before) * 1024 if known else None)
        optimizer.step()
        module.lazy_reset_grad()
    return peaks


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> bool:
    """Whether the resident set's high-water mark could be reset to its current size."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    print(json.dumps({"peaks": measure(spec)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
