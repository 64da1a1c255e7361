"""The memory estimate on the graph TF really runs (``runtime_memory_profile``: Grappler's
output, asked from TF) against what TF does: the order its executor ran the step in
(``RunMetadata`` step stats, one inter-op thread) and the allocation records' peak,
with oneDNN on and off (each measurement in a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphpass
from graphpass.analysis.manager import AnalysisManager
from graphpass.analysis.memory import memory_profile, tensor_bytes
from graphpass.analysis.runtime_memory import (
    follow_runtime_order,
    runtime_memory_profile,
)
from graphpass.ir.names import Tensor
from graphpass.runtimes import runtime_for
from graphpass.runtimes.tf_grappler import GRAPPLER
from tools.fixtures import call_profile, keras_models, tf_models, third_party
from tools.fixtures.measure import measure

pytestmark = pytest.mark.slow  # every test here measures in subprocesses

ROOT = Path(__file__).resolve().parents[1]

#: Nodes whose order is compared: those with an output of at least this many bytes,
#: the values a peak is made of. Scalars, shapes and variable reads wait in the
#: executor's pool queue for as long as the thread is busy with other work, which
#: moves no memory that counts.
LARGE_BYTES = 64 * 1024
#: Kendall's tau between the estimate's order of those nodes and TF's: 1 is the same
#: order; 0.98 allows a few neighbours swapped (measured 0.999-1.0 on both models).
ORDER_AGREEMENT = 0.98
#: The stable models' estimate against the measured peak (measured within 1%).
STABLE_TOLERANCE = 0.05
#: The issue's bound for third-party models.
THIRD_PARTY_TOLERANCE = 0.15
#: Two estimates of one peak told apart from rounding: a replay in another order.
SAME_PEAK = 0.02
#: The allocator's records leave buffers under 256 KiB out (with oneDNN on), which
#: the estimate counts: how far above the records' peak that may put it.
SMALL_BUFFERS = 1.10

STABLE = {"mlp": lambda: tf_models.block_mlp(batch=256, width=256, optimizer="sgd"),
          "transformer": lambda: keras_models.transformer(size=32, batch=8, layers=2,
                                                          width=64)}


def kendall_tau(ranks: list[int]) -> float:
    """Kendall's tau between positions 0..n-1 and ``ranks`` (distinct values): the
    share of pairs in the same order minus the share swapped."""
    r = np.asarray(ranks)
    pairs = np.sign(r[None, :] - r[:, None])[np.triu_indices(len(r), 1)]
    return float(pairs.mean()) if pairs.size else 1.0


@pytest.fixture(scope="module")
def stable(tmp_path_factory):
    """name -> (MetaGraphDef path, fetches, init op), each built once."""
    built = {}
    for name, build in STABLE.items():
        model = build()
        path = tmp_path_factory.mktemp(name) / f"{name}.meta"
        path.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
        built[name] = (path, [model.loss, model.train_op], model.init)
    return built


def _large_nodes(graph, names: list[str]) -> set[str]:
    return {n for n in names if n in graph and any(
        (tensor_bytes(graph, Tensor(n, p)) or 0) >= LARGE_BYTES for p in graph.used_ports(n))}


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("name", sorted(STABLE))
def test_schedule_and_peak_follow_what_tf_ran(stable, name, onednn):
    """The estimate's order of the large values is the executor's, and its peak the
    allocation records' peak; the figure says it was made on Grappler's graph."""
    path, fetches, init = stable[name]
    graph = graphpass.load(path)
    profile = runtime_memory_profile(graph, fetches)
    assert profile.model == GRAPPLER
    ran = measure(path, fetches, init=init, steps=1, onednn=onednn)
    estimated_order = [n for n, _ in profile.timeline]
    large = _large_nodes(graph, estimated_order)
    executed = [n for n in ran.order if n in large]
    position = {n: i for i, n in enumerate(n for n in estimated_order if n in set(executed))}
    assert len(executed) >= 50
    tau = kendall_tau([position[n] for n in executed])
    assert tau >= ORDER_AGREEMENT, tau
    estimated = profile.peak_bytes - profile.fed_bytes
    assert abs(estimated / ran.peak_bytes - 1) <= STABLE_TOLERANCE, (estimated, ran.peak_bytes)


def test_keras3_train_signature_estimate_within_the_issue_bound(tmp_path):
    """A Keras 3 train signature, read as its function body: Grappler's graph of the
    body (inlined calls, its arithmetic rewrites) within 15% of the measured peak
    with oneDNN on and off, where the hand model was 0.76x. (The CNNs are not
    here: their measured peak moves from run to run, see ``third_party``.)"""
    name = "encoder"
    path, _ = third_party.build(name, tmp_path, "test")
    graph = graphpass.load(path)
    step = AnalysisManager().regions(graph)
    profile = runtime_memory_profile(graph, step.fetches)
    hand = memory_profile(graph, step.fetches)
    assert profile.model == GRAPPLER and hand.model == ""
    estimated = profile.peak_bytes - profile.fed_bytes
    for onednn in (True, False):
        measured = third_party.measure(name, path, "test", onednn)["peak"]
        assert abs(estimated / measured - 1) <= THIRD_PARTY_TOLERANCE, (onednn, estimated,
                                                                         measured)


def test_a_cnn_step_function_is_estimated_as_tf2_calls_it(tmp_path):
    """Keras 3 ResNet50 at the test size: its weights outweigh its activations, so
    with every update held to the end of the step (as a v1 session runs it in some
    processes) its peak would be far higher. TF2 calls the signature with its
    variables as arguments, and ran each update as its gradient appeared in every
    process measured: the original's estimate is of that step.

    TF's profiler gives the order each call ran its ops in. On a quiet machine
    that is the estimate's schedule (its replay is the estimate within rounding);
    under load some calls run a lower one (docs/benchmarks.md), so what is
    asserted holds in either: what no call's kernels ask for exceeds the
    estimate by more than the issue's 15% or comes near the held figure, none ran
    an order the estimate puts above its own, and replayed in each call's order the
    estimate is what the allocator was asked for, plus the buffers under 256 KiB
    it leaves out of its records. The chunks the allocator hands out for those
    requests depend on its heap, which differs per process and with the load
    beside it (a chunk up to twice a request is handed out whole); they are
    compared on a quiet machine by the benchmark (docs/benchmarks.md), as is the
    issue's 15% the other way round."""
    path, _ = third_party.build("resnet50", tmp_path, "test")
    # the lowest peak, whatever its time: a plan that pins the updates (the original's
    # figures are what is read here, not the plan's exactness: not checked, for time)
    report = graphpass.run_passes(graphpass.load(path), {
        "recompute": ["auto"], "max_extra_time": "none", "exactness": "trust"})[0].report
    estimate = report["estimated_peak_bytes_before"] / 2**20
    held = report["estimated_peak_bytes_updates_held"] / 2**20
    assert estimate == report["estimated_peak_bytes_updates_as_gradients_appear"] / 2**20
    assert held > 1.3 * estimate
    # The figures are compared with the call's own estimate, made with oneDNN on as
    # the call ran (this process runs with the machine's default).
    for call in (call_profile.run("resnet50", path, "test") for _ in range(3)):
        estimated = call["estimate_mib"]
        assert call["ops"] >= 1000 and call["chunks_mib"] == call["allocator_mib"], call
        requested = call["requested_mib"]
        assert requested <= (1 + THIRD_PARTY_TOLERANCE) * estimated, call
        assert requested < (estimated + held) / 2, (held, call)
        replayed = call["estimate_in_call_order_mib"]
        assert replayed <= (1 + SAME_PEAK) * estimated, call
        assert requested <= replayed <= SMALL_BUFFERS * requested, call


