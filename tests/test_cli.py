"""The command line, through ``graphpass.cli.main(argv)``: rewrite, inspect,
passes, and the user errors (exit 2, one line on stderr, nothing written)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tf_helpers import listing, read_message, write_message

import graphpass
from graphpass.cli import main


def _graph_def_type():
    from tensorflow.core.framework import graph_pb2

    return graph_pb2.GraphDef


@pytest.fixture
def mlp(models, tmp_path):
    """The Adam MLP (resource variables) as a binary GraphDef in tmp_path."""
    model = models.model("mlp_adam")
    return model, write_message(tmp_path / "model.pb", model.graph_def)


def assert_user_error(capsys, argv, directory: Path, *, mentions: str = "") -> str:
    """Exit 2, exactly one line on stderr starting ``graphpass: error:``, no
    traceback, nothing on stdout, and no file left behind in ``directory``."""
    before = listing(directory)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("graphpass: error: "), lines[0]
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert listing(directory) == before  # no output, no temporary files
    assert mentions in lines[0]
    return lines[0]


# -- rewrite, inspect, passes --------------------------------------------------------


def test_rewrite_without_passes_prints_a_summary(mlp, tmp_path, capsys):
    model, source = mlp
    target = tmp_path / "out.pb"
    assert main(["rewrite", str(source), "-o", str(target)]) == 0
    out = capsys.readouterr().out
    count = len(model.graph_def.node)
    assert f"{source} -> {target}" in out and f"{count} -> {count} nodes" in out
    assert "no passes requested" in out
    assert read_message(target, _graph_def_type()) == model.graph_def
    assert listing(tmp_path) == ["model.pb", "out.pb"]


def test_rewrite_quiet_and_report(mlp, tmp_path, capsys):
    model, source = mlp
    report = tmp_path / "report.json"
    argv = ["rewrite", str(source), "-o", str(tmp_path / "out.pb"), "--quiet",
            "--report", str(report)]
    assert main(argv) == 0
    assert capsys.readouterr().out == ""
    data = json.loads(report.read_text())
    assert data["nodes_before"] == data["nodes_after"] == len(model.graph_def.node)
    assert data["passes"] == [] and data["format"] == "tf"


def test_rewrite_accepts_valid_overrides(mlp, tmp_path, capsys):
    _, source = mlp
    argv = ["rewrite", str(source), "-o", str(tmp_path / "out.pb"), "--loss", "loss:0",
            "--train-op", "train", "--global-step", "global_step"]
    assert main(argv) == 0
    assert (tmp_path / "out.pb").exists()


def _control_edges(graph_def) -> int:
    return sum(1 for n in graph_def.node for i in n.input if i.startswith("^"))


def test_inspect_json(mlp, capsys):
    model, source = mlp
    assert main(["inspect", str(source), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    graph_def = model.graph_def
    assert (info["format"], info["container"]) == ("tf", "graphdef")
    assert info["nodes"] == len(graph_def.node)
    assert info["ops"] == dict(Counter(n.op for n in graph_def.node))
    assert info["control_edges"] == _control_edges(graph_def) > 0
    assert "x" in info["inputs"]
    consumed = {i.lstrip("^").split(":")[0] for n in graph_def.node for i in n.input}
    assert info["outputs"] == [n.name for n in graph_def.node if n.name not in consumed]
    handles = [n.name for n in graph_def.node if n.op == "VarHandleOp"]
    assert handles and info["variables"] == handles  # resource variables
    assert {"block1/W", "global_step", "block1/W/Adam"} <= set(info["variables"])
    regions = info["regions"]
    assert sum(regions["counts"].values()) == info["nodes"]
    assert all(regions["counts"][k] > 0 for k in ("forward", "backward", "optimizer"))
    assert regions["losses"] == ["loss"]
    assert regions["train_ops"] == ["train"]
    assert regions["apply_ops"] == 3  # one ResourceApplyAdam per block
    assert regions["global_step"] == "global_step"


def test_inspect_json_ref_variables(models, tmp_path, capsys):
    model = models.model("conv_bn_dropout")
    source = write_message(tmp_path / "conv.pb", model.graph_def)
    assert main(["inspect", str(source), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    variable_ops = {n.name: n.op for n in model.graph_def.node
                    if n.op in ("VariableV2", "VarHandleOp")}
    assert info["variables"] == list(variable_ops)
    assert variable_ops["conv1/moving_mean"] == "VariableV2"  # ref variables
    assert variable_ops["global_step"] == "VarHandleOp"
    assert info["regions"]["apply_ops"] == 7 and info["regions"]["losses"] == ["loss"]


def test_inspect_text(mlp, capsys):
    model, source = mlp
    assert main(["inspect", str(source)]) == 0
    out = capsys.readouterr().out
    fields = dict(line.split(":", 1) for line in out.splitlines())
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["format"] == "tf (graphdef)"
    assert fields["nodes"] == \
        f"{len(model.graph_def.node)}  control edges: {_control_edges(model.graph_def)}"
    assert "x" in fields["inputs"].split(", ")
    assert fields["variables"].startswith("12: block1/W, block2/W, block3/W, global_step, ")
    assert fields["ops"].startswith("Const ") and fields["ops"].endswith(" in all)")
    assert fields["regions"].startswith("forward ")
    assert fields["loss"] == "loss" and fields["train ops"] == "train"
    assert fields["global_step"] == "global_step"


def test_inspect_all_prints_every_list_whole(mlp, capsys):
    _, source = mlp
    assert main(["inspect", str(source), "--all"]) == 0
    out = capsys.readouterr().out
    assert "in all)" not in out
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert "ResourceApplyAdam 3" in fields["ops"]
    assert main(["inspect", str(source), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert len(fields["ops"].split(", ")) == len(info["ops"]) > 10


def test_every_long_list_of_inspect_is_cut_the_same_way():
    """Inputs (a Keras graph has hundreds), outputs, variables, ops, regions' lists and
    signatures: the first ten, then "... (N in all)"; ``limit=None`` (--all): whole."""
    from graphpass.cli.text import describe_text

    names = [f"n{i}" for i in range(582)]
    info = {"format": "tf", "container": "graphdef", "nodes": 600, "control_edges": 0,
            "inputs": names, "outputs": names, "variables": names,
            "ops": {f"Op{i}": 1 for i in range(30)},
            "signatures": [{"signature": s, "function": "f", "updates_variables": False}
                           for s in names],
            "regions": {"counts": {"forward": 1}, "losses": names, "train_ops": names,
                        "updates": names, "gradients": names, "global_step": None}}
    lines = describe_text(info).splitlines()
    cut = [line for line in lines if line.split(":")[0] in
           ("inputs", "outputs", "variables", "signatures", "loss", "train ops", "updates",
            "gradients")]
    assert len(cut) == 8
    assert all(line.endswith(", n9 ... (582 in all)") for line in cut), cut
    assert next(line for line in lines if line.startswith("ops")).endswith(" ... (30 in all)")
    whole = describe_text(info, None)
    assert "in all" not in whole and ", n581" in whole


def test_inspect_inference_graph_describes_without_regions(tmp_path, capsys):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        tf.nn.relu(tf.matmul(x, tf.ones([3, 3])), name="y")
    source = write_message(tmp_path / "inference.pb", graph.as_graph_def())
    assert main(["inspect", str(source)]) == 0
    out = capsys.readouterr().out
    assert "not a training graph (found no optimizer apply ops" in out
    assert main(["inspect", str(source), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["regions"] is None and info["outputs"] == ["y"] and info["variables"] == []


def test_passes_lists_every_registered_pass(capsys):
    from graphpass.passes import registered_passes

    assert main(["passes"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    names = [line.split(":")[0] for line in captured.out.splitlines()
             if line and not line.startswith(" ")]
    assert names == [cls.name for cls in registered_passes()]


def test_help_is_instant_and_does_not_import_tensorflow():
    code = ("import sys; from graphpass.cli import main; rc = main(['--help']); "
            "assert rc == 0, rc; assert 'tensorflow' not in sys.modules; "
            "assert 'onnx' not in sys.modules")
    root = Path(graphpass.__file__).parent.parent
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "rewrite" in result.stdout and "inspect" in result.stdout


# -- user errors -----------------------------------------------------------------


def _corrupt_first_node_name(data: bytes) -> bytes:
    """Make the first node's name claim more bytes than its node holds."""
    data = bytearray(data)
    assert data[0] == 0x0A  # field 1 (node), length-delimited
    pos = 1
    while data[pos] & 0x80:  # the node's length varint
        pos += 1
    pos += 1
    assert data[pos] == 0x0A  # NodeDef field 1 (name)
    data[pos + 1] = 0x7F
    return bytes(data)


