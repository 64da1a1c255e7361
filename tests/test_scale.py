"""Scale: start-up imports nothing heavy, commands import only their format's
runtime, and the analyses do a bounded number of graph walks whatever the size
of the graph (the structural form of "linear": a walk per candidate would make
the count grow with the graph). Timings live in python -m tools.bench.scale."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
HEAVY = ("tensorflow", "onnx", "onnxruntime", "networkx", "numpy")


def imported_after(argv: list[str]) -> list[str]:
    """The heavy top-level modules loaded by ``graphpass ARGV`` in a fresh interpreter."""
    code = (
        "import contextlib, io, json, sys\n"
        "from graphpass.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    status = main({argv!r})\n"
        f"print(json.dumps([status, sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
                                         "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr
    status, modules = json.loads(done.stdout.splitlines()[-1])
    assert status == 0
    return modules


@pytest.mark.parametrize("argv", [["--help"], ["passes"], ["rewrite", "--help"]])
def test_help_and_passes_import_no_runtime(argv):
    assert imported_after(argv) == []


@pytest.mark.slow
def test_onnx_commands_never_import_tensorflow(tmp_path):
    source = str(DATA / "onnx_mlp.onnx")
    assert "tensorflow" not in imported_after(["inspect", source])
    modules = imported_after(["rewrite", source, "-o", str(tmp_path / "out.onnx"),
                              "--recompute", "block[1-2]/"])
    assert "tensorflow" not in modules and "onnx" in modules


@pytest.mark.slow
def test_tf_commands_never_import_onnx(tmp_path):
    source = str(DATA / "mlp_adam.meta")
    modules = imported_after(["rewrite", source, "-o", str(tmp_path / "out.meta"),
                              "--recompute", "block[1-2]/"])
    assert "tensorflow" in modules
    assert "onnx" not in modules and "onnxruntime" not in modules


@pytest.mark.parametrize("name", ["mlp_adam", "conv_bn_dropout", "control_flow",
                                  "function_library", "clipped_custom_scope"])
def test_tf_shapes_are_the_python_importers(name):
    """The C-importer-only inference records what ``import_graph_def`` infers."""
    import tensorflow as tf

    import graphpass
    from graphpass.formats.tf_io import graph_def_from_graph

    graph = graphpass.load(DATA / f"{name}.meta")
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        tf.compat.v1.import_graph_def(graph_def_from_graph(graph), name="")
    expected = {op.name: [None if t.shape.rank is None else tuple(t.shape.as_list())
                          for t in op.outputs] for op in tf_graph.get_operations()}
    graph.dialect.infer_shapes(graph)
    assert {n: graph.node(n).meta["shapes"] for n in graph} == expected


@pytest.mark.parametrize("name", ["mlp_adam", "conv_bn_dropout", "control_flow",
                                  "function_library", "clipped_custom_scope"])
def test_tf_shapes_asked_for_some_nodes_are_the_whole_graphs(monkeypatch, name):
    """Inference asked for a few nodes imports them and their data ancestors only
    (control inputs dropped) and records on the nodes asked for, alone, what the
    whole graph's gives (reading the others' shapes back was most of its cost)."""
    import graphpass
    from graphpass.analysis.shapes import infer_shapes
    from graphpass.dialects import tf_shapes as tf_dialect

    graph = graphpass.load(DATA / f"{name}.meta")
    whole = graphpass.load(DATA / f"{name}.meta", shapes=True)
    names = list(graph)
    asked = names[len(names) // 2::7]
    imported = []
    serialize = tf_dialect._serialized_graph_def
    monkeypatch.setattr(tf_dialect, "_serialized_graph_def", lambda graph, batch, only=None:
                        imported.append(only) or serialize(graph, batch, only))
    assert infer_shapes(graph, asked) and not infer_shapes(graph, asked)
    assert imported == [graph.ancestors(asked, follow_control=False) | set(asked)]
    recorded = {n for n in graph if "shapes" in graph.node(n).meta}
    assert recorded == set(asked)
    assert {n: graph.node(n).meta["shapes"] for n in recorded} == \
        {n: whole.node(n).meta["shapes"] for n in recorded}


@pytest.mark.parametrize("argv", [["inspect"], ["rewrite", "--recompute", "block[1-2]/",
                                                "--quiet"]])
def test_commands_that_show_no_estimate_infer_part_of_the_graph(monkeypatch, tmp_path,
                                                                 capsys, argv):
    """Loss detection reads its candidates' shapes and a rewrite's report the bytes
    its segments release: only those and what they are computed from are inferred."""
    from graphpass.cli import main
    from graphpass.dialects import tf_shapes as tf_dialect

    inferred = []
    record = tf_dialect.record_shapes
    monkeypatch.setattr(tf_dialect, "record_shapes", lambda graph, shapes, batch_size=None,
                        only=None: inferred.append((len(graph), only)) or
                        record(graph, shapes, batch_size, only))
    source = str(DATA / "mlp_adam.meta")
    extra = ["-o", str(tmp_path / "out.meta")] if argv[0] == "rewrite" else []
    assert main([argv[0], source, *extra, *argv[1:]]) == 0
    assert inferred and all(only is not None and len(only) < size for size, only in inferred)


def count_calls(monkeypatch, owner, name: str) -> list[int]:
    """Count calls of ``owner.name`` (the counter is a one-element list)."""
    counter = [0]
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return counter


def rewrite_counts(monkeypatch, tmp_path, source: Path, pattern: str) -> tuple[int, int]:
    """(whole-graph walks, shape inferences) of ``inspect`` then ``rewrite --recompute``
    (with ``--report``, so the memory estimates before and after the rewrite run)."""
    from graphpass.cli import main
    from graphpass.dialects import onnx as onnx_dialect
    from graphpass.dialects import tf_shapes as tf_dialect
    from graphpass.ir.graph import Graph

    walks = count_calls(monkeypatch, Graph, "_reach")
    inferences = count_calls(monkeypatch, onnx_dialect, "_infer_types")
    tf_inferences = count_calls(monkeypatch, tf_dialect, "_infer_shapes")
    assert main(["inspect", str(source)]) == 0
    out = tmp_path / f"out{source.suffix}"
    assert main(["rewrite", str(source), "-o", str(out), "--recompute", pattern,
                 "--dependency", "data", "--quiet", "--report",
                 str(tmp_path / "report.json")]) == 0
    monkeypatch.undo()
    return walks[0], inferences[0] + tf_inferences[0]


def test_onnx_walks_and_inferences_do_not_grow_with_the_graph(monkeypatch, tmp_path, capsys):
    """4 and 24 blocks (4 and 24 segments): the same number of ancestor/descendant
    walks and of shape inferences. A walk or an inference per candidate loss,
    segment or added node (as before) would make the counts grow."""
    from tools.fixtures import onnx_models

    counts = []
    for blocks in (4, 24):
        source = tmp_path / f"mlp{blocks}.onnx"
        source.write_bytes(onnx_models.block_mlp(blocks=blocks, check=False)
                           .model.SerializeToString())
        counts.append(rewrite_counts(monkeypatch, tmp_path, source, "block[0-9]+/"))
    assert counts[0] == counts[1]
    # inspect's and rewrite's before the segments: the nodes a pass builds carry their
    # types (the ties, the deferred updates' gate), so no estimate after re-infers
    assert counts[0][1] == 2


def test_tf_walks_and_inferences_do_not_grow_with_the_graph(monkeypatch, tmp_path, capsys):
    from tools.fixtures import tf_models

    counts = []
    for blocks in (3, 12):
        source = tmp_path / f"mlp{blocks}.meta"
        source.write_bytes(tf_models.block_mlp(blocks=blocks).meta_graph.SerializeToString())
        counts.append(rewrite_counts(monkeypatch, tmp_path, source, "block[0-9]+/"))
    assert counts[0] == counts[1]


def test_tf_source_is_used_only_while_the_graph_is_as_read():
    """Shape inference may serialize the GraphDef a graph was read from only while
    the graph is unchanged: an added node or an attr set through the dialect
    drops it (the lowered IR is inferred then), and copies start without it."""
    import graphpass

    graph = graphpass.load(DATA / "mlp_adam.meta")
    assert graph.source() is not None and graph.copy().source() is None
    x = next(n for n in graph if graph.node(n).op == "Placeholder")
    graph.dialect.set_attr(graph, x, "_recompute_hint", 0)
    assert graph.source() is None
    graph = graphpass.load(DATA / "mlp_adam.meta")
    graph.add_node("extra", "NoOp")
    assert graph.source() is None


def test_a_quiet_rewrite_infers_no_segment_shapes(monkeypatch):
    """The bytes a segment releases are sized only where a summary or report shows
    them: a rewrite that estimates nothing (``--quiet`` without ``--report``) never
    asks for its segments' shapes, and its report leaves the bytes unknown."""
    import graphpass
    from graphpass.analysis import shapes
    from graphpass.ir.graph import parse_tensor_name
    from graphpass.options import pipeline_options
    from graphpass.passes import PassContext, Pipeline, build_passes
    from graphpass.passes.remat import rewrite

    asked = []
    infer = shapes.infer_shapes
    monkeypatch.setattr(rewrite, "infer_shapes", lambda graph, nodes=None:
                        asked.append(set(nodes)) or infer(graph, nodes))
    options = pipeline_options({"recompute": ["block[1-2]/"]})
    graph = graphpass.load(DATA / "mlp_adam.meta")
    (result,) = Pipeline(build_passes(options)).run(
        graph, PassContext.from_options(options, estimates=False))
    segments = result.report["segments"]
    assert segments and all(s["copied"] and s["released_bytes"] is None for s in segments)
    assert result.report["released_bytes"] is None and asked == []
    graph = graphpass.load(DATA / "mlp_adam.meta")
    (result,) = Pipeline(build_passes(options)).run(graph, PassContext.from_options(options))
    released = {parse_tensor_name(t).node for s in result.report["segments"]
                for t in s["released"]}
    assert len(asked) == 1 and released <= asked[0]
    assert result.report["released_bytes"] > 0