def test_hand_model_where_grappler_refuses(stable):
    """Where TF cannot give its graph (here: a fetch the graph lacks), the estimate is
    the hand model's, and says so and why."""
    from graphpass.runtimes.tf_grappler import HAND_MODEL, runtime_graph

    path, fetches, _ = stable["mlp"]
    graph = graphpass.load(path)
    view = runtime_graph(graph, [*fetches, "no_such_node"])
    assert view.model == HAND_MODEL and view.graph is graph
    assert view.reason.startswith("Grappler refused the graph")



def _grappler_graph(graph, fetches):
    """Grappler's graph of ``graph``, without the im2col buffers a oneDNN-off process
    adds to it (``tf_kernels``; the hand model leaves them out by design): the
    same figure whatever the machine's oneDNN default."""
    from graphpass.runtimes.tf_grappler import runtime_graph
    from graphpass.runtimes.tf_kernels import META_KEY

    view = runtime_graph(graph, fetches)
    assert view.model.startswith(GRAPPLER)
    for node in view.graph.nodes():
        node.meta.pop(META_KEY, None)
    return view


def _in_its_orders(view, fetches) -> int:
    """The estimate of Grappler's graph ``view`` in its own node orders."""
    return memory_profile(view.graph, fetches,
                          runtime=runtime_for(view.graph).following(view)).peak_bytes


