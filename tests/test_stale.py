"""The stale pass (graph-level DropStaleGradientOptimizer), on real TF graphs and a
real TF cluster: semantics single-process, TF 1.15's distributed matrix, structure,
checkpoints, errors through the CLI."""

from __future__ import annotations

import numpy as np
import pytest

import graphpass
from graphpass.cli import main
from graphpass.errors import GraphpassError
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.options import pipeline_options
from graphpass.passes import build_passes
from graphpass.passes.stale import GATE_ATTR
from tools.fixtures import stale_cluster, tf_models

STEPS = 3
COUNTER = "graphpass/stale_counter"
PS = "/job:ps/task:0"

MATRIX = stale_cluster.TF115_MATRIX


def rewrite(graph_def, **settings):
    """Run the pass through the pipeline; returns (graph, rewritten GraphDef, report)."""
    graph = graph_from_graph_def(graph_def)
    settings = {k: v for k, v in settings.items() if v is not None}
    # Bitwise comparisons need the runtime's kernels: keep XLA from compiling the step
    # (lowering is tested in test_lower.py); the conditional's form still follows target.
    settings.setdefault("xla_cluster", "none")
    results = graphpass.run_passes(graph, settings)
    # --target xla also runs the lowering pass (XLA clustering) before stale.
    assert results[-1].name == "stale" and results[-1].changed
    return graph, graph_def_from_graph(graph), results[-1].report


def _tf1():
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    return tf.compat.v1


# -- single process: semantics -----------------------------------------------------

BUILDERS = {
    "sgd-resource": lambda: tf_models.block_mlp(blocks=3, optimizer="sgd"),
    "momentum-ref": lambda: tf_models.block_mlp(blocks=3, optimizer="momentum",
                                                use_resource=False),
    "adam-resource": lambda: tf_models.block_mlp(blocks=3, optimizer="adam"),
}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def trained(request):
    """A model, its original losses/variables after STEPS steps, and its initial values."""
    model = BUILDERS[request.param]()
    losses, values, _ = tf_models.run_steps(model.graph_def, model, steps=STEPS)
    _, initial, _ = tf_models.run_steps(model.graph_def, model, steps=0)
    return request.param, model, losses, values, initial


def _targets(kind: str) -> list[str]:
    return ["tf", "xla"] if "resource" in kind else ["tf"]  # If needs resource variables


@pytest.mark.parametrize("staleness", [0, 2])
def test_nothing_stale_trains_bitwise_identically(trained, staleness):
    kind, model, losses, values, _ = trained
    for target in _targets(kind):
        _, rewritten, report = rewrite(model.graph_def, drop_stale=str(staleness), target=target)
        got_losses, got, _ = tf_models.run_steps(rewritten, model, steps=STEPS)
        assert np.array_equal(got_losses, losses), (kind, target)
        for name, value in values.items():
            assert np.array_equal(got[name], value), (kind, target, name)
        assert got["global_step"] == STEPS
        assert got[COUNTER] == 0.0
        assert report["counter"] == COUNTER and report["target"] == target


def test_negative_staleness_drops_every_step(trained):
    kind, model, losses, _, initial = trained
    for target in _targets(kind):
        _, rewritten, _ = rewrite(model.graph_def, drop_stale="-1", target=target)
        got_losses, got, _ = tf_models.run_steps(rewritten, model, steps=STEPS)
        assert got["global_step"] == 0, target
        assert got[COUNTER] == float(STEPS), target
        for name, value in initial.items():
            assert np.array_equal(got[name], value), (kind, target, name)
        assert np.all(got_losses == got_losses[0]) and got_losses[0] == losses[0]


