"""The memory estimate (``graphpass.analysis.memory``) against TF's measured step peak.

Measured figures come from ``tools/fixtures/measure.py``: each graph in its own process,
one inter-op thread, Grappler defaults. Two figures, compared like with like:
the peak of the step's allocation records (present with oneDNN on or off) is
the kernels' own allocations, so it is compared with the estimate less the fed
values (``MemoryProfile.fed_bytes``); the CPU allocator's peak (where oneDNN keeps
statistics: what ``python -m tools.bench.planner``'s budgets and the README call the
measured peak) also counts the fed arrays, as the estimate does. Models are the
benchmark's, at test sizes (``tools/memory_models.py --small``), before and after
a hand-written ``--recompute`` rewrite.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphpass
from graphpass.analysis.memory import (
    check_batch_size,
    estimated_peak_bytes,
    memory_profile,
    memory_timeline,
)
from graphpass.errors import GraphpassError
from graphpass.formats.tf_io import graph_from_graph_def
from graphpass.ir.graph import Tensor
from graphpass.runtimes import runtime_for
from tools.fixtures import keras_models, memory_models
from tools.fixtures.measure import measure

pytestmark = pytest.mark.slow  # every test here measures in subprocesses

FETCHES = memory_models.FETCHES
#: The issue's target: estimate within 10% of the measured allocator peak.
TOLERANCE = 0.10
#: Known gaps at test size (within 5% at benchmark size, tools/memory_models.py):
#: the pre-norm FFN stack is 9-10% under, because Grappler's arithmetic optimizer
#: rewrites the GELU gradient's products so that two of them cannot write in
#: place, which the estimate, walking the graph as exported, does not see.
KNOWN_GAPS = {("ffn", "original"): 0.12, ("ffn", "remat"): 0.12}


def kernels_estimate(path, batch_size: int | None = None) -> int:
    """The estimated peak less the fed values: what the allocation records count."""
    profile = memory_profile(graphpass.load(path), FETCHES, batch_size)
    return profile.peak_bytes - profile.fed_bytes


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """model -> {"original": path, "remat": path}, each built once."""
    cache: dict = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = memory_models.write_variants(name, True, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


#: Models whose measured peak repeats from run to run at test size. The tf_keras CNNs
#: (MobileNetV2, ResNet50) do not: at test size their weight gradients outweigh the
#: activations, and TF's executor holds a varying set of them to the end of the step
#: (the same graph measured 16.0 and 25.0 MiB in two runs), so comparing them with a
#: deterministic estimate in CI would be a coin toss. Their calibration is measured at
#: benchmark size by ``tools/memory_models.py`` (within 5% there).
STABLE_MODELS = ("ffn", "mlp", "transformer")


@pytest.mark.parametrize("variant", ["original", "remat"])
@pytest.mark.parametrize("name", STABLE_MODELS)
def test_estimate_within_ten_percent_of_measured(variants, name, variant):
    path = variants(name)[variant]
    estimated = kernels_estimate(path)
    measured = measure(path, FETCHES, steps=1).peak_bytes
    tolerance = KNOWN_GAPS.get((name, variant), TOLERANCE)
    assert abs(estimated / measured - 1) <= tolerance, (estimated, measured)


def test_remat_lowers_estimate_and_measurement_alike(variants):
    paths = variants("mlp")
    estimated = [kernels_estimate(p) for p in paths.values()]
    measured = [measure(p, FETCHES, steps=1).peak_bytes for p in paths.values()]
    assert estimated[1] < 0.6 * estimated[0]
    assert abs(estimated[1] / estimated[0] - measured[1] / measured[0]) <= TOLERANCE


@pytest.mark.parametrize("onednn", [False, True])
def test_measured_with_onednn_off_and_on(variants, onednn):
    """TF_ENABLE_ONEDNN_OPTS=0 leaves the CPU allocator without statistics; the
    allocation records are there either way, and the estimate holds for both. Where
    the allocator keeps statistics, its peak includes the fed ``x`` as the estimate
    does."""
    path = variants("mlp")["original"]
    result = measure(path, FETCHES, steps=1, onednn=onednn)
    profile = memory_profile(graphpass.load(path), FETCHES)
    estimated = profile.peak_bytes - profile.fed_bytes
    assert profile.fed_bytes > 0
    assert result.peak_bytes > 0
    assert abs(estimated / result.peak_bytes - 1) <= TOLERANCE, (estimated, result.peak_bytes)
    if not onednn:
        assert result.allocator_peak_bytes is None
    elif result.allocator_peak_bytes is not None:  # a CPU oneDNN keeps statistics on
        measured = result.allocator_peak_bytes
        assert abs(profile.peak_bytes / measured - 1) <= TOLERANCE, (profile.peak_bytes, measured)


def test_dynamic_batch_needs_batch_size(tmp_path):
    model = keras_models.ffn(size=32, batch=8, layers=2, dynamic_batch=True)
    path = tmp_path / "ffn.meta"
    path.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    graph = graphpass.load(path)
    with pytest.raises(GraphpassError, match=r"input tokens has shape \[\?, 32\].*--batch-size"):
        check_batch_size(graph, FETCHES, None)
    check_batch_size(graph, FETCHES, 8)
    estimated = kernels_estimate(path, batch_size=8)
    measured = measure(path, FETCHES, batch_size=8, steps=1).peak_bytes
    assert abs(estimated / measured - 1) <= TOLERANCE, (estimated, measured)
    # Without the size, only what does not depend on the batch is counted.
    assert estimated_peak_bytes(graph, FETCHES) < estimated / 10
    assert memory_profile(graph, FETCHES, 8).fed_bytes == (8 * 32 + 8) * 4  # tokens, labels (i32)


def _chain_graph():
    """x (fed, 1 MiB) -> m = x * 2 -> r = relu(m) -> t = tanh(r) -> reshape -> sum."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [1024, 256], name="x")
        m = tf.multiply(x, 2.0, name="m")
        r = tf.nn.relu(m, name="r")
        t = tf.tanh(r, name="t")
        flat = tf.reshape(t, [-1], name="flat")
        tf.reduce_sum(flat, name="total")
    return graph_from_graph_def(graph.as_graph_def(), {})


