"""Attrs of the wrong kind and absurd numbers (issue 27): range-checked where they
are read (the file, the command line, ``--config``), each one line, exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tf_helpers import listing

from graphpass.cli import main

DATA = Path(__file__).resolve().parent / "data"
THIRTY_DIGITS = "1" + "0" * 29


def _refused(capsys, argv, directory: Path, mentions: str) -> str:
    before = listing(directory)
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0], lines[0]
    assert listing(directory) == before
    return lines[0]


@pytest.fixture
def meta(tmp_path) -> Path:
    path = tmp_path / "model.meta"
    shutil.copyfile(DATA / "mlp_sgd.meta", path)
    return path


@pytest.mark.parametrize("value", [THIRTY_DIGITS, "-" + THIRTY_DIGITS, str(2**63)])
def test_staleness_out_of_int64_is_refused(meta, tmp_path, capsys, value):
    """OverflowError building the staleness constant."""
    out = str(tmp_path / "o.meta")
    _refused(capsys, ["rewrite", str(meta), "-o", out, f"--drop-stale={value}"], tmp_path,
             "out of range")
    config = tmp_path / "c.toml"
    config.write_text(f"drop_stale = {value}\n" if len(value) < 19 else
                      f'drop_stale = "{value}"\n')
    _refused(capsys, ["rewrite", str(meta), "-o", out, "--config", str(config)], tmp_path,
             "out of range")


def test_staleness_at_the_int64_bounds_is_accepted(meta, tmp_path):
    for value in (str(2**63 - 1), str(-2**63)):
        assert main(["rewrite", str(meta), "-o", str(tmp_path / "o.meta"), "--quiet",
                     f"--drop-stale={value}"]) == 0


@pytest.mark.parametrize("loss,mentions", [
    ("loss:2147483648", "2147483648"),
    ("loss:5", "'loss' has 1 output(s), so there is no output 5"),
    ("ghost:0", "is not a node of the graph"),
])
def test_loss_ports_that_cannot_exist_are_refused(meta, tmp_path, capsys, loss, mentions):
    _refused(capsys, ["rewrite", str(meta), "-o", str(tmp_path / "o.meta"), "--drop-stale",
                      "1", "--loss", loss], tmp_path, mentions)
    _refused(capsys, ["inspect", str(meta), "--loss", loss], tmp_path, mentions)


def test_batch_size_out_of_range_is_refused(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    shutil.copyfile(DATA / "onnx_mlp.onnx", model)
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--recompute",
                      "auto", "--batch-size", "1" + "0" * 30], tmp_path, "out of range")


def _write(tmp_path: Path, meta) -> Path:
    path = tmp_path / "damaged.meta"
    path.write_bytes(meta.SerializeToString())
    return path


def _load(name: str):
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.ParseFromString((DATA / name).read_bytes())
    return meta


def test_required_type_attr_missing_before_a_while_is_refused(tmp_path, capsys):
    """KeyError 'T' where the loop's arguments were counted."""
    meta = _load("control_flow.meta")
    node = next(n for n in meta.graph_def.node if n.name == "while/Identity")
    del node.attr["T"]
    path = _write(tmp_path, meta)
    for argv in (["inspect", str(path)],
                 ["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--drop-stale", "2"]):
        _refused(capsys, argv, tmp_path,
                 "node 'while/Identity': attr 'T' is missing, and the op has no default")


@pytest.mark.parametrize("dims", [[0], [-1], [2**40]])
def test_loop_bound_constant_of_an_impossible_shape_is_refused(
        tmp_path, capsys, dims):
    """ValueError in numpy's pad where the loop estimate read a v1 loop's bound: a
    scalar ``int_val`` under a shape of no, negative or absurd size (the fuzzer's
    'extreme shape while/Less/y.value'). The loop estimate reads no trips from it;
    TF's shape inference cannot import the graph either, so the planner has no
    sizes and says which input it needs."""
    meta = _load("control_flow.meta")
    node = next(n for n in meta.graph_def.node if n.name == "while/Less/y")
    shape = node.attr["value"].tensor.tensor_shape
    for size in dims:
        shape.dim.add().size = size
    path = _write(tmp_path, meta)
    _refused(capsys, ["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--recompute",
                      "auto", "--batch-size", "2"], tmp_path, "input x has shape")


def test_loop_counter_step_whose_bytes_do_not_fit_its_dtype_leaves_the_trips_unknown(
        tmp_path, capsys):
    """ValueError 'buffer size must be a multiple of element size' where the loop
    estimate read a v1 counter's step: ``tensor_content`` of 6 bytes for an int32
    (fuzzer, pbtxt-11-342). The step is unreadable, so the trips are unknown and the
    summary says how to give them."""
    meta = _load("control_flow.meta")
    node = next(n for n in meta.graph_def.node if n.name == "while/add/y")
    node.attr["value"].tensor.tensor_content = b"\x17\xff\xefY\xcd!"
    path = _write(tmp_path, meta)
    assert main(["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--recompute",
                 "auto", "--batch-size", "2"]) == 0
    assert "trip count unknown" in capsys.readouterr().out


def test_constant_of_no_tf_dtype_keeps_grappler_out(tmp_path, capsys):
    """SIGABRT in Grappler (``tensor.cc`` 'Unexpected type: 99') when the summary's
    estimate asked it for the graph TF runs: TF's importer accepts a constant whose
    value has dtype 99 (fuzzer, graphdef-12-7). Grappler is not asked; the figure is
    the hand model's, and the line says why."""
    meta = _load("mlp_sgd.meta")
    node = next(n for n in meta.graph_def.node if n.op == "Const" and
                n.attr["value"].tensor.dtype == 1)
    node.attr["value"].tensor.dtype = 99
    path = _write(tmp_path, meta)
    assert main(["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--recompute",
                 "block[1-2]/"]) == 0
    assert f"Grappler refused the graph: node '{node.name}': attr 'value' has no dtype TF " \
        "knows (99)" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["i", "s", "absent"])
def test_dtype_attr_of_the_wrong_kind_in_a_function_body_is_refused(tmp_path, capsys, kind):
    """TypeError in dtype_name: a body's ``T`` holding an int, a string or nothing."""
    meta = _load("function_library.meta")
    fdef = meta.graph_def.library.function[0]
    node = next(n for n in fdef.node_def if "T" in n.attr)
    if kind == "i":
        node.attr["T"].i = 5
    elif kind == "s":
        node.attr["T"].s = b"float32"
    else:
        del node.attr["T"]
    path = _write(tmp_path, meta)
    for argv in (["inspect", str(path)],
                 ["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--recompute", ".*",
                  "--target", "xla"]):
        _refused(capsys, argv, tmp_path, f"node {node.name!r}: attr 'T' ")
