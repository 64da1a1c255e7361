"""``graphpass verify`` on artifact sets made as ORT's on-device training tutorial
makes them (``tools/fixtures/ort_tutorial.py``: ``additional_output_names``, so the
Module returns a tuple), trained in the training environment
(``tests/ort_training_env.py``): the outputs, gradients and parameters compared,
the original checked for determinism as TF's is, memory measured truthfully or
said to be not measured, and the eval model never needed."""

from __future__ import annotations

import json
import shutil

import pytest
from ort_training_env import ARTIFACTS, run_in_env

from graphpass.cli import main

NOT_DETERMINISTIC = "cannot verify: the original is not deterministic (first differing output: "

VERIFY = """
import contextlib, io, json, sys
from graphpass.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["verify", *sys.argv[1:]])
print(json.dumps({"rc": rc, "out": out.getvalue()}))
"""


def _verify(*args: str) -> tuple[int, str]:
    result = run_in_env(VERIFY, *args)
    return result["rc"], result["out"]


def _verify_json(*args: str) -> tuple[int, dict]:
    rc, out = _verify(*args, "--json")
    return rc, json.loads(out)


def _training_model(case: str) -> str:
    return str(ARTIFACTS / case / "training_model.onnx")


def _rewrite(case: str, tmp_path, *options: str) -> str:
    target = tmp_path / f"{case}.onnx"
    assert main(["rewrite", _training_model(case), "-o", str(target), "--quiet",
                 *options]) == 0
    return str(target)


def test_the_tutorial_artifacts_return_the_logits_too():
    """What makes them the tutorial's: the training model's outputs are the loss and
    ``output``, then the accumulators; the inputs have a dynamic batch."""
    import onnx

    for case in ("tutorial_mlp", "tutorial_cnn_dropout", "tutorial_cnn_bn", "tutorial_lstm",
                 "tutorial_gpt2"):
        model = onnx.load(_training_model(case))
        assert [o.name for o in model.graph.output][1] == "output"
        first = model.graph.input[0]
        assert first.name == "input"
        assert first.type.tensor_type.shape.dim[0].dim_param == "batch_size"


@pytest.mark.slow
def test_verify_of_a_tutorial_artifact_compares_every_output(tmp_path):
    """The Module returns ``(loss, output)``: both are compared, and each gradient
    and parameter (#45: ``np.asarray`` of the tuple was a traceback)."""
    rewritten = _rewrite("tutorial_cnn_bn", tmp_path, "--recompute", "auto",
                         "--batch-size", "64")
    rc, report = _verify_json(_training_model("tutorial_cnn_bn"), rewritten,
                              "--batch-size", "64", "--quiet")
    assert rc == 0, report
    assert report["verdict"] == "MATCH" and report["deterministic"] is True
    compared = report["compared"]
    assert compared[:2] == ["output onnx::loss::14", "output output"]
    assert "gradient conv.weight" in compared and "parameter fc.bias" in compared
    assert len(report["steps"]) == 3


@pytest.mark.slow
def test_unseeded_dropout_in_an_artifact_cannot_be_verified():
    """The original runs twice each step, as TF's does: its two runs differ, so
    nothing is compared, no MISMATCH is printed, and ``--json`` says so."""
    path = _training_model("tutorial_cnn_dropout")
    rc, out = _verify(path, path, "--batch-size", "4")
    assert rc == 1 and "MISMATCH" not in out
    assert out.strip().splitlines()[-1].startswith(
        NOT_DETERMINISTIC + "output onnx::loss::8 at step 1)")
    rc, report = _verify_json(path, path, "--batch-size", "4")
    assert rc == 1
    assert report["deterministic"] is False and report["ok"] is False
    assert report["nondeterministic"] == "output onnx::loss::8 at step 1"
    assert report["steps"] == [] and report["failure"] is None


@pytest.mark.slow
def test_a_deterministic_artifact_verified_against_itself_matches():
    path = _training_model("tutorial_mlp")
    rc, report = _verify_json(path, path, "--batch-size", "4")
    assert rc == 0 and report["deterministic"] is True and report["verdict"] == "MATCH"


@pytest.mark.slow
def test_a_batch_norm_set_verifies_without_its_eval_model(tmp_path):
    """torch's training-mode BatchNorm gives an ``eval_model.onnx`` ORT cannot load;
    verify runs training steps only, and never loads it."""
    rewritten = _rewrite("tutorial_cnn_bn", tmp_path, "--recompute", "auto",
                         "--batch-size", "64")
    load_eval = """
import json, sys
import onnxruntime as ort
try:
    ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    print(json.dumps({"loads": True}))
except Exception as exc:
    print(json.dumps({"loads": False, "why": str(exc)}))
"""
    eval_model = run_in_env(load_eval, str(ARTIFACTS / "tutorial_cnn_bn" / "eval_model.onnx"))
    assert eval_model["loads"] is False and "BatchNormalization" in eval_model["why"]
    rc, out = _verify(_training_model("tutorial_cnn_bn"), rewritten, "--batch-size", "64")
    assert rc == 0 and out.strip().endswith("MATCH"), out
    # Without any eval model beside it, too.
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("training_model.onnx", "optimizer_model.onnx", "checkpoint"):
        shutil.copy(ARTIFACTS / "tutorial_cnn_bn" / name, alone / name)
    rc, out = _verify(str(alone / "training_model.onnx"), rewritten, "--batch-size", "64")
    assert rc == 0 and out.strip().endswith("MATCH"), out


@pytest.mark.slow
def test_memory_of_an_unchanged_rewrite_is_the_same_or_not_measured(tmp_path):
    """An LSTM whose rewrite is its original: each model is measured in a process of
    its own with ORT's arena off, so every step is measured and the ratio is 1; at
    the export batch the steps are too small for the resident set to resolve, and
    they are "not measured", never 0 B and never a ratio."""
    rewritten = _rewrite("tutorial_lstm", tmp_path, "--recompute", "auto",
                         "--batch-size", "4")
    original = _training_model("tutorial_lstm")
    rc, report = _verify_json(original, rewritten, "--batch-size", "4096", "--quiet")
    assert rc == 0, report
    peaks = [p for step in report["steps"] for p in step["peak_bytes"]]
    assert len(peaks) == 6 and all(p is not None and p >= 1 << 20 for p in peaks), peaks
    before, after = report["median_peak_bytes"]
    assert after / before == pytest.approx(1.0, abs=0.05), (before, after)
    assert report["memory_not_measured"] is None and "process of its own" in report["memory"]

    rc, out = _verify(original, rewritten, "--batch-size", "4")
    assert rc == 0, out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 3 and all(row.count("not measured") == 2 for row in rows), out
    assert " 0 B" not in out and "ratio" not in out
    assert "peak memory not measured: a step whose resident set rose less than 1 MiB" in out
