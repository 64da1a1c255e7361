"""Output hashes pinned across refactorings: every input in tests/data/ and the
shipped example, rewritten under each pass combination, must give byte-identical
output (or the same exit status) as when tests/golden_hashes.json was recorded.

A deliberate change of output regenerates the file:

    python tests/test_golden.py --update

and the commit says why the bytes changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
HASHES = ROOT / "tests" / "golden_hashes.json"

#: input file -> the --recompute pattern that marks some of its forward scopes.
INPUTS = {
    "examples/mlp_train.pb": "block[1-7]/",
    "tests/data/mlp_adam.meta": "block[1-2]/",
    "tests/data/mlp_sgd.meta": "block[1-2]/",
    "tests/data/conv_bn_dropout.meta": "conv[12]/",
    "tests/data/control_flow.meta": "cond/",
    "tests/data/function_library.meta": "Square",
    "tests/data/clipped_custom_scope.meta": "tower0/block[1-2]/",
    "tests/data/onnx_mlp.onnx": "block[1-2]/",
    "tests/data/onnx_conv_net.onnx": "conv[12]/",
}


def combinations(pattern: str) -> dict[str, list[str]]:
    """Pass options by combination name."""
    return {
        "none": [],
        "remat_control": ["--recompute", pattern, "--dependency", "control"],
        "remat_data": ["--recompute", pattern, "--dependency", "data"],
        "remat_auto": ["--recompute", "auto"],
        "stale_tf": ["--drop-stale", "0"],
        "stale_xla": ["--drop-stale", "0", "--target", "xla"],
        "remat_stale": ["--recompute", pattern, "--drop-stale", "0"],
        "xla": ["--target", "xla"],
    }


def cases() -> list[tuple[str, str, list[str]]]:
    return [(source, combo, options) for source, pattern in INPUTS.items()
            for combo, options in combinations(pattern).items()]


def outcome(source: str, options: list[str], tmp: Path) -> str:
    """``sha256:<hex>`` of the written output, ``exit <status>`` when rewrite refuses,
    or ``raises <type>`` for an internal error (pinned too, so fixing one is visible)."""
    from graphpass.cli import main

    target = tmp / ("out" + Path(source).suffix)
    target.unlink(missing_ok=True)
    try:
        status = main(["rewrite", str(ROOT / source), "-o", str(target), "--quiet", *options])
    except Exception as exc:  # noqa: BLE001 - the pinned outcome of a known internal error
        return f"raises {type(exc).__name__}"
    if status != 0:
        return f"exit {status}"
    return "sha256:" + hashlib.sha256(target.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads(HASHES.read_text())


@pytest.mark.parametrize("source,combo,options", cases(),
                         ids=[f"{Path(s).stem}-{c}" for s, c, _ in cases()])
def test_output_is_pinned(source, combo, options, pinned, tmp_path, capsys):
    assert outcome(source, options, tmp_path) == pinned[f"{source} {combo}"]


def test_every_case_is_pinned(pinned):
    assert sorted(pinned) == sorted(f"{s} {c}" for s, c, _ in cases())


@pytest.mark.slow
def test_output_does_not_depend_on_the_hash_seed(tmp_path):
    """Python randomises str hashing per process: a rewrite that iterated a set of
    names would write differently in another process. Every combination on the
    input with the most of them (remat, stale, BatchNorm updates), in two processes."""
    import os
    import subprocess

    source = "tests/data/conv_bn_dropout.meta"
    script = ("import sys; from pathlib import Path; from tests.test_golden import "
              "combinations, outcome, INPUTS; "
              f"print([outcome({source!r}, o, Path(sys.argv[1])) "
              f"for o in combinations(INPUTS[{source!r}]).values()])")
    printed = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        printed.append(done.stdout.strip().splitlines()[-1])
    assert printed[0] == printed[1]


def _update() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        hashes = {f"{s} {c}": outcome(s, o, Path(tmp)) for s, c, o in cases()}
    HASHES.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(hashes)} hashes to {HASHES.relative_to(ROOT)}")


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    _update()
