"""The arena of a Keras 3 train step converted for TensorFlow Lite, rematerialized or not.

For each model (``tools/fixtures/keras3_models.py``, size ``litert``, SGD with
momentum, exported with a ``set_weights`` signature) the SavedModel is rewritten by
the CLI with ``--target litert`` and every variant is converted with TFLite's
on-device training recipe (``from_saved_model`` with the train and set_weights
signatures, resource variables, builtin and Select TF ops), each in its own
process. Columns: ops of the converted ``train`` subgraph; the arena TFLite's
planner packs for it (``analysis.arena`` on the converted model's own op order and
tensors: it needs no interpreter, so it holds for models whose gradients are
Select TF ops, which pip's interpreters cannot run); for ``mlp_max`` (every op a
builtin), the arena measured in ``tf.lite.Interpreter`` after a step and whether
3 steps' losses are bit-identical to the original's. Ratios are to the original,
measured in the same run. Variants:

* auto  -- ``--recompute auto`` (the planner on the arena model);
* regex -- ``--recompute <the model's block scopes>``.

    python -m tools.bench.litert [--models mlp convnet transformer mlp_max]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZE = "litert"
BLOCKS = {"mlp": "mlp_1/block[1-7]_", "convnet": "convnet_1/block[1-2]_",
          "transformer": "transformer_1/block[1-2]_", "mlp_max": "mlp_max_1/block[1-7]_"}
VARIANTS = {
    "auto": lambda model: ["--recompute", "auto"],
    "regex": lambda model: ["--recompute", BLOCKS[model]],
}
#: Models every op of whose step is a TFLite builtin: run in the interpreter too.
RUNNABLE = ("mlp_max",)


def _fixture(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tools.fixtures.keras3_models", *args],
                          cwd=ROOT, check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def measured(directory: Path, model: str, source: Path) -> dict:
    run = ["--run", str(source)] if model in RUNNABLE else []
    return json.loads(_fixture("tflite", str(directory), model, "--size", SIZE, *run))


def bench(model: str, work: Path) -> list[tuple[str, dict]]:
    """Export, rewrite and measure every variant of one model."""
    source = work / f"{model}_original"
    _fixture("export", model, "sgd", str(source), "--size", SIZE, "--on-device")
    rows = [("original", measured(source, model, source))]
    for name, args in VARIANTS.items():
        target = work / f"{model}_{name}"
        subprocess.run([sys.executable, "-m", "graphpass.cli", "rewrite", str(source), "-o",
                        str(target), "--quiet", "--target", "litert", *args(model)],
                       cwd=ROOT, check=True)
        rows.append((name, measured(target, model, source)))
    return rows


def _mib(count: int) -> str:
    return f"{count / 2**20:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "convnet", "transformer",
                                                        "mlp_max"])
    args = parser.parse_args()
    print("| model | variant | train ops | arena MiB (planned) | ratio "
          "| arena MiB (interpreter) | ratio | 3 losses bit-identical |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            rows = bench(model, Path(work))
            base = rows[0][1]
            for name, result in rows:
                planned = result["planned_arena_bytes"]
                cells = [model, name, str(result["train_ops"]), _mib(planned),
                         f"{planned / base['planned_arena_bytes']:.2f}x"]
                if "arena_bytes" in result:
                    cells += [_mib(result["arena_bytes"]),
                              f"{result['arena_bytes'] / base['arena_bytes']:.2f}x",
                              "yes" if result["losses"] == base["losses"] else "NO"]
                else:
                    cells += ["-", "-", "- (Select TF ops)"]
                print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
