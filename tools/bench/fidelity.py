"""Benchmark: how exactly a rewritten step trains, per model and variant, with
oneDNN on and off (``TF_ENABLE_ONEDNN_OPTS`` set explicitly in each child run):
max |difference| over every variable and loss after 3 steps, how many
variables differ, and the kernel-parity errors on the executed graph.

    python -m tools.bench.fidelity [--models gelu_mlp,mobilenet] [--variants auto,cheap]

The models and the matrix are the fidelity tests' (tests/fidelity_models.py,
tests/test_fidelity.py); each TF run is a child process (tests/fidelity_child.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tests.fidelity_models import MODELS, model_path  # noqa: E402
from tests.kernel_parity import (  # noqa: E402
    graph_node_names,
    parity_errors,
    run_child,
    stepped,
)
from tests.test_fidelity import CASES, VARIANTS, rewrite  # noqa: E402


def measure(model: str, variant: str, root: Path) -> dict:
    source = model_path(root / model / "original", model)
    if not source.exists():
        run_child("export", model, root / model / "original")
    rewritten = rewrite(source, root / model / variant, VARIANTS[variant](model))
    row = {}
    for onednn in (True, False):
        original, new = stepped(source, onednn), stepped(rewritten, onednn)
        diffs = {k: float(abs(original.values[k] - new.values[k]).max())
                 for k in original.values}
        row[onednn] = {"max": max(diffs.values()),
                       "differ": sum(1 for d in diffs.values() if d),
                       "total": len(diffs),
                       "parity": len(parity_errors(original.kernels, new.kernels,
                                                   graph_node_names(source),
                                                   graph_node_names(rewritten)))}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    models, variants = args.models.split(","), args.variants.split(",")
    print("| model | variant | oneDNN on: max abs diff (vars differing) | parity errors "
          "| oneDNN off: max abs diff (vars differing) | parity errors |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for model, variant in CASES:
            if model not in models or variant not in variants:
                continue
            try:
                row = measure(model, variant, Path(scratch))
            except BaseException as error:  # pytest.skip: a budget this model cannot meet
                if type(error).__name__ != "Skipped":
                    raise
                print(f"| {model} | {variant} | {error} | | | |", flush=True)
                continue
            cells = [f"{row[o]['max']:.3g} ({row[o]['differ']}/{row[o]['total']}) | "
                     f"{row[o]['parity']}" for o in (True, False)]
            print(f"| {model} | {variant} | {cells[0]} | {cells[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
