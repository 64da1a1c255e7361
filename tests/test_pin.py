"""Pinning the updates next to their gradients (``passes/remat/pin``): TF's
executor queues the updates' inputs of optimizer state behind later work, so in some
processes every update waits for the end of the step; the rewrite makes the
backward pass wait for those reads instead. Fast: structure, estimates and the
training step run in this process. The third-party InceptionV3 it was found on
is measured by ``tools/bench/third_party.py``."""

from __future__ import annotations

import numpy as np
import pytest

import graphpass
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.passes.remat.pin import PIN_SCOPE
from tools.fixtures import tf_models
from tools.fixtures.loop_models import v1_control_flow_graph


@pytest.fixture(scope="module")
def adam():
    return tf_models.block_mlp(batch=16, width=32, blocks=4, optimizer="adam")


def _rewrite(model, **settings):
    graph = graph_from_graph_def(model.graph_def, {})
    return graph, graphpass.run_passes(graph, settings)[0].report


def _gate(graph) -> str:
    gates = [n for n in graph if n.startswith(PIN_SCOPE)]
    assert len(gates) == 1
    return gates[0]


def test_backward_waits_for_the_updates_reads(adam):
    graph, report = _rewrite(adam, recompute=["auto"])
    gate = _gate(graph)
    reads = graph.control_inputs(gate)
    assert report["pinned_update_reads"] == len(reads) > 0
    # Adam's beta-power reads, its slots' handles and hyperparameters: no forward or
    # backward op reads them (the slots' initializers do).
    ops = {graph.node(r).op for r in reads}
    assert {"ReadVariableOp", "VarHandleOp", "Const"} <= ops <= {"ReadVariableOp",
                                                              "VarHandleOp", "Const"}
    users = {u for r in reads for u in graph.users(r)} - {gate}
    assert not any(u.startswith("gradients/") or graph.node(u).op in ("MatMul", "Relu", "Tanh")
                   for u in users)
    waiting = graph.control_users(gate)
    assert "gradients/grad_ys_0" in waiting or "gradients/Fill" in waiting
    graph.check_acyclic()
    assert any(line.startswith("updates pinned next to their gradients")
               for line in report["summary"])


def test_the_original_is_estimated_as_its_worse_processes_run_it():
    """Weights that outweigh the activations (batch 2): held to the end, every
    weight gradient is alive at once, where one at a time is when each update
    runs as its gradient appears. TF's executor does either, per process: the
    original's estimate (and the ratio printed) is the held step, the other
    figure beside it; the pinned rewrite is estimated as the lower one."""
    model = tf_models.block_mlp(batch=2, width=128, blocks=4, optimizer="adam")
    _, report = _rewrite(model, recompute=["auto"])
    held = report["estimated_peak_bytes_updates_held"]
    low = report["estimated_peak_bytes_updates_as_gradients_appear"]
    weight = 128 * 128 * 4
    assert held >= low + 2 * weight
    assert report["estimated_peak_bytes_before"] == held
    assert report["auto"]["estimated_peak_bytes_before"] == held
    assert report["estimated_peak_bytes_after"] <= low
    summary = " ".join(report["summary"])
    assert f"estimated peak {held / 2**20:.1f} MiB -> " in summary
    after = report["estimated_peak_bytes_after"]
    assert (f"each update runs as its gradient appears: estimated {low / 2**20:.1f} MiB "
            f"({after / low:.2f}x of it after the rewrite)") in summary


def test_pinned_step_trains_the_same(adam):
    graph, _ = _rewrite(adam, recompute=["auto"])
    losses, variables, _ = tf_models.run_steps(adam.graph_def, adam)
    new_losses, new_variables, _ = tf_models.run_steps(graph_def_from_graph(graph), adam)
    np.testing.assert_array_equal(new_losses, losses)
    for name, value in variables.items():
        np.testing.assert_array_equal(new_variables[name], value, err_msg=name)


def test_pinning_twice_changes_nothing(adam):
    graph, _ = _rewrite(adam, recompute=["auto"])
    again = graphpass.run_passes(graph, {"recompute": ["auto"]})[0].report
    assert again["pinned_update_reads"] == 0
    _gate(graph)


@pytest.mark.parametrize("settings", [{"recompute": ["auto"], "target": "xla"},
                                      {"recompute": ["block[1-3]/"], "dependency": "data"}])
def test_data_ordered_steps_are_not_pinned(adam, settings):
    """XLA schedules a cluster itself; a data-ordered step is for a compiler."""
    graph, report = _rewrite(adam, **settings)
    assert report["pinned_update_reads"] == 0
    assert not any(n.startswith(PIN_SCOPE) for n in graph)


def test_plain_sgd_pins_its_learning_rate():
    """Plain SGD reads no optimizer state but its learning rate (and the global
    step's handle): roots, which the executor queues before it starts."""
    model = tf_models.block_mlp(batch=16, width=32, blocks=4, optimizer="sgd")
    graph, report = _rewrite(model, recompute=["auto"])
    reads = graph.control_inputs(_gate(graph))
    assert report["pinned_update_reads"] == len(reads) > 0
    assert "Const" in {graph.node(r).op for r in reads} <= {"Const", "VarHandleOp"}


def _loop_gradient_model(batch: int = 4, seed: int = 0) -> tf_models.Model:
    """A v1 ``while_loop`` whose body's gradient starts from a ``Fill`` of
    constants: a backward op that waits for no other, inside the gradient loop."""
    with v1_control_flow_graph(seed) as (tf, graph):
        tf1 = tf.compat.v1
        x = tf1.placeholder(tf.float32, [batch, 4], name="x")
        w = tf1.get_variable("W", [4, 4],
                             initializer=tf1.random_normal_initializer(seed=seed))

        @tf.custom_gradient
        def damped_sin(v):
            return tf.sin(v), lambda dy: dy * tf.fill([batch, 4], 0.5)

        _, h = tf1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, damped_sin(v)),
                              [tf.constant(0), tf.matmul(x, w)])
        loss = tf.reduce_mean(h * h, name="loss")
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.AdamOptimizer(0.1).minimize(loss, global_step=step,
                                                      name="train")
    feeds = {"x:0": np.random.RandomState(seed).standard_normal([batch, 4]).astype(np.float32)}
    return tf_models.export_model(tf, graph, loss, train, feeds)


def test_backward_starts_in_a_loop_frame_are_not_pinned():
    """TF rejects a control edge from the root frame into a v1 loop's body; the
    gradient loop's own start runs after the gate through the loop's ``Enter``."""
    model = _loop_gradient_model()
    graph, report = _rewrite(model, recompute=["auto"])
    gate = _gate(graph)
    depths = graph.dialect.frame_depths(graph)
    inside = [n for n in graph if n.endswith("_grad/Fill") and depths[n] > 0]
    assert inside and report["pinned_update_reads"] > 0
    assert all(depths[n] == 0 for n in graph.control_users(gate) + graph.control_inputs(gate))
    assert set(inside) <= graph.descendants({gate})
    losses, variables, _ = tf_models.run_steps(model.graph_def, model)
    new_losses, new_variables, _ = tf_models.run_steps(graph_def_from_graph(graph), model)
    np.testing.assert_array_equal(new_losses, losses)
    for name, value in variables.items():
        np.testing.assert_array_equal(new_variables[name], value, err_msg=name)