@pytest.mark.slow
def test_several_train_ops_custom_scope_and_clipping():
    """Two towers, gradients under ``training/grads``, clipped by global norm: each
    train op gets its own snapshot and conditional, and waits for the *clipped*
    gradients. Both run in one ``Session.run`` and tower0 increments global_step,
    so tower1's gradients may be 1 step stale: staleness 1 accepts everything."""
    tf1 = _tf1()
    model = tf_models.clipped_custom_scope(train_ops=2)
    graph, rewritten, report = rewrite(model.graph_def, drop_stale="1")
    assert [s["train_op"] for s in report["steps"]] == ["tower0/train", "tower1/train"]
    snapshots = {s["snapshot"] for s in report["steps"]}
    assert len(snapshots) == 2 and len({s["gate"] for s in report["steps"]}) == 2
    for step in graphpass.analyze(graph_from_graph_def(model.graph_def)).steps:
        snapshot = next(s["snapshot"] for s in report["steps"] if s["train_op"] == step.train_op)
        assert all("clip_by_global_norm" in t.node for t in step.gradients)
        for gradient in step.gradients:
            assert snapshot in graph.ancestors([gradient.node])

    def run(graph_def, steps):
        g = tf1.Graph()
        with g.as_default():
            tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=g) as session:
            session.run(model.init)
            out = [session.run(["tower0/loss:0", "tower1/loss:0", "tower0/train",
                                "tower1/train"], model.feeds)[:2]
                   for _ in range(steps)]
            return np.array(out)

    assert np.array_equal(run(model.graph_def, STEPS), run(rewritten, STEPS))
    _, dropped, report = rewrite(model.graph_def, drop_stale="-1")
    g = tf1.Graph()
    with g.as_default():
        tf1.import_graph_def(dropped, name="")
    with tf1.Session(graph=g) as session:
        session.run(model.init)
        for _ in range(STEPS):
            session.run(["tower0/train", "tower1/train"], model.feeds)
        assert session.run(report["counter_read"]) == 2.0 * STEPS


def test_v1_control_flow_and_update_ops():
    """A v1 ``cond`` + ``while_loop`` (gradient loops: the snapshot stays in the root
    frame), and batch-norm updates the train op depends on (ref variables)."""
    for model in (tf_models.control_flow(), tf_models.conv_bn_dropout()):
        losses, values, _ = tf_models.run_steps(model.graph_def, model, steps=2)
        graph, rewritten, report = rewrite(model.graph_def, drop_stale="0")
        got_losses, got, _ = tf_models.run_steps(rewritten, model, steps=2)
        assert np.array_equal(got_losses, losses)
        assert all(np.array_equal(got[k], v) for k, v in values.items())
        step = graphpass.analyze(graph_from_graph_def(model.graph_def)).steps[0]
        snapshot = report["steps"][0]["snapshot"]
        for gradient in step.gradients:
            assert snapshot in graph.ancestors([gradient.node]), gradient


# -- structure -------------------------------------------------------------------------


def _step_nodes(graph, report):
    step = report["steps"][0]
    gate = step["gate"]
    switch = next(n.name for n in graph.nodes() if GATE_ATTR in n.attrs)
    return step["snapshot"], switch, gate


def test_structure_switch_merge():
    """Every gradient depends on the snapshot; the apply ops, Adam's beta-power updates
    and the global-step increment depend on the Switch's true side; the counter
    increment on its false side; the train op keeps its name after the Merge."""
    model = tf_models.block_mlp(blocks=2, optimizer="adam")
    original = graph_from_graph_def(model.graph_def)
    regions = graphpass.analyze(original)
    step = regions.steps[0]
    graph, _, report = rewrite(model.graph_def, drop_stale="1")
    snapshot, switch, merge = _step_nodes(graph, report)
    assert graph.node(snapshot).op == "AddV2"
    assert graph.node(switch).op == "Switch" and graph.node(merge).op == "Merge"
    for gradient in step.gradients:
        assert snapshot in graph.ancestors([gradient.node])
    accept = next(u for u in graph.users(switch)
                  if any(t.port == 1 for t in graph.inputs(u) if t.node == switch))
    drop = next(u for u in graph.users(switch)
                if any(t.port == 0 for t in graph.inputs(u) if t.node == switch))
    beta_updates = [n.name for n in original.nodes() if n.op == "AssignVariableOp"
                    and regions.label(n.name) == "optimizer"]
    assert len(beta_updates) == 2
    for name in step.applies + beta_updates + ["train/accepted"]:
        assert accept in graph.ancestors([name]), name
        assert drop not in graph.ancestors([name]), name
    count = next(n.name for n in graph.nodes() if n.op == "AssignAddVariableOp"
                 and graph.inputs(n.name)[0].node == COUNTER)
    assert graph.control_inputs(count) == [drop]
    staleness_read = graph.inputs(graph.inputs(graph.inputs(switch)[1].node)[0].node)[0].node
    assert {t.node for t in step.gradients} <= set(graph.control_inputs(staleness_read))
    assert graph.node("train").op == "NoOp" and graph.control_inputs("train") == [merge]
    assert not graph.users("train")


