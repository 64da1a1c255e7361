"""ONNX reader/writer and dialect: lossless round trips (bytes, checker, bitwise
equal onnxruntime outputs), external data, unnamed nodes, empty optional
inputs, subgraph captures, builders run through onnxruntime, and region
analysis of hand-written ONNX training steps."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphpass
from graphpass.analysis.regions import BACKWARD, FORWARD, OPTIMIZER
from graphpass.analysis.shapes import infer_shapes
from graphpass.cli import main
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_io import graph_from_model, model_from_graph
from graphpass.formats.onnx_order import INITIALIZER, INPUT
from graphpass.ir.graph import Tensor
from graphpass.ir.verify import verify
from tools.fixtures import onnx_models
from tools.fixtures.onnx_models import run

FLOAT = TensorProto.FLOAT
INFERENCE = {"resnet18": onnx_models.resnet18, "densenet": onnx_models.densenet,
             "inception": onnx_models.inception}
TRAINING = {"block_mlp": lambda: onnx_models.block_mlp(batch=4, width=8),
            "conv_net": onnx_models.conv_net}


def _round_trip(model: onnx.ModelProto, tmp_path: Path) -> tuple[Path, Path]:
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    graph = graphpass.load(source)
    verify(graph)
    graphpass.save(graph, target)
    return source, target


def _assert_same_run(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict) -> None:
    for x, y in zip(run(a, feeds), run(b, feeds), strict=True):
        assert np.array_equal(x, y)


def _graph(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8):
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers)),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    onnx.checker.check_model(model)
    return model


def _vi(name, shape, dtype=FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("name", [*INFERENCE, *TRAINING])
def test_untouched_round_trip_is_byte_identical_and_runs_the_same(name, tmp_path):
    built = {**INFERENCE, **TRAINING}[name]()
    source, target = _round_trip(built.model, tmp_path)
    assert target.read_bytes() == source.read_bytes()
    onnx.checker.check_model(str(target), full_check=True)
    _assert_same_run(built.model, onnx.load(target), built.feeds)


def test_reader_builds_source_nodes_with_ports_and_outputs():
    built = onnx_models.resnet18(size=16, width=4)
    graph = graph_from_model(built.model)
    assert graph.node("image").op == INPUT
    assert graph.node("stem/W").op == INITIALIZER
    assert graph.node("stem/W").outputs == ["stem/W"]
    assert graph.inputs("stem/conv") == [Tensor("image", 0), Tensor("stem/W", 0)]
    assert graph.consumers(Tensor("stem/W", 0)) == [("stem/conv", 1)]
    assert graph.node("logits").outputs == ["logits"]
    # every non-source node of the file is an IR node, in file order
    ops = [n.name for n in graph.nodes() if n.op not in (INPUT, INITIALIZER)]
    assert ops == [n.name for n in built.model.graph.node]
    carried = graph.format_state.initializers["stem/W"]
    assert carried == next(t for t in built.model.graph.initializer if t.name == "stem/W")


def test_meta_carries_model_fields_functions_and_training_info(tmp_path):
    built = onnx_models.block_mlp(batch=2, width=4, blocks=2)
    model = built.model
    model.doc_string = "model doc"
    model.graph.doc_string = "graph doc"
    model.model_version = 7
    model.domain = "org.example"
    helper.set_model_props(model, {"author": "graphpass", "purpose": "test"})
    model.graph.value_info.append(_vi("block1/MatMul", [2, 4]))
    function = helper.make_function("org.example", "Twice", ["a"], ["b"],
                                    [helper.make_node("Add", ["a", "a"], ["b"])],
                                    [helper.make_opsetid("", 17)])
    model.functions.append(function)
    model.opset_import.append(helper.make_opsetid("org.example", 1))
    model.training_info.add().algorithm.name = "carried"
    source, target = _round_trip(model, tmp_path)
    assert target.read_bytes() == source.read_bytes()
    written = onnx.load(target)
    assert written.functions[0].name == "Twice"
    assert written.training_info[0].algorithm.name == "carried"
    assert {p.key: p.value for p in written.metadata_props}["author"] == "graphpass"


def test_writer_keeps_node_order_and_places_new_nodes_topologically(tmp_path):
    built = onnx_models.block_mlp(batch=2, width=4, blocks=2)
    graph = graph_from_model(built.model)
    dialect = graph.dialect
    doubled = dialect.binary(graph, "extra/double", "add", Tensor("block1/Relu", 0),
                             Tensor("block1/Relu", 0))
    graph.set_input("block1/Tanh", 0, doubled)
    model = model_from_graph(graph)
    onnx.checker.check_model(model)
    names = [n.name for n in model.graph.node]
    assert names.index("block1/Relu") < names.index("extra/double") < names.index("block1/Tanh")
    original = [n.name for n in built.model.graph.node]
    # A rewritten graph's leaves go last, ready-first at the end (onnxruntime's
    # schedule walks from the last leaf); every other node keeps its place.
    leaves = ["sgd/block1/update", "sgd/block2/update", "loss"]
    assert names[-3:] == leaves
    assert [n for n in names if n != "extra/double" and n not in leaves] == \
        [n for n in original if n not in leaves]
    run(model, built.feeds)
    dialect.identity(graph, "extra/unread", Tensor("block1/Relu", 0))
    assert model_from_graph(graph).graph.node[-1].name == "extra/unread"
    graph.set_input("block1/MatMul", 0, Tensor("block1/Tanh", 0))
    with pytest.raises(ValueError, match="cycle"):
        model_from_graph(graph)


def test_round_tripped_training_step_trains_identically(tmp_path):
    built = onnx_models.block_mlp(batch=4, width=8, params_as_inputs=True)
    _, target = _round_trip(built.model, tmp_path)
    losses, params = onnx_models.train_steps(built.model, built, steps=3)
    again, params_again = onnx_models.train_steps(onnx.load(target), built, steps=3)
    assert np.array_equal(losses, again) and losses[2] < losses[0]
    assert all(np.array_equal(params[p], params_again[p]) for p in params)


def test_ir3_initializers_listed_as_inputs(tmp_path):
    w = numpy_helper.from_array(np.full([2], 3, np.float32), "w")
    model = _graph([helper.make_node("Mul", ["x", "w"], ["y"], name="mul")],
                   [_vi("x", [2]), _vi("w", [2])], [_vi("y", [2])], [w], opset=8,
                   ir_version=3)
    source, target = _round_trip(model, tmp_path)
    assert target.read_bytes() == source.read_bytes()
    graph = graph_from_model(model)
    assert graph.node("w").op == INITIALIZER
    assert graph.dialect.step.graph_inputs(graph) == ["x"]
    half = graph.dialect.scalar(graph, "half", 0.5, "float32")
    copy = graph.dialect.copy_node(graph, "w", "w_copy")
    graph.set_input("mul", 1, graph.dialect.binary(graph, "scaled", "mul", Tensor(copy, 0),
                                                   half))
    graph.remove_node("w")
    written = model_from_graph(graph)
    onnx.checker.check_model(written)
    assert [v.name for v in written.graph.input] == ["x", "half", "w_copy"]
    assert [t.name for t in written.graph.initializer] == ["half", "w_copy"]
    (y,) = run(written, {"x": np.array([1, 2], np.float32)})
    assert np.array_equal(y, [1.5, 3])


# -- naming --------------------------------------------------------------------


def _unnamed_model():
    empty_name = helper.make_node("Neg", ["a"], ["b"])
    empty_name.name = ""  # present but empty: proto2 keeps the difference on the wire
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),                  # no name at all
        empty_name,
        helper.make_node("Abs", ["b"], ["c"], name="dup"),
        helper.make_node("Abs", ["c"], ["d"], name="dup"),       # duplicate
        helper.make_node("Add", ["d", "w"], ["w_out"], name="w"),  # same name as an initializer
        helper.make_node("Sigmoid", ["w_out"], ["dup"]),         # output named like a node
    ]
    w = numpy_helper.from_array(np.ones([2, 3], np.float32), "w")
    return _graph(nodes, [_vi("x", [2, 3])], [_vi("dup", [2, 3])], [w])


def test_unnamed_and_duplicate_node_names_get_deterministic_keys(tmp_path):
    model = _unnamed_model()
    graph = graph_from_model(model)
    ops = {n.name: n.op for n in graph.nodes()}
    assert ops == {"x": INPUT, "w_1": INITIALIZER, "dup": "Abs", "w": "Add", "a": "Relu",
                   "b": "Neg", "dup_1": "Abs", "dup_2": "Sigmoid"}
    assert graph.node("a").meta["onnx_name"] == ""
    assert graph.node("dup_1").meta["onnx_name"] == "dup"
    assert "onnx_name" not in graph.node("dup").meta
    assert graph.inputs("w") == [Tensor("dup_1", 0), Tensor("w_1", 0)]
    assert graph_from_model(model).nx.nodes == graph.nx.nodes  # deterministic
    source, target = _round_trip(model, tmp_path)
    assert target.read_bytes() == source.read_bytes()
    written = onnx.load(target)
    assert [n.name for n in written.graph.node] == ["", "", "dup", "dup", "w", ""]
    assert not written.graph.node[0].HasField("name")
    assert written.graph.node[1].HasField("name")
    onnx.checker.check_model(written)  # (onnxruntime refuses duplicate node names)


def test_parse_tensor_takes_onnx_tensor_names_first():
    graph = graph_from_model(_unnamed_model())
    dialect = graph.dialect
    assert dialect.parse_tensor(graph, "dup") == Tensor("dup_2", 0)   # the tensor, not the node
    assert dialect.parse_tensor(graph, "w_out") == Tensor("w", 0)
    assert dialect.parse_tensor(graph, "w") == Tensor("w_1", 0)
    assert dialect.parse_tensor(graph, "dup_1") == Tensor("dup_1", 0)  # a node key


# -- slots, subgraphs, external data ---------------------------------------------


def test_empty_optional_inputs_are_empty_slots(tmp_path):
    high = numpy_helper.from_array(np.array(0.5, np.float32), "high")
    nodes = [
        helper.make_node("Clip", ["x", "", "high"], ["clipped"], name="clip"),
        helper.make_node("Dropout", ["clipped", "", ""], ["y"], name="drop"),  # trailing empties
    ]
    model = _graph(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], [high])
    graph = graph_from_model(model)
    assert graph.input_slots("clip") == {0: Tensor("x", 0), 2: Tensor("high", 0)}
    assert graph.input_slots("drop") == {0: Tensor("clip", 0)}
    assert graph.dialect.allows_empty_input_slots
    verify(graph)
    source, target = _round_trip(model, tmp_path)
    assert target.read_bytes() == source.read_bytes()
    assert list(onnx.load(target).graph.node[0].input) == ["x", "", "high"]
    _assert_same_run(model, onnx.load(target), {"x": np.linspace(-1, 1, 6, dtype=np.float32)
                                               .reshape(2, 3)})


def test_subgraph_reads_of_outer_values_order_the_writer(tmp_path):
    then_graph = helper.make_graph([helper.make_node("Add", ["outer", "outer"], ["t"])],
                                   "then", [], [_vi("t", [2])])
    else_graph = helper.make_graph([helper.make_node("Neg", ["outer"], ["e"])],
                                   "else", [], [_vi("e", [2])])
    nodes = [
        helper.make_node("Relu", ["x"], ["outer"], name="producer"),
        helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then_graph,
                         else_branch=else_graph),
    ]
    model = _graph(nodes, [_vi("x", [2]), _vi("flag", [], TensorProto.BOOL)], [_vi("y", [2])])
    graph = graph_from_model(model)
    assert graph.control_inputs("branch") == ["producer"]
    assert graph.dialect.is_stateful(graph, "branch")
    with pytest.raises(ValueError, match="still used"):
        graph.remove_node("producer")
    source, target = _round_trip(model, tmp_path)
    assert target.read_bytes() == source.read_bytes()
    feeds = {"x": np.array([-1, 2], np.float32), "flag": np.array(True)}
    _assert_same_run(model, onnx.load(target), feeds)


def _without_locations(model_bytes: bytes) -> onnx.ModelProto:
    """The model with its external-data locations blanked (all else compared)."""
    model = onnx.ModelProto.FromString(model_bytes)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = ""
    return model


def test_external_data_is_kept_on_disk_and_copied_beside_the_output(tmp_path):
    """The data file is copied whole under a name of the output's own, taken from
    its content: the model reads the same bytes at the same offsets, and only the
    locations differ from the input."""
    import hashlib

    built = onnx_models.resnet18(size=16, width=4)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    source = tmp_path / "a" / "model.onnx"
    external = onnx.ModelProto()
    external.CopyFrom(built.model)  # save_model moves the data out of the proto it is given
    onnx.save_model(external, source, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    weights = (tmp_path / "a" / "weights.bin").read_bytes()
    graph = graphpass.load(source)
    proto = graph.format_state.initializers["stem/W"]
    assert proto.data_location == TensorProto.EXTERNAL and not proto.raw_data
    target = tmp_path / "b" / "model.onnx"
    graphpass.save(graph, target)
    data_name = f"model.onnx.{hashlib.sha256(weights).hexdigest()[:16]}.data"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["model.onnx", data_name]
    assert (tmp_path / "b" / data_name).read_bytes() == weights
    written = onnx.load(target, load_external_data=False)
    assert {e.value for t in written.graph.initializer for e in t.external_data
            if e.key == "location"} == {data_name}
    assert _without_locations(target.read_bytes()) == _without_locations(source.read_bytes())
    onnx.checker.check_model(str(target))
    loaded = onnx.load(target)  # loads the copied data
    _assert_same_run(built.model, loaded, built.feeds)
    first = target.read_bytes()
    graphpass.save(graph, target)  # deterministic: the same bytes again
    assert target.read_bytes() == first
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["model.onnx", data_name]
    beside = tmp_path / "a" / "rewritten.onnx"  # the input's directory: its own copy
    graphpass.save(graph, beside)
    assert (tmp_path / "a" / f"rewritten.onnx.{data_name[11:]}").read_bytes() == weights
    assert (tmp_path / "a" / "weights.bin").read_bytes() == weights
    again = graphpass.load(target)  # a written model rewritten in place shares its data
    graphpass.save(again, target)
    assert target.read_bytes() == first
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["model.onnx", data_name]
    (tmp_path / "a" / "weights.bin").unlink()
    with pytest.raises(GraphpassError, match="weights.bin is missing"):
        graphpass.save(graph, tmp_path / "c.onnx")


def test_reader_and_writer_errors_name_the_problem(tmp_path):
    broken = tmp_path / "broken.onnx"
    model = _unnamed_model()
    model.graph.node[0].input[0] = "nowhere"
    onnx.save(model, broken)
    with pytest.raises(GraphpassError, match="'nowhere'"):
        graphpass.load(broken)
    graph = graph_from_model(_unnamed_model())
    graph.remove_node("dup_2")
    with pytest.raises(GraphpassError, match="'dup' are no longer produced"):
        model_from_graph(graph)


# -- dialect ---------------------------------------------------------------------


def test_dtypes_shapes_sources_and_attrs():
    graph = graph_from_model(onnx_models.resnet18(batch=2, size=16, width=4).model)
    dialect = graph.dialect
    assert dialect.shape(graph, Tensor("stem/relu", 0)) is None  # reading never infers
    assert infer_shapes(graph) and not infer_shapes(graph)  # the analysis, once
    assert dialect.dtype(graph, Tensor("stem/relu", 0)) == "float32"
    assert dialect.shape(graph, Tensor("stem/relu", 0)) == (2, 4, 16, 16)
    assert dialect.shape(graph, Tensor("layer2.0/conv1/W", 0)) == (8, 4, 3, 3)
    assert graph.node("stem/relu").meta["shapes"] == [(2, 4, 16, 16)]
    assert dialect.is_source(graph, "image") and dialect.is_source(graph, "stem/W")
    assert not dialect.is_source(graph, "stem/conv")
    assert dialect.step.graph_inputs(graph) == ["image"]
    assert dialect.step.graph_outputs(graph) == ["logits"]
    assert not dialect.is_variable(graph, "stem/W")  # frozen weights of an inference net
    assert dialect.get_attr(graph, "stem/conv", "pads") == [1, 1, 1, 1]
    assert dialect.get_attr(graph, "stem/conv", "missing", "dflt") == "dflt"
    dialect.set_attr(graph, "stem/conv", "auto_pad", "NOTSET")
    assert dialect.get_attr(graph, "stem/conv", "auto_pad") == "NOTSET"
    assert graph.node("stem/conv").attrs["auto_pad"].type == onnx.AttributeProto.STRING
    assert dialect.num_outputs(graph, "stem/conv") == 1


def test_random_ops_and_training_dropout_are_stateful():
    true = numpy_helper.from_array(np.array(True), "train")
    nodes = [
        helper.make_node("Dropout", ["x"], ["d0"], name="inference_dropout"),
        helper.make_node("Dropout", ["x", "", "train"], ["d1", "mask"], name="train_dropout"),
        helper.make_node("Dropout", ["x", "", "mode"], ["d2"], name="fed_dropout"),
        helper.make_node("RandomNormalLike", ["x"], ["r"], name="noise"),
        helper.make_node("Bernoulli", ["x"], ["coin"], name="coin"),
        helper.make_node("Relu", ["x"], ["relu"], name="relu"),
        helper.make_node("Custom", ["x"], ["c"], name="custom", domain="com.example"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [_vi("x", [3]), _vi("mode", [], TensorProto.BOOL)],
                          [_vi(v, [3]) for v in ("d0", "d1", "d2", "r", "coin", "relu", "c")],
                          initializer=[true]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    graph = graph_from_model(model)
    dialect = graph.dialect
    stateful = {n for n in graph if dialect.is_stateful(graph, n)}
    assert stateful == {"train_dropout", "fed_dropout", "noise", "coin", "custom"}
    assert not dialect.is_recomputable(graph, "x")
    assert dialect.is_recomputable(graph, "relu")
    with pytest.raises(GraphpassError, match="cannot copy 'x'"):
        dialect.copy_node(graph, "x", "x_copy")


def test_dropout_before_opset_7_trains_unless_is_test():
    nodes = [helper.make_node("Dropout", ["x"], ["a"], name="train"),
             helper.make_node("Dropout", ["x"], ["b"], name="test", is_test=1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [_vi("x", [3])],
                                                [_vi("a", [3]), _vi("b", [3])]),
                              opset_imports=[helper.make_opsetid("", 6)], ir_version=3)
    graph = graph_from_model(model)
    assert graph.dialect.is_stateful(graph, "train")
    assert not graph.dialect.is_stateful(graph, "test")


def test_builders_run_in_onnxruntime(tmp_path):
    model = _graph([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                   [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    graph = graph_from_model(model)
    dialect = graph.dialect
    x = Tensor("relu", 0)
    head = dialect.first_element(graph, "probe/first", x)
    assert dialect.shape(graph, head) == ()
    tiny = dialect.scalar(graph, "probe/tiny", 0.5, "float32")
    scaled = dialect.binary(graph, "probe/scaled", "mul", head, tiny)
    total = dialect.add_n(graph, "probe/sum", [scaled, head, tiny])
    assert dialect.add_n(graph, "probe/one", [total]) == total
    stopped = dialect.stop_gradient(graph, "probe/stop", total)
    assert graph.node(stopped.node).op == "Identity"
    back = dialect.binary(graph, "probe/sub", "sub", dialect.identity(graph, "probe/id", x),
                          stopped)
    as_double = dialect.cast(graph, "probe/cast", back, "float64")
    assert dialect.cast(graph, "probe/same", as_double, "float64") == as_double
    assert dialect.dtype(graph, as_double) == "float64"
    assert infer_shapes(graph)  # the built nodes without recorded shapes
    assert dialect.shape(graph, as_double) == (2, 3)
    with pytest.raises(GraphpassError, match="no control"):
        dialect.identity(graph, "probe/ordered", x, ["relu"])
    new_out = _vi(graph.node(as_double.node).outputs[0], [2, 3], TensorProto.DOUBLE)
    graph.format_state.outputs = [*graph.format_state.outputs, new_out]
    verify(graph)
    target = tmp_path / "built.onnx"
    graphpass.save(graph, target)
    onnx.checker.check_model(str(target), full_check=True)
    x_value = np.array([[-1.0, 2.0, 3.0], [4.0, -5.0, 6.0]], np.float32)
    y, result = run(onnx.load(target), {"x": x_value})
    first = np.float32(0.0)  # relu(-1)
    expected = y - (first * np.float32(0.5) + first + np.float32(0.5))
    assert result.dtype == np.float64 and np.array_equal(result, expected.astype(np.float64))


def test_first_element_before_opset_10_uses_slice_attributes(tmp_path):
    model = _graph([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                   [_vi("x", [2, 2])], [_vi("y", [2, 2])], opset=9, ir_version=4)
    graph = graph_from_model(model)
    head = graph.dialect.first_element(graph, "first", Tensor("relu", 0))
    assert graph.dialect.get_attr(graph, "first/head", "ends") == [1]
    graph.format_state.outputs.append(_vi(graph.node(head.node).outputs[0], []))
    written = model_from_graph(graph)
    onnx.checker.check_model(written)
    _, value = run(written, {"x": np.array([[3, 1], [2, 4]], np.float32)})
    assert value.shape == () and value == 3


def test_copy_node_gives_fresh_output_names():
    graph = graph_from_model(onnx_models.resnet18(size=16, width=4).model)
    copy = graph.dialect.copy_node(graph, "stem/conv", "stem/conv/recompute")
    node = graph.node(copy)
    assert node.op == "Conv" and node.attrs == graph.node("stem/conv").attrs
    assert node.outputs == ["stem/conv/recompute"]
    assert graph.inputs(copy) == []


# -- training steps ---------------------------------------------------------------


def test_generated_gradients_match_numpy_and_a_wrong_one_is_caught():
    built = onnx_models.block_mlp(batch=4, width=8, blocks=3)
    params = {t.name: numpy_helper.to_array(t) for t in built.model.graph.initializer
              if t.name.endswith("/W")}
    x = built.feeds["x"].astype(np.float64)
    hs, zs = [x], []
    for i in range(1, 4):
        zs.append(hs[-1] @ params[f"block{i}/W"])
        hs.append(np.tanh(np.maximum(zs[-1], 0)) * 2)
    grad = 2 * hs[-1] / hs[-1].size
    expected = {}
    for i in range(3, 0, -1):
        t = hs[i] / 2
        grad = grad * 2 * (1 - t * t) * (zs[i - 1] > 0)
        expected[f"block{i}/W"] = hs[i - 1].T @ grad
        grad = grad @ params[f"block{i}/W"].T
    probe = onnx.ModelProto()
    probe.CopyFrom(built.model)
    probe.graph.output.extend(_vi(g, None) for g in built.gradients.values())
    got = run(probe, built.feeds, list(built.gradients.values()))
    for (param, _), value in zip(built.gradients.items(), got, strict=True):
        np.testing.assert_allclose(value, expected[param], rtol=1e-4, atol=1e-6)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(built.model)
    relu_grad = next(n for n in wrong.graph.node if n.name == "gradients/block2/Relu_grad")
    relu_grad.input[1] = "gradients/block2/mul_grad"  # skips the tanh derivative
    with pytest.raises(AssertionError, match="gradient of block"):
        onnx_models.check_gradients(dataclasses.replace(built, model=wrong),
                                    lambda p: _mlp_loss(x, p), params)


def _mlp_loss(x, params):
    h = x
    for i in range(1, len(params) + 1):
        h = np.tanh(np.maximum(h @ params[f"block{i}/W"], 0)) * 2
    return float(np.mean(h * h))


@pytest.mark.parametrize("params_as_inputs", [False, True])
def test_region_analysis_finds_loss_gradients_and_updates(params_as_inputs):
    built = onnx_models.block_mlp(batch=4, width=8, params_as_inputs=params_as_inputs)
    graph = graph_from_model(built.model)
    regions = graphpass.analyze(graph)
    (step,) = regions.steps  # one graph, one step: its updates are separate outputs
    assert step.loss == Tensor("loss", 0)
    assert {t.node for t in step.gradients} == {f"gradients/block{i}/W_grad" for i in range(1, 9)}
    updates = {f"sgd/block{i}/update" for i in range(1, 9)}
    assert set(step.applies) == updates and set(step.train_ops) == updates
    for name in graph:
        label = regions.label(name)
        if name.startswith("block") and not name.endswith("/W"):
            assert label == FORWARD, name
        elif name.startswith("gradients/"):
            assert label == BACKWARD, name
        elif name.startswith("sgd/"):
            assert label == OPTIMIZER, name
    variables = [n for n in graph if graph.dialect.is_variable(graph, n)]
    assert variables == [f"block{i}/W" for i in range(1, 9)]
    if params_as_inputs:
        assert graph.dialect.step.graph_inputs(graph) == ["x", *variables]
    assert graphpass.analyze(graph, loss="loss").loss == Tensor("loss", 0)


def test_region_analysis_of_the_conv_net_and_either_mul_order():
    built = onnx_models.conv_net()
    for node in built.model.graph.node:
        if node.name == "sgd/conv1/step":
            node.input[0], node.input[1] = node.input[1], node.input[0]  # Mul(grad, lr)
    graph = graph_from_model(built.model)
    regions = graphpass.analyze(graph)
    assert regions.loss == Tensor("loss", 0)
    assert graph.dialect.step.optimizer_applies(graph) == {
        "sgd/head/update": [Tensor("gradients/head/W_grad", 0)],
        "sgd/conv2/update": [Tensor("gradients/conv2/W_grad", 0)],
        "sgd/conv1/update": [Tensor("gradients/conv1/W_grad", 0)],
    }
    assert regions.label("conv1/Conv") == FORWARD
    assert regions.label("gradients/conv2/input_grad") == BACKWARD


# -- API and CLI -------------------------------------------------------------------


def test_cli_rewrite_and_inspect(tmp_path):
    built = onnx_models.block_mlp(batch=4, width=8)
    source, target = tmp_path / "step.onnx", tmp_path / "rewritten.onnx"
    onnx.save(built.model, source)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["rewrite", str(source), "-o", str(target)]) == 0
    assert target.read_bytes() == source.read_bytes()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(target), "--json"]) == 0
    info = json.loads(out.getvalue())
    assert info["format"] == "onnx" and info["inputs"] == ["x"]
    assert info["regions"]["losses"] == ["loss"]
    assert info["regions"]["apply_ops"] == 8
    assert len(info["variables"]) == 8
    assert info["outputs"][0] == "loss"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["inspect", str(target), "--loss", "loss"]) == 0
    assert "loss:          loss" in text.getvalue()
    text = io.StringIO()
    with contextlib.redirect_stderr(text):  # a bad override is the caller's error
        assert main(["inspect", str(target), "--loss", "no_such_tensor"]) == 2
    assert "--loss 'no_such_tensor' is not a node" in text.getvalue()
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["rewrite", str(tmp_path / "missing.onnx"), "-o", str(target)]) == 2
