"""Drop-stale gates every kind of update, sparse ones included, and region analysis
counts each update's gradient once (tools/fixtures/sparse_models.py).

An embedding's gradient is ``IndexedSlices``; TF 1.x SGD and Adam apply it with
plain ops and scatters (``ScatterSub``, ``ScatterAdd``, ``ResourceScatterAdd``)
beside the ``Apply*`` ops of the dense variables, Keras optimizers with
``ResourceScatter*`` or a dense ``UnsortedSegmentSum``. ``--drop-stale -1``
(drop every step) must leave every trained and optimizer variable as it was;
``--drop-stale 0`` with one worker must train them exactly as the original.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphpass
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.inspect.describe import describe
from tools.fixtures import keras3_models, sparse_models, stale_cluster, tf_models

ROOT = Path(__file__).resolve().parent.parent
STEPS = 3
COUNTER = "graphpass/stale_counter"
#: TF 1.15's matrix, each row with an embedding table (its row 1 is 10 + v0).
MATRIX = stale_cluster.TF115_MATRIX
V1_CASES = [(o, r) for o in ("sgd", "adam") for r in (False, True)]


def _rewrite(graph_def, **settings):
    graph = graph_from_graph_def(graph_def)
    settings.setdefault("xla_cluster", "none")  # the runtime's kernels, for exact comparisons
    results = graphpass.run_passes(graph, settings)
    assert results[-1].name == "stale" and results[-1].changed
    return graph_def_from_graph(graph), results[-1].report


@pytest.fixture(scope="module")
def lstm():
    """The tf_keras Embedding + LSTM + Dense model, its initial variables and its
    reference run."""
    model = sparse_models.embedding_lstm()
    _, initial, _ = tf_models.run_steps(model.graph_def, model, steps=0)
    losses, values, _ = tf_models.run_steps(model.graph_def, model, steps=STEPS)
    return model, initial, losses, values


def _trainable_and_slots(values: dict) -> list[str]:
    return [n for n in values if n != COUNTER]


# -- region analysis: every sparse update found, each gradient counted once -----------------


@pytest.mark.parametrize("optimizer,use_resource", V1_CASES,
                         ids=[f"{o}-{'resource' if r else 'ref'}" for o, r in V1_CASES])
def test_v1_sparse_updates_are_found(optimizer, use_resource):
    """SGD's ``ScatterSub``/``ResourceScatterAdd`` and Adam's ``ScatterAdd`` path
    update the table beside the head's ``Apply*`` op: two updates, one gradient each."""
    model = sparse_models.embedding_v1(optimizer, use_resource)
    graph = graph_from_graph_def(model.graph_def)
    (step,) = graphpass.analyze(graph).steps
    variables = {graph.inputs(a)[0].node for a in step.applies}
    assert len(step.applies) == 2 and len(step.gradients) == 2, step
    assert {graph.node(v).name for v in variables} == {"table", "head"}


def test_tf_keras_lstm_counts_six_updates(lstm):
    model, *_ = lstm
    info = describe(graph_from_graph_def(model.graph_def))
    regions = info["regions"]
    assert len(regions["updates"]) == 6 and len(regions["gradients"]) == 6
    assert any("embed" in u for u in regions["updates"])


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_keras3_gradients_counted_once(keras3_dir, optimizer):
    """A Keras 3 step: one gradient per update of a trainable variable (Adam reads
    ``g`` and ``square(g)``, both from one gradient)."""
    source = keras3_dir / f"mlp_{optimizer}"
    keras3_models.export(source, "mlp", optimizer)
    regions = describe(graphpass.load(source))["regions"]
    assert len(regions["updates"]) == len(regions["gradients"]) == 8, regions["gradients"]
    embedding = sparse_models.export_keras3_embedding(keras3_dir / f"embed_{optimizer}",
                                                      optimizer)
    regions = describe(graphpass.load(embedding))["regions"]
    assert len(regions["updates"]) == len(regions["gradients"]) == 3, regions["gradients"]


# -- TF 1.x graphs, one process ----------------------------------------------------------------