def test_forwarding_and_aliasing():
    """Only ``m`` allocates: relu and tanh write into their single-use inputs and the
    reshape shares its input's buffer. The fed ``x`` is held for the whole step
    (TF copies it in), so it never frees a buffer for ``m``."""
    graph = _chain_graph()
    timeline = dict(memory_timeline(graph, ["total:0"]))
    mib = 1024 * 256 * 4
    assert memory_profile(graph, ["total:0"]).fed_bytes == mib
    assert timeline["m"] == timeline["r"] == timeline["t"] == timeline["flat"] == 2 * mib
    assert "x" not in timeline  # fed: no node of the step allocates it
    assert estimated_peak_bytes(graph, ["total:0"]) == 2 * mib + 4


def test_second_reader_blocks_forwarding():
    """A value read again later cannot be overwritten in place: relu's input ``m``
    is also fetched, so relu allocates its own buffer."""
    graph = _chain_graph()
    profile = memory_profile(graph, ["total:0", "m:0"])
    assert dict(profile.timeline)["r"] == 3 * 1024 * 256 * 4  # x, m, r
    assert profile.peak_bytes == max(live for _, live in profile.timeline)


def test_timeline_follows_schedule_and_peak(variants):
    graph = graphpass.load(variants("mlp")["original"])
    profile = memory_profile(graph, FETCHES)
    names = [name for name, _ in profile.timeline]
    assert len(names) == len(set(names))
    position = {name: i for i, name in enumerate(names)}
    for name in names:  # every node runs after the producers of its inputs
        assert all(position.get(t.node, -1) < position[name] for t in graph.inputs(name))
    lives = np.array([live for _, live in profile.timeline])
    assert profile.peak_bytes == lives.max()
    assert names[int(lives.argmax())] == profile.peak_node


def _tuple_graph():
    """Two products joined by ``tf.tuple`` (a NoOp and two Identities, as every
    gradient's ``tuple/control_dependency`` is), read by ``u`` (the first) and an
    assignment (the second); ``f`` fills ``x``'s static shape, a folded value."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [256, 256], name="x")
        w = tf1.get_variable("w", [256, 256], use_resource=True)
        a = tf.matmul(x, x, name="a")
        b = tf.matmul(x, w.read_value(), name="b")
        first, second = tf.tuple([a, b], name="pair")
        f = tf.fill(tf.shape(x, name="shape"), 1.0, name="f")
        u = tf.tanh(first + f, name="u")
        assign = w.assign(second, name="assign")
        with tf.control_dependencies([assign]):
            tf.identity(tf.reduce_sum(u), name="total")
    return graph_from_graph_def(graph.as_graph_def(), {})


def test_schedule_follows_the_graph_grappler_hands_the_executor():
    """The dependency optimizer bypasses ``tf.tuple``'s NoOp and Identities, so ``u``
    reads ``a`` and waits on ``b`` by a control edge, and the assignment reads ``b``;
    constant folding makes ``f`` (and the ``Shape`` it reads) run first, waiting on
    nothing; the fetched ``total`` is kept."""
    from graphpass.analysis.memory import _known_before
    from graphpass.runtimes.tf_order import GrapplerView

    graph = _tuple_graph()
    needed = graph.ancestors(["total"]) | {"total"}
    known = _known_before(graph, needed, None, runtime_for(graph))
    assert {"shape", "f"} <= known
    members = [n for n in graph if n in needed]
    view = GrapplerView(graph, members, known, frozenset({"total"}),
                        lambda s, d: False, lambda n: graph.dialect.is_stateful(graph, n))
    view.optimize()
    bypassed = {"pair/control_dependency", "pair/control_dependency_1", "pair/group_deps"}
    assert bypassed <= view.bypassed and "total" not in view.bypassed
    successors = view.successors()
    assert "add" in successors["a"] and "add" in successors["b"]
    assert ("a", False) in view.inputs["add"] and ("b", True) in view.inputs["add"]
    assert successors["b"][0] == "assign"  # data edges first, then control edges
    assert view.inputs["f"] == [] and view.inputs["shape"] == []
    execution = runtime_for(graph).executions(graph, needed, known, frozenset({"total"}))[0]
    assert sorted(execution.order) == sorted(needed - bypassed)  # bypassed: run nowhere
    assert execution.read(Tensor("pair/control_dependency", 0)) == Tensor("a", 0)
    assert execution.read(Tensor("pair/control_dependency_1", 0)) == Tensor("b", 0)
    position = {n: i for i, n in enumerate(execution.order)}
    for name in execution.order:  # after the producers of what they really read
        assert all(position[execution.read(t).node] < position[name]
                   for t in graph.inputs(name) if name not in known
                   and execution.read(t).node not in known)
