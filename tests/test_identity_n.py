"""Keras 3's optimizers pass every gradient through one ``IdentityN`` before
applying any. Grappler's dependency optimizer bypasses it (each update reads its
gradient directly), so TF applies each gradient as soon as it exists; the
estimate's model of Grappler must do the same, or it holds every weight gradient
to the end of the backward pass (1.75x the measured peak of a Keras 3 ResNet50).
Checked against Grappler's own graph and the allocation records of a real step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphpass.analysis.memory import _known_before, memory_profile
from graphpass.analysis.runtime_memory import runtime_memory_profile
from graphpass.formats.tf_io import graph_from_graph_def
from graphpass.ir.graph import Tensor
from graphpass.runtimes import runtime_for
from graphpass.runtimes.tf_order import GrapplerView
from tools.fixtures.measure import measure
from tools.fixtures.tf_models import Model, export_model

WIDTH, LAYERS, BATCH = 256, 4, 8
WEIGHT_BYTES = WIDTH * WIDTH * 4
#: Processes measured per setting (the lower mode is judged).
PROCESSES = 2
FETCHES = ["loss:0", "train"]


def _step() -> Model:
    """A tanh MLP whose weight gradients go through one ``IdentityN`` (``grads``)
    to their updates; the weights outweigh the activations."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [BATCH, WIDTH], name="x")
        weights = [tf1.get_variable(f"w{i}", [WIDTH, WIDTH], use_resource=True,
                                    initializer=tf1.glorot_uniform_initializer(seed=i))
                   for i in range(LAYERS)]
        h = x
        for w in weights:
            h = tf.tanh(tf.matmul(h, w))
        loss = tf.reduce_sum(h, name="loss")
        gradients = tf.identity_n(tf.gradients(loss, weights), name="grads")
        updates = [tf.raw_ops.AssignSubVariableOp(resource=w.handle, value=0.1 * g,
                                                  name=f"update{i}")
                   for i, (w, g) in enumerate(zip(weights, gradients))]
        with tf1.control_dependencies(updates):
            train = tf.no_op(name="train")
    return export_model(tf, graph, loss, train, {"x:0": np.ones([BATCH, WIDTH], np.float32)})


def _measured_peak(model: Model, fetches: list[str], where: Path, onednn: bool) -> int:
    """The allocation records' lower peak over ``PROCESSES`` new processes (one
    inter-op thread, after a warm-up step), oneDNN set as asked. TF's executor
    holds every update to the end of the step in some processes whatever the graph
    (docs/remat.md, updates pinned); the lower mode is the one this graph decides."""
    path = where / "step.meta"
    model.save(path)
    return min(measure(path, fetches, model.init, onednn=onednn).peak_bytes
               for _ in range(PROCESSES))


def test_the_gradients_identity_n_is_bypassed():
    """Each update reads its gradient, not ``grads:k``; the executor's graph has no
    ``grads``, so nothing waits for the last gradient."""
    graph = graph_from_graph_def(_step().graph_def, {})
    needed = graph.ancestors(["train", "loss"]) | {"train", "loss"}
    known = _known_before(graph, needed, None, runtime_for(graph))
    execution = runtime_for(graph).executions(graph, needed, known,
                                              frozenset({"train", "loss"}))[0]
    assert "grads" not in execution.order
    for k, gradient in enumerate(graph.inputs("grads")):
        assert execution.read(Tensor("grads", k)) == gradient
    members = [n for n in graph if n in needed]
    view = GrapplerView(graph, members, known, frozenset({"train", "loss"}),
                        lambda s, d: False, lambda n: graph.dialect.is_stateful(graph, n))
    view.optimize()
    assert "grads" in view.bypassed


@pytest.mark.parametrize("onednn", [False, True])
@pytest.mark.parametrize("fetched", [False, True])
def test_estimate_matches_grappler_and_the_records(fetched, onednn, tmp_path):
    """Bypassed, the hand model's peak is Grappler's graph's and the measured one, and
    under the weights plus every gradient; fetched, ``grads`` is kept (Grappler
    never removes a fetched node) and every gradient is held until the last."""
    model = _step()
    fetches = FETCHES + (["grads"] if fetched else [])
    graph = graph_from_graph_def(model.graph_def, {})
    hand = memory_profile(graph, fetches)
    grappler = runtime_memory_profile(graph, fetches)
    assert hand.peak_bytes == grappler.peak_bytes
    measured = _measured_peak(model, fetches, tmp_path, onednn)
    assert abs((hand.peak_bytes - hand.fed_bytes) / measured - 1) <= 0.05, \
        (hand.peak_bytes - hand.fed_bytes, measured)
    every_gradient = LAYERS * WEIGHT_BYTES
    if fetched:
        assert measured >= every_gradient
    else:
        assert measured < every_gradient
