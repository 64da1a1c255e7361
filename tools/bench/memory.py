"""Estimated vs measured peak memory of one training step, before and after remat.

For each model: the original training graph and the graph rewritten with
``--recompute REGEX`` (control mode, hand-written block marks), each
estimated by ``graphpass.analysis.memory`` (the simulation of TF's executor
the planner plans with) and measured in its own process by
``tools/fixtures/measure.py`` (peak of the step's allocation records; the CPU
allocator's own peak beside it where oneDNN keeps statistics). Like is compared
with like: the records leave out the fed arrays, so "est/meas" is the estimate
less its fed values over the records' peak; the allocator counts them, so
"est/alloc" is the whole estimate over the allocator's peak.

Models: ``tools/fixtures/memory_models.py`` (``--small`` runs the test sizes).

    python -m tools.bench.memory [--models mlp,resnet50] [--small] [--onednn 0|1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tools.fixtures.memory_models import FETCHES, MODELS, estimate, write_variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--small", action="store_true", help="test sizes (fast)")
    parser.add_argument("--onednn", choices=("0", "1"),
                        help="TF_ENABLE_ONEDNN_OPTS for the measuring processes")
    args = parser.parse_args(argv)
    from tools.fixtures.measure import measure

    onednn = None if args.onednn is None else args.onednn == "1"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for variant, path in write_variants(name, args.small, Path(tmp)).items():
                profile = estimate(path)
                measured = measure(path, FETCHES, onednn=onednn, steps=1)
                rows.append((name, variant, profile, measured))
                print_row(*rows[-1], header=len(rows) == 1)
    worst = max(abs((r[2].peak_bytes - r[2].fed_bytes) / r[3].peak_bytes - 1)
                for r in rows if r[3].peak_bytes)
    print(f"largest |estimate/measured - 1|: {worst:.1%}")
    return 0


def print_row(name, variant, profile, measured, header=False) -> None:
    if header:
        print(f"{'model':13s} {'variant':8s} {'estimated':>10s} {'fed':>8s} {'measured':>10s} "
              f"{'est/meas':>8s} {'allocator':>10s} {'est/alloc':>9s}  estimated peak at")
    allocator, peak = measured.allocator_peak_bytes, measured.peak_bytes
    estimated = profile.peak_bytes
    shown = f"{allocator / 2**20:8.1f}Mi {estimated / allocator:8.2f}x" \
        if allocator is not None else f"{'n/a':>10s} {'':9s}"
    print(f"{name:13s} {variant:8s} {estimated / 2**20:8.1f}Mi "
          f"{profile.fed_bytes / 2**20:6.1f}Mi {peak / 2**20:8.1f}Mi "
          f"{(estimated - profile.fed_bytes) / peak:7.2f}x {shown}  {profile.peak_node}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