def test_quiet_rewrite_estimates_only_for_a_report(monkeypatch, tmp_path, capsys):
    """``--quiet`` without ``--report`` shows no estimate, so none is computed; with
    ``--report`` the estimates run (before and after, under the planner's model and on
    the graph Grappler hands TF, and with the updates held to the step's end) and give
    the figures a shown summary gives."""
    from graphpass.analysis import buffers
    from graphpass.cli import main

    # Every estimate, whichever module named it, is one simulated step.
    estimates = count_calls(monkeypatch, buffers.Simulation, "run")
    source = str(DATA / "mlp_adam.meta")
    argv = ["rewrite", source, "-o", str(tmp_path / "out.meta"), "--recompute", "block[1-2]/"]
    assert main(argv + ["--quiet"]) == 0
    assert estimates[0] == 0
    assert main(argv + ["--quiet", "--report", str(tmp_path / "r.json")]) == 0
    assert estimates[0] == 5
    capsys.readouterr()
    assert main(argv) == 0
    shown = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())["passes"][0]["report"]
    before, after = (report[f"estimated_peak_bytes_{k}"] for k in ("before", "after"))
    assert before > after > 0
    assert f"estimated peak {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB" in shown


def test_names_tried_per_new_node_do_not_grow_with_the_graph(monkeypatch, tmp_path, capsys):
    """A rewrite of 4 and of 24 ONNX blocks tries as many names per name it hands out:
    the search for a free ``base_N`` starts where the last one for ``base`` ended (it
    tried every taken suffix each time, quadratic in a pass's same-named nodes)."""
    from graphpass.cli import main
    from graphpass.ir import graph as ir_graph
    from tools.fixtures import onnx_models

    tries = []
    for blocks in (4, 24):
        source = tmp_path / f"mlp{blocks}.onnx"
        source.write_bytes(onnx_models.block_mlp(blocks=blocks, check=False)
                           .model.SerializeToString())
        tried = count_calls(monkeypatch, ir_graph, "_suffixed")
        named = count_calls(monkeypatch, ir_graph.Graph, "unique_name")
        assert main(["rewrite", str(source), "-o", str(tmp_path / "out.onnx"),
                     "--recompute", "block[0-9]+/", "--quiet"]) == 0
        monkeypatch.undo()
        tries.append(tried[0] / named[0])
    assert tries[1] <= tries[0] * 1.1, tries
