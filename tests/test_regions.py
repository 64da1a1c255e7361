"""Region analysis on real TF training graphs: loss, gradients, apply ops,
global_step, labels; the overrides; and the errors for ambiguity or absence."""

from __future__ import annotations

import json

import pytest
from tf_helpers import write_message

import graphpass
from graphpass.analysis.regions import BACKWARD, FORWARD, OPTIMIZER, OTHER, analyze
from graphpass.cli import main
from graphpass.errors import GraphpassError
from graphpass.formats.tf_io import graph_from_graph_def
from graphpass.ir.graph import Tensor

# key -> (tools.tf_models builder, kwargs, train ops, losses, apply op type, variables per step)
CASES = {
    "adam_resource": ("block_mlp", {"blocks": 3}, ["train"], ["loss"], "ResourceApplyAdam", 3),
    "momentum_ref": ("block_mlp", {"blocks": 3, "optimizer": "momentum", "use_resource": False},
                     ["train"], ["loss"], "ApplyMomentum", 3),
    "sgd_resource": ("block_mlp", {"blocks": 2, "optimizer": "sgd"}, ["train"], ["loss"],
                     "ResourceApplyGradientDescent", 2),
    "conv_bn_dropout": ("conv_bn_dropout", {}, ["train"], ["loss"], "ApplyMomentum", 7),
    "control_flow": ("control_flow", {}, ["train"], ["loss"], "ResourceApplyGradientDescent", 1),
    "function_library": ("function_library", {}, ["train"], ["loss"],
                         "ResourceApplyGradientDescent", 1),
    "clipped_custom_scope": ("clipped_custom_scope", {}, ["tower0/train"], ["tower0/loss"],
                             "ResourceApplyMomentum", 3),
    "two_train_ops": ("clipped_custom_scope", {"train_ops": 2}, ["tower0/train", "tower1/train"],
                      ["tower0/loss", "tower1/loss"], "ResourceApplyMomentum", 3),
}


def _graph(models, key):
    builder, kwargs = CASES[key][:2] if key in CASES else (key, {})
    model = models.model(f"regions_{key}", builder, **kwargs)
    return graph_from_graph_def(model.graph_def), model