def test_missing_input(tmp_path, capsys):
    assert_user_error(capsys, ["rewrite", str(tmp_path / "nope.pb"), "-o",
                               str(tmp_path / "out.pb")], tmp_path, mentions="no such file")
    assert_user_error(capsys, ["inspect", str(tmp_path / "nope.pb")], tmp_path)


@pytest.mark.parametrize("damage", ["corrupt", "truncated_half", "truncated_last_byte",
                                    "corrupt_text"])
def test_damaged_protobuf(mlp, tmp_path, capsys, damage):
    model, source = mlp
    data = source.read_bytes()
    if damage == "corrupt":
        bad = _corrupt_first_node_name(data)
    elif damage == "truncated_half":
        bad = data[: len(data) // 2]
    elif damage == "truncated_last_byte":
        bad = data[:-1]
    else:
        from google.protobuf import text_format

        bad = text_format.MessageToString(model.graph_def)[:5000].encode()
    damaged = tmp_path / "damaged.pb"
    damaged.write_bytes(bad)
    line = assert_user_error(capsys, ["rewrite", str(damaged), "-o", str(tmp_path / "out.pb")],
                             tmp_path)
    assert "corrupt" in line or "truncated" in line


@pytest.mark.parametrize("content", ["random", "text", "empty"])
def test_unknown_format(tmp_path, capsys, content):
    path = tmp_path / "model.pb"
    if content == "random":
        path.write_bytes(np.random.RandomState(0).bytes(4096))
    elif content == "text":
        path.write_text("hello world\nthis is not a model\n")
    else:
        path.write_bytes(b"")
    line = assert_user_error(capsys, ["rewrite", str(path), "-o", str(tmp_path / "out.pb")],
                             tmp_path)
    assert "expected a" in line and "GraphDef" in line
    if content == "text":
        assert "unknown format" in line and "'hello world'" in line


def test_output_equal_to_input_needs_in_place(mlp, tmp_path, capsys):
    model, source = mlp
    original = source.read_bytes()
    assert_user_error(capsys, ["rewrite", str(source), "-o", str(source)], tmp_path,
                      mentions="--in-place")
    assert source.read_bytes() == original
    # the same file under another spelling of its path
    other = tmp_path / "." / "model.pb"
    assert_user_error(capsys, ["rewrite", str(source), "-o", str(other)], tmp_path)

    assert main(["rewrite", str(source), "-o", str(source), "--in-place", "--quiet"]) == 0
    assert read_message(source, _graph_def_type()) == model.graph_def
    assert listing(tmp_path) == ["model.pb"]


@pytest.mark.parametrize("where", ["missing_dir", "under_a_file", "existing_dir"])
def test_unwritable_output(mlp, tmp_path, capsys, where):
    _, source = mlp
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "a_dir").mkdir()
    target = {
        "missing_dir": tmp_path / "no" / "such" / "out.pb",
        "under_a_file": tmp_path / "a_file" / "out.pb",
        "existing_dir": tmp_path / "a_dir",
    }[where]
    line = assert_user_error(capsys, ["rewrite", str(source), "-o", str(target)], tmp_path)
    assert str(target) in line
    assert (tmp_path / "a_file").read_text() == "not a directory"


