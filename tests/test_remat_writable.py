"""The automatic planner plans only what the rewrite can write for the target
(#45): in data mode (onnxruntime, TFLite) a segment whose copies read no float
value computed in the step cannot be ordered after its gradient, so it is never
chosen, and no message suggests an option graphpass refuses for the input and
target (``RuntimeModel.dependency_modes``).

What users have: ORT's tutorial artifacts of a ``transformers`` GPT-2
(``tools/fixtures/ort_tutorial.py``), whose embedding starts with index
arithmetic, and a Keras GRU step for ``--target litert``
(``tools/fixtures/keras3_models.py``), whose loop carries tensor lists.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ort_training_env import ARTIFACTS, run_in_env

from graphpass.analysis.forward import Unit
from graphpass.cli import main
from graphpass.passes.remat.plan import Runs, solve_budget, solve_min_peak

GPT2 = ARTIFACTS / "tutorial_gpt2" / "training_model.onnx"
ORT_ONLY = "data mode is the only one onnxruntime takes"


def _rewrite(source, target, *options: str) -> tuple[int, dict | None]:
    report = target.parent / f"{target.name}.json"
    rc = main(["rewrite", str(source), "-o", str(target), "--quiet", "--report", str(report),
               *options])
    return rc, json.loads(report.read_text()) if rc == 0 else None


def _auto(report: dict) -> dict:
    return next(p for p in report["passes"] if p["name"] == "remat")["report"]["auto"]


@pytest.mark.parametrize("policy", [["--recompute-policy", "cheap"], []],
                         ids=["cheap", "min-peak"])
def test_gpt2_artifacts_get_a_plan_without_an_unorderable_segment(tmp_path, policy):
    """Both policies exit 0 (they refused before, advising --dependency control):
    min-peak writes a plan that leaves the index Reshape of the embedding out, and
    the note says why without naming control mode, which ONNX has not; cheap
    writes what fits its time limit, or nothing and says which groups cost too
    much time (its cost rule does not reach the Reshape)."""
    target = tmp_path / "out.onnx"
    rc, report = _rewrite(GPT2, target, "--recompute", "auto", "--batch-size", "4", *policy)
    assert rc == 0 and target.exists()
    auto = _auto(report)
    notes = [n for n in auto["notes"] if n.startswith("not planned as segments")]
    assert all(ORT_ONLY in note for note in notes)
    assert "--dependency" not in json.dumps(report)
    if policy:
        assert auto["segments"] or any("groups not recomputed" in n for n in auto["notes"])
        return
    assert auto["segments"] and auto["estimated_peak_bytes"] < auto["estimated_peak_bytes_before"]
    assert len(notes) == 1, auto["notes"]


def test_gpt2_budget_that_cannot_be_met_suggests_only_accepted_options(tmp_path, capsys):
    target = tmp_path / "out.onnx"
    rc = main(["rewrite", str(GPT2), "-o", str(target), "--recompute", "auto",
               "--batch-size", "4", "--memory-budget", "0.6x"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and not target.exists()
    assert "cannot be met" in err and "--memory-budget-bytes" in err
    assert "--dependency" not in err


def _units(saved: list[int]) -> list[Unit]:
    return [Unit(i, i + 1, s, 0, 0, s, 10) for i, s in enumerate(saved)]


def test_solver_never_holds_a_run_the_rewrite_cannot_write():
    """Banning the run the unconstrained solver picks: both programs answer with
    runs that avoid it, the one they asked about is remembered, and a plan that
    meets the budget without it is still found."""
    units = _units([40, 40, 40, 40])
    free = solve_min_peak(units)
    assert free.runs
    refused = set(free.runs)
    runs = Runs(lambda first, last: (first, last) not in refused)
    planned = solve_min_peak(units, runs)
    assert not refused & set(planned.runs) and runs.banned >= refused
    assert planned.peak >= free.peak
    budget = solve_budget(units, planned.peak, quantum=1, runs=runs)
    assert budget is not None and not refused & set(budget.runs)
    assert solve_min_peak(units, Runs(lambda first, last: False)).runs == ()


@pytest.mark.slow
@pytest.mark.parametrize("policy", [["--recompute-policy", "cheap"], []],
                         ids=["cheap", "min-peak"])
def test_gpt2_plans_train_bit_for_bit_in_the_module(tmp_path, policy):
    """The written plans run 3 steps in ORT's training Module on the export batch
    with every output, gradient and parameter equal to the original's."""
    target = tmp_path / "out.onnx"
    assert _rewrite(GPT2, target, "--recompute", "auto", "--batch-size", "4", *policy)[0] == 0
    batch = np.load(GPT2.parent / "inputs.npz")
    feeds = []
    for name, key in (("input", "x"), ("labels", "target")):
        np.save(tmp_path / f"{name}.npy", batch[key])
        feeds += ["--feed", f"{name}={tmp_path / f'{name}.npy'}"]
    verify = """
import contextlib, io, json, sys
from graphpass.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["verify", *sys.argv[1:], "--json", "--quiet"])
print(json.dumps({"rc": rc, "report": json.loads(out.getvalue())}))
"""
    result = run_in_env(verify, str(GPT2), str(target), *feeds)
    report = result["report"]
    assert result["rc"] == 0 and report["verdict"] == "MATCH", report
    assert report["deterministic"] is True and len(report["steps"]) == 3
    assert "gradient gpt2.transformer.wte.weight" in report["compared"]


@pytest.fixture(scope="module")
def gru(tmp_path_factory):
    """The Keras GRU step exported for on-device training."""
    from tools.fixtures import keras3_models

    return keras3_models.export(tmp_path_factory.mktemp("gru") / "saved", "gru", "sgd",
                                on_device=True)


@pytest.mark.slow
def test_gru_for_litert_is_written_and_says_why_nothing_is_recomputed(gru, tmp_path, capsys):
    """``--target litert --recompute auto`` exits 0 (it refused before, advising
    --dependency control, which litert refuses): the loop's segments read only
    tensor lists, the note says so, the rewrite converts, and nothing suggests
    control mode."""
    rc, report = _rewrite(gru, tmp_path / "out", "--target", "litert", "--recompute", "auto")
    assert rc == 0 and (tmp_path / "out").is_dir()
    auto = _auto(report)
    notes = [n for n in auto["notes"] if n.startswith("not planned as segments")]
    assert len(notes) == 1 and "data mode is the only one litert takes" in notes[0]
    assert "gru_1/gru_1/" in notes[0]
    assert report["litert"]["train_ops"] > 0
    assert "--dependency" not in json.dumps(report)


@pytest.mark.slow
def test_gru_in_data_mode_for_tf_names_control_mode_where_tf_takes_it(gru, tmp_path):
    """The same step for TF's executor in data mode: there control mode is
    accepted, so the note names it."""
    rc, report = _rewrite(gru, tmp_path / "out", "--recompute", "auto", "--dependency", "data")
    assert rc == 0
    notes = [n for n in _auto(report)["notes"] if n.startswith("not planned as segments")]
    assert len(notes) == 1 and "--dependency control orders them" in notes[0], notes
