"""Dumps, ``graphpass diff`` and ``graphpass verify``.

The rewriting passes are written elsewhere, so a tiny test-only pass (``Probe``)
stands in for them: it inserts an Identity under ``graphpass/probe/``, rewires
a consumer to it and adds control edges -- every kind of change a dump must
highlight -- without changing what the graph computes. Graphs are the real
training graphs of ``tools.tf_models``; dumps are rendered by the real ``dot``
and training runs are real TF sessions.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import graphpass
from graphpass.cli import main
from graphpass.formats.tf_io import graph_def_from_graph
from graphpass.inspect.diff import TOP_SCOPE, graph_diff, scope_of
from graphpass.inspect.dot import STYLES
from graphpass.inspect.dump import DumpInstrument
from graphpass.inspect.progress import PassProgress, Progress
from graphpass.ir.graph import Tensor
from graphpass.passes.base import Pass, Pipeline
from graphpass.passes.context import PassContext
from tools.fixtures import tf_models

PROBE = "graphpass/probe/block1_relu"
SVG = "{http://www.w3.org/2000/svg}"


class Probe(Pass):
    """Test-only pass: ``block1/Relu -> PROBE (Identity, ^x) -> block1/Tanh``, and
    ``^PROBE -> block2/MatMul``. Same values, new node, rewired input, control edges."""

    name = "probe"

    def run(self, graph, ctx):
        copy = graph.dialect.identity(graph, PROBE, Tensor("block1/Relu"), control_inputs=["x"])
        graph.set_input("block1/Tanh", 0, copy)
        graph.add_control_input("block2/MatMul", copy.node)
        return True


class Nothing(Pass):
    """Test-only pass that changes nothing."""

    name = "nothing"

    def run(self, graph, ctx):
        return False


# -- fixtures -------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return tf_models.block_mlp(batch=8, width=16, blocks=3, optimizer="sgd")


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    """original.meta, its graphpass round trip, the probe-rewritten graph, and a graph
    with a different learning rate (the "deliberately broken" rewrite)."""
    root = tmp_path_factory.mktemp("graphs")
    original = root / "original.meta"
    original.write_bytes(model.meta_graph.SerializeToString())
    assert main(["rewrite", str(original), "-o", str(root / "roundtrip.meta"), "--quiet"]) == 0
    probed = graphpass.load(original)
    Pipeline([Probe()]).run(probed)
    graphpass.save(probed, root / "probed.meta")
    broken = graphpass.load(original)
    _set_float_const(broken, "train/learning_rate", 0.2)
    graphpass.save(broken, root / "broken.meta")
    return {name: root / f"{name}.meta" for name in ("original", "roundtrip", "probed", "broken")}


def _set_float_const(graph, name, value):
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.python.framework import tensor_util

    assert graph.node(name).op == "Const"
    graph.node(name).attrs["value"] = attr_value_pb2.AttrValue(
        tensor=tensor_util.make_tensor_proto(value, dtype="float32"))


@pytest.fixture(scope="module")
def dumped(model, tmp_path_factory):
    """A pipeline (probe, then a no-op pass) run with a DumpInstrument."""
    dump_dir = tmp_path_factory.mktemp("dump")
    graph = graphpass.load(_write(model, tmp_path_factory.mktemp("in")))
    instrument = DumpInstrument(dump_dir, quiet=True)
    Pipeline([Probe(), Nothing()]).run(graph, PassContext(instruments=(instrument,)))
    return dump_dir, instrument


def _write(model, directory: Path) -> Path:
    path = directory / "model.meta"
    path.write_bytes(model.meta_graph.SerializeToString())
    return path


# -- graph_diff -------------------------------------------------------------------

def test_graph_diff_of_a_copy_is_empty(model, tmp_path):
    graph = graphpass.load(_write(model, tmp_path))
    diff = graph_diff(graph, graph.copy())
    assert diff.equal
    assert not any(diff.counts().values())


def test_graph_diff_names_every_kind_of_change(model, tmp_path):
    before = graphpass.load(_write(model, tmp_path))
    after = before.copy()
    Probe().run(after, PassContext())
    diff = graph_diff(before, after)
    assert diff.added_nodes == [PROBE]
    assert [(e.dst, e.slot, e.before, e.src) for e in diff.rewired_edges] == \
        [("block1/Tanh", 0, Tensor("block1/Relu"), Tensor(PROBE))]
    assert [(str(e.src), e.dst) for e in diff.added_data_edges] == [("block1/Relu", PROBE)]
    assert {(e.src, e.dst) for e in diff.added_control_edges} == \
        {("x", PROBE), (PROBE, "block2/MatMul")}
    assert diff.rewired_nodes() == ["block1/Tanh", "block2/MatMul"]
    assert not diff.removed_nodes and not diff.changed_nodes and not diff.meta
    # The other direction is the mirror image.
    back = graph_diff(after, before)
    assert back.removed_nodes == [PROBE]
    assert [(e.before, e.src) for e in back.rewired_edges] == \
        [(Tensor(PROBE), Tensor("block1/Relu"))]
    assert len(back.removed_control_edges) == 2 and len(back.removed_data_edges) == 1


def test_graph_diff_groups_by_pass_scope(model, tmp_path):
    before = graphpass.load(_write(model, tmp_path))
    after = before.copy()
    Probe().run(after, PassContext())
    scopes = graph_diff(before, after).scope_counts()
    assert scopes == {
        "block1": {"rewired_edges": 1},
        "block2": {"added_control_edges": 1},
        "graphpass/probe": {"added_nodes": 1, "added_data_edges": 1, "added_control_edges": 1},
    }
    assert scope_of("graphpass/remat/block1/MatMul") == "graphpass/remat"
    assert scope_of("gradients/block1/MatMul_grad/MatMul") == "gradients"
    assert scope_of("loss") == TOP_SCOPE


def test_graph_diff_sees_a_changed_constant(files):
    diff = graph_diff(graphpass.load(files["original"]), graphpass.load(files["broken"]))
    assert diff.changed_nodes == ["train/learning_rate"]
    assert diff.counts()["changed_nodes"] == 1 and not diff.added_nodes


# -- dumps ------------------------------------------------------------------------

#: Graphviz is optional: the svg tests check the rendering where `dot` is installed and
#: the documented behaviour without it (.dot written, no .svg, one note) where it is not.
HAVE_DOT = shutil.which("dot") is not None


def _svg_or_no_dot(dump_dir: Path, stem: str) -> Path | None:
    """The rendered ``stem.svg`` when `dot` is installed; without it, check that the
    ``.dot`` file is written, no ``.svg``, and one note says why, and return None."""
    svg = dump_dir / f"{stem}.svg"
    if HAVE_DOT:
        assert svg.is_file(), svg
        return svg
    assert (dump_dir / f"{stem}.dot").is_file() and not svg.exists()
    notes = json.loads((dump_dir / "index.json").read_text())["notes"]
    assert len(notes) == 1 and "Graphviz `dot` is not on PATH" in notes[0], notes
    return None


def test_dump_files_are_numbered_in_pass_order(dumped):
    dump_dir, instrument = dumped
    index = json.loads((dump_dir / "index.json").read_text())
    assert [d["dump"] for d in index["dumps"]] == ["00-input", "01-probe", "02-nothing"]
    assert index["dumps"][1]["diff_counts"]["added_nodes"] == 1
    assert index["dumps"][2]["changed"] is False
    assert index["notes"] == instrument.notes and (index["notes"] == []) == HAVE_DOT
    for stem in ("00-input", "01-probe", "02-nothing"):
        for suffix in (".pbtxt", ".dot"):
            assert (dump_dir / f"{stem}{suffix}").is_file(), stem + suffix
        _svg_or_no_dot(dump_dir, stem)
    assert (dump_dir / "01-probe.diff.json").is_file()
    assert not (dump_dir / "00-input.diff.json").exists()


def test_dump_pbtxt_is_the_graph_at_that_point(dumped):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    dump_dir, _ = dumped

    def names(stem):
        graph_def = text_format.Parse((dump_dir / f"{stem}.pbtxt").read_text(),
                                      graph_pb2.GraphDef())
        return {n.name for n in graph_def.node}

    assert PROBE not in names("00-input")
    assert PROBE in names("01-probe")


def _svg_items(path: Path, kind: str) -> dict[str, ET.Element]:
    """``{title: <g>}`` for the svg's nodes (kind="node") or edges (kind="edge")."""
    root = ET.parse(path).getroot()
    return {g.find(f"{SVG}title").text: g for g in root.iter(f"{SVG}g")
            if g.get("class") == kind}


