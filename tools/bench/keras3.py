"""Peak memory of one call of a Keras 3 train signature, rematerialized or not.

For each model (``tools/fixtures/keras3_models.py``, SGD with momentum) the SavedModel is
rewritten by the CLI, and every variant is measured in its own process: the CPU
allocator's peak over one call of the ``train`` signature after a warm-up call,
one inter-op thread, oneDNN on (its allocator keeps the statistics). Beside it,
"records": the peak of the kernels' allocation records over the same call run by a
TF1 session, oneDNN off (``keras3_models.measure_records_peak``: every buffer,
in the bytes asked for). Ratios are to the original, measured in the same run.
Variants:

* regex control -- ``--recompute <the model's block scopes>`` (control edges);
* regex data    -- the same with ``--dependency data``;
* auto          -- ``--recompute auto``.

    python -m tools.bench.keras3 [--size test|bench] [--models mlp transformer]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.fixtures import keras3_models

ROOT = Path(__file__).resolve().parents[2]

BLOCKS = {"mlp": "mlp_1/block[1-7]_", "convnet": "convnet_1/block[1-2]_",
          "transformer": "transformer_1/block[1-9]_"}
VARIANTS = {
    "regex control": lambda model: ["--recompute", BLOCKS[model]],
    "regex data": lambda model: ["--recompute", BLOCKS[model], "--dependency", "data"],
    "auto": lambda model: ["--recompute", "auto"],
}


def bench(model: str, size: str, work: Path) -> list[tuple[str, dict]]:
    """Export, rewrite and measure every variant of one model."""
    source = work / f"{model}_original"
    subprocess.run([sys.executable, "-m", "tools.fixtures.keras3_models", "export", model, "sgd",
                    str(source), "--size", size], cwd=ROOT, check=True, capture_output=True)
    rows = [("original", measured(source, model, size))]
    for name, args in VARIANTS.items():
        target = work / f"{model}_{name.replace(' ', '_')}"
        subprocess.run([sys.executable, "-m", "graphpass.cli", "rewrite", str(source), "-o",
                        str(target), "--quiet", *args(model)], cwd=ROOT, check=True)
        rows.append((name, measured(target, model, size)))
    return rows


def measured(directory: Path, model: str, size: str) -> dict:
    """The allocator's peak, and beside it (``records``) the allocation records' peak."""
    result = keras3_models.measure_in_subprocess(directory, model, size)
    records = keras3_models.measure_in_subprocess(directory, model, size, records=True)
    assert records["loss"] == result["loss"], (records, result)
    return {**result, "records": records["peak"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(keras3_models.SIZES), default="test")
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"],
                        choices=keras3_models.MODELS)
    args = parser.parse_args()
    print(f"peak of one train call, SGD momentum, size {args.size}, CPU")
    print(f"{'model':12s} {'variant':14s} {'peak MiB':>9s} {'peak':>6s} "
          f"{'records MiB':>12s} {'records':>8s} {'loss':>12s}")
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            rows = bench(model, args.size, Path(work))
            base = rows[0][1]
            for name, result in rows:
                print(f"{model:12s} {name:14s} {result['peak'] / 2**20:9.1f} "
                      f"{result['peak'] / base['peak']:5.2f}x "
                      f"{result['records'] / 2**20:12.1f} "
                      f"{result['records'] / base['records']:7.2f}x {result['loss']:12.8g}")


if __name__ == "__main__":
    main()
