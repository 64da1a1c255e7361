"""Lossless round trips of TF training graphs through every container.

Each case writes a real training graph (tools/fixtures/tf_models), runs
``graphpass rewrite IN -o OUT`` with no pass, and checks that OUT holds the
same protobuf (nodes in order, attrs, devices, inputs, control inputs,
library, versions, collections, saver_def, signatures) and that the graph
trains bitwise-identically for 3 steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tf_helpers import (
    add_signature,
    assert_same_graph_def,
    assert_trains_identically,
    read_message,
    write_message,
    write_saved_model,
)

import graphpass
from graphpass.cli import main

BUILDER_KEYS = ["mlp_adam", "conv_bn_dropout", "control_flow", "function_library"]


def _graph_def_type():
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef


def _meta_graph_type():
    from tensorflow.core.protobuf import meta_graph_pb2

    return meta_graph_pb2.MetaGraphDef


def _saved_model_type():
    from tensorflow.core.protobuf import saved_model_pb2

    return saved_model_pb2.SavedModel


@pytest.fixture(scope="session")
def saved_models(models, tmp_path_factory):
    """One SavedModel directory per builder, written once."""
    cache = {}

    def get(key):
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"sm_{key}") / "model"
            cache[key] = write_saved_model(directory, models.model(key))
        return cache[key]

    return get


def _rewrite(source: Path, target: Path, *extra: str) -> None:
    assert main(["rewrite", str(source), "-o", str(target), "--quiet", *extra]) == 0


# -- GraphDef and MetaGraphDef -------------------------------------------------


@pytest.mark.parametrize("text", [False, True], ids=["pb", "pbtxt"])
@pytest.mark.parametrize("key", BUILDER_KEYS)
def test_graph_def_round_trip(models, tmp_path, key, text):
    model = models.model(key)
    suffix = ".pbtxt" if text else ".pb"
    source = write_message(tmp_path / f"in{suffix}", model.graph_def, text)
    target = tmp_path / f"out{suffix}"
    _rewrite(source, target)

    graph = graphpass.load(source)
    assert (graph.format_state.container, graph.format_state.text) == ("graphdef", text)
    out = read_message(target, _graph_def_type(), text)
    assert_same_graph_def(out, model.graph_def)
    assert_trains_identically(out, model, models.reference_run(key))


@pytest.mark.parametrize("text", [False, True], ids=["binary", "text"])
@pytest.mark.parametrize("key", BUILDER_KEYS)
def test_meta_graph_round_trip(models, tmp_path, key, text):
    model = models.model(key)
    meta = add_signature(model.meta_graph, model)
    # The things that must survive besides the graph are really there.
    assert {"variables", "trainable_variables", "train_op"} <= set(meta.collection_def)
    assert meta.saver_def.restore_op_name and meta.signature_def["train"].inputs
    source = write_message(tmp_path / "in.meta", meta, text)
    target = tmp_path / "out.meta"
    _rewrite(source, target)

    graph = graphpass.load(source)
    assert (graph.format_state.container, graph.format_state.text) == ("metagraph", text)
    out = read_message(target, _meta_graph_type(), text)
    assert_same_graph_def(out.graph_def, meta.graph_def)
    assert out.collection_def == meta.collection_def
    assert out.saver_def == meta.saver_def
    assert out.signature_def == meta.signature_def
    assert out.meta_info_def == meta.meta_info_def
    assert out == meta
    assert_trains_identically(out.graph_def, model, models.reference_run(key))


# -- SavedModel ------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["directory", "saved_model.pb"])
@pytest.mark.parametrize("key", BUILDER_KEYS)
def test_saved_model_round_trip(models, saved_models, tmp_path, key, entry):
    model = models.model(key)
    source_dir = saved_models(key)
    source = source_dir if entry == "directory" else source_dir / "saved_model.pb"
    target = tmp_path / "out"
    _rewrite(source, target)

    original = read_message(source_dir / "saved_model.pb", _saved_model_type())
    out = read_message(target / "saved_model.pb", _saved_model_type())
    assert [list(m.meta_info_def.tags) for m in out.meta_graphs] == [["train"], ["serve"]]
    for got, want in zip(out.meta_graphs, original.meta_graphs):
        assert_same_graph_def(got.graph_def, want.graph_def)
        assert got.collection_def == want.collection_def
        assert got.saver_def == want.saver_def
        assert got.signature_def == want.signature_def
    assert out == original
    # variables/ is copied beside the output, byte for byte.
    variables = sorted(p.name for p in (source_dir / "variables").iterdir())
    assert variables and sorted(p.name for p in (target / "variables").iterdir()) == variables
    for name in variables:
        assert (target / "variables" / name).read_bytes() == \
            (source_dir / "variables" / name).read_bytes()
    assert_trains_identically(out.meta_graphs[0].graph_def, model, models.reference_run(key))


def test_saved_model_variables_restore_from_output(models, saved_models, tmp_path):
    import tensorflow as tf

    source = saved_models("mlp_adam")
    target = tmp_path / "out"
    _rewrite(source, target)

    def restored(directory):
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
            tf.compat.v1.saved_model.loader.load(session, ["train"], str(directory))
            variables = tf.compat.v1.global_variables()
            values = session.run([v.value() for v in variables])  # not the handles
            return {v.op.name: value for v, value in zip(variables, values)}

    want, got = restored(source), restored(target)
    assert len(want) >= 4 and sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].tobytes() == value.tobytes(), name


def test_saved_model_tag_chooses_the_meta_graph(models, saved_models, tmp_path, capsys):
    import json

    source = saved_models("control_flow")
    counts = {}
    for tag in (None, "train", "serve"):
        argv = ["inspect", str(source), "--json"] + (["--tag", tag] if tag else [])
        assert main(argv) == 0
        counts[tag] = json.loads(capsys.readouterr().out)["nodes"]
    assert counts[None] == counts["train"]  # default: train before serve
    assert counts["serve"] == counts["train"] + 1  # serve adds `serving_loss`
    graph = graphpass.load(source, tag="serve")
    assert "serving_loss" in graph and graph.format_state.metagraph_index == 1

    target = tmp_path / "out"
    _rewrite(source, target, "--tag", "serve")
    original = read_message(source / "saved_model.pb", _saved_model_type())
    assert read_message(target / "saved_model.pb", _saved_model_type()) == original

    assert main(["rewrite", str(source), "-o", str(tmp_path / "other"), "--tag", "eval"]) == 2
    err = capsys.readouterr().err
    assert "'eval'" in err and "train" in err and "serve" in err
    assert not (tmp_path / "other").exists()


def test_saved_model_output_never_replaces_a_foreign_directory(saved_models, tmp_path, capsys):
    source = saved_models("control_flow")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me too")
    for target in (precious, a_file):
        assert main(["rewrite", str(source), "-o", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"graphpass: error: {target}: ") and err.count("\n") == 1
    assert (precious / "notes.txt").read_text() == "keep me"
    assert a_file.read_text() == "keep me too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "precious"]
    # an earlier SavedModel output, and an empty directory, are replaced
    target = tmp_path / "empty"
    target.mkdir()
    _rewrite(source, target)
    _rewrite(source, target)  # over its own earlier output
    assert graphpass.load(target).format_state.container == "savedmodel"
    assert sorted(p.name for p in target.iterdir()) == ["saved_model.pb", "variables"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "empty", "precious"]


def test_saved_model_text_output(models, saved_models, tmp_path):
    source = saved_models("function_library")
    target = tmp_path / "out"
    _rewrite(source, target, "--output-format", "pbtxt")
    original = read_message(source / "saved_model.pb", _saved_model_type())
    assert not (target / "saved_model.pb").exists()
    assert read_message(target / "saved_model.pbtxt", _saved_model_type(), text=True) == original
    assert graphpass.load(target).format_state.text is True


# -- detection from content, output encodings, determinism -------------------------


def test_graph_def_named_bin_is_detected(models, tmp_path):
    model = models.model("mlp_adam")
    source = write_message(tmp_path / "model.bin", model.graph_def)
    graph = graphpass.load(source)
    assert (graph.format_state.container, graph.format_state.text) == ("graphdef", False)
    _rewrite(source, tmp_path / "out.bin")
    assert_same_graph_def(read_message(tmp_path / "out.bin", _graph_def_type()),
                          model.graph_def)


def test_meta_graph_named_pb_is_detected(models, tmp_path):
    model = models.model("conv_bn_dropout")
    source = write_message(tmp_path / "model.pb", model.meta_graph)
    graph = graphpass.load(source)
    assert graph.format_state.container == "metagraph"
    assert len(graph) == len(model.graph_def.node)
    _rewrite(source, tmp_path / "out.pb")
    assert read_message(tmp_path / "out.pb", _meta_graph_type()) == model.meta_graph


def test_text_graph_def_named_txt_is_detected(models, tmp_path):
    model = models.model("control_flow")
    source = write_message(tmp_path / "model.txt", model.graph_def, text=True)
    graph = graphpass.load(source)
    assert (graph.format_state.container, graph.format_state.text) == ("graphdef", True)


@pytest.mark.parametrize("container", ["graphdef", "metagraph"])
def test_output_format_pbtxt_and_back(models, tmp_path, container):
    model = models.model("function_library")
    message = model.graph_def if container == "graphdef" else model.meta_graph
    kind = _graph_def_type() if container == "graphdef" else _meta_graph_type()
    source = write_message(tmp_path / "in.pb", message)
    _rewrite(source, tmp_path / "out.pbtxt", "--output-format", "pbtxt")
    assert (tmp_path / "out.pbtxt").read_text().lstrip()[:1].isalpha()  # text, not binary
    assert read_message(tmp_path / "out.pbtxt", kind, text=True) == message
    _rewrite(tmp_path / "out.pbtxt", tmp_path / "back.pb", "--output-format", "pb")
    assert (tmp_path / "back.pb").read_bytes() == message.SerializeToString(deterministic=True)


@pytest.mark.slow
@pytest.mark.parametrize("text", [False, True], ids=["pb", "pbtxt"])
def test_output_is_byte_identical_across_runs(models, tmp_path, text):
    model = models.model("conv_bn_dropout")
    meta = add_signature(model.meta_graph, model)
    source = write_message(tmp_path / "in.meta", meta, text)
    _rewrite(source, tmp_path / "a.meta")
    _rewrite(source, tmp_path / "b.meta")
    first = (tmp_path / "a.meta").read_bytes()
    assert first == (tmp_path / "b.meta").read_bytes()
    # and the same bytes again from a fresh process with another hash seed
    env = dict(os.environ, PYTHONHASHSEED="12345",
               PYTHONPATH=os.pathsep.join([str(Path(graphpass.__file__).parent.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "graphpass.cli", "rewrite", str(source), "-o",
                    str(tmp_path / "c.meta"), "--quiet"], check=True, env=env, timeout=120)
    assert (tmp_path / "c.meta").read_bytes() == first


def test_api_load_save_round_trip_keeps_node_data(models, tmp_path):
    model = models.model("conv_bn_dropout")
    source = write_message(tmp_path / "in.pb", model.graph_def)
    graph = graphpass.load(source)
    for node_def in model.graph_def.node:
        node = graph.node(node_def.name)
        data_inputs = [i for i in node_def.input if not i.startswith("^")]
        assert node.op == node_def.op and node.device == node_def.device
        assert [str(t) for t in graph.inputs(node.name)] == \
            [i[:-2] if i.endswith(":0") else i for i in data_inputs]
        assert graph.control_inputs(node.name) == \
            [i[1:] for i in node_def.input if i.startswith("^")]
        assert set(node.attrs) == set(node_def.attr)
    graphpass.save(graph, tmp_path / "out.pb")
    assert_same_graph_def(read_message(tmp_path / "out.pb", _graph_def_type()), model.graph_def)


def test_bench_io_synthetic_graphs_are_valid_and_round_trip():
    import tensorflow as tf

    from tools.fixtures import tf_synthetic

    graph_def = tf_synthetic.synthetic_graph_def(1000)
    assert len(graph_def.node) == 1000
    assert any(i.startswith("^") for n in graph_def.node for i in n.input)
    assert any(len(n.input) >= 3 for n in graph_def.node)
    with tf.Graph().as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")  # a graph TF accepts
    rows = tf_synthetic.measure([1000, 2000], repeat=1)  # raises if the round trip differs
    assert [r["nodes"] for r in rows] == [1000, 2000]
    assert rows[0]["io_ratio"] == 1.0 and all(r["regions"] == "error" for r in rows)


# -- the writer re-emits the nodes still as read ------------------------------------


def _lowered_bytes(graph, rebuild: bool) -> bytes:
    """The GraphDef the writer makes of ``graph``; with ``rebuild``, every node
    lowered from the IR (its record forgotten) instead of re-emitted."""
    from graphpass.formats.tf_io import graph_def_from_graph

    if rebuild:
        for node in graph.nodes():
            node.attrs.edited = True
    return graph_def_from_graph(graph).SerializeToString(deterministic=True)


@pytest.mark.parametrize("name", ["mlp_adam", "conv_bn_dropout", "control_flow",
                                  "function_library", "clipped_custom_scope"])
def test_records_write_what_lowering_the_ir_writes(name):
    """A node as read is written from its NodeDef: the same bytes as lowering it."""
    data = Path(__file__).resolve().parent / "data" / f"{name}.meta"
    graph = graphpass.load(data)
    assert all(graph.record(n) is not None for n in graph)
    assert _lowered_bytes(graph, rebuild=False) == \
        _lowered_bytes(graphpass.load(data), rebuild=True)


def test_edits_made_in_any_form_are_written():
    """An attr set straight into ``node.attrs``, a rewired input and a new device
    reach the file: a node so edited is lowered from the IR, not re-emitted."""
    from tensorflow.core.framework import attr_value_pb2

    from graphpass.formats.tf_io import graph_def_from_graph
    from graphpass.ir.graph import Tensor

    data = Path(__file__).resolve().parent / "data" / "mlp_adam.meta"
    graph = graphpass.load(data)
    const = next(n for n in graph if graph.node(n).op == "Const")
    graph.node(const).attrs["_marked"] = attr_value_pb2.AttrValue(i=7)
    reader = next(n for n in graph if graph.node(n).op == "Identity")
    graph.set_input(reader, 0, Tensor(const))
    graph.node(const).device = "/device:CPU:0"
    written = {n.name: n for n in graph_def_from_graph(graph).node}
    assert written[const].attr["_marked"].i == 7
    assert written[const].device == "/device:CPU:0"
    assert list(written[reader].input)[0] == const


def test_inputs_written_otherwise_are_normalized_as_before(tmp_path):
    """``x:0``, a control input twice and a control input before a data input are
    written as the IR names them (no record is kept for such a node)."""
    graph_def = _graph_def_type()()
    graph_def.node.add(name="x", op="Placeholder").attr["dtype"].type = 1
    graph_def.node.add(name="y", op="NoOp")
    neg = graph_def.node.add(name="neg", op="Neg", input=["^y", "x:0", "^y"])
    neg.attr["T"].type = 1
    source = tmp_path / "in.pb"
    source.write_bytes(graph_def.SerializeToString())
    assert main(["rewrite", str(source), "-o", str(tmp_path / "out.pb"), "--quiet"]) == 0
    written = read_message(tmp_path / "out.pb", _graph_def_type())
    assert list(written.node[2].input) == ["x", "^y"]