def test_drop_every_step_freezes_the_tf_keras_lstm(lstm):
    model, initial, losses, _ = lstm
    rewritten, report = _rewrite(model.graph_def, drop_stale="-1")
    got_losses, got, _ = tf_models.run_steps(rewritten, model, steps=STEPS)
    changed = [n for n in initial if not np.array_equal(initial[n], got[n])]
    assert changed == []
    assert got[COUNTER] == STEPS and got["global_step"] == 0
    assert np.all(got_losses == losses[0])


def test_nothing_stale_trains_the_tf_keras_lstm_exactly(lstm):
    model, _, losses, values = lstm
    rewritten, _ = _rewrite(model.graph_def, drop_stale="0")
    got_losses, got, _ = tf_models.run_steps(rewritten, model, steps=STEPS)
    assert got_losses.tobytes() == losses.tobytes()
    assert [n for n in values if got[n].tobytes() != values[n].tobytes()] == []


@pytest.mark.parametrize("optimizer,use_resource", V1_CASES,
                         ids=[f"{o}-{'resource' if r else 'ref'}" for o, r in V1_CASES])
def test_drop_every_step_freezes_v1_embeddings(optimizer, use_resource):
    model = sparse_models.embedding_v1(optimizer, use_resource)
    _, initial, _ = tf_models.run_steps(model.graph_def, model, steps=0)
    losses, trained, _ = tf_models.run_steps(model.graph_def, model, steps=STEPS)
    assert not np.array_equal(initial["table"], trained["table"])
    for target in ["tf", "xla"] if use_resource else ["tf"]:
        rewritten, _ = _rewrite(model.graph_def, drop_stale="-1", target=target)
        _, got, _ = tf_models.run_steps(rewritten, model, steps=STEPS)
        assert [n for n in initial if not np.array_equal(initial[n], got[n])] == [], target
        assert got[COUNTER] == STEPS
        rewritten, _ = _rewrite(model.graph_def, drop_stale="0", target=target)
        got_losses, got, _ = tf_models.run_steps(rewritten, model, steps=STEPS)
        assert got_losses.tobytes() == losses.tobytes(), target
        assert [n for n in trained if got[n].tobytes() != trained[n].tobytes()] == [], target


_EXACT = """
import json, numpy as np, graphpass
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from tools.fixtures import sparse_models, tf_models
out = {}
for name, model in (("lstm", sparse_models.embedding_lstm()),
                    ("adam-ref", sparse_models.embedding_v1("adam", False)),
                    ("sgd-resource", sparse_models.embedding_v1("sgd", True))):
    losses, values, _ = tf_models.run_steps(model.graph_def, model, steps=3)
    graph = graph_from_graph_def(model.graph_def)
    graphpass.run_passes(graph, {"drop_stale": "0"})
    got_losses, got, _ = tf_models.run_steps(graph_def_from_graph(graph), model, steps=3)
    out[name] = [n for n in values if got[n].tobytes() != values[n].tobytes()] + (
        [] if got_losses.tobytes() == losses.tobytes() else ["losses"])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["1", "0"])
def test_nothing_stale_trains_sparse_exactly_onednn_on_and_off(onednn):
    """``--drop-stale 0``, one worker: every variable, the sparse ones included, and
    every loss bit for bit as the original, with oneDNN's rewrites on and off."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _EXACT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, done.stderr[-2000:]
    assert json.loads(line[len("RESULT "):]) == {"lstm": [], "adam-ref": [],
                                                 "sgd-resource": []}


# -- Keras 3, a TF2 train signature -------------------------------------------------------------


@pytest.fixture(scope="module")
def keras3_dir(tmp_path_factory):
    import tensorflow as tf

    was_eager = tf.executing_eagerly()
    yield tmp_path_factory.mktemp("keras3_sparse")
    if not was_eager:  # TF1 tests after this module expect graph mode
        tf.compat.v1.disable_eager_execution()


def _keras3_train(directory: Path, steps: int = STEPS) -> tuple[list, dict]:
    tf, _ = keras3_models._keras()
    loaded = tf.saved_model.load(str(directory))  # holds the variables
    function = loaded.signatures["train"]
    feed = {k: tf.constant(v) for k, v in sparse_models.keras3_inputs().items()}
    losses = [function(**feed)["loss"].numpy() for _ in range(steps)]
    return losses, {v.name: v.numpy() for v in function.variables}


