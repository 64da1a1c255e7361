"""Tensors the memory estimate cannot size are named, never silently 0 B: the
simulation lists them, remat's summary and report name them; and onnxruntime's
training ops (``ConcatTraining``, ``LSTMTraining``) are sized, their batch too
where it is not the first dimension."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import helper
from ort_training_env import ARTIFACTS, run_in_env

import graphpass
from graphpass.analysis.memory import memory_profile
from graphpass.cli import main
from graphpass.formats.onnx_io import graph_from_model
from tools.fixtures import onnx_models
from tools.fixtures.ort_tutorial import training_op_sizes


def _with_unknown_op(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with an op of a domain no inference knows between the last
    block's output and the loss's ``square``: it, the square and the loss have
    no shape (the gradients do: they are written from the block's output)."""
    unknown = onnx.ModelProto()
    unknown.CopyFrom(model)
    square = next(n for n in unknown.graph.node if n.name == "square")
    unknown.graph.node.insert(list(unknown.graph.node).index(square), helper.make_node(
        "Mystery", [square.input[0]], ["mystery_out"], name="mystery", domain="graphpass.test"))
    square.input[:] = ["mystery_out", "mystery_out"]
    unknown.opset_import.append(helper.make_opsetid("graphpass.test", 1))
    return unknown


def test_tensors_of_unknown_shape_are_named_in_the_summary_and_report(tmp_path, capsys):
    source, report = tmp_path / "step.onnx", tmp_path / "report.json"
    onnx.save(_with_unknown_op(onnx_models.block_mlp(batch=16, width=32).model), source)
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.onnx"), "--loss", "loss",
                 "--recompute-hints", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    remat = next(p for p in json.loads(report.read_text())["passes"] if p["name"] == "remat")
    unsized = remat["report"]["unsized_tensors"]
    assert unsized[0] == "mystery_out" and "square" in unsized, unsized
    assert f"{len(unsized)} tensors of unknown size counted as 0 B in the estimate: " \
        f"mystery_out, " in out, out


def test_a_fully_sized_step_names_nothing():
    graph = graph_from_model(onnx_models.block_mlp(batch=16, width=32).model)
    profile = memory_profile(graph, [o.name for o in graph.format_state.outputs])
    assert profile.peak_bytes > 0 and profile.unsized == []
    assert profile.unsized_note() is None


def test_the_lstm_artifacts_training_ops_are_sized():
    """With this environment's onnxruntime: the gates ``iofc`` are four times the
    cell states, both ``[seq, 1, batch, hidden]`` with the batch filled in."""
    graph = graphpass.load(ARTIFACTS / "tutorial_lstm" / "training_model.onnx")
    sizes = training_op_sizes(graph, 4096)
    assert sizes["all_cell_states"] == 6 * 4096 * 16 * 4
    assert sizes["iofc"] == 4 * sizes["all_cell_states"]
    assert sizes["/lstm/ConstantOfShape_output_0"] == 4096 * 16 * 4
    assert all(sizes.values()), {k: v for k, v in sizes.items() if not v}
    profile = memory_profile(graph, [o.name for o in graph.format_state.outputs], 4096)
    assert profile.unsized == []


SIZES = """
import json, sys
from pathlib import Path
import graphpass
from tools.fixtures.ort_tutorial import generate, training_op_sizes
directory = generate("tutorial_lstm", Path(sys.argv[1]))
graph = graphpass.load(directory / "training_model.onnx")
report = graphpass.run_passes(graph, {"recompute": ["auto"], "batch_size": 4096})[0].report
print(json.dumps({"sizes": training_op_sizes(graph, 4096),
                  "unsized": report["unsized_tensors"]}))
"""


@pytest.mark.slow
def test_an_lstm_built_as_the_tutorial_does_has_its_training_ops_sized(tmp_path):
    """Built and inferred in the training environment (onnxruntime-training's own
    symbolic inference): every training op's output is sized at the batch, and
    remat's report names no unsized tensor."""
    found = run_in_env(SIZES, str(tmp_path))
    sizes = found["sizes"]
    assert sizes["all_cell_states"] == 6 * 4096 * 16 * 4
    assert sizes["iofc"] == 4 * sizes["all_cell_states"]
    concat = [v for k, v in sizes.items() if k.startswith("per_input_length")]
    assert len(concat) == 6 and all(concat)
    assert all(sizes.values()), {k: v for k, v in sizes.items() if not v}
    assert found["unsized"] == []
