"""Scale: start-up imports nothing heavy, commands import only their format's
runtime, and the analyses do a bounded number of graph walks whatever the size
of the graph (the structural form of "linear": a walk per candidate would make
the count grow with the graph). Timings live in tools/bench_scale.py."""

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


def test_onnx_commands_never_import_tensorflow(tmp_path):
    source = str(DATA / "onnx_mlp.onnx")
    assert "tensorflow" not in imported_after(["inspect", source])
    modules = imported_after(["rewrite", source, "-o", str(tmp_path / "out.onnx"),
                              "--recompute", "block[1-2]/"])
    assert "tensorflow" not in modules and "onnx" in modules


def test_tf_commands_never_import_onnx(tmp_path):
    source = str(DATA / "mlp_adam.meta")
    modules = imported_after(["rewrite", source, "-o", str(tmp_path / "out.meta"),
                              "--recompute", "block[1-2]/"])
    assert "tensorflow" in modules
    assert "onnx" not in modules and "onnxruntime" not in modules


@pytest.mark.parametrize("name", ["mlp_adam", "conv_bn_dropout", "control_flow",
                                  "function_library", "clipped_custom_scope"])
def test_tf_shapes_are_the_python_importers(name):
    """The C-importer-only inference records what ``import_graph_def`` infers, for
    the whole graph and for the data subgraph of a few nodes."""
    import tensorflow as tf

    import graphpass
    from graphpass.dialects import tf as tf_dialect
    from graphpass.formats.tf_io import graph_def_from_graph

    graph = graphpass.load(DATA / f"{name}.meta")
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        tf.compat.v1.import_graph_def(graph_def_from_graph(graph), name="")
    expected = {op.name: [None if t.shape.rank is None else tuple(t.shape.as_list())
                          for t in op.outputs] for op in tf_graph.get_operations()}
    last = list(graph)[-len(graph) // 3:]
    graph.dialect.infer_shapes(graph, last)
    partial = {n: graph.node(n).meta["shapes"] for n in graph if "shapes" in graph.node(n).meta}
    assert set(last) <= set(partial) and len(partial) < len(graph)
    tf_dialect._infer_shapes(graph)
    assert {n: graph.node(n).meta["shapes"] for n in graph} == expected
    assert all(expected[n] == shapes for n, shapes in partial.items())