#: Keras 3 optimizers and the write each applies to the embedding with (Adagrad also
#: scatters into its accumulator: ResourceScatterAdd).
KERAS3_SPARSE = {"adam": "AssignSubVariableOp", "sgd": "AssignAddVariableOp",
                 "sgd-plain": "ResourceScatterSub", "adagrad": "ResourceScatterSub"}


def _keras3_source(keras3_dir: Path, optimizer: str) -> Path:
    source = keras3_dir / f"source_{optimizer}"
    if not source.exists():
        sparse_models.export_keras3_embedding(source, optimizer)
    return source


def _keras3_rewrite(source: Path, staleness: str) -> Path:
    from graphpass.cli import main

    target = source.with_name(f"{source.name}_stale{staleness}")
    assert main(["rewrite", str(source), "-o", str(target), "--quiet",
                 "--drop-stale", staleness]) == 0
    return target


@pytest.mark.parametrize("optimizer", sorted(KERAS3_SPARSE))
def test_keras3_embedding_drop_every_step_freezes(keras3_dir, optimizer):
    source = _keras3_source(keras3_dir, optimizer)
    graph = graphpass.load(source)
    ops = {graph.node(n).op for n in graphpass.analyze(graph).steps[0].applies}
    assert KERAS3_SPARSE[optimizer] in ops, ops
    _, initial = _keras3_train(source, steps=0)
    _, trained = _keras3_train(source)
    assert any("embed" in n and not np.array_equal(initial[n], trained[n]) for n in initial)
    _, got = _keras3_train(_keras3_rewrite(source, "-1"))
    assert sorted(got) == sorted(initial)
    assert [n for n in initial if got[n].tobytes() != initial[n].tobytes()] == []


@pytest.mark.parametrize("optimizer", sorted(KERAS3_SPARSE))
def test_keras3_embedding_nothing_stale_trains_exactly(keras3_dir, optimizer):
    """Adagrad included: the gated update compiles with the step (the If is lowered
    and inlined before Grappler), so Grappler rewrites ``lr * g / sqrt(acc + eps)``
    into ``* rsqrt`` there as in the original."""
    source = _keras3_source(keras3_dir, optimizer)
    losses, trained = _keras3_train(source)
    got_losses, got = _keras3_train(_keras3_rewrite(source, "0"))
    assert np.array(got_losses).tobytes() == np.array(losses).tobytes()
    assert [n for n in trained if got[n].tobytes() != trained[n].tobytes()] == []


# -- TF's distributed matrix with a sparse variable ---------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """1 ps + 3 workers on 127.0.0.1 in this process (they live until it ends)."""
    return stale_cluster.start_servers(stale_cluster.cluster_dict(3))


@pytest.mark.slow
@pytest.mark.parametrize("variables,target", [("ref", "tf"), ("resource", "xla")])
@pytest.mark.parametrize("row", MATRIX, ids=[f"{r[0]}workers-staleness{r[1]}" for r in MATRIX])
def test_distributed_matrix_with_an_embedding(cluster, row, variables, target):
    """Each worker's loss also subtracts row 1 of an embedding table on the ps, so
    SGD scatters into it: the row moves exactly when v0 does, rows 0 and 2 never."""
    workers, staleness, step, counter, v0, v1 = row
    graphs = []
    for index in range(workers):
        original = stale_cluster.worker_graph(index, workers, variables == "resource",
                                              f"_sparse_{workers}_{staleness}_{variables}",
                                              sparse=True)
        rewritten, report = _rewrite(original, drop_stale=str(staleness), train_op=["train"],
                                     loss="loss", target=target)
        graphs.append(rewritten)
    state = stale_cluster.run_in_process(cluster, graphs, report["counter_read"])
    assert state == {"global_step": step, "stale_counter": counter, "v0": v0, "v1": v1,
                     "table0": 0.0, "table1": 10.0 + v0, "table2": 20.0}
