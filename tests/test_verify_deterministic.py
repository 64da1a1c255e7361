"""``graphpass verify`` checks the original first: it runs it twice on the same
inputs, and when the two runs differ (unseeded dropout) it says the original is
not deterministic, names the first differing value, exits 1 and reports no
MISMATCH for the rewrite. A deterministic original verifies as before."""

from __future__ import annotations

import json

import pytest

from graphpass.cli import main
from tools.fixtures import tf_models

NOT_DETERMINISTIC = "cannot verify: the original is not deterministic (first differing output: "


def _unseeded_dropout_meta(path, seed: int | None = None):
    """A TF1 training graph whose dropout has no seed (``seed`` seeds it)."""
    tf = tf_models.import_tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 4], initializer=tf1.ones_initializer())
        h = tf.nn.dropout(tf.matmul(x, w), rate=0.5, seed=seed)
        loss = tf.reduce_mean(h * h, name="loss")
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step,
                                                                  name="train")
        if seed is not None:
            tf1.set_random_seed(seed)
    model = tf_models.export_model(tf, graph, loss, train, {})
    path.write_bytes(model.meta_graph.SerializeToString())
    return path


def _rewrite(source, target, *options):
    assert main(["rewrite", str(source), "-o", str(target), "--quiet", *options]) == 0
    return target


def test_unseeded_dropout_cannot_be_verified(tmp_path, capsys):
    source = _unseeded_dropout_meta(tmp_path / "dropout.meta")
    rewritten = _rewrite(source, tmp_path / "stale.meta", "--drop-stale", "0")
    assert main(["verify", str(source), str(rewritten)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" not in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith(NOT_DETERMINISTIC + "loss loss:0 at step 1)"), verdict

    assert main(["verify", str(source), str(rewritten), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["deterministic"] is False
    assert report["nondeterministic"] == "loss loss:0 at step 1"
    assert report["verdict"].startswith(NOT_DETERMINISTIC)
    assert report["steps"] == [] and report["failure"] is None


def test_seeded_dropout_verifies_as_before(tmp_path, capsys):
    model = tf_models.conv_bn_dropout()  # seeded dropout: the same mask in every session
    source = tmp_path / "conv.meta"
    source.write_bytes(model.meta_graph.SerializeToString())
    rewritten = _rewrite(source, tmp_path / "remat.meta", "--recompute", "conv[12]/")
    assert main(["verify", str(source), str(rewritten), "--steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["deterministic"] and report["verdict"] == "MATCH"
    assert report["nondeterministic"] is None and len(report["steps"]) == 2
    assert main(["verify", str(source), str(rewritten), "--steps", "1"]) == 0
    assert capsys.readouterr().out.strip().endswith("MATCH")


def test_a_real_mismatch_is_still_reported(tmp_path, capsys):
    """A deterministic original and a rewrite that trains differently: MISMATCH."""
    source = _unseeded_dropout_meta(tmp_path / "a.meta", seed=3)
    other = _unseeded_dropout_meta(tmp_path / "b.meta", seed=4)  # another mask
    assert main(["verify", str(source), str(other), "--steps", "1"]) == 1
    out = capsys.readouterr().out
    assert out.strip().endswith("MISMATCH") and NOT_DETERMINISTIC not in out


def test_unseeded_dropout_in_a_train_signature(tmp_path, capsys):
    from tools.fixtures import keras3_models

    tf, _ = keras3_models._keras()
    tf.random.set_seed(None)  # no global seed left by an earlier test: the op is unseeded

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones([4, 4]))

        @tf.function(input_signature=[tf.TensorSpec([8, 4], tf.float32, name="x")])
        def train(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.dropout(x @ self.w, rate=0.5) ** 2)
            self.w.assign_sub(0.1 * tape.gradient(loss, self.w))
            return {"loss": loss}

    module = Module()
    source = tmp_path / "saved"
    tf.saved_model.save(module, str(source), signatures={"train": module.train})
    try:
        assert main(["verify", str(source), str(source), "--json"]) == 1
    finally:
        tf.compat.v1.disable_eager_execution()  # later TF1 tests expect graph mode
    report = json.loads(capsys.readouterr().out)
    assert report["deterministic"] is False and report["steps"] == []
    assert report["nondeterministic"] == "output loss at step 1"


def test_unseeded_onnx_dropout(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    def model(path, seed=None):
        attrs = {} if seed is None else {"seed": seed}
        nodes = [helper.make_node("Constant", [], ["ratio"], value=helper.make_tensor(
                     "ratio", TensorProto.FLOAT, [], [0.5])),
                 helper.make_node("Constant", [], ["training"], value=helper.make_tensor(
                     "training", TensorProto.BOOL, [], [True])),
                 helper.make_node("Dropout", ["X", "ratio", "training"], ["Y"], **attrs)]
        graph = helper.make_graph(
            nodes, "dropout", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [64])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [64])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                  str(path))
        return path

    unseeded = model(tmp_path / "a.onnx")
    assert main(["verify", str(unseeded), str(unseeded)]) == 1
    assert NOT_DETERMINISTIC + "Y at step 1)" in capsys.readouterr().out
    seeded = model(tmp_path / "b.onnx", seed=1)
    assert main(["verify", str(seeded), str(seeded)]) == 0
