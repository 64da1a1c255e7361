"""Model content that raised deep inside the tool (issue 43), refused where it is
read: ONNX tensors whose payload does not fit their dims and dtype, nodes that do
not fit their op's schema, a TF node named ``^``, TF1 gradients and apply ops of
quantized or string dtypes, text files nested thousands of levels deep, and a
``--dump-dir`` the file system will not take. Each: exit 2, one line, nothing
written, the input unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tf_helpers import listing

from graphpass.cli import main

DATA = Path(__file__).resolve().parent / "data"
ARTIFACT = DATA / "ort_artifacts" / "mlp_ce"


def _refused(capsys, argv, directory: Path, mentions: str) -> str:
    before = listing(directory)
    files = {p: p.read_bytes() for p in Path(directory).rglob("*") if p.is_file()}
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0], lines[0]
    assert listing(directory) == before
    assert {p: p.read_bytes() for p in files} == files
    return lines[0]


def _commands(path: Path, tmp_path: Path, suffix: str) -> list[list[str]]:
    out = str(tmp_path / f"o{suffix}")
    return [["inspect", str(path)],
            ["rewrite", str(path), "-o", out, "--dump-dir", str(tmp_path / "dumps")],
            ["rewrite", str(path), "-o", out, "--recompute", "auto", "--batch-size", "2"]]


# -- ONNX tensors ------------------------------------------------------------------


def _onnx(tmp_path: Path, damage, source: Path = DATA / "onnx_mlp.onnx") -> Path:
    import onnx

    model = onnx.load(source)
    damage(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def _weight(model):
    return next(t for t in model.graph.initializer if t.name == "block1/W")


def _to_floats(tensor, count):
    from onnx import numpy_helper

    values = numpy_helper.to_array(tensor).ravel().tolist()
    tensor.ClearField("raw_data")
    tensor.float_data.extend(values[:count])


@pytest.mark.parametrize("damage,mentions", [
    (lambda t: setattr(t, "raw_data", t.raw_data[:5]), "so 256 bytes, but holds 5"),
    (lambda t: _to_floats(t, 3), "so 64 values in float_data, but holds 3"),
    (lambda t: (t.ClearField("raw_data"), t.int64_data.extend(range(64))),
     "64 values in float_data, but holds 0"),
    (lambda t: setattr(t, "data_type", 0), "data_type 0, which is not an ONNX tensor type"),
    (lambda t: setattr(t, "data_type", -1), "data_type -1"),
    (lambda t: setattr(t, "data_type", 255), "data_type 255"),
    (lambda t: setattr(t, "data_type", 16), "of BFLOAT16, so 128 bytes, but holds 256"),
    (lambda t: setattr(t, "data_type", 8), "holds strings in raw_data"),
], ids=["raw-short", "few-values", "wrong-field", "dtype-0", "dtype-minus-1", "dtype-255",
        "bfloat16-size", "string-raw"])
def test_initializer_payload_that_does_not_fit_is_refused(tmp_path, capsys, damage, mentions):
    """KeyError, TypeError and ValueError (numpy's reshape) in the estimates and in
    ``--dump-dir``'s text dump."""
    path = _onnx(tmp_path, lambda m: damage(_weight(m)))
    for argv in _commands(path, tmp_path, ".onnx"):
        line = _refused(capsys, argv, tmp_path, mentions)
        assert "initializer 'block1/W'" in line


def test_constant_attribute_payload_is_checked_too(tmp_path, capsys):
    from onnx import helper

    def damage(model):
        value = helper.make_tensor("v", 1, [3], [1.0, 2.0, 3.0])
        value.float_data.pop()
        model.graph.node.append(helper.make_node("Constant", [], ["c"], value=value))

    _refused(capsys, ["inspect", str(_onnx(tmp_path, damage))], tmp_path,
             "attribute 'value' has dims [3] of FLOAT, so 3 values in float_data, but holds 2")


# -- ONNX nodes against their schema ---------------------------------------------------


def _transpose_perm(model):
    node = next(n for n in model.graph.node if n.op_type == "Transpose")
    return next(a for a in node.attribute if a.name == "perm")


def _perm_int(model):
    from onnx import AttributeProto

    perm = _transpose_perm(model)
    perm.ClearField("ints")
    perm.type, perm.i = AttributeProto.INT, 1


@pytest.mark.parametrize("damage,mentions", [
    (_perm_int, "attribute 'perm' holds INT, but Transpose declares it INTS"),
    (lambda m: setattr(_transpose_perm(m), "ref_attr_name", "p"),
     "refers to a function's attribute 'p', which only a function body may"),
])
def test_attributes_the_runtime_model_reads_must_fit_the_schema(tmp_path, capsys, damage,
                                                                 mentions):
    """TypeError (``len`` of an int) where ORT's kernel facts read ``perm``;
    onnx's ValueError reading a reference attribute."""
    path = _onnx(tmp_path, damage)
    for argv in _commands(path, tmp_path, ".onnx"):
        _refused(capsys, argv, tmp_path, mentions)


def _artifact(tmp_path: Path, damage) -> Path:
    copy = tmp_path / "artifact"
    shutil.copytree(ARTIFACT, copy)
    _onnx(copy, damage, ARTIFACT / "training_model.onnx").rename(copy / "training_model.onnx")
    return copy / "training_model.onnx"


def _third_input(model):
    node = next(n for n in model.graph.node if n.op_type == "MatMul")
    node.input.append(node.input[0])


@pytest.mark.parametrize("damage,mentions", [
    (_third_input, "(MatMul) has 3 inputs, but MatMul-13 takes 2"),
    (lambda m: setattr(m.opset_import[0], "version", 4), "has 2 inputs, but Gemm-1 takes 3"),
], ids=["matmul-third-input", "opset-4"])
def test_ort_artifact_nodes_must_fit_their_schema(tmp_path, capsys, damage, mentions):
    """ValueError unpacking a MatMul's inputs in ORT's Gemm fusion; TypeError
    building Reshape-1's empty ``shape`` attribute for an opset-4 step."""
    path = _artifact(tmp_path, damage)
    for argv in _commands(path, tmp_path, ".onnx"):
        _refused(capsys, argv, tmp_path, mentions)


def test_reshape_1_is_built_with_a_typed_shape():
    """Opset 4's Reshape takes its shape as an attribute; an empty one (a scalar)
    is written as an empty INTS, which onnx cannot infer from ``[]``."""
    import onnx

    from graphpass.dialects.onnx_builders import _reshape
    from graphpass.formats.onnx_io import graph_from_model

    graph = graph_from_model(onnx.load(DATA / "onnx_mlp.onnx"))
    source = next(iter(graph.nodes())).name
    from graphpass.ir.graph import Tensor

    scalar = _reshape(graph, "first", Tensor(source, 0), [], 4)
    attr = graph.node(scalar.node).attrs["shape"]
    assert attr.type == onnx.AttributeProto.INTS and list(attr.ints) == []


# -- TF ----------------------------------------------------------------------------


def _meta(tmp_path: Path, damage, name: str = "mlp_sgd.meta") -> Path:
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.ParseFromString((DATA / name).read_bytes())
    damage(meta.graph_def)
    path = tmp_path / "model.meta"
    path.write_bytes(meta.SerializeToString())
    return path


def test_tf_node_named_caret_is_refused(tmp_path, capsys):
    """KeyError "no node named ''" in the region analysis: ``^`` reads as a control
    input of the empty name."""
    def damage(graph_def):
        next(n for n in graph_def.node if n.name == "loss").name = "^"

    path = _meta(tmp_path, damage)
    for argv in _commands(path, tmp_path, ".meta"):
        _refused(capsys, argv, tmp_path, "node name '^' starts with '^'")


def _apply(graph_def):
    return next(n for n in graph_def.node if n.op == "ResourceApplyGradientDescent")


@pytest.mark.parametrize("dtype,name", [(7, "DT_STRING"), (10, "DT_BOOL")])
def test_apply_op_of_a_dtype_its_op_does_not_take_is_refused(tmp_path, capsys, dtype, name):
    """A string or bool update: TF's importer refuses such a node; so does the reader."""
    def damage(graph_def):
        _apply(graph_def).attr["T"].type = dtype

    path = _meta(tmp_path, damage)
    mentions = f"attr 'T' holds {name}, which ResourceApplyGradientDescent does not take"
    for argv in _commands(path, tmp_path, ".meta") + [
            ["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--recompute", "block1/"]]:
        _refused(capsys, argv, tmp_path, mentions)


@pytest.mark.parametrize("where", ["gradient", "apply"])
@pytest.mark.parametrize("dtype", [7, 10, 11, 12, 13, 15])
def test_gradient_of_a_quantized_or_string_dtype_is_not_gated(tmp_path, capsys, dtype, where):
    """TypeError (numpy knows no qint8 or string) and ValueError (``finfo`` of bool)
    where the estimate gated the updates on every gradient by a tiny float (only
    floats carry that signal); ZeroDivisionError in the summary of a step whose
    quantized update the estimate sized as nothing."""
    def damage(graph_def):
        if where == "apply":
            _apply(graph_def).attr["T"].type = dtype
            return
        gradient = _apply(graph_def).input[2].split(":")[0]
        next(n for n in graph_def.node if n.name == gradient).attr["T"].type = dtype

    path = _meta(tmp_path, damage)
    for extra in (["--recompute", "auto", "--batch-size", "2"], ["--recompute", "block1/"]):
        assert main(["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--quiet",
                     *extra]) in (0, 2)
        err = capsys.readouterr().err.splitlines()
        assert len(err) <= 1


def test_text_graph_nested_thousands_deep_is_refused(tmp_path, capsys):
    """RecursionError in protobuf's text parser."""
    depth = 3000
    text = ('node { name: "a" op: "NoOp" attr { key: "x" value { func { name: "f" '
            + 'attr { key: "y" value { func { name: "g" ' * depth + "} } " * depth
            + "} } } }\n")
    path = tmp_path / "deep.pbtxt"
    path.write_text(text)
    for argv in _commands(path, tmp_path, ".pbtxt"):
        _refused(capsys, argv, tmp_path, "levels deep, more than the 100 graphpass reads")


@pytest.mark.parametrize("text", ["x = " + "[" * 5000 + "]" * 5000,
                                  "x = " + "{a=" * 5000 + "1" + "}" * 5000])
def test_config_nested_thousands_deep_is_refused(tmp_path, capsys, text):
    """RecursionError in Python's TOML parser."""
    model = tmp_path / "model.onnx"
    shutil.copyfile(DATA / "onnx_mlp.onnx", model)
    config = tmp_path / "c.toml"
    config.write_text(text + "\n")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--config",
                      str(config)], tmp_path, "--config")


