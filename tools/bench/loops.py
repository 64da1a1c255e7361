"""Estimated vs measured peak memory of training steps that run a loop.

Each model of ``tools/fixtures/loop_models.py`` is built, estimated by
``graphpass.analysis.memory`` and measured ``--runs`` times, each run in its own
process (``tools/fixtures/measure.py``: the peak of one step's allocation
records), with oneDNN on and off. The records leave out the fed arrays, so the
estimate is taken less its fed values. TF runs up to ``parallel_iterations``
iterations of a loop at once and the measured peak of one graph moves from run
to run; the table gives the lowest and highest run, and the estimate over each.

    python -m tools.bench.loops [--small] [--runs 3] [--models lstm,rnn_v1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tools.fixtures import loop_models

FETCHES = ["loss:0", "train"]
#: (seq, batch, units): the issue's LSTM size, and the tests' size.
SIZES = {"issue": (64, 32, 256), "small": (16, 8, 32)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(loop_models.BUILDERS))
    parser.add_argument("--small", action="store_true", help="test sizes (fast)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per setting")
    args = parser.parse_args(argv)
    from graphpass.analysis.memory import format_bytes, memory_profile
    from graphpass.formats.dispatch import load
    from tools.fixtures.measure import measure

    seq, batch, units = SIZES["small" if args.small else "issue"]
    print(f"seq {seq}, batch {batch}, units {units}; {args.runs} runs per setting")
    print("| model | oneDNN | estimate | measured (lowest .. highest) | "
          "est/highest | est/lowest |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = loop_models.BUILDERS[name](seq=seq, batch=batch, units=units)
            path = Path(tmp) / f"{name}.meta"
            path.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
            profile = memory_profile(load(path), FETCHES)
            estimate = profile.peak_bytes - profile.fed_bytes
            for onednn in (True, False):
                peaks = sorted(measure(path, FETCHES, onednn=onednn).peak_bytes
                               for _ in range(args.runs))
                print(f"| {name} | {'on' if onednn else 'off'} | {format_bytes(estimate)} | "
                      f"{format_bytes(peaks[0])} .. {format_bytes(peaks[-1])} | "
                      f"{estimate / peaks[-1]:.2f}x | {estimate / peaks[0]:.2f}x |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