def _tf_graph(build):
    """The IR of a small graph that ``build()`` makes in a fresh tf.Graph."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        build(tf, tf.compat.v1)
    return graph_from_graph_def(graph.as_graph_def())


@pytest.mark.parametrize("key", list(CASES))
def test_regions_of_training_graphs(models, key):
    graph, _ = _graph(models, key)
    _, _, train_ops, losses, apply_op, per_step = CASES[key]
    regions = analyze(graph)

    assert [s.train_op for s in regions.steps] == train_ops
    assert [str(s.loss) for s in regions.steps] == losses
    assert regions.global_step == "global_step"
    for step in regions.steps:
        assert len(step.applies) == len(step.gradients) == per_step
        assert {graph.node(a).op for a in step.applies} == {apply_op}
        # the gradient each apply op reads is in its "grad" (or "delta") slot
        for apply, gradient in zip(step.applies, step.gradients):
            assert gradient in graph.inputs(apply)
            assert regions.label(gradient.node) == BACKWARD
            assert regions.label(apply) == OPTIMIZER
        assert regions.label(step.loss.node) == FORWARD
        assert regions.label(step.train_op) == OPTIMIZER
    # every node is labelled in the table, none on the node
    assert set(regions.labels) == set(graph)
    for node in graph.nodes():
        assert "region" not in node.meta  # analysing never writes into the IR
        assert regions.label(node.name) in (FORWARD, BACKWARD, OPTIMIZER, OTHER)
    counts = regions.counts()
    assert sum(counts.values()) == len(graph)
    assert min(counts[FORWARD], counts[BACKWARD], counts[OPTIMIZER]) > 0
    # inputs are forward, the step increment is optimizer
    feeds = [n for n in graph if graph.node(n).op == "Placeholder"]
    assert any(regions.label(n) == FORWARD for n in feeds)
    increments = [inc for inc, var in graph.dialect.step.counter_increments(graph)
                  if var == "global_step"]
    assert increments and all(regions.label(inc) == OPTIMIZER for inc in increments)


def test_gradients_outside_gradients_scope_with_clipping(models):
    graph, _ = _graph(models, "clipped_custom_scope")
    regions = analyze(graph)
    assert not any(n.startswith("gradients/") for n in graph)
    step = regions.steps[0]
    # the apply ops read the clipped gradients ...
    assert all("clip_by_global_norm" in t.node for t in step.gradients)
    # ... and the raw gradients under training/grads that the step runs are backward
    # too; the dead ones (gradients of constants, of the input x) are not in the step.
    raw = [n for n in graph if n.startswith("tower0/training/grads/")]
    runs = graph.ancestors([step.train_op])
    assert len([n for n in raw if n in runs]) > 20
    for name in raw:
        assert regions.label(name) == (BACKWARD if name in runs else OTHER), name
    clip = [n for n in graph if n.startswith("tower0/clip_by_global_norm/")]
    assert clip and {regions.label(n) for n in clip} == {BACKWARD}
    assert regions.label("tower0/block3/MatMul") == FORWARD


def test_two_train_ops_do_not_share_gradients(models):
    graph, _ = _graph(models, "two_train_ops")
    regions = analyze(graph)
    first, second = regions.steps
    assert all(a.startswith("tower0/") for a in first.applies)
    assert all(a.startswith("tower1/") for a in second.applies)
    assert not {t.node for t in first.gradients} & {t.node for t in second.gradients}


def test_keras_like_scope_rmsprop_and_sparse_adagrad():
    def build(tf, tf1):
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        ids = tf1.placeholder(tf.int32, [4], name="ids")
        with tf1.name_scope("training"):
            w = tf1.get_variable("w", [3, 3], use_resource=True)
            emb = tf1.get_variable("emb", [10, 3], use_resource=True)
            h = tf.matmul(x, w) + tf.nn.embedding_lookup(emb, ids)
            loss = tf.reduce_mean(tf.square(h), name="loss")
            step = tf1.train.get_or_create_global_step()
            dense, sparse = tf1.gradients(loss, [w, emb], name="gradient_tape")
            tf1.train.RMSPropOptimizer(0.1).apply_gradients([(dense, w)], global_step=step,
                                                            name="train")
            tf1.train.AdagradOptimizer(0.1).apply_gradients([(sparse, emb)], name="train_emb")

    graph = _tf_graph(build)
    regions = analyze(graph)
    ops = {s.train_op: sorted(graph.node(a).op for a in s.applies) for s in regions.steps}
    assert ops == {"training/train": ["ResourceApplyRMSProp"],
                   "training/train_emb": ["ResourceSparseApplyAdagrad"]}
    # the sparse apply reads the IndexedSlices values as its gradient
    sparse_step = next(s for s in regions.steps if s.train_op == "training/train_emb")
    assert len(sparse_step.gradients) == 1
    assert {str(s.loss) for s in regions.steps} == {"training/loss"}
    assert regions.global_step == "global_step"


# -- overrides -------------------------------------------------------------------------


def test_override_train_op_and_loss(models):
    graph, _ = _graph(models, "two_train_ops")
    regions = analyze(graph, train_ops=["tower1/train"])
    assert [s.train_op for s in regions.steps] == ["tower1/train"]
    assert all(a.startswith("tower1/") for a in regions.steps[0].applies)
    assert str(regions.loss) == "tower1/loss"
    # tower1 does not increment global_step; only tower0's optimizer does
    assert regions.global_step is None

    regions = analyze(graph, train_ops=["tower0/train"], loss="tower0/block3/mul:0")
    assert regions.loss == Tensor("tower0/block3/mul", 0)
    assert regions.label("tower0/block3/mul") == FORWARD
    assert regions.label("tower0/loss") != FORWARD  # no longer part of the loss


def test_override_global_step_resolves_two_counters():
    def build(tf, tf1):
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        w = tf1.get_variable("w", [3, 3])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        for name in ("step_a", "step_b"):
            counter = tf1.get_variable(name, [], tf.int64, trainable=False,
                                       initializer=tf1.zeros_initializer())
            tf1.train.GradientDescentOptimizer(0.1).minimize(
                loss, global_step=counter, name=f"train_{name[-1]}")

    graph = _tf_graph(build)
    with pytest.raises(GraphpassError) as error:
        analyze(graph)
    message = str(error.value)
    assert "step_a, step_b" in message and "--global-step" in message and "\n" not in message
    regions = analyze(graph, global_step="step_b")
    assert regions.global_step == "step_b"
    assert [s.train_op for s in regions.steps] == ["train_a", "train_b"]

    with pytest.raises(GraphpassError, match=r"'loss' is not a variable.*step_a, step_b"):
        analyze(graph, global_step="loss")
    with pytest.raises(GraphpassError, match="'nosuch' is not a node"):
        analyze(graph, global_step="nosuch")


def test_overrides_through_inspect(models, tmp_path, capsys):
    _, model = _graph(models, "two_train_ops")
    source = write_message(tmp_path / "model.pb", model.graph_def)
    argv = ["inspect", str(source), "--json", "--train-op", "tower1/train",
            "--loss", "tower1/loss", "--global-step", "global_step"]
    assert main(argv) == 0
    regions = json.loads(capsys.readouterr().out)["regions"]
    assert regions["train_ops"] == ["tower1/train"] and regions["losses"] == ["tower1/loss"]
    assert regions["global_step"] == "global_step" and regions["apply_ops"] == 3


# -- absence and ambiguity: one clear error naming the candidates ------------------------------


def test_inference_graph_has_no_regions():
    def build(tf, tf1):
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        w = tf1.get_variable("w", [3, 3])
        tf.nn.softmax(tf.matmul(x, w), name="probabilities")

    with pytest.raises(GraphpassError, match="found no optimizer apply ops") as error:
        analyze(_tf_graph(build))
    assert "\n" not in str(error.value)


def test_train_op_that_applies_no_gradients(models):
    graph, _ = _graph(models, "adam_resource")
    with pytest.raises(GraphpassError) as error:
        analyze(graph, train_ops=["loss"])
    message = str(error.value)
    assert "'loss' applies no gradients" in message and "train ops found: ['train']" in message
    with pytest.raises(GraphpassError, match=r"'nosuch' is not a node; train ops found"):
        analyze(graph, train_ops=["nosuch"])
    with pytest.raises(GraphpassError, match="--loss 'nosuch' is not a node"):
        analyze(graph, loss="nosuch")


def test_two_losses_are_ambiguous():
    def build(tf, tf1):
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        w, v = tf1.get_variable("w", [3, 3]), tf1.get_variable("v", [3, 3])
        first = tf.reduce_mean(tf.matmul(x, w), name="loss_w")
        second = tf.reduce_mean(tf.matmul(x, v), name="loss_v")
        grads = tf1.gradients([first, second], [w, v])
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients(zip(grads, [w, v]),
                                                                name="train")

    graph = _tf_graph(build)
    with pytest.raises(GraphpassError) as error:
        analyze(graph)
    message = str(error.value)
    assert "cannot tell the loss of train op 'train'" in message
    assert "candidates: loss_v, loss_w" in message and "--loss" in message
    assert str(analyze(graph, loss="loss_w").loss) == "loss_w"


def test_fed_gradients_have_no_loss():
    def build(tf, tf1):
        w = tf1.get_variable("w", [3, 3])
        grad = tf1.placeholder(tf.float32, [3, 3], name="grad")
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(grad, w)], name="train")

    with pytest.raises(GraphpassError, match=r"candidates: none\); name it with --loss"):
        analyze(_tf_graph(build))


def test_loss_found_among_summaries_and_regularizers():
    def build(tf, tf1):
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        w = tf1.get_variable("w", [3, 3])
        data_loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="data_loss")
        reg = tf.reduce_sum(w * w, name="reg")
        loss = tf.add(data_loss, 0.1 * reg, name="loss")
        tf1.summary.scalar("data_loss", data_loss)
        tf1.summary.scalar("loss", loss)
        tf1.train.AdamOptimizer(0.1).minimize(loss, name="train")

    regions = analyze(_tf_graph(build))
    assert str(regions.loss) == "loss"
    assert regions.global_step is None  # minimize() without a global_step


def test_api_analyze_matches_module(models):
    graph, _ = _graph(models, "sgd_resource")
    assert graphpass.analyze(graph).labels == analyze(graph).labels


@pytest.mark.parametrize("bits", [1, 7, 8, 9, 300, 2100])
def test_bit_sums_are_the_weights_of_the_masks_holding_each_bit(bits):
    """Loss detection's covered counts: numpy's bit matrix gives what a loop over
    each mask's bits gives, across chunks (``2100`` bits: several rows a chunk)."""
    import random

    from graphpass.analysis.regions import _bit_sums

    rng = random.Random(bits)
    weights = {rng.getrandbits(bits): rng.randrange(1, 50) for _ in range(700)}
    expected = [sum(w for m, w in weights.items() if m >> k & 1) for k in range(bits)]
    assert _bit_sums(weights, bits) == expected
    assert _bit_sums({}, bits) == [0] * bits