def test_bad_config(mlp, tmp_path, capsys):
    _, source = mlp
    out = str(tmp_path / "out.pb")
    bad = tmp_path / "bad.toml"
    bad.write_text("loss = [\n")
    assert_user_error(capsys, ["rewrite", str(source), "-o", out, "--config", str(bad)],
                      tmp_path, mentions="not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('loss = "loss"\nrecompute_everything = true\n')
    line = assert_user_error(capsys, ["rewrite", str(source), "-o", out, "--config",
                                      str(unknown)], tmp_path, mentions="recompute_everything")
    assert "unknown option" in line and "valid: " in line
    assert_user_error(capsys, ["rewrite", str(source), "-o", out, "--config",
                               str(tmp_path / "none.toml")], tmp_path, mentions="no such file")


def test_config_values_are_used(mlp, tmp_path, capsys):
    _, source = mlp
    config = tmp_path / "good.toml"
    config.write_text('loss = "nosuchnode"\n')
    out = str(tmp_path / "out.pb")
    assert_user_error(capsys, ["rewrite", str(source), "-o", out, "--config", str(config)],
                      tmp_path, mentions="'nosuchnode'")
    # the command line wins over the file
    assert main(["rewrite", str(source), "-o", out, "--config", str(config),
                 "--loss", "loss", "--quiet"]) == 0


def test_the_target_runtime_configuration_is_an_option_and_reported(mlp, tmp_path, capsys):
    """``--onednn`` and ``--intra-op-threads`` (or a config file's ``onednn`` and
    ``intra_op_threads``) say what the plan targets; the report and the summary name
    it; without them the documented defaults, not this machine's setting."""
    _, source = mlp
    out, report = tmp_path / "out.pb", tmp_path / "report.json"
    base = ["rewrite", str(source), "-o", str(out), "--recompute", "block[1-2]/"]

    def runtime(*options: str) -> dict:
        assert main([*base, "--report", str(report), *options]) == 0
        remat = json.loads(report.read_text())["passes"][0]["report"]
        return remat["runtime"]

    assert runtime() == {"runtime": "tf", "heap": "best-fit", "onednn": True,
                         "intra_op_threads": 8}
    assert "for TF's executor, oneDNN on, 8 intra-op threads" in capsys.readouterr().out
    # (--onednn off on a machine with oneDNN on: test_host_independence.py)
    assert runtime("--onednn", "on", "--intra-op-threads", "3")["intra_op_threads"] == 3
    config = tmp_path / "runtime.toml"
    config.write_text('onednn = "on"\nintra_op_threads = 2\n')
    assert runtime("--config", str(config))["intra_op_threads"] == 2
    out.unlink()
    capsys.readouterr()
    assert_user_error(capsys, [*base, "--intra-op-threads", "0"], tmp_path,
                      mentions="--intra-op-threads")
    assert not out.exists()


@pytest.mark.parametrize("option", [["--loss", "nosuchnode"], ["--train-op", "loss"],
                                    ["--global-step", "loss"]])
def test_bad_override_fails_and_keeps_existing_output(mlp, tmp_path, capsys, option):
    _, source = mlp
    target = tmp_path / "out.pb"
    target.write_bytes(b"previous output")
    assert_user_error(capsys, ["rewrite", str(source), "-o", str(target), *option], tmp_path,
                      mentions=option[0])
    assert target.read_bytes() == b"previous output"
    assert_user_error(capsys, ["inspect", str(source), *option], tmp_path, mentions=option[0])


def test_failure_while_writing_keeps_existing_output(mlp, tmp_path, capsys, monkeypatch):
    from graphpass.formats import tf_io

    _, source = mlp
    target = tmp_path / "out.pb"
    target.write_bytes(b"previous output")
    real_serialize = tf_io.serialize
    calls = []

    def full_disk(message, text):
        calls.append(real_serialize(message, text))  # the graph was lowered fine
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tf_io, "serialize", full_disk)
    assert_user_error(capsys, ["rewrite", str(source), "-o", str(target)], tmp_path,
                      mentions="No space left on device")
    assert calls and target.read_bytes() == b"previous output"