def _fill(node: ET.Element) -> str | None:
    """A box node's fill colour (legend sample points are ellipses, without one)."""
    shape = node.find(f"{SVG}polygon")
    return shape.get("fill") if shape is not None else None


def _colour(style_key: str, attr: str) -> str:
    text = STYLES[style_key].node or STYLES[style_key].edge
    return text.split(f'{attr}="')[1].split('"')[0]


def test_dump_svg_highlights_the_rewrite_and_has_a_legend(dumped):
    dump_dir, _ = dumped
    svg = _svg_or_no_dot(dump_dir, "01-probe")
    if svg is None:
        return
    nodes = _svg_items(svg, "node")
    fill = {name: _fill(g) for name, g in nodes.items()}
    assert fill[PROBE] == _colour("added", "fillcolor")
    assert fill["block1/Tanh"] == _colour("rewired", "fillcolor")
    assert fill["block1/Relu"] == _colour("context", "fillcolor")  # 1-hop context, greyed
    assert "block3/W" not in nodes  # far from the change: not drawn
    edges = _svg_items(svg, "edge")
    stroke = {title: g.find(f"{SVG}path").get("stroke") for title, g in edges.items()}
    assert stroke[f"{PROBE}->block1/Tanh"] == _colour("rewired_edge", "color")
    assert stroke[f"block1/Relu->{PROBE}"] == _colour("new_data", "color")
    assert stroke[f"x->{PROBE}"] == _colour("new_control", "color")
    assert stroke[f"{PROBE}->block2/MatMul"] == _colour("new_control", "color")
    assert "cluster_legend" in _svg_items(svg, "cluster")
    legend = [g for title, g in {**nodes, **edges}.items() if title.startswith("legend_")]
    legend_text = " ".join(t.text or "" for g in legend for t in g.iter(f"{SVG}text"))
    for key in ("added", "changed", "rewired", "context", "removed",
                "new_data", "new_control", "rewired_edge"):
        assert STYLES[key].label in legend_text
    assert fill["legend_added"] == fill[PROBE]