def test_segments_in_turn_lower_what_tf_runs_and_the_hand_model_follows_its_order(tmp_path):
    """Keras 3 MobileNetV2 at the benchmark's size (64x64, batch 8; the small size
    shows nothing: its weight gradients run early in any order), ``auto``:

    * on the graph Grappler returns (asked from TF, not modelled), the plan as
      written holds far less than the same plan without the edges that make each
      segment wait for the weight gradients of the one recomputed before it: TF's
      executor would leave those to the end of the backward pass, holding every
      segment's copies;
    * on that plan without the edges, the hand model in the order of Grappler's
      output is within the issue's 15% of Grappler's graph, where in the order of
      the graph as exported it was half of it."""
    path, _ = third_party.build("mobilenet_v2", tmp_path, "bench")
    graph = graphpass.load(path)
    report = graphpass.run_passes(graph, {"recompute": ["auto"]})[0].report
    fetches = AnalysisManager().regions(graph).fetches
    unordered = graph.copy()
    triggers = {t.rsplit(":", 1)[0] for e in report["segments"] for t in e["triggers"]}
    for read in [n for n in unordered if "/order/read" in n]:
        for source in unordered.control_inputs(read):
            if source not in triggers:
                unordered.remove_control_input(read, source)
    assert report["segment_order_edges"] > 0
    view = _grappler_graph(unordered, fetches)
    without = _in_its_orders(view, fetches)
    written = _in_its_orders(_grappler_graph(graph, fetches), fetches)
    assert written <= 0.75 * without, (written, without)
    exported_order = memory_profile(unordered, fetches).peak_bytes
    grappler_order = memory_profile(unordered, fetches,
                                    runtime=follow_runtime_order(unordered, view)).peak_bytes
    assert abs(grappler_order / without - 1) <= THIRD_PARTY_TOLERANCE, (grappler_order, without)
    assert abs(exported_order / without - 1) > THIRD_PARTY_TOLERANCE, (exported_order, without)


@pytest.fixture(scope="module")
def mobilenet_steps(tmp_path_factory) -> tuple[dict[str, Path], dict]:
    """Keras 3 MobileNetV2 at the test size: the SavedModel built, and ``auto``'s
    rewrite of it, with the rewrite's report."""
    root = tmp_path_factory.mktemp("mobilenet_orders")
    path, _ = third_party.build("mobilenet_v2", root, "test")
    graph = graphpass.load(path)
    report = graphpass.run_passes(graph, {"recompute": ["auto"]})[0].report
    graphpass.save(graph, root / "auto")
    return {"original": path, "auto": root / "auto"}, report


def _records_peaks(trace: Path) -> tuple[int, int]:
    """``step_stats.records_peak_bounds`` of a traced step."""
    import tensorflow as tf

    from graphpass.inspect.step_stats import records_peak_bounds

    return records_peak_bounds(tf.compat.v1.RunMetadata.FromString(trace.read_bytes()).step_stats)


def _orders(graph: Path, trace: Path, onednn: bool) -> dict:
    """``tools.fixtures.trace_order`` of ``graph`` against ``trace``, in a process
    with oneDNN set as where the trace was taken (its remapper fuses by it)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS=str(int(onednn)))
    done = subprocess.run([sys.executable, "-m", "tools.fixtures.trace_order", str(graph),
                           str(trace)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("onednn", [True, False])
def test_a_function_step_runs_in_the_order_grappler_gives_its_call(mobilenet_steps, tmp_path,
                                                                    onednn):
    """A session runs a SavedModel's step inlined into its call, in an order the
    function's own Grappler output does not give (thousands of nodes out of place)
    and Grappler asked on a graph calling it does (``tf_grappler.called_positions``):
    the estimate in that order is the estimate in the order of the graph TF ran,
    and the rewrite's order is TF's node for node (the original's differs in
    places, the first where variable reads go). The estimate shown is the higher
    order's, and the summary gives each. Replayed strictly in the order TF started
    the nodes, the estimate of the graph TF ran is the records' peak: what is left
    between the estimate and a measurement is the schedule, not the buffers."""
    paths, report = mobilenet_steps
    figures = report["runtime_estimate"]
    for key, shown in (("order_peaks_before", "peak_bytes_before"),
                       ("order_peaks_after", "peak_bytes_after")):
        assert len(figures[key]) == 2 and figures[shown] >= max(figures[key]), figures
    assert any("as a session calls it" in line for line in report["summary"]), report["summary"]
    for variant, path in paths.items():
        trace = tmp_path / f"{variant}.pb"
        records = third_party.measure("mobilenet_v2", path, "test", onednn, trace)["peak"]
        orders = _orders(path, trace, onednn)
        # where a free and an allocation share the trace's microsecond, the
        # records do not say which came first: either way round
        low, high = _records_peaks(trace)
        assert 0.98 * low <= orders["executed_order_mib"] * 2**20 <= 1.02 * high, \
            (variant, records, low, high, orders)
        assert orders["grappler_order_out_of_place"] > 100, (variant, orders)
        assert orders["called_order_mib"] == pytest.approx(
            orders["partition_graph_order_mib"], rel=0.01), (variant, orders)
        assert orders["estimate_mib"] == pytest.approx(
            max(orders["grappler_order_mib"], orders["called_order_mib"])), (variant, orders)
        if variant == "auto":
            assert orders["called_order_out_of_place"] == 0, orders

