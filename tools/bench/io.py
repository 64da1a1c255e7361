"""Benchmark: read + write and inspect of synthetic GraphDefs of 10k, 30k, 100k nodes.

    python -m tools.bench.io [--sizes 10000,30000,100000] [--repeat 1]

The graphs: ``tools/fixtures/tf_synthetic.py``.

All sizes are measured side by side in one run (these machines are noisy);
``ratio`` is the time per node relative to the smallest size, so 1.0 means
linear growth. ``import tensorflow`` and a 1k-node warm-up happen before any
timing.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tools.fixtures.tf_synthetic import measure

ROUND_TRIP_LIMIT_S = 10.0  # the 100k-node round trip must take less (issue 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,30000,100000",
                        help="comma-separated node counts (the first is the ratio base)")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per size")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    import tensorflow  # noqa: F401  (loaded before any timing)

    rows = measure(sizes, args.repeat)
    print(f"{'nodes':>8} {'read+write s':>13} {'ratio':>6} {'inspect s':>10} {'ratio':>6}"
          f"  regions")
    for r in rows:
        print(f"{r['nodes']:>8} {r['io_s']:>13.2f} {r['io_ratio']:>6.2f} "
              f"{r['inspect_s']:>10.2f} {r['inspect_ratio']:>6.2f}  {r['regions']}")
    print("ratio = time per node relative to the first size (1.00 = linear)")
    largest = rows[-1]
    if largest["nodes"] >= 100_000 and largest["io_s"] >= ROUND_TRIP_LIMIT_S:
        print(f"FAIL: {largest['nodes']} nodes round-trip in {largest['io_s']:.1f}s "
              f"(limit {ROUND_TRIP_LIMIT_S:.0f}s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
