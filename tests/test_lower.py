"""Target lowering: XLA clustering that really compiles, device strings, the XLA check."""

from __future__ import annotations

import numpy as np

import graphpass
from graphpass.cli import main
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.passes.remat.marks import SCOPE
from tools.fixtures import tf_models


def _rewrite(model, **settings):
    graph = graph_from_graph_def(model.graph_def, {})
    return graph, graphpass.run_passes(graph, settings)


def _xla_ops_that_ran(graph_def, model) -> set[str]:
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    options = tf1.RunOptions(output_partition_graphs=True)
    metadata = tf1.RunMetadata()
    with tf1.Session(graph=tf_graph) as session:
        session.run(model.init)
        session.run(model.train_op, model.feeds, options=options, run_metadata=metadata)
    return {n.op for g in metadata.partition_graphs for n in g.node if n.op.startswith("_Xla")}


def test_xla_target_compiles_the_step_and_matches_the_original():
    model = tf_models.block_mlp(optimizer="momentum")
    graph, results = _rewrite(model, recompute=["block[1-7]/"], target="xla")
    assert [r.name for r in results] == ["remat", "lower"]
    assert results[0].report["dependency"] == "data"  # XLA ignores control edges
    rewritten = graph_def_from_graph(graph)
    assert {"_XlaCompile", "_XlaRun"} <= _xla_ops_that_ran(rewritten, model)
    losses, variables, _ = tf_models.run_steps(model.graph_def, model)
    new_losses, new_variables, _ = tf_models.run_steps(rewritten, model)
    np.testing.assert_allclose(new_losses, losses, rtol=1e-5)
    for name, value in variables.items():
        np.testing.assert_allclose(new_variables[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_xla_lowering_marks_the_step_only():
    model = tf_models.block_mlp(optimizer="sgd")
    graph, results = _rewrite(model, recompute=["block[1-7]/"], target="xla")
    dialect = graph.dialect
    regions = graphpass.analyze(graph)
    scoped = {n for n in graph if dialect.get_attr(graph, n, "_XlaScope") is not None}
    assert scoped and results[1].report["clustered"] == len(scoped)
    assert all(regions.label(n) in ("forward", "backward") for n in scoped)
    assert "init" not in scoped and not any(n.startswith("save/") for n in scoped)
    assert all(dialect.get_attr(graph, n, "_XlaCompile") is True for n in scoped)
    copies = [n for n in graph if n.startswith(SCOPE) and "/dep/" not in n]
    assert copies and all(not graph.control_inputs(c) for c in copies)


def test_xla_cluster_none_and_tf_target_add_no_xla_attrs():
    model = tf_models.block_mlp(optimizer="sgd")
    for settings in ({"target": "xla", "xla_cluster": "none"}, {"recompute": ["block1/"]}):
        graph, _ = _rewrite(model, **settings)
        assert not any(graph.dialect.get_attr(graph, n, "_XlaCompile") is not None
                       for n in graph), settings
    graph, results = _rewrite(model, recompute=["block[1-7]/"], target="tf")
    assert results[0].report["dependency"] == "control"
    # Control mode orders the copies through reads that wait on the trigger (copies
    # themselves carry no control input: TF would fuse them unlike their originals).
    reads = [n for n in graph if n.startswith("graphpass/remat_kept/") and "/order/" in n]
    assert reads and all(graph.control_inputs(n) for n in reads)
    assert not any(graph.control_inputs(n) for n in graph if n.startswith(SCOPE))


def test_tpu_refuses_ops_without_xla_kernels(tmp_path, capsys):
    model = tf_models.block_mlp(optimizer="sgd", debug_print=True)
    source = tmp_path / "printing.pb"
    source.write_bytes(model.graph_def.SerializeToString())
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(source), "-o", str(out), "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "PrintV2 at debug_print" in err and "--xla-cluster none" in err
    assert not out.exists()
    assert main(["inspect", str(source), "--xla"]) == 1
    assert "PrintV2 at debug_print" in capsys.readouterr().out
    # Off TPU the op just stays outside the cluster, and is reported.
    assert main(["rewrite", str(source), "-o", str(out), "--target", "xla", "--report",
                 str(tmp_path / "r.json")]) == 0
    assert "PrintV2" in (tmp_path / "r.json").read_text()


def test_clean_step_passes_the_xla_check(tmp_path, capsys):
    model = tf_models.block_mlp(optimizer="sgd")
    source = tmp_path / "mlp.pb"
    source.write_bytes(model.graph_def.SerializeToString())
    assert main(["inspect", str(source), "--xla"]) == 0
    assert "every op of the step has an XLA kernel" in capsys.readouterr().out


def test_gpu_device_strings_keep_existing_placement():
    import tensorflow as tf

    tf1 = tf.compat.v1
    model = tf_models.block_mlp(optimizer="sgd")
    graph = graph_from_graph_def(model.graph_def, {})
    graph.node("block1/W").device = "/job:ps/task:0/device:CPU:0"
    graph.node("block2/MatMul").device = "/job:worker/task:1"
    graphpass.run_passes(graph, {"device": "gpu"})
    regions = graphpass.analyze(graph)
    assert graph.node("block1/W").device == "/job:ps/task:0/device:CPU:0"
    assert graph.node("block2/MatMul").device == "/job:worker/task:1/device:GPU:0"
    assert graph.node("block3/MatMul").device == "/device:GPU:0"
    assert graph.node("init").device == ""  # not part of the step
    step = [n for n in graph if regions.label(n) in ("forward", "backward")]
    assert all("GPU" in graph.node(n).device or "CPU" in graph.node(n).device for n in step)
    # Colocation constraints ride along untouched.
    original = graph_from_graph_def(model.graph_def, {})
    for name in graph:
        if "_class" in original.node(name).attrs:
            assert graph.node(name).attrs["_class"] == original.node(name).attrs["_class"]
    # The graph still imports (soft placement would run it on a CPU-only machine).
    with tf.Graph().as_default():
        tf1.import_graph_def(graph_def_from_graph(graph), name="")


def test_tpu_with_target_tf_is_a_user_error(tmp_path, capsys):
    source = tmp_path / "mlp.pb"
    source.write_bytes(tf_models.block_mlp(optimizer="sgd").graph_def.SerializeToString())
    assert main(["rewrite", str(source), "-o", str(tmp_path / "o.pb"), "--device", "tpu",
                 "--target", "tf"]) == 2
    assert "--device tpu needs --target xla" in capsys.readouterr().err
