"""ONNX inputs that escaped as onnx's or numpy's own errors (issue 27): recursive
model-local functions, external-data locations with control bytes, dims no
tensor could have, and dims the planner cannot multiply."""

from __future__ import annotations

from pathlib import Path

import pytest
from tf_helpers import listing

from graphpass.cli import main

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def model():
    import onnx

    return onnx.load(DATA / "onnx_mlp.onnx")


def _commands(path: Path, tmp_path: Path) -> list[list[str]]:
    out = str(tmp_path / "o.onnx")
    return [["inspect", str(path)], ["rewrite", str(path), "-o", out],
            ["rewrite", str(path), "-o", out, "--recompute", "auto", "--batch-size", "2"]]


def _all_refused(capsys, model, tmp_path: Path, mentions: str) -> None:
    import onnx

    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    before = listing(tmp_path)
    for argv in _commands(path, tmp_path):
        assert main(argv) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"graphpass: error: {path}: "), lines
        assert mentions in lines[0], lines[0]
        assert listing(tmp_path) == before


@pytest.mark.parametrize("mutual", [False, True])
def test_recursive_local_function_is_refused(model, tmp_path, capsys, mutual):
    """onnx's ValidationError escaped from shape inference."""
    from onnx import helper

    names = ["fa", "fb"] if mutual else ["fa"]
    for i, name in enumerate(names):
        body = [helper.make_node(names[(i + 1) % len(names)], ["x"], ["y"], domain="local")]
        model.functions.append(helper.make_function(
            "local", name, ["x"], ["y"], body,
            [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.graph.node.append(helper.make_node("fa", [model.graph.node[0].output[0]], ["z"],
                                             domain="local", name="call"))
    _all_refused(capsys, model, tmp_path, "model-local function local::fa calls itself")


@pytest.mark.parametrize("location", ["da\x00ta.bin", "data\n.bin", "\x1b[2J.bin"])
def test_external_location_with_control_bytes_is_refused(model, tmp_path, capsys, location):
    """ValueError: embedded null byte, from the path checks."""
    import onnx

    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    _all_refused(capsys, model, tmp_path, "holds a NUL or control character")


@pytest.mark.parametrize("dim,mentions", [
    (2**63 - 1, "more than any device holds"),
    (2**50, "more than any device holds"),
    (-3, "negative dimension"),
])
def test_dims_no_tensor_could_have_are_refused(model, tmp_path, capsys, dim, mentions):
    """OverflowError in the planner's int64 arrays."""
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = dim
    _all_refused(capsys, model, tmp_path, mentions)


@pytest.mark.parametrize("symbolic", [True, False])
def test_unknown_batch_dim_asks_for_a_batch_size(model, tmp_path, capsys, symbolic):
    """TypeError multiplying None in the dialect's scalar check."""
    import onnx

    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    if symbolic:
        dim.dim_param = "N"
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    assert main(["rewrite", str(path), "-o", str(tmp_path / "a.onnx"), "--recompute",
                 "auto"]) == 2
    assert "give --batch-size N" in capsys.readouterr().err
    assert main(["rewrite", str(path), "-o", str(tmp_path / "b.onnx"), "--recompute", "auto",
                 "--batch-size", "4", "--quiet"]) == 0
    assert main(["rewrite", str(path), "-o", str(tmp_path / "c.onnx"), "--recompute", ".*",
                 "--quiet"]) == 0


def test_empty_forward_is_an_empty_chain():
    """IndexError in forward_chain: the planner indexed past the end of an empty
    forward (a step whose loss no computed op makes)."""
    import graphpass
    from graphpass.analysis.cost import Sizes
    from graphpass.analysis.forward import forward_chain

    graph = graphpass.load(DATA / "onnx_mlp.onnx")
    chain = forward_chain(graph, [], set(), Sizes(graph, None))
    assert (chain.units, chain.width, chain.saved, chain.saved_bytes) == ([], 0, [], 0)


def _external(model, directory: Path, location: str = "data.bin") -> Path:
    import onnx

    directory.mkdir(exist_ok=True)
    onnx.save_model(model, directory / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location=location, size_threshold=0)
    return directory / "model.onnx"


def test_external_location_over_the_name_limit_is_refused(model, tmp_path, capsys):
    """OSError: File name too long, from the path checks (found by the fuzzer)."""
    import onnx

    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="d" * 300 + ".bin")
    _all_refused(capsys, model, tmp_path, "longer than 255 bytes")


def test_external_data_target_that_is_a_fifo_is_refused(model, tmp_path, capsys):
    """Beside the output, the data file's name holds a FIFO (the rename would replace
    it): refused before anything is written."""
    import hashlib
    import os

    path = _external(model, tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    digest = hashlib.sha256((tmp_path / "in" / "data.bin").read_bytes()).hexdigest()
    os.mkfifo(out / f"model.onnx.{digest[:16]}.data")
    before = listing(tmp_path)
    assert main(["rewrite", str(path), "-o", str(out / "model.onnx")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert listing(tmp_path) == before