@pytest.mark.parametrize("source", ["mlp_sgd.meta", "onnx_mlp.onnx"])
@pytest.mark.parametrize("occupied,mentions", [
    ("tensorboard", "tensorboard is not a directory"),
    ("index.json/", "index.json is a directory"),
])
def test_dump_dir_names_of_the_wrong_kind_are_refused_first(tmp_path, capsys, source,
                                                            occupied, mentions):
    """NotADirectoryError writing TensorBoard's event file of a TF graph (the ONNX
    graph, which writes none, gave one line already)."""
    model = tmp_path / f"model{Path(source).suffix}"
    shutil.copyfile(DATA / source, model)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    if occupied.endswith("/"):
        (dumps / occupied).mkdir()
    else:
        (dumps / occupied).write_text("mine")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / f"o{model.suffix}"),
                      "--dump-dir", str(dumps)], tmp_path, mentions)


def test_dump_the_file_system_refuses_is_one_line(tmp_path, capsys):
    model = tmp_path / "model.meta"
    shutil.copyfile(DATA / "mlp_sgd.meta", model)
    dumps = tmp_path / "dumps"
    (dumps / "00-input.pbtxt").mkdir(parents=True)
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.meta"), "--dump-dir",
                 str(dumps)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"graphpass: error: --dump-dir {dumps}: {dumps / '00-input.pbtxt'} is a "
                     "directory, where the dumps write a file; remove it"]
    assert not (tmp_path / "o.meta").exists()


@pytest.mark.parametrize("damage,mentions", [
    (lambda sig: sig.input_arg.add(), "has argument '<unnamed>' without a name"),
    (lambda sig: setattr(sig.input_arg[0], "type", 0), "has no dtype (DataType 0"),
    (lambda sig: sig.output_arg.add().CopyFrom(sig.output_arg[0]), "twice"),
], ids=["unnamed", "no-dtype", "twice"])
def test_function_signature_args_need_a_name_and_a_dtype(tmp_path, capsys, damage, mentions):
    """TypeError in TF's ``as_dtype`` reading an argument node's dtype 0 (the hostile
    fuzzer's field mutation added an empty argument to a TF2 step's signature)."""
    def mutate(graph_def):
        function = next(f for f in graph_def.library.function if f.signature.input_arg
                        and f.signature.output_arg)
        damage(function.signature)

    path = _meta(tmp_path, mutate, "function_library.meta")
    for argv in _commands(path, tmp_path, ".meta"):
        _refused(capsys, argv, tmp_path, mentions)