def test_structure_if_form():
    model = tf_models.block_mlp(blocks=2, optimizer="adam")
    graph, _, report = rewrite(model.graph_def, drop_stale="1", target="xla")
    gate = report["steps"][0]["gate"]
    node = graph.node(gate)
    assert node.op == "If" and GATE_ATTR in node.attrs
    assert not [n for n in graph.nodes() if n.op.startswith("ResourceApply")]
    library = {f.signature.name: f for f in graph.format_state.library.function}
    then = library[node.attrs["then_branch"].func.name]
    orelse = library[node.attrs["else_branch"].func.name]
    assert sum(n.op == "ResourceApplyAdam" for n in then.node_def) == 2
    assert any(n.op == "AssignAddVariableOp" for n in then.node_def)  # global_step += 1
    assert [n.op for n in orelse.node_def if n.op != "Const"] == ["AssignAddVariableOp"]
    assert set(then.control_ret) >= {n.name for n in then.node_def
                                     if n.op.startswith(("ResourceApply", "Assign"))}
    assert graph.control_inputs("train") == [gate]


def test_devices_kept_on_a_ps_worker_graph():
    """Snapshot, check and counter on global_step's device (the ps); the apply ops stay
    on the variables' devices; the train op stays on the worker."""
    original = graph_from_graph_def(stale_cluster.worker_graph(1, 2))
    devices = {n.name: n.device for n in original.nodes()}
    graph, _, report = rewrite(stale_cluster.worker_graph(1, 2), drop_stale="0",
                               train_op=["train"], loss="loss")
    assert graph.node("global_step").device == PS
    snapshot = report["steps"][0]["snapshot"]
    assert graph.node(snapshot).device == PS and graph.node(COUNTER).device == PS
    assert graph.node(report["steps"][0]["gate"]).device == PS
    for node in original.nodes():
        if node.name in graph:
            assert graph.node(node.name).device == devices[node.name], node.name
    assert graph.node("train").device == "/job:worker/task:1"


def test_ordering_is_inherited():
    """TF's test orders the chief's gradients after a dequeue and the other workers'
    apply after another: the chief's snapshot and the others' staleness read
    inherit those control inputs (without them the matrix comes out different)."""
    def rewritten(worker):
        graph, _, report = rewrite(stale_cluster.worker_graph(worker, 2), drop_stale="0",
                                   train_op=["train"], loss="loss")
        return graph, report["steps"][0]["snapshot"]

    chief, snapshot = rewritten(0)
    dequeue_many = next(n.name for n in chief.nodes() if n.op == "QueueDequeueManyV2")
    assert dequeue_many in chief.control_inputs(f"{snapshot}/read")
    other, snapshot = rewritten(1)
    dequeue = next(n.name for n in other.nodes() if n.op == "QueueDequeueV2")
    check = snapshot.replace("local_step", "staleness/read")
    assert dequeue in other.control_inputs(check)
    assert dequeue not in other.ancestors([snapshot])
    # the final enqueue (the train op) now follows the conditional, on both branches
    merge = next(n.name for n in other.nodes() if n.op == "Merge")
    assert merge in other.control_inputs("train")
    assert not {"GradientDescent", "GradientDescent/update"} & set(other.control_inputs("train"))


def test_device_tpu_implies_the_if_form():
    """The stale pass takes the target the context resolved: --device tpu is xla."""
    model = tf_models.block_mlp(blocks=2, optimizer="sgd")
    graph, _, report = rewrite(model.graph_def, drop_stale="0", device="tpu")
    assert report["target"] == "xla" and [s["form"] for s in report["steps"]] == ["If"]
    assert any(graph.node(n).op == "If" for n in graph)


def test_second_run_is_refused_and_options():
    model = tf_models.block_mlp(blocks=2, optimizer="sgd")
    graph, _, _ = rewrite(model.graph_def, drop_stale="0")
    with pytest.raises(GraphpassError, match="already drops stale gradients"):
        graphpass.run_passes(graph, {"drop_stale": "0"})
    assert pipeline_options({}).stale is None
    assert build_passes(pipeline_options({"drop_stale": 0}))[0].options.staleness == 0
    with pytest.raises(GraphpassError, match="--target"):  # from a config file
        pipeline_options({"drop_stale": "1", "target": "onnx"})
    ref_model = tf_models.block_mlp(blocks=2, optimizer="momentum", use_resource=False)
    with pytest.raises(GraphpassError, match="--target xla needs resource variables"):
        rewrite(ref_model.graph_def, drop_stale="0", target="xla")


