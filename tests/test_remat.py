"""Rematerialization: same training step bit for bit, copies per segment, acyclic."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import graphpass
from graphpass.analysis.regions import analyze
from graphpass.cli import main
from graphpass.errors import GraphpassError
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.passes.remat.marks import KEPT_SCOPE, SCOPE
from graphpass.runtimes import runtime_for
from tests.kernel_parity import ROOT, child_env
from tools.fixtures import tf_models


def _rewrite(model, **settings):
    graph = graph_from_graph_def(model.graph_def, {})
    results = graphpass.run_passes(graph, settings)
    return graph, results[0]


def _grappler_off():
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def _assert_same_training(model, graph, config=None, rtol=0.0):
    losses, variables, _ = tf_models.run_steps(model.graph_def, model, config=config)
    new_losses, new_variables, _ = tf_models.run_steps(graph_def_from_graph(graph), model,
                                                       config=config)
    assert set(variables) == set(new_variables)
    if rtol == 0.0:
        np.testing.assert_array_equal(new_losses, losses)
        for name, value in variables.items():
            np.testing.assert_array_equal(new_variables[name], value, err_msg=name)
    else:
        np.testing.assert_allclose(new_losses, losses, rtol=rtol)
        for name, value in variables.items():
            np.testing.assert_allclose(new_variables[name], value, rtol=rtol, atol=1e-7,
                                       err_msg=name)


CASES = {
    "mlp_adam": (lambda: tf_models.block_mlp(optimizer="adam"), {"recompute": ["block[1-7]/"]}),
    "conv_bn_dropout_momentum": (tf_models.conv_bn_dropout, {"recompute": ["conv[12]/"]}),
    # Layer norm by moments + rsqrt, exact GELU, clip_by_norm, Adam: Grappler's remapper
    # fuses an original layer norm once its backward readers move to the copies,
    # unless remat keeps each value's reader count (Dialect.keep_readers).
    "prenorm_ffn": (tf_models.prenorm_ffn, {"recompute": ["layer[1-4]/"]}),
    "clipped_two_train_ops": (
        lambda: tf_models.clipped_custom_scope(train_ops=2),
        {"recompute": ["tower0/block[12]/"], "train_op": ["tower0/train"],
         "loss": "tower0/loss"}),
}


@pytest.mark.parametrize("grappler", ["default", "off"])
@pytest.mark.parametrize("dependency", ["control", "data"])
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "prenorm_ffn"
                                  else c for c in sorted(CASES)])
def test_same_training_step(case, dependency, grappler):
    """Bitwise in control mode, rtol 1e-6 in data mode; Grappler on and off."""
    build, settings = CASES[case]
    model = build()
    graph, result = _rewrite(model, dependency=dependency, **settings)
    assert result.changed and result.report["dependency"] == dependency
    _assert_same_training(model, graph, config=_grappler_off() if grappler == "off" else None,
                          rtol=0.0 if dependency == "control" else 1e-6)


def test_mlp_segments_copy_each_block():
    model = tf_models.block_mlp(optimizer="adam")
    graph, result = _rewrite(model, recompute=["block[1-7]/"])
    assert len(result.report["segments"]) == 7
    assert all(s["copied"] == 3 for s in result.report["segments"])
    assert result.report["estimated_peak_bytes_after"] < \
        result.report["estimated_peak_bytes_before"]


def test_data_mode_orders_by_data_only():
    model = tf_models.block_mlp(optimizer="adam")
    graph, result = _rewrite(model, recompute=["block[1-7]/"], dependency="data")
    copies = [n for n in graph if n.startswith(SCOPE) and "/dep/" not in n]
    assert copies and all(not graph.control_inputs(c) for c in copies)
    ties = [n for n in graph if "/dep/tie" in n]
    assert len(ties) == 7  # one tied checkpoint (the block's input) per segment


def test_copies_survive_grappler():
    import tensorflow as tf

    tf1 = tf.compat.v1
    model = tf_models.block_mlp(optimizer="sgd")
    graph, _ = _rewrite(model, recompute=["block[1-7]/"])
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        tf1.import_graph_def(graph_def_from_graph(graph), name="")
    options = tf1.RunOptions(output_partition_graphs=True)
    metadata = tf1.RunMetadata()
    with tf1.Session(graph=tf_graph) as session:
        session.run(model.init)
        session.run(model.train_op, model.feeds, options=options, run_metadata=metadata)
    ran = {n.name for g in metadata.partition_graphs for n in g.node}
    copies = {n for n in graph if n.startswith(SCOPE)}
    survivors = {n for n in ran if n.startswith(SCOPE)}
    # Grappler may fuse or rename a copy, but every segment must still be recomputed.
    for i in range(1, 8):
        assert any(n.startswith(f"{SCOPE}block{i}/") for n in survivors), f"block{i} merged away"
    assert len(survivors) >= len(copies) // 2


def test_each_segment_is_triggered_by_its_own_incoming_gradient():
    model = tf_models.block_mlp(optimizer="sgd")
    graph, result = _rewrite(model, recompute=["block[1-7]/"])
    for i in range(1, 7):
        # Block i's trigger is downstream of block i+1's recomputation: the segments
        # run one after the other as the backward pass reaches them, not all at once.
        trigger = result.report["segments"][i - 1]["triggers"][0].split(":")[0]
        upstream = graph.ancestors([trigger])
        assert any(n.startswith(f"{SCOPE}block{i + 1}/") for n in upstream), (i, trigger)
        assert not any(n.startswith(f"{SCOPE}block{i}/") for n in upstream), (i, trigger)


def _verify_exact(model, graph, directory) -> None:
    """Original and rewrite trained two steps side by side by ``graphpass verify``,
    bit for bit, with oneDNN off and on, each in a process of its own (TF reads the
    setting once, and the CPU's default differs between machines)."""
    original, rewritten = directory / "original.pb", directory / "rewritten.pb"
    original.write_bytes(model.graph_def.SerializeToString())
    rewritten.write_bytes(graph_def_from_graph(graph).SerializeToString())
    for onednn in (False, True):
        done = subprocess.run([sys.executable, "-m", "graphpass.cli", "verify", original,
                               rewritten, "--steps", "2", "--rtol", "0", "--atol", "0"],
                              env=child_env(onednn), cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0 and done.stdout.rstrip().endswith("MATCH"), \
            (onednn, done.stdout[-2000:], done.stderr[-2000:])


def test_segments_wait_in_turn_for_the_weight_gradients_before_them(tmp_path):
    """Each segment recomputed after another waits, through its ordering reads, for
    the ops finishing the weight gradients that depend on the other's copies (the
    filter gradients: TF's executor would leave them to the end of the backward
    pass, holding their copies), never for an elementwise op (an edge out of one
    stops Grappler's rewrites of it); the step trains bit for bit, oneDNN off and on."""
    model = tf_models.conv_bn_dropout()
    graph, result = _rewrite(model, recompute=["conv[12]/"])
    report = result.report
    triggers = {t.rsplit(":", 1)[0] for e in report["segments"] for t in e["triggers"]}
    reads = [n for n in graph if n.startswith(KEPT_SCOPE) and "/order/read" in n]
    extra = [(source, read) for read in reads for source in graph.control_inputs(read)
             if source not in triggers]
    backward = set(analyze(graph).nodes("backward"))
    assert report["segment_order_edges"] == len(extra) > 0
    assert sum(e["waits_for_gradients"] for e in report["segments"]) == len(extra)
    for source, read in extra:
        assert source in backward
        assert not runtime_for(graph).rewritten_with_neighbours(graph, source), source
        assert read not in graph.ancestors([source])  # no cycle: checked by the pipeline too
    assert "segments recomputed in turn" in " ".join(report["summary"])
    _verify_exact(model, graph, tmp_path)


def test_segments_not_in_turn_wait_only_for_their_triggers():
    """A plan the planner estimated lower without the waits (``Segment.in_turn``
    False) is written without them."""
    from dataclasses import replace

    from graphpass.options import pipeline_options
    from graphpass.passes import PassContext, build_passes
    from graphpass.passes.remat.marks import marked_segments
    from graphpass.passes.remat.rewrite import rewrite_segments

    model = tf_models.conv_bn_dropout()
    graph, result = _rewrite(model, recompute=["conv[12]/"])
    assert result.report["segment_order_edges"] > 0
    graph = graph_from_graph_def(model.graph_def, {})
    options = pipeline_options({"recompute": ["conv[12]/"]})
    pass_ = build_passes(options)[0]
    step = pass_._analyze(graph, PassContext.from_options(options))
    segments, _ = marked_segments(graph, pass_.options, step.forward, step.backward)
    entries = rewrite_segments(graph, [replace(s, in_turn=False) for s in segments], step,
                               tupleize_grads=False)
    assert len(entries) == 2 and all(e["copied"] for e in entries)
    assert all(e["waits_for_gradients"] == 0 for e in entries)


def test_marking_the_last_block_before_the_loss_stays_acyclic():
    model = tf_models.block_mlp(optimizer="sgd")
    graph, result = _rewrite(model, recompute=["block[1-8]/"])
    assert result.changed  # the pipeline verified acyclicity after the pass
    graph.topological_order(ignore_edge=lambda s, d: graph.dialect.is_back_edge(graph, s, d))
    _assert_same_training(model, graph)


def test_second_run_is_a_no_op():
    model = tf_models.block_mlp(optimizer="sgd")
    graph, _ = _rewrite(model, recompute=["block[1-7]/"])
    nodes = len(graph)
    again = graphpass.run_passes(graph, {"recompute": ["block[1-7]/"]})[0]
    assert not again.changed
    assert len(graph) == nodes


def test_batch_norm_dropout_state_and_randomness_are_not_duplicated():
    model = tf_models.conv_bn_dropout()
    graph, result = _rewrite(model, recompute=["conv[12]/"])
    assert result.changed
    dialect = graph.dialect
    copies = [n for n in graph if n.startswith(SCOPE)]
    assert copies
    assert not [c for c in copies if dialect.is_stateful(graph, c)]
    assert not [c for c in copies if graph.node(c).op in ("RandomUniform", "AssignSub")]
    ops_before = sorted(n.op for n in graph_from_graph_def(model.graph_def, {}).nodes()
                        if n.op.startswith(("Assign", "Random", "Apply")))
    ops_after = sorted(n.op for n in graph.nodes() if n.op.startswith(("Assign", "Random",
                                                                         "Apply")))
    assert ops_before == ops_after
    assert not [c for c in copies if graph.node(c).op.startswith("Placeholder")]
    # The moving-average updates the gradients wait on (control_dependencies(update_ops))
    # are not gradient ops: each conv block is triggered by its own incoming gradient.
    regions = graphpass.analyze(graph)
    for segment in result.report["segments"]:
        for trigger in segment["triggers"]:
            node = trigger.split(":")[0]
            assert regions.label(node) == "backward", trigger
            assert not dialect.is_variable_value(graph, node), trigger
    _assert_same_training(model, graph)


def test_hints_mark_segments_like_grappler():
    model = tf_models.block_mlp(optimizer="sgd")
    graph = graph_from_graph_def(model.graph_def, {})
    forward = set(graphpass.analyze(graph).nodes("forward"))
    for name in list(graph):
        if name.startswith(("block2/", "block5/")) and name in forward:
            graph.dialect.set_attr(graph, name, "_recompute_hint", 1)
    result = graphpass.run_passes(graph, {"recompute_hints": True})[0]
    # Same hint, but not connected: two segments.
    assert [s["copied"] for s in result.report["segments"]] == [3, 3]
    _assert_same_training(model, graph)


def test_tupleize_grads_keeps_numbers():
    model = tf_models.block_mlp(optimizer="sgd")
    graph, result = _rewrite(model, recompute=["block[1-7]/"], tupleize_grads=True)
    assert any("/tuple/gate" in n for n in graph)
    _assert_same_training(model, graph)


def test_pattern_matching_nothing_lists_close_scopes():
    model = tf_models.block_mlp(optimizer="sgd")
    graph = graph_from_graph_def(model.graph_def, {})
    with pytest.raises(GraphpassError, match="closest scopes: .*block"):
        graphpass.run_passes(graph, {"recompute": ["blok9/"]})


def test_marks_on_backward_nodes_are_reported_and_skipped():
    model = tf_models.block_mlp(optimizer="sgd")
    graph = graph_from_graph_def(model.graph_def, {})
    result = graphpass.run_passes(graph, {"recompute": ["(gradients/)?block1/"]})[0]
    skipped = result.report["skipped_marks"]
    assert any(n.startswith("gradients/block1/") for n in skipped)
    assert not any(n in skipped for n in ("block1/MatMul", "block1/Relu", "block1/Tanh"))
    assert result.changed  # the forward part of the marks is still recomputed


def test_cli_rewrite_with_config_and_report(tmp_path, capsys):
    model = tf_models.block_mlp(optimizer="sgd")
    source = tmp_path / "mlp.pb"
    source.write_bytes(model.graph_def.SerializeToString())
    config = tmp_path / "remat.toml"
    config.write_text('recompute = ["block[1-7]/"]\ndependency = "control"\n')
    report = tmp_path / "report.json"
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(source), "-o", str(out), "--config", str(config),
                 "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "segment block1/" in printed
    data = json.loads(report.read_text())
    remat = data["passes"][0]
    assert remat["name"] == "remat" and remat["changed"]
    assert len(remat["report"]["segments"]) == 7
    assert remat["report"]["released_bytes"] > 0
    rewritten = graphpass.load(out)
    assert sum(n.startswith(SCOPE) for n in rewritten) == remat["report"]["nodes_added"]


def test_exactness_is_checked_on_both_onednn_settings_unless_trusted(tmp_path, capsys):
    """The default asks Grappler for the original's and the rewrite's graphs with
    oneDNN on and off and says so; ``--exactness trust`` writes the same plan
    without asking, and says that nothing was checked."""
    outputs = {}
    for mode in ("check", "trust"):
        out, report = tmp_path / f"{mode}.pb", tmp_path / f"{mode}.json"
        assert main(["rewrite", str(ROOT / "examples" / "mlp_train.pb"), "-o", str(out),
                     "--recompute", "block[1-7]/", "--exactness", mode,
                     "--report", str(report)]) == 0
        outputs[mode] = out.read_bytes()
        exactness = json.loads(report.read_text())["passes"][0]["report"]["exactness"]
        summary = capsys.readouterr().out
        if mode == "check":
            assert exactness == {"checked": True, "configurations": ["oneDNN on", "oneDNN off"],
                                 "refused": False, "kept": [], "differences": [],
                                 "inexact": []}
            assert "exactness checked on the graph TF runs, oneDNN on and oneDNN off" in summary
        else:
            assert exactness == {"checked": False, "reason": "--exactness trust"}
            assert "exactness not checked: --exactness trust (check with verify)" in summary
    assert outputs["check"] == outputs["trust"]


def test_exactness_numbers_values_not_names():
    """``tf_exactness.differences`` on hand-made executed graphs: a product grouped
    otherwise differs, unless the factor it moves is a power of two (exact in any
    grouping); operand order of a commutative kernel and names do not count."""
    import tensorflow as tf

    from graphpass.runtimes.tf_exactness import differences

    def graph(factor: float, grouping: str, names=("m1", "m2")):
        graph_def = tf.compat.v1.GraphDef()
        for name in ("a", "b"):
            graph_def.node.add(name=name, op="Placeholder").attr["dtype"].type = 1
        const = graph_def.node.add(name="c", op="Const")
        const.attr["dtype"].type = 1
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(factor, tf.float32))
        factor_of, other = ("a", "b") if grouping == "ca" else ("b", "a")
        inner, outer = names
        graph_def.node.add(name=inner, op="Mul", input=["c", factor_of])
        graph_def.node.add(name=outer, op="Mul", input=[other, inner])
        return graph_def

    same = lambda name: name  # noqa: E731 - every node stands for itself
    assert differences(graph(0.5, "ca"), graph(0.5, "ca", ("x", "m2")), same) == []
    assert differences(graph(0.5, "ca"), graph(0.5, "cb"), same) == []
    found = differences(graph(0.3, "ca"), graph(0.3, "cb"), same)
    assert [d.node for d in found] == ["m1"] and "never" in found[0].reason


def test_a_difference_names_the_copies_near_it_by_distance():
    """``Difference.copied_by_distance``: the originals of the copies around a node
    that computes otherwise, one tuple per distance, nearest first (what the
    repair widens through); names the caller says stand for themselves are none."""
    import tensorflow as tf

    from graphpass.runtimes.tf_exactness import differences

    def graph(grouping: tuple[str, str], copies: dict[str, str]):
        graph_def = tf.compat.v1.GraphDef()
        for name in ("a", "b"):
            graph_def.node.add(name=name, op="Placeholder").attr["dtype"].type = 1
        const = graph_def.node.add(name="c", op="Const")
        const.attr["dtype"].type = 1
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0.3, tf.float32))
        graph_def.node.add(name="m1", op="Mul", input=["c", grouping[0]])
        graph_def.node.add(name="m2", op="Mul", input=[grouping[1], "m1"])
        for name, reads in copies.items():
            graph_def.node.add(name=name, op="Neg", input=[reads])
        return graph_def

    original = graph(("a", "b"), {"n1": "m1", "n2": "n1"})
    rewritten = graph(("b", "a"), {"copy/n1": "m1", "copy/n2": "copy/n1"})
    found = differences(original, rewritten, lambda name: name.removeprefix("copy/"))
    assert [(d.node, d.found_at) for d in found] == [("m1", "m1")]
    assert found[0].copied_by_distance == (("n1",), ("n2",))
    assert found[0].copied(1) == ("n1",) and found[0].copied() == ("n1", "n2")