def _asked_shapes(monkeypatch) -> list[list[str]]:
    """The node lists loss detection asks the shapes of, as it asks."""
    from graphpass.analysis import regions

    asked = []
    infer = regions.infer_shapes
    monkeypatch.setattr(regions, "infer_shapes", lambda graph, nodes=None:
                        asked.append(list(nodes)) or infer(graph, nodes))
    return asked


def test_loss_shapes_are_read_for_the_best_scored_candidates_first(models, monkeypatch):
    """The loss scores best, so only its group's shapes are read: the other
    candidates (unread gradient values, reaching back through the backward pass)
    are never inferred."""
    graph, _ = _graph(models, "adam_resource")
    asked = _asked_shapes(monkeypatch)
    loss = analyze(graph).loss.node
    assert asked == [[loss]]


def test_a_vector_scored_above_the_loss_reads_every_candidates_shape(monkeypatch):
    """An unread value computed from the gradient covers more of what the gradients
    read than the loss does and scores better, but it is no scalar: then every
    other candidate's shape is read at once (a second inference, the last), and
    the loss still wins."""
    def build(tf, tf1):
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        w = tf1.get_variable("w", [3, 3])
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        (grad,) = tf1.gradients(loss, [w])
        tf.reduce_sum(grad, axis=0, name="spread")
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(grad, w)], name="train")

    graph = _tf_graph(build)
    asked = _asked_shapes(monkeypatch)
    assert str(analyze(graph).loss) == "loss"
    assert asked[0] == ["spread"] and len(asked) == 2 and "loss" in asked[1]