def test_staleness_summary():
    from tensorflow.core.framework import summary_pb2

    model = tf_models.block_mlp(blocks=2, optimizer="sgd")
    _, rewritten, report = rewrite(model.graph_def, drop_stale="-1", staleness_summary=True)
    _, _, (serialized,) = tf_models.run_steps(rewritten, model, steps=2,
                                              fetch_extra=[report["summary_op"] + ":0"])
    (value,) = summary_pb2.Summary.FromString(serialized).value
    assert value.simple_value == 2.0  # 2 drops / (global_step 0 + 1)


def test_ref_global_step_train_op_keeps_its_value():
    """With a ref global_step the train op is ``AssignAdd`` (``train:0`` is the new
    step). The recreated ``train`` still yields it: the new step when applied, the
    unchanged step when dropped."""
    tf1 = _tf1()
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        step = tf1.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                            use_resource=False,
                            collections=[tf1.GraphKeys.GLOBAL_VARIABLES,
                                         tf1.GraphKeys.GLOBAL_STEP])
        w = tf1.Variable([1.0, 2.0], name="w", use_resource=False)
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(
            tf.reduce_sum(w * w, name="loss"), global_step=step, name="train")
        tf1.global_variables_initializer()
    assert train.type == "AssignAdd"

    def run(graph_def):
        g = tf1.Graph()
        with g.as_default():
            tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=g) as session:
            session.run("init")
            steps = [session.run("train:0") for _ in range(STEPS)]
            return steps, session.run("w:0")

    original = run(graph.as_graph_def())
    _, accepted, _ = rewrite(graph.as_graph_def(), drop_stale="0")
    got = run(accepted)
    assert got[0] == original[0] == [1, 2, 3] and np.array_equal(got[1], original[1])
    _, dropped, _ = rewrite(graph.as_graph_def(), drop_stale="-1")
    got = run(dropped)
    assert got[0] == [0, 0, 0] and np.array_equal(got[1], [1.0, 2.0])


# -- checkpoints -------------------------------------------------------------------------


def test_checkpoint_of_the_original_restores_into_the_rewritten(tmp_path):
    """Train 2 steps on the original graph and ``Saver.save`` (which writes the .meta
    with its SaverDef); rewrite that .meta with the CLI; continue 2 steps from the
    checkpoint on both (init op, then the Saver ``import_meta_graph`` returns):
    identical losses and variables. The counter is a global variable of the
    rewritten MetaGraph, but the existing Saver does not save or restore it."""
    tf1 = _tf1()
    model = tf_models.block_mlp(blocks=2, optimizer="adam")
    ckpt, rewritten = tmp_path / "ckpt", tmp_path / "stale.meta"
    graph = tf1.Graph()
    with graph.as_default():
        saver = tf1.train.import_meta_graph(model.meta_graph)
    with tf1.Session(graph=graph) as session:
        session.run(model.init)
        for _ in range(2):
            session.run(model.train_op, model.feeds)
        saver.save(session, str(ckpt))
    assert main(["rewrite", f"{ckpt}.meta", "-o", str(rewritten), "--drop-stale", "0",
                 "--quiet"]) == 0

    def continue_from_checkpoint(meta_path):
        graph = tf1.Graph()
        with graph.as_default():
            saver = tf1.train.import_meta_graph(str(meta_path))
            variables = {v.name: v for v in tf1.global_variables()}
        with tf1.Session(graph=graph) as session:
            session.run(model.init)
            saver.restore(session, str(ckpt))
            losses = [session.run([model.loss, model.train_op], model.feeds)[0]
                      for _ in range(2)]
            values = session.run({k: v for k, v in variables.items()
                                  if not k.startswith(COUNTER)})
        return np.array(losses), values, variables

    losses, values, _ = continue_from_checkpoint(f"{ckpt}.meta")
    got_losses, got_values, variables = continue_from_checkpoint(rewritten)
    assert not variables[f"{COUNTER}:0"].trainable
    assert np.array_equal(losses, got_losses)
    assert values.keys() == got_values.keys()
    assert all(np.array_equal(values[k], got_values[k]) for k in values)


