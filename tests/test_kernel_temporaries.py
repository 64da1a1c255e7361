"""The estimate counts what TF's kernels allocate while they run, as the kernels
TF picks in the estimating process (``runtimes/tf_kernels``), checked against the
allocation records of a real step with oneDNN's kernels off and on, set
explicitly in each child process.

The model is a small TF1 conv net on ref variables (``ApplyMomentum``, which
TF's OpDef does not call stateful): its updates must count as run, or the whole
backward pass drops out of the estimate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphpass import load
from graphpass.analysis.manager import AnalysisManager
from graphpass.analysis.memory import memory_profile
from graphpass.runtimes.tf_grappler import GRAPPLER
from tools.fixtures import tf_models, trace_order
from tools.fixtures.measure import measure

ROOT = Path(__file__).resolve().parents[1]
FETCHES = ["train", "loss"]


@pytest.fixture(scope="module")
def conv_net(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kernels") / "conv.meta"
    tf_models.conv_bn_dropout().save(path)
    return path


def _estimate(path: Path, onednn: int) -> dict:
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=str(onednn),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernel_temporaries_child.py"),
                          str(path), *FETCHES], env=env, capture_output=True, text=True,
                         timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _metadata(trace: Path):
    import tensorflow as tf

    metadata = tf.compat.v1.RunMetadata()
    metadata.ParseFromString(trace.read_bytes())
    return metadata


def _allocations(trace: Path) -> dict[str, list[int]]:
    """Per executed node, the bytes of each allocation it made."""
    metadata = _metadata(trace)
    return {node.node_name: [r.alloc_bytes for m in node.memory
                             for r in m.allocation_records if r.alloc_bytes > 0]
            for device in metadata.step_stats.dev_stats for node in device.node_stats}


@pytest.mark.parametrize("onednn", [0, 1])
def test_estimate_matches_allocation_records(conv_net, tmp_path, onednn):
    estimate = _estimate(conv_net, onednn)
    trace = tmp_path / "trace.pb"
    measured = measure(conv_net, ["loss:0", "train"], onednn=bool(onednn), trace_path=trace)
    allocations = _allocations(trace)
    temporaries = estimate["temporaries"]
    if onednn:
        assert temporaries == {}, "oneDNN's kernels are not TF's custom ones"
        assert "im2col" not in estimate["model"]
    else:
        # both gradients of conv2, the filter gradient of conv1 (its input is fed)
        assert sorted(n.rsplit("/", 1)[-1] for n in temporaries) == \
            ["Conv2DBackpropFilter", "Conv2DBackpropFilter", "Conv2DBackpropInput"]
        for name, size in temporaries.items():
            assert size in allocations[name], (name, size, allocations[name])
        assert "im2col buffers of its 3 convolution gradients" in estimate["model"]
    assert abs(estimate["estimate"] / measured.peak_bytes - 1) < 0.15, \
        (estimate, measured.peak_bytes)
    _check_renamed(estimate["renamed"], trace, bool(onednn))
    # The diagnostic that replays the estimate in the order of the graph TF ran
    # (tools.fixtures.trace_order) finds the graph's nodes in the trace; on this
    # small step both orders give the same peak.
    orders = trace_order.estimates(conv_net, trace)
    computed = memory_profile(load(conv_net), FETCHES).timeline
    assert orders["nodes_matched"] >= len(computed)
    assert orders["partition_graph_order_mib"] == pytest.approx(orders["grappler_order_mib"],
                                                                rel=0.05)


def _check_renamed(renamed: list[str], trace: Path, onednn: bool) -> None:
    """The nodes the estimate takes oneDNN's layout pass to replace are the ones
    TF ran as oneDNN's kernels (none with oneDNN off), and they close the graph
    TF's executor ran: they come after every other node in its order."""
    (graph,) = _metadata(trace).partition_graphs
    names = [node.name for node in graph.node]
    kernels = {node.name for node in graph.node if node.op.startswith("_Mkl")}
    assert bool(kernels) == onednn
    assert set(renamed) == kernels
    assert set(names[len(names) - len(kernels):]) == kernels


def test_ref_variable_updates_run(conv_net):
    """Grappler keeps an op with a ref input (it may write through it); so must
    the estimate, with the gradients the updates read."""
    graph = load(conv_net)
    ran = {name for name, _ in memory_profile(graph, FETCHES).timeline}
    updates = [n for n in graph if graph.node(n).op == "ApplyMomentum"]
    assert updates and set(updates) <= ran
    assert any(graph.node(n).op == "Conv2DBackpropFilter" for n in ran)


def test_grappler_is_asked_on_the_graph_placed_as_a_session_places_it(tmp_path):
    """A session places the step before Grappler optimizes it, and the remapper
    fuses a convolution with its ``BiasAdd`` only on a node placed on the CPU: the
    graph the estimate asks for has the fused kernel a session runs, under the
    ``BiasAdd``'s name, with the ``BiasAdd``'s shape (TF's shape function of the
    fused kernel, which cannot see a variable argument's shape, leaves all but
    the batch open)."""
    import tensorflow as tf

    from graphpass.runtimes.tf_grappler import runtime_graph

    tf_models.conv_bias_signature(tmp_path / "step")
    graph = load(tmp_path / "step")
    view = runtime_graph(graph, AnalysisManager().regions(graph).fetches)
    assert view.model.startswith(GRAPPLER)
    assert view.graph.node("biased").op == "_FusedConv2D"
    assert view.graph.node("biased").meta["shapes"][0] == (2, 8, 8, 4)
    tf1 = tf.compat.v1
    with tf.Graph().as_default() as session_graph:
        loss = tf.saved_model.load(str(tmp_path / "step")).signatures["train"](
            tf.ones([2, 8, 8, 3]))["loss"]
        metadata = tf1.RunMetadata()
        with tf1.Session(graph=session_graph) as session:
            session.run(tf1.global_variables_initializer())
            session.run(loss, run_metadata=metadata,
                        options=tf1.RunOptions(output_partition_graphs=True))
    ran = {n.op for g in metadata.partition_graphs for n in g.node
           if n.name.rsplit("/", 1)[-1] == "biased"}
    assert ran and all(op.endswith("FusedConv2D") for op in ran), ran
