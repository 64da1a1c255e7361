"""Every ONNX rewrite is stepped once in the onnxruntime installed here before it
is written (``ORTModel.check_written``, ``runtimes/ort_step``): a rewrite that
does not run is refused, one line naming the node, nothing written; where
onnxruntime cannot run the input either (plain onnxruntime and a training
artifact's gradient ops), the rewrite is written and the summary says why it was
not stepped."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper
from ort_training_env import ARTIFACTS, run_in_env

from graphpass.cli import main
from graphpass.runtimes import ort_step
from tools.fixtures import onnx_models


def _rewrite(source, tmp_path, *flags):
    target, report = tmp_path / "out.onnx", tmp_path / "report.json"
    rc = main(["rewrite", str(source), "-o", str(target), "--report", str(report),
               "--recompute", "auto", *flags])
    return rc, target, report


def test_a_plain_training_step_is_stepped_before_it_is_written(tmp_path, capsys):
    source = tmp_path / "mlp.onnx"
    onnx.save(onnx_models.block_mlp().model, source)
    rc, target, report = _rewrite(source, tmp_path)
    assert rc == 0 and target.exists()
    entry = json.loads(report.read_text())["onnxruntime"]
    assert entry["stepped"] is True
    assert f"onnxruntime {entry['version']}: the rewrite loads and runs a step" in \
        capsys.readouterr().out


def test_an_artifact_plain_onnxruntime_cannot_run_is_written_unstepped_saying_why(
        tmp_path, capsys, plain_onnxruntime):
    rc, target, report = _rewrite(ARTIFACTS / "mlp_ce" / "training_model.onnx", tmp_path)
    assert rc == 0 and target.exists()
    entry = json.loads(report.read_text())["onnxruntime"]
    assert entry["stepped"] is False
    assert "cannot run the input either" in entry["reason"]
    assert "onnxruntime-training, not installed here" in entry["reason"]
    line = next(s for s in capsys.readouterr().out.splitlines() if "not stepped" in s)
    assert entry["reason"] in line


def test_a_failing_node_is_named_in_one_line(tmp_path):
    """A model that loads and fails as it runs (a Reshape of 4 values into 3)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="into three")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("shape", TensorProto.INT64, [1], [3])])
    path = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ort_step.StepFailed) as failed:
        ort_step.step_once(path)
    message = str(failed.value)
    assert message.startswith("node 'into three' (Reshape) fails: ")
    assert "\n" not in message and "onnxruntime_src" not in message


def test_labels_named_by_the_logits_rows_are_fed_as_many(tmp_path):
    """ORT's tutorial names a language model's labels by its flattened logits' rows
    (``tokens``: batch times sequence): fed one row each, its loss refuses them
    (here a product of the labels and the rows), so the check learns the rows from
    the part of the model that computes the logits."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["output"], name="flatten"),
             helper.make_node("MatMul", ["labels", "output"], ["weighed"], name="weigh"),
             helper.make_node("ReduceSum", ["weighed"], ["loss"], name="loss", keepdims=0)]
    graph = helper.make_graph(
        nodes, "tokens",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 2, 3]),
         helper.make_tensor_value_info("labels", TensorProto.FLOAT, ["tokens"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("output", TensorProto.FLOAT, ["tokens", 3])],
        initializer=[helper.make_tensor("rows", TensorProto.INT64, [2], [-1, 3])])
    path = tmp_path / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    ort_step.step_once(path)  # fed one label for two rows, "node 'weigh' (MatMul) fails"


REFUSED = """
import io, json, sys
from contextlib import redirect_stderr
from pathlib import Path
from graphpass.cli import main
from graphpass.runtimes import ort_kernels
source, out = sys.argv[1], Path(sys.argv[2])
def rewrite(name):
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["rewrite", source, "-o", str(out / name), "--recompute", "auto", "--quiet",
                   "--report", str(out / (name + ".json"))])
    return {"rc": rc, "err": err.getvalue(), "written": sorted(p.name for p in out.iterdir())}
runs = rewrite("ok.onnx")
runs = {"ok": runs, "ok_report": json.loads((out / "ok.onnx.json").read_text())}
# A runtime model that misses a fusion: the planner as it was before it knew that
# recomputing a post-norm residual leaves the original sum to its norm alone.
copy_rule = ort_kernels.fused_unlike_its_copy
ort_kernels.fused_unlike_its_copy = \
    lambda graph, name: graph.node(name).op == "LayerNormalization" and copy_rule(graph, name)
runs["missing"] = rewrite("missing.onnx")
print(json.dumps(runs))
"""


@pytest.mark.slow
def test_a_rewrite_onnxruntime_training_cannot_step_is_refused(tmp_path):
    """In the training build the artifact is stepped; the rewrite a runtime model
    blind to ``SkipLayerNormFusion`` plans (the original residual ``Add`` left to its
    norm alone, fused, its statistics unset) is refused: exit 2, one line naming
    the gradient node that stops, nothing written."""
    source = ARTIFACTS / "transformer_post_ln_ce" / "training_model.onnx"
    runs = run_in_env(REFUSED, str(source), str(tmp_path))
    assert runs["ok"]["rc"] == 0 and runs["ok_report"]["onnxruntime"]["stepped"] is True
    missing = runs["missing"]
    assert missing["rc"] == 2
    lines = missing["err"].strip().splitlines()
    assert len(lines) == 1, lines
    assert "node 'layer2/ln1_Grad/LayerNormalizationGrad_0' (LayerNormalizationGrad) fails: " \
        "Missing Input: layer2/ln1/mean" in lines[0]
    assert missing["written"] == ["ok.onnx", "ok.onnx.json"]


STEPPED = """
import json, sys
from pathlib import Path
from graphpass.cli import main
source, out = sys.argv[1], Path(sys.argv[2])
rc = main(["rewrite", source, "-o", str(out / "gpt2.onnx"), "--recompute", "auto", "--quiet",
           "--batch-size", "4", "--report", str(out / "report.json")])
print(json.dumps({"rc": rc, **json.loads((out / "report.json").read_text())["onnxruntime"]}))
"""


@pytest.mark.slow
def test_the_tutorials_gpt2_rewrite_is_stepped_before_it_is_written(tmp_path):
    """The tutorial's GPT-2 (labels one per logits row) in the training build: the
    step check feeds its labels as many as the logits have rows and steps it."""
    entry = run_in_env(STEPPED, str(ARTIFACTS / "tutorial_gpt2" / "training_model.onnx"),
                       str(tmp_path))
    assert entry["rc"] == 0 and entry["stepped"] is True, entry


def test_an_input_too_large_to_feed_is_not_stepped_and_says_so(tmp_path, capsys):
    """The check feeds zeros; an input of 16 TiB (the fuzzer's extreme dimension)
    is not allocated: the rewrite is written unstepped, with the reason."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**40, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**40, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])],
                                                "huge", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    source, target = tmp_path / "huge.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    assert main(["rewrite", str(source), "-o", str(target)]) == 0 and target.exists()
    out = capsys.readouterr().out
    assert "not stepped" in out and f"over {ort_step.MAX_FEED_BYTES >> 30} GiB" in out