# -- TF's distributed test ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """1 ps + 3 workers on 127.0.0.1, in this process (TF servers cannot be stopped:
    they live until the test process ends; each run resets the ps's state)."""
    return stale_cluster.start_servers(stale_cluster.cluster_dict(3))


def _worker_graphs(workers, staleness, use_resource, target, tag):
    graphs = []
    for index in range(workers):
        original = stale_cluster.worker_graph(index, workers, use_resource, tag)
        _, rewritten, report = rewrite(original, drop_stale=str(staleness), train_op=["train"],
                                       loss="loss", target=target)
        graphs.append(rewritten)
    return graphs, report["counter_read"]


@pytest.mark.slow
@pytest.mark.parametrize("variables,target", [("ref", "tf"), ("resource", "xla")])
@pytest.mark.parametrize("row", MATRIX, ids=[f"{r[0]}workers-staleness{r[1]}" for r in MATRIX])
def test_distributed_matrix(cluster, row, variables, target):
    workers, staleness, step, counter, v0, v1 = row
    graphs, counter_read = _worker_graphs(workers, staleness, variables == "resource", target,
                                          tag=f"_{workers}_{staleness}_{variables}")
    state = stale_cluster.run_in_process(cluster, graphs, counter_read)
    assert state == {"global_step": step, "stale_counter": counter, "v0": v0, "v1": v1}


@pytest.mark.slow
def test_distributed_matrix_separate_processes(tmp_path):
    """ps and 3 workers as separate OS processes, each worker loading the GraphDef the
    CLI wrote (staleness 1: the chief and one worker apply, one drops)."""
    workers, staleness, step, counter, v0, v1 = MATRIX[-1]
    paths = []
    for index in range(workers):
        source, target = tmp_path / f"worker{index}.pb", tmp_path / f"worker{index}.stale.pb"
        source.write_bytes(stale_cluster.worker_graph(index, workers).SerializeToString())
        assert main(["rewrite", str(source), "-o", str(target), "--drop-stale", str(staleness),
                     "--train-op", "train", "--loss", "loss", "--quiet"]) == 0
        paths.append(target)
    state = stale_cluster.run_in_processes(paths, f"{COUNTER}/Read/ReadVariableOp:0")
    assert state == {"global_step": step, "stale_counter": counter, "v0": v0, "v1": v1}


# -- errors through the CLI ---------------------------------------------------------------


def _graph_file(tmp_path, build):
    tf1 = _tf1()
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        build(tf, tf1)
        tf1.global_variables_initializer()
    path = tmp_path / "model.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


def _no_global_step(tf, tf1):
    w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
    tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w * w), name="train")


def _forward_only(tf, tf1):
    w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
    tf.reduce_sum(w * w, name="loss")


def _with_step(tf, tf1):
    w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
    step = tf1.train.get_or_create_global_step()
    tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w * w), global_step=step,
                                                     name="train")


@pytest.mark.parametrize("build,extra,message", [
    (_no_global_step, [], "found no global_step"),
    (_forward_only, [], "found no optimizer apply ops"),
    (_with_step, ["--train-op", "init"], "applies no gradients"),
    (_with_step, ["--drop-stale", "0.5"], "expects an integer staleness"),
    (_with_step, ["--drop-stale", "two"], "expects an integer staleness"),
    (_with_step, ["--stale-counter", "w"], "names an existing node"),
])
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, build, extra, message):
    source, output = _graph_file(tmp_path, build), tmp_path / "out.pb"
    argv = ["rewrite", str(source), "-o", str(output)]
    argv += extra if "--drop-stale" in extra else ["--drop-stale", "1", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphpass: error:") and message in err
    assert not output.exists()


def test_cli_refuses_a_rewritten_graph(tmp_path, capsys):
    source = _graph_file(tmp_path, _with_step)
    once, twice = tmp_path / "once.pb", tmp_path / "twice.pb"
    assert main(["rewrite", str(source), "-o", str(once), "--drop-stale", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["rewrite", str(once), "-o", str(twice), "--drop-stale", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already drops stale gradients" in err
    assert not twice.exists()
