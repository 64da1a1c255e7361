"""The orders TF's executor may run a step in (``RuntimeGraph.node_orders``).

A TF2 step is a function, which TF runs inlined into the graph that calls it, and
Grappler's order of that graph is not the function's own: the caller's nodes
(its data inputs, the variables' handles) decide it, and no file holds them. The
estimate asks Grappler for both (``tf_grappler.called_positions``) and keeps the
higher; here, that the order asked for a caller is the one a session calling the
step runs, and that the estimate is the worse of the two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graphpass import load
from graphpass.analysis.manager import AnalysisManager
from graphpass.analysis.memory import memory_profile
from graphpass.analysis.runtime_memory import runtime_view
from graphpass.formats.tf_io import graph_from_graph_def
from graphpass.runtimes import RuntimeGraph, RuntimeModel, runtime_for
from tools.fixtures import tf_models, trace_order


def _branches():
    """A data branch (``x`` through ``a1`` to the scalar ``a2``) and a product of
    state (``s1``, as large) that waits for ``a2``: run first, ``s1`` is held
    through the data branch."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x = tf1.placeholder(tf.float32, [256, 1024], name="x")
        w = tf1.get_variable("w", [256, 1024], initializer=tf1.zeros_initializer(),
                             use_resource=True)
        a2 = tf.reduce_sum(tf.tanh(x, name="a1"), name="a2")
        tf.reduce_sum(tf.multiply(w, 0.9, name="s1") * a2, name="out")
    return graph_from_graph_def(graph.as_graph_def(), shapes=True)


def _following(graph, *firsts: list[str]) -> RuntimeModel:
    """TF's model following an order of ``graph`` per ``firsts``, each starting
    with its list (as the oracle's orders of Grappler's output)."""
    orders = tuple(tuple(first + [n for n in graph if n not in first]) for first in firsts)
    return runtime_for(graph).following(RuntimeGraph(graph, "recorded", node_orders=orders))


DATA_FIRST = ["x", "a1", "a2"]


def _state_first() -> list[str]:
    return [n for n in _branches() if n.startswith(("w", "s1"))]


def _alone() -> list[int]:
    """The step's peak in each order, data first and state first."""
    alone = []
    for first in (DATA_FIRST, _state_first()):
        graph = _branches()
        alone.append(memory_profile(graph, ["out"], runtime=_following(graph, first)).peak_bytes)
    assert alone[0] != alone[1], "the orders should hold different values at their peaks"
    return alone


def test_a_step_tf_may_run_in_two_orders_is_estimated_in_the_worse():
    data_first, state_first = DATA_FIRST, _state_first()
    alone = _alone()
    graph = _branches()
    both = memory_profile(graph, ["out"], runtime=_following(graph, data_first, state_first))
    assert both.peak_bytes == max(alone)
    assert both.order_peaks == tuple(alone)


def test_the_orders_are_the_model_s_and_cached_per_order():
    """A model's orders are analysis results: following them leaves the nodes as
    they were, and the analysis manager keeps an estimate per order followed
    (the pass's models of one graph differ by them alone)."""
    graph = _branches()
    analyses = AnalysisManager()
    analyses.shapes(graph)
    before = {n.name: set(n.meta) for n in graph.nodes()}
    peaks = [analyses.profile(graph, ["out"], _following(graph, first)).peak_bytes
             for first in (DATA_FIRST, _state_first())]
    assert peaks == _alone()
    assert {n.name: set(n.meta) for n in graph.nodes()} == before


def test_a_replay_runs_the_step_in_the_order_a_trace_gives():
    """``memory_profile(replay=...)`` simulates one process's schedule (``--profile``
    and ``tools.fixtures.trace_order`` pass the order TF started the nodes in): the
    peak of that order, whatever orders the graph records. Names are matched under
    a call's prefix, as a session reports a called function's nodes, and a node the
    trace leaves out (``a1``) runs right after its producer."""
    mib, scalar = 2**20, 4
    graph = _branches()
    runtime = _following(graph, DATA_FIRST, _state_first())
    # x is fed (1 MiB, live all step); a1 and s1 are 1 MiB each
    for first, computed, peak in (
            (DATA_FIRST, ["a1", "a2", "s1", "mul", "out"], 2 * mib + scalar),
            (_state_first(), ["s1", "a1", "a2", "mul", "out"], 3 * mib + scalar)):
        ran = [f"StatefulPartitionedCall/{name}" for name in
               first + [n for n in graph if n not in first] if name != "a1"]
        replay = memory_profile(graph, ["out"], replay=ran, runtime=runtime)
        assert [name for name, _ in replay.timeline] == computed, replay.timeline
        assert replay.peak_bytes == peak and replay.order_peaks == (), replay


def _session_trace(step: Path, trace: Path) -> Path:
    """One step of the SavedModel's ``train`` signature called in a TF1 graph, run
    by a session: its ``RunMetadata`` (the partition graphs TF executed)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        loss = tf.saved_model.load(str(step)).signatures["train"](tf.ones([2, 8, 8, 3]))["loss"]
        metadata = tf1.RunMetadata()
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            session.run(loss, run_metadata=metadata,
                        options=tf1.RunOptions(output_partition_graphs=True))
    trace.write_bytes(metadata.SerializeToString())
    return trace


def test_a_function_step_is_ordered_as_a_session_calling_it_runs_it(tmp_path):
    """Grappler asked on a graph that calls the step gives the order of the graph a
    session ran, node for node (TF's constants and oneDNN's kernels apart: folding
    and its layout pass place them); the function's own order is the other one
    the estimate runs."""
    step = tmp_path / "step"
    tf_models.conv_bias_signature(step)
    graph = load(step)
    view = runtime_view(graph, AnalysisManager().regions(graph).fetches)
    assert len(view.node_orders) == 2
    called = set(view.node_orders[1]) & set(graph)
    updates = {n for n in graph if graph.node(n).op == "AssignSubVariableOp"}
    assert len(updates) == 2 and updates | {"biased"} <= called
    orders = trace_order.estimates(step, _session_trace(step, tmp_path / "trace.pb"))
    assert orders["called_order_out_of_place"] == 0, orders
    assert orders["estimate_mib"] == pytest.approx(max(orders["grappler_order_mib"],
                                                       orders["called_order_mib"]))