def test_the_repair_keeps_the_nearest_copies_then_widens():
    """``Exactness.keep``: a difference found the first time keeps its nearest copies;
    found again (by its original, whatever the round named its node), or in the
    last round, every copy near it; two nodes of one original in a round count once."""
    from graphpass.passes.remat.exactness import Exactness
    from graphpass.runtimes import Difference

    def difference(node: str, original: str, *layers: tuple[str, ...]) -> Difference:
        return Difference(node, original, "regrouped", "oneDNN on", layers)

    gelu = difference("grad/mul", "grad/mul", ("gelu/mul",), ("bias", "matmul"))
    renamed = difference(SCOPE + "grad/mul_1", "grad/mul", ("gelu/mul",))
    exactness = Exactness(check=None)
    assert exactness.keep([gelu, renamed], last=False) == {"gelu/mul"}
    assert exactness.keep([gelu], last=False) == {"gelu/mul", "bias", "matmul"}
    made = difference("add/Internal_0_Add", "", ("relu",), ("bn/add",))
    assert exactness.keep([made], last=True) == {"relu", "bn/add"}
    assert exactness.kept == {"gelu/mul", "bias", "matmul", "relu", "bn/add"}
    assert len(exactness.left_out) == 4


def test_grapplers_answers_for_both_settings_survive_the_cache_filling(monkeypatch):
    """One setting answered from the cache, the other asked: storing the new answer
    must not evict the one in hand (with room for one answer, the remat pass of
    ``--drop-stale 0 --recompute auto`` found its original's answer gone)."""
    from graphpass.runtimes import tf_grappler_ask

    monkeypatch.setattr(tf_grappler_ask, "ANSWERS_KEPT", 1)
    monkeypatch.setattr(tf_grappler_ask, "_ANSWERS", {})
    model = tf_models.block_mlp(batch=8, width=16, blocks=2, optimizer="sgd")
    graph_def = model.graph_def
    fetches = ["loss", "train"]
    alone = tf_grappler_ask.optimize(graph_def, fetches, True)
    both = tf_grappler_ask.optimize_each(graph_def, fetches, (True, False))
    assert len(both) == 2 and both[0] == alone
    assert {n.name for n in both[1].node} >= {"loss"}
