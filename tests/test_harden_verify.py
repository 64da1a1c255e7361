"""``verify`` on pairs that are no rewrite and its original, ``--feed`` arrays that
do not fit, and ``--target litert`` on a SavedModel TF will not load for the
converter (issue 43): each a traceback before, now exit 2 and one line, with
nothing written and the inputs unchanged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tf_helpers import listing

from graphpass.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
ARTIFACT = DATA / "ort_artifacts" / "mlp_ce" / "training_model.onnx"


def _refused(capsys, argv, directory: Path, mentions: str) -> str:
    before = listing(directory)
    files = {p: p.read_bytes() for p in Path(directory).rglob("*") if p.is_file()}
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0], lines[0]
    assert listing(directory) == before
    assert {p: p.read_bytes() for p in files} == files
    return lines[0]


@pytest.fixture
def inputs(tmp_path) -> Path:
    for name in ("mlp_sgd.meta", "control_flow.meta", "onnx_mlp.onnx", "onnx_conv_net.onnx"):
        shutil.copyfile(DATA / name, tmp_path / name)
    shutil.copyfile(ARTIFACT, tmp_path / "artifact.onnx")
    return tmp_path


@pytest.mark.parametrize("a,b,mentions", [
    ("mlp_sgd.meta", "control_flow.meta", "the original reads inputs x:0 and the rewritten "
     "flag:0, x:0"),
    ("onnx_mlp.onnx", "onnx_conv_net.onnx", "the original reads inputs x and the rewritten "
     "images, labels"),
    ("artifact.onnx", "onnx_mlp.onnx", "is an onnxruntime training artifact but"),
    ("onnx_mlp.onnx", "artifact.onnx", "is a plain ONNX model but"),
])
def test_verify_pairs_reading_other_inputs_are_refused(inputs, capsys, a, b, mentions):
    """TF's 'Cannot feed value of shape' ValueError; onnxruntime failing to load an
    artifact's training ops as a plain inference session."""
    _refused(capsys, ["verify", str(inputs / a), str(inputs / b)], inputs, mentions)


def test_verify_pair_with_an_input_of_another_shape_is_refused(inputs, capsys):
    import onnx

    model = onnx.load(inputs / "onnx_mlp.onnx")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 5
    onnx.save(model, inputs / "wider.onnx")
    _refused(capsys, ["verify", str(inputs / "onnx_mlp.onnx"), str(inputs / "wider.onnx")],
             inputs, "input x is float32 (4, 8) in the original but float32 (5, 8) in the "
             "rewritten model")


def test_verify_of_an_onnx_model_the_reader_refuses_is_its_line(inputs, capsys):
    data = (inputs / "onnx_mlp.onnx").read_bytes()
    (inputs / "cut.onnx").write_bytes(data[:300])
    _refused(capsys, ["verify", str(inputs / "cut.onnx"), str(inputs / "onnx_mlp.onnx")],
             inputs, "corrupt/truncated")


@pytest.mark.parametrize("model", ["mlp_sgd.meta", "onnx_mlp.onnx"])
@pytest.mark.parametrize("array,mentions", [
    (np.zeros((3, 5, 7), np.float32), "an array of float32 (3, 5, 7), but input x"),
    (np.zeros((2, 8), np.float32), "an array of float32 (2, 8), but input x"),
    (np.array([["a"] * 8] * 4), "an array of <U1 (4, 8), but input x"),
    (np.zeros((4, 8), np.complex128), "an array of complex128 (4, 8), but input x"),
], ids=["rank", "dim", "strings", "complex"])
def test_feeds_of_the_wrong_shape_or_dtype_are_refused(inputs, capsys, model, array, mentions):
    """TF's ValueError ('Cannot feed value of shape', 'could not convert string to
    float'); onnxruntime's InvalidArgument and RuntimeError."""
    np.save(inputs / "feed.npy", array)
    _refused(capsys, ["verify", str(inputs / model), str(inputs / model), "--feed",
                      f"x={inputs / 'feed.npy'}"], inputs, mentions)


@pytest.mark.parametrize("model", ["mlp_sgd.meta", "onnx_mlp.onnx"])
def test_feed_of_a_castable_dtype_is_given_in_the_input_dtype(inputs, capsys, model):
    """float64 and int64 arrays for a float32 input: cast, as TF would; onnxruntime
    refused them."""
    for array in (np.ones((4, 8), np.float64), np.ones((4, 8), np.int64)):
        np.save(inputs / "feed.npy", array)
        assert main(["verify", str(inputs / model), str(inputs / model), "--steps", "1",
                     "--quiet", "--feed", f"x={inputs / 'feed.npy'}"]) == 0


# -- --target litert -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tf2_step(tmp_path_factory) -> Path:
    """A TF2 SavedModel whose ``train`` signature updates one variable (exported in
    a process of its own: another test may have left this one in graph mode)."""
    from tools.fuzz_strategies import tf2_seed

    return tf2_seed(tmp_path_factory.mktemp("litert"))


def test_litert_savedmodel_tf_cannot_load_is_one_line(tf2_step, tmp_path):
    """A library function holding an op TF does not register: graphpass's reader
    passes it on untouched, TF's loader (``from_saved_model``, called outside the
    converter's guard) raised NotFoundError."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = tmp_path / "model"
    shutil.copytree(tf2_step, model)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model / "saved_model.pb").read_bytes())
    library = saved.meta_graphs[0].graph_def.library
    broken = library.function.add()
    broken.CopyFrom(library.function[0])
    broken.signature.name = "broken_function"
    broken.node_def.add(name="bad", op="NoSuchOp")
    (model / "saved_model.pb").write_bytes(saved.SerializeToString())
    before = listing(tmp_path)
    # In a process of its own, as a user runs it: in this one another test may have
    # left TF in graph mode, where its loader logs warnings of its own.
    done = subprocess.run([sys.executable, "-m", "graphpass.cli", "rewrite", str(model),
                           "-o", str(tmp_path / "out"), "--target", "litert"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines()
             if not line.startswith(("WARNING: All log messages", "I0000 "))]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("graphpass: error: TFLite's converter cannot load the "
                               "SavedModel: Op type not registered 'NoSuchOp'"), lines
    assert listing(tmp_path) == before
