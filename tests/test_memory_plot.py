"""The memory plot: live bytes along the step, original vs rewritten, for TF and ONNX.

The SVG keeps its text as text, so the tests read the labels back: each line's
peak with the value the remat report estimated and the op where it happens,
the shaded backward pass, and (from verify) the measured peaks. Same input,
same bytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import onnx
import pytest

import graphpass
from graphpass.analysis.memory import format_bytes, memory_profile
from graphpass.analysis.regions import analyze
from graphpass.analysis.runtime_memory import follow_runtime_order, runtime_view
from graphpass.cli import main
from tools.fixtures import onnx_models, tf_models

SVG = "{http://www.w3.org/2000/svg}"


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, err.getvalue()


def _texts(svg: Path) -> list[str]:
    """Every text element of the SVG, as drawn."""
    return ["".join(t.itertext()).strip() for t in ET.parse(svg).iter(f"{SVG}text")]


def _peak(graph_path: Path) -> tuple[str, int]:
    """``(node, bytes)`` of the first highest point of the step's estimate, in the
    order of the graph the runtime runs (as the plot and the remat pass take it)."""
    graph = graphpass.load(graph_path)
    fetches = analyze(graph).fetches
    runtime = follow_runtime_order(graph, runtime_view(graph, fetches))
    timeline = memory_profile(graph, fetches, runtime=runtime).timeline
    peak = max(live for _, live in timeline)
    return next(name for name, live in timeline if live == peak), peak


@pytest.fixture(scope="module", params=["tf", "onnx"])
def rewritten(request, tmp_path_factory):
    """``(original, rewritten, dump dir, remat report)`` of a block MLP in each format."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "tf":
        source = root / "step.pb"
        model = tf_models.block_mlp(batch=64, width=64, blocks=4, optimizer="sgd")
        source.write_bytes(model.graph_def.SerializeToString())
    else:
        source = root / "step.onnx"
        onnx.save(onnx_models.block_mlp(batch=64, width=64).model, source)
    target, dumps = root / f"out{source.suffix}", root / "dumps"
    status, err = _cli("rewrite", source, "-o", target, "--recompute", "block[1-3]/",
                       "--dump-dir", dumps, "--report", root / "report.json", "--quiet")
    assert status == 0, err
    report = json.loads((root / "report.json").read_text())["passes"][0]["report"]
    return source, target, dumps, report


def test_dump_plot_marks_both_peaks_with_value_and_op(rewritten):
    source, target, dumps, report = rewritten
    index = json.loads((dumps / "index.json").read_text())
    assert index["memory_plot"] == "memory.svg"
    texts = _texts(dumps / "memory.svg")
    before, after = report["estimated_peak_bytes_before"], report["estimated_peak_bytes_after"]
    assert after < before  # the rewrite saved something: two different peaks to mark
    for label, path, peak in (("original", source, before), ("rewritten", target, after)):
        node, value = _peak(path)
        assert value == peak
        assert f"{label} peak {format_bytes(peak)} at {node}" in texts
    assert "backward pass (original)" in texts


def test_plot_is_byte_identical_from_run_to_run(rewritten, tmp_path):
    source, target, dumps, _ = rewritten
    plots = [tmp_path / "a.svg", tmp_path / "b.svg"]
    for plot in plots:
        status, err = _cli("inspect", source, "--rewritten", target, "--memory-plot", plot)
        assert status == 0, err
    assert plots[0].read_bytes() == plots[1].read_bytes()
    status, err = _cli("rewrite", source, "-o", tmp_path / f"again{source.suffix}",
                       "--recompute", "block[1-3]/", "--dump-dir", tmp_path / "dumps", "--quiet")
    assert status == 0, err
    assert (tmp_path / "dumps" / "memory.svg").read_bytes() == (dumps / "memory.svg").read_bytes()


def test_verify_plot_shows_measured_peaks_beside_the_estimates(rewritten, tmp_path):
    source, target, _, report = rewritten
    plot = tmp_path / "verify.svg"
    status, err = _cli("verify", source, target, "--steps", "2", "--memory-plot", plot, "--json")
    assert status == 0, err
    texts = _texts(plot)
    assert f"original peak {format_bytes(report['estimated_peak_bytes_before'])} at " \
        f"{_peak(source)[0]}" in " ".join(texts)
    measured = [t for t in texts if "measured peak" in t]
    # TF measures the allocator's peak; onnxruntime has no allocator statistics.
    assert len(measured) == (2 if source.suffix == ".pb" else 0)


def test_plot_draws_the_original_as_its_worse_processes_run_it(tmp_path):
    """Weights that outweigh the activations: the original's estimate is its step
    with every update held to the end (``test_pin``). The plot draws that schedule
    beside the other, labelled with the peak the summary gives; the pinned rewrite
    has no such mode."""
    model = tf_models.block_mlp(batch=2, width=128, blocks=4, optimizer="adam")
    source, target = tmp_path / "step.pb", tmp_path / "out.pb"
    source.write_bytes(model.graph_def.SerializeToString())
    status, err = _cli("rewrite", source, "-o", target, "--recompute", "auto", "--dump-dir",
                       tmp_path / "dumps", "--report", tmp_path / "report.json", "--quiet")
    assert status == 0, err
    report = json.loads((tmp_path / "report.json").read_text())["passes"][0]["report"]
    held = report["estimated_peak_bytes_updates_held"]
    assert report["estimated_peak_bytes_before"] == held
    texts = _texts(tmp_path / "dumps" / "memory.svg")
    assert "original, every update held to the end of the step (TF's executor in some " \
        f"processes): peak {format_bytes(held)}" in texts
    assert not any(t.startswith("rewritten, every update held") for t in texts)


def test_memory_plot_of_a_graph_without_a_training_step_is_a_user_error(tmp_path):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.placeholder(tf.float32, [2], name="x")
    source = tmp_path / "plain.pb"
    source.write_bytes(graph.as_graph_def().SerializeToString())
    status, err = _cli("inspect", source, "--memory-plot", tmp_path / "m.svg")
    assert status == 2 and err.startswith("graphpass: error: no memory plot")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.svg").exists()
