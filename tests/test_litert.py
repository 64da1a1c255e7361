"""``--target litert`` (alias ``tflite``): TFLite's on-device training.

The options (data mode by default, control mode refused), the arena model against
hand-packed plans, and (slow) the real thing: a Keras 3 step rewritten, converted
with the on-device training recipe, its recomputed ops found in the converted
``train`` subgraph, trained 3 steps in ``tf.lite.Interpreter`` with bit-identical
losses and a smaller arena, and the arena model checked against the interpreter's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tf_helpers import litert_rewrites

from graphpass.analysis.arena import TENSOR_ALIGNMENT, plan_arena
from graphpass.cli import main
from graphpass.errors import GraphpassError
from graphpass.options import pipeline_options

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
MODEL = "mlp_max"  # every op of its step and gradient is a TFLite builtin
BLOCKS = "mlp_max_1/block[1-7]_"


def test_tflite_is_litert_with_data_mode():
    """``tflite`` names litert; its runtime model orders copies by data (the options
    leave the mode to the runtime where the user gives none)."""
    from graphpass.runtimes import runtime_model

    options = pipeline_options({"target": "tflite", "recompute": ["block"]})
    assert options.target == "litert"
    assert options.remat.dependency is None
    assert runtime_model("tf", options.target).dependency == "data"
    assert options.lower is not None
    assert runtime_model("tf", "tf").dependency is None


def test_control_mode_is_refused_for_litert():
    """The runtime model refuses it (``TFLiteModel.refuses_dependency``) before the
    pass edits anything, naming the mode that works (the CLI prints it as one line
    and writes nothing, as every ``GraphpassError``)."""
    import graphpass

    graph = graphpass.load(DATA / "mlp_sgd.meta")
    untouched = graph.copy()
    with pytest.raises(GraphpassError, match=r"--dependency control cannot survive --target "
                       r"litert: TFLite's converter drops control edges .* use --dependency "
                       r"data"):
        graphpass.run_passes(graph, {"target": "litert", "recompute": ["block"],
                                     "dependency": "control"})
    assert list(graph) == list(untouched)
    done = graphpass.run_passes(graph, {"target": "litert", "recompute": ["block"]})[0]
    assert done.changed and done.report["dependency"] == "data"


def test_litert_needs_a_signature(tmp_path, capsys):
    """TFLite converts a SavedModel's signatures: a TF1 graph is refused before any pass."""
    status = main(["rewrite", str(DATA / "mlp_sgd.meta"), "-o", str(tmp_path / "out.meta"),
                   "--target", "litert"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "needs a TF2 SavedModel" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out.meta").exists()


def test_arena_reuses_the_tightest_gap_of_dead_tensors():
    """x (input, kept) at 0; a (the largest) after it; b while a still lives (a's
    last reader writes b) after a; c, an output, fits in a's place once a is dead."""
    ops = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"])]
    plan = plan_arena(ops, ["x"], ["c"], {"x": 64, "a": 128, "b": 64, "c": 64})
    offsets = {t: p.offset for t, p in plan.placements.items()}
    assert offsets == {"x": 0, "a": 64, "b": 192, "c": 64}
    assert plan.size_bytes == 256


def test_arena_aligns_offsets_and_counts_temporaries():
    """Every offset is a multiple of the tensor alignment; a kernel's scratch tensor
    lives at its op only, beside that op's inputs and outputs, and (the largest) is
    placed before them."""
    ops = [(["x"], ["a"]), (["a"], ["b"])]
    plan = plan_arena(ops, ["x"], ["b"], {"x": 4, "a": 4, "b": 4}, {1: [100]})
    assert all(p.offset % TENSOR_ALIGNMENT == 0 for p in plan.placements.values())
    scratch = plan.placements[("temporary", 1, 0)]
    assert (scratch.first, scratch.last) == (1, 1)
    offsets = {t: p.offset for t, p in plan.placements.items()}
    assert offsets == {"x": 0, ("temporary", 1, 0): 64, "a": 192, "b": 256}
    assert plan.size_bytes == 4 * TENSOR_ALIGNMENT + 4


def _tflite(directory: Path, weights_from: Path, onednn: str) -> dict:
    """Convert and train 3 steps in a process of its own (``keras3_models tflite``)."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tools.fixtures.keras3_models", "tflite",
                           str(directory), MODEL, "--run", str(weights_from)],
                          cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def litert_variants(tmp_path_factory):
    """The MLP exported for on-device training, rewritten by auto and by the block
    regex for --target litert, each with its remat report."""
    from tools.fixtures import keras3_models

    work = tmp_path_factory.mktemp("litert")
    source = keras3_models.export(work / "original", MODEL, "sgd", on_device=True)
    return litert_rewrites(source, work, {"auto": ["--recompute", "auto"],
                                          "regex": ["--recompute", BLOCKS]}, target="tflite")


@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"])
def test_rewritten_step_trains_exactly_in_the_interpreter_with_a_smaller_arena(
        litert_variants, onednn):
    """Copies survive conversion (more ops in the train subgraph, more products
    among them), the interpreter's losses are bit for bit the original's, and
    auto's arena, measured in the interpreter, is smaller."""
    source = litert_variants["original"][0]
    runs = {name: _tflite(path, source, onednn) for name, (path, _) in litert_variants.items()}
    base = runs["original"]
    for name in ("auto", "regex"):
        report = litert_variants[name][1]
        assert report["litert"]["train_ops"] == runs[name]["train_ops"] > base["train_ops"]
        assert report["litert"]["select_tf_ops"] == []

        def products(counts):
            return counts.get("BATCH_MATMUL", 0) + counts.get("FULLY_CONNECTED", 0)

        assert products(runs[name]["op_counts"]) > products(base["op_counts"])
        assert runs[name]["losses"] == base["losses"], (name, runs[name], base)
    assert runs["auto"]["arena_bytes"] < base["arena_bytes"]


@pytest.mark.slow
def test_arena_model_matches_the_interpreter(litert_variants):
    """The arena model on the converted model's op order is within 10% of the
    interpreter's arena (it does not see every kernel's scratch tensors), and the
    planner's estimate on the graph, before conversion, within 25%."""
    source = litert_variants["original"][0]
    runs = {name: _tflite(path, source, "0") for name, (path, _) in litert_variants.items()}
    for name, run in runs.items():
        assert abs(run["planned_arena_bytes"] - run["arena_bytes"]) <= 0.1 * run["arena_bytes"]
        report = litert_variants[name][1]
        if report is not None:
            remat = next(p for p in report["passes"] if p["name"] == "remat")["report"]
            for estimate, measured in ((remat["estimated_peak_bytes_before"], "original"),
                                       (remat["estimated_peak_bytes_after"], name)):
                actual = runs[measured]["arena_bytes"]
                assert abs(estimate - actual) <= 0.25 * actual, (name, estimate, actual)


@pytest.mark.slow
def test_budget_is_planned_on_the_arena(litert_variants, tmp_path):
    """``--memory-budget`` for litert is met by the arena estimate, with no allocator
    headroom taken off (a static arena is what it is planned to be)."""
    source = litert_variants["original"][0]
    report = tmp_path / "report.json"
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out"), "--quiet", "--target",
                 "litert", "--recompute", "auto", "--memory-budget", "0.95x",
                 "--report", str(report)]) == 0
    remat = json.loads(report.read_text())["passes"][0]["report"]
    auto = remat["auto"]
    assert auto["budget_met"] and auto["planned_budget_bytes"] == auto["budget_bytes"]
    assert remat["estimated_peak_bytes_after"] <= 0.95 * remat["estimated_peak_bytes_before"]