def test_dump_of_the_input_and_of_an_unchanged_pass_highlight_nothing(dumped):
    dump_dir, _ = dumped
    for stem in ("00-input", "02-nothing"):
        svg = _svg_or_no_dot(dump_dir, stem)
        if svg is None:
            continue
        nodes = _svg_items(svg, "node")
        assert PROBE not in nodes and "block1/Tanh" not in nodes
        assert "legend_added" in nodes


def test_dump_full_draws_every_node(model, tmp_path):
    graph = graphpass.load(_write(model, tmp_path))
    Pipeline([Probe()]).run(graph, PassContext(instruments=(
        DumpInstrument(tmp_path / "d", full=True, quiet=True),)))
    svg = _svg_or_no_dot(tmp_path / "d", "01-probe")
    if svg is None:
        return
    nodes = _svg_items(svg, "node")
    assert set(graph) <= set(nodes)
    assert _fill(nodes[PROBE]) == _colour("added", "fillcolor")


def test_dot_view_draws_removed_nodes_dashed(model, tmp_path):
    from graphpass.inspect.dot import neighbourhood_dot

    without = graphpass.load(_write(model, tmp_path))
    with_probe = without.copy()
    Probe().run(with_probe, PassContext())
    text = neighbourhood_dot(without, graph_diff(with_probe, without), before=with_probe,
                             title="undo")
    [line] = [t for t in text.splitlines() if t.strip().startswith(f'"{PROBE}" [')]
    assert STYLES["removed"].node in line
    assert f'"{PROBE}" -> "block1/Tanh" [{STYLES["removed"].edge}]' in text
    assert "1 removed nodes" in text


def test_tensorboard_event_files_hold_the_graphs(dumped):
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    dump_dir, _ = dumped
    for stem, has_probe in (("00-input", False), ("01-probe", True)):
        [events] = (dump_dir / "tensorboard" / stem).glob("events.out.tfevents.*")
        graphs = [e.graph_def for e in tf.compat.v1.train.summary_iterator(str(events))
                  if e.HasField("graph_def")]
        assert len(graphs) == 1
        graph_def = graph_pb2.GraphDef.FromString(graphs[0])
        assert (PROBE in {n.name for n in graph_def.node}) == has_probe


