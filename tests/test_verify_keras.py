"""``graphpass verify`` without ``--feed`` on graphs built with tf_keras (graph mode,
MetaGraphDef): only the placeholders the training step reads get values, and a
dynamic batch dimension comes from ``--batch-size`` or the other inputs."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

import graphpass
from graphpass.analysis.memory import estimated_peak_bytes, format_bytes
from graphpass.analysis.regions import analyze
from graphpass.analysis.runtime_memory import follow_runtime_order, runtime_view
from graphpass.cli import main
from tools.fixtures import keras_models


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def _rewrite(model, root: Path, pattern: str) -> tuple[Path, Path]:
    """The exported model and its remat rewrite (which must change something)."""
    source, target = root / "step.meta", root / "remat.meta"
    source.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    status, out, err = _cli("rewrite", source, "-o", target, "--recompute", pattern)
    assert status == 0 and "remat: changed" in out, err
    return source, target


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    model = keras_models.mobilenet_v2(size=32, batch=4)
    return _rewrite(model, tmp_path_factory.mktemp("mobilenet"),
                    r"mobilenetv2_1\.00_32/block_[1-6]_")


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    model = keras_models.resnet50(size=32, batch=2)
    return _rewrite(model, tmp_path_factory.mktemp("resnet50"), r"resnet50/conv[23]_")


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    model = keras_models.transformer(size=16, batch=4, dynamic_batch=True, layers=2, width=32)
    return _rewrite(model, tmp_path_factory.mktemp("transformer"), "encoder/(mha|ln1|mlp)1")


@pytest.mark.slow
def test_keras_input_placeholder_the_step_never_reads_needs_no_feed(mobilenet):
    source, target = mobilenet
    graph = graphpass.load(source)
    # Keras's own input beside the user's: a dynamic batch nobody could guess.
    [keras_input] = [n for n in graph.dialect.step.graph_inputs(graph)
                     if n not in ("images", "labels") and graph.node(n).op == "Placeholder"]
    assert graph.node(keras_input).attrs["shape"].shape.dim[0].size == -1
    status, out, err = _cli("verify", source, target, "--steps", "1")
    assert status == 0, err
    assert out.strip().endswith("MATCH")


@pytest.mark.slow
def test_resnet50_verifies_without_feeds(resnet):
    source, target = resnet
    status, out, err = _cli("verify", source, target, "--steps", "2")
    assert status == 0, err
    assert out.strip().endswith("MATCH")


def test_dynamic_batch_without_a_source_names_the_inputs_and_the_fix(transformer):
    source, target = transformer
    status, _, err = _cli("verify", source, target, "--steps", "1")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "labels:0 (?)" in err and "tokens:0 (?, 16)" in err and "--batch-size" in err
    assert "model_tokens" not in err  # Keras's own input: the step never reads it


def test_dynamic_batch_from_batch_size(transformer, tmp_path):
    source, target = transformer
    plot = tmp_path / "memory.svg"
    status, out, err = _cli("verify", source, target, "--steps", "2", "--batch-size", "4",
                            "--memory-plot", plot)
    assert status == 0, err
    assert out.strip().endswith("MATCH")
    # The plot's estimate sizes the batch-dependent tensors with --batch-size too
    # (in the order of the graph TF runs, as the plot takes it).
    graph = graphpass.load(source)
    fetches = analyze(graph).fetches
    runtime = follow_runtime_order(graph, runtime_view(graph, fetches))
    batched = estimated_peak_bytes(graph, fetches, 4, runtime=runtime)
    assert batched > estimated_peak_bytes(graph, fetches, runtime=runtime)
    assert f"original peak {format_bytes(batched)} at " \
        in plot.read_text()


def test_dynamic_batch_from_the_other_inputs(transformer, tmp_path):
    source, target = transformer
    labels = tmp_path / "labels.npy"
    np.save(labels, np.arange(3, dtype=np.int32))
    status, out, err = _cli("verify", source, target, "--steps", "1", "--feed",
                            f"labels={labels}", "--json")
    assert status == 0, err
    assert '"ok": true' in out