def test_without_dot_the_dot_files_are_written_and_one_line_says_why(model, tmp_path,
                                                                     monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    graph = graphpass.load(_write(model, tmp_path))
    instrument = DumpInstrument(tmp_path / "d")
    Pipeline([Probe(), Nothing()]).run(graph, PassContext(instruments=(instrument,)))
    assert sorted(p.name for p in (tmp_path / "d").glob("*.dot")) == \
        ["00-input.dot", "01-probe.dot", "02-nothing.dot"]
    assert not list((tmp_path / "d").glob("[0-9]*.svg"))  # memory.svg is matplotlib's
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "dot" in lines[0] and "graphviz" in lines[0]
    assert json.loads((tmp_path / "d" / "index.json").read_text())["notes"] == \
        [lines[0].removeprefix("graphpass: ")]


def test_rewrite_dump_dir_option(files, tmp_path, capsys):
    dump_dir = tmp_path / "dumps"
    status = main(["rewrite", str(files["original"]), "-o", str(tmp_path / "out.meta"),
                   "--dump-dir", str(dump_dir), "--quiet"])
    assert status == 0
    assert capsys.readouterr() == ("", "")
    index = json.loads((dump_dir / "index.json").read_text())
    assert [d["dump"] for d in index["dumps"]] == ["00-input"]  # no pass is registered yet
    _svg_or_no_dot(dump_dir, "00-input")
    # A second run replaces the dumps it wrote, and leaves other files alone.
    (dump_dir / "notes.txt").write_text("mine")
    (dump_dir / "07-old.dot").write_text("digraph {}")
    assert main(["rewrite", str(files["original"]), "-o", str(tmp_path / "out.meta"),
                 "--dump-dir", str(dump_dir), "--quiet"]) == 0
    assert (dump_dir / "notes.txt").exists() and not (dump_dir / "07-old.dot").exists()


def test_dump_dir_that_is_a_file_is_a_user_error(files, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    status = main(["rewrite", str(files["original"]), "-o", str(tmp_path / "out.meta"),
                   "--dump-dir", str(blocker)])
    assert status == 2
    assert "--dump-dir" in capsys.readouterr().err


# -- graphpass diff -----------------------------------------------------------------

def test_diff_exit_codes(files, capsys):
    assert main(["diff", str(files["original"]), str(files["roundtrip"])]) == 0
    assert "equal" in capsys.readouterr().out
    assert main(["diff", str(files["original"]), str(files["probed"])]) == 1
    out = capsys.readouterr().out
    assert "graphpass/probe: 1 added nodes, 1 added data edges, 1 added control edges" in out
    assert f"+ node {PROBE}" in out
    assert f"~ edge block1/Tanh input 0: block1/Relu -> {PROBE}" in out


def test_diff_json_counts(files, capsys):
    assert main(["diff", str(files["original"]), str(files["probed"]), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["equal"] is False
    assert report["counts"]["added_nodes"] == 1
    assert report["counts"]["rewired_edges"] == 1
    assert report["counts"]["added_control_edges"] == 2
    assert report["scopes"]["graphpass/probe"]["counts"] == \
        {"added_nodes": 1, "added_data_edges": 1, "added_control_edges": 1}
    assert report["scopes"]["block1"]["rewired_edges"] == \
        [f"block1/Tanh input 0: block1/Relu -> {PROBE}"]
    assert main(["diff", str(files["original"]), str(files["roundtrip"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["equal"] is True


def test_diff_of_a_missing_file_is_a_user_error(files, tmp_path, capsys):
    assert main(["diff", str(files["original"]), str(tmp_path / "nope.pb")]) == 2
    assert "no such file" in capsys.readouterr().err


# -- graphpass verify ---------------------------------------------------------------

def test_verify_round_trip_matches(files, capsys):
    assert main(["verify", str(files["original"]), str(files["roundtrip"])]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("MATCH")
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 3  # one row per step, with losses and peak memory
    assert all("B" in row for row in rows)
    assert "peak memory, median over steps: original" in out


def test_verify_json(files, capsys):
    assert main(["verify", str(files["original"]), str(files["broken"]), "--steps", "2",
                 "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["format"] == "tf"
    assert report["compared"] == ["block1/W", "block2/W", "block3/W", "global_step"]
    assert [s["step"] for s in report["steps"]] == [1, 2]
    assert report["steps"][0]["max_abs"] > 0
    assert any(m.startswith("block1/W") for m in report["steps"][0]["mismatches"])


def test_verify_probed_graph_trains_identically(files, capsys):
    assert main(["verify", str(files["original"]), str(files["probed"]), "--steps", "2"]) == 0


def test_verify_detects_a_changed_learning_rate(files, capsys):
    assert main(["verify", str(files["original"]), str(files["broken"]), "--steps", "2"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH block1/W" in out
    assert out.strip().endswith("MISMATCH")
    # A generous tolerance accepts it.
    assert main(["verify", str(files["original"]), str(files["broken"]), "--steps", "1",
                 "--rtol", "1e6", "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def _add_counter(graph, assign_name: str) -> str:
    """A pass-added variable (like the stale-gradient counter), absent from the
    MetaGraph's collections, initialised by its own assign op."""
    from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2, types_pb2

    attr = attr_value_pb2.AttrValue
    counter = "graphpass/stale/counter"
    graph.add_node(counter, "VarHandleOp", attrs={
        "dtype": attr(type=types_pb2.DT_FLOAT), "shape": attr(shape=tensor_shape_pb2.
                                                             TensorShapeProto()),
        "shared_name": attr(s=counter.encode()), "container": attr(s=b"")})
    zero = graph.dialect.constant(graph, f"{counter}/zero", 0.0, "float32")
    graph.add_node(assign_name, "AssignVariableOp", [Tensor(counter), zero],
                   attrs={"dtype": attr(type=types_pb2.DT_FLOAT)})
    return counter


def test_verify_initialises_pass_added_variables_and_does_not_compare_them(files, tmp_path,
                                                                           capsys):
    graph = graphpass.load(files["original"])
    counter = _add_counter(graph, "graphpass/stale/counter/Assign")
    graphpass.save(graph, tmp_path / "counter.meta")
    assert main(["verify", str(files["original"]), str(tmp_path / "counter.meta"),
                 "--steps", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["only_rewritten"] == [counter] and counter not in report["compared"]


def test_verify_names_an_uninitialisable_variable(files, tmp_path, capsys):
    graph = graphpass.load(files["original"])
    _add_counter(graph, "graphpass/stale/setup")
    graphpass.save(graph, tmp_path / "counter.meta")
    assert main(["verify", str(files["original"]), str(tmp_path / "counter.meta")]) == 2
    err = capsys.readouterr().err
    assert "graphpass/stale/counter" in err and "--init" in err


def test_verify_with_feeds(files, model, tmp_path, capsys):
    feed = tmp_path / "x.npy"
    np.save(feed, model.feeds["x:0"])
    assert main(["verify", str(files["original"]), str(files["roundtrip"]), "--steps", "1",
                 "--feed", f"x={feed}", "--quiet"]) == 0
    assert main(["verify", str(files["original"]), str(files["roundtrip"]),
                 "--feed", f"nope={feed}"]) == 2
    assert "no placeholder" in capsys.readouterr().err
    assert main(["verify", str(files["original"]), str(files["roundtrip"]),
                 "--feed", "x"]) == 2


@pytest.mark.slow
def test_verify_xla_compiles_and_matches(files):
    """In its own process: TF reads the CPU auto-jit flag once, at its first session."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    result = subprocess.run(
        [sys.executable, "-m", "graphpass.cli", "verify", str(files["original"]),
         str(files["roundtrip"]), "--xla", "--steps", "1"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "XLA on" in result.stdout
    assert "Compiled cluster using XLA" in result.stderr


def _onnx_model(path: Path, op: str, constant: float) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node(op, ["X", "c"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor("c", TensorProto.FLOAT, [], [constant])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_verify_onnx_compares_outputs(tmp_path, capsys):
    times_two = _onnx_model(tmp_path / "a.onnx", "Mul", 2.0)
    also_times_two = _onnx_model(tmp_path / "b.onnx", "Mul", 2.0)
    plus_two = _onnx_model(tmp_path / "c.onnx", "Add", 2.0)
    assert main(["verify", str(times_two), str(also_times_two)]) == 0
    assert "onnx" in capsys.readouterr().out
    assert main(["verify", str(times_two), str(plus_two)]) == 1
    assert "MISMATCH Y" in capsys.readouterr().out
    assert main(["verify", str(times_two), str(plus_two), "--xla"]) == 2


# -- progress -------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_on_a_terminal_and_erases_itself():
    stream = _Terminal()
    with Progress("verify step", total=3, stream=stream) as progress:
        progress.update(1, "running")
    text = stream.getvalue()
    assert "\rgraphpass: verify step 1/3 running" in text
    assert text.endswith("\r")


def test_progress_is_silent_off_a_terminal_and_when_quiet():
    plain, terminal = io.StringIO(), _Terminal()
    for stream, quiet in ((plain, False), (terminal, True)):
        with Progress("dump", total=2, stream=stream, quiet=quiet) as progress:
            progress.update(1)
    assert plain.getvalue() == terminal.getvalue() == ""


def test_dumped_pbtxt_is_the_written_graph_def(model, tmp_path):
    """The pbtxt a dump writes parses back to the GraphDef the writer would emit."""
    graph = graphpass.load(_write(model, tmp_path))
    from graphpass.inspect.dump import write_graph_text

    path = write_graph_text(graph, tmp_path / "g")
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    parsed = text_format.Parse(path.read_text(), graph_pb2.GraphDef())
    assert parsed == graph_def_from_graph(graph)


def test_pass_progress_names_the_running_pass_and_erases_itself(model, tmp_path):
    stream = _Terminal()
    graph = graphpass.load(_write(model, tmp_path))
    Pipeline([Probe(), Nothing()]).run(graph, PassContext(
        instruments=(PassProgress(stream=stream),)))
    text = stream.getvalue()
    assert f"rewrite pass 1/2 probe ({len(graph) - 1} nodes)" in text
    assert f"rewrite pass 2/2 nothing ({len(graph)} nodes)" in text
    assert text.endswith("\r") and text.rstrip("\r ").endswith("nodes)")


def test_inspect_saved_lists_what_the_backward_keeps(tmp_path, capsys):
    """The 8-block MLP (x [16, 32] float32): every block keeps its input (read by the
    MatMul gradient), its Relu and Tanh outputs; the values are listed largest first."""
    from tools.fixtures import tf_models

    model = tf_models.block_mlp(batch=16, width=32, optimizer="sgd")
    source = tmp_path / "mlp.pb"
    source.write_bytes(model.graph_def.SerializeToString(deterministic=True))
    assert main(["inspect", str(source), "--saved", "--json"]) == 0
    saved = json.loads(capsys.readouterr().out)["saved"]
    values = saved["values"]
    assert saved["count"] == len(values) and saved["total_bytes"] == sum(v["bytes"] for v in values)
    assert [v["bytes"] for v in values] == sorted((v["bytes"] for v in values), reverse=True)
    by_tensor = {v["tensor"]: v for v in values}
    relu = by_tensor["block3/Relu"]
    assert relu["op"] == "Relu" and relu["shape"] == [16, 32] and relu["bytes"] == 16 * 32 * 4
    assert relu["readers"] == ["gradients/block3/Relu_grad/ReluGrad"]
    assert all(r.startswith("gradients/") for v in values for r in v["readers"])
    assert "block3/MatMul" not in by_tensor  # read by the Relu only, not by a gradient op
    assert main(["inspect", str(source), "--saved", "--all"]) == 0
    text = capsys.readouterr().out
    assert f"saved:         {len(values)} forward values kept" in text
    assert "block3/Relu (Relu [16, 32]) <- gradients/block3/Relu_grad/ReluGrad" in text
    assert main(["inspect", str(source), "--saved"]) == 0
    short = capsys.readouterr().out.splitlines()
    rows = [line for line in short if line.startswith("   ")]
    assert len(values) > 10 and len(rows) == 10
    assert short[-1] == f"  ... ({len(values)} in all)"
