"""``graphpass verify``'s memory columns tell the truth: a step is measured from what
sees all of its buffers (TF: its allocation records, for a SavedModel's signature
too, where the CPU allocator's statistics leave buffers under 256 KiB out), or it
is "not measured", never "0 B"; medians and the ratio need every step measured.
onnxruntime's training steps: ``tests/test_verify_ort_training.py``."""

from __future__ import annotations

import json

from graphpass.cli import main
from graphpass.inspect.verify import VerifyOptions, VerifyReport, format_report
from graphpass.inspect.verify.report import StepReport


def _small_train_signature(path):
    """A TF2 SavedModel whose ``train`` signature updates a 4x4 weight: every
    buffer of its step is far under the allocator's 256 KiB."""
    from tools.fixtures import keras3_models

    tf, _ = keras3_models._keras()

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones([4, 4]))

        @tf.function(input_signature=[tf.TensorSpec([8, 4], tf.float32, name="x")])
        def train(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ self.w) ** 2)
            self.w.assign_sub(0.1 * tape.gradient(loss, self.w))
            return {"loss": loss}

    module = Module()
    tf.saved_model.save(module, str(path), signatures={"train": module.train})
    return tf, path


def test_a_small_train_signature_is_measured_from_its_allocation_records(tmp_path, capsys):
    tf, path = _small_train_signature(tmp_path / "saved")
    try:
        assert main(["verify", str(path), str(path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert main(["verify", str(path), str(path), "--steps", "1"]) == 0
        out = capsys.readouterr().out
    finally:
        tf.compat.v1.disable_eager_execution()  # later TF1 tests expect graph mode
    peaks = [p for step in report["steps"] for p in step["peak_bytes"]]
    assert len(peaks) == 6 and all(p and p > 0 for p in peaks), peaks
    assert report["median_peak_bytes"][0] == report["median_peak_bytes"][1] > 0
    assert report["memory"].startswith("allocation records")
    assert report["memory_not_measured"] is None
    assert " 0 B" not in out and "peak memory measured from: allocation records" in out


def _report(peaks: list[tuple], memory: str | None, why: str | None) -> VerifyReport:
    report = VerifyReport("onnx training", ["output loss"], [], [], memory=memory,
                          memory_not_measured=why)
    report.steps = [StepReport(i + 1, ([1.0], [1.0]), 0.0, 0.0, "-", pair)
                    for i, pair in enumerate(peaks)]
    return report


def test_steps_not_measured_print_so_and_give_no_median_or_ratio():
    report = _report([(None, None)] * 3, "the resident set", "too small to resolve")
    text = format_report(report, "a", "b", VerifyOptions())
    rows = [line for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert all(row.count("not measured") == 2 for row in rows), text
    assert "0 B" not in text and "(ratio" not in text and "median" not in text
    assert "peak memory not measured: too small to resolve" in text
    assert report.median_peaks() == (None, None)
    data = report.to_json()
    assert data["median_peak_bytes"] == [None, None]
    assert data["memory_not_measured"] == "too small to resolve"


def test_a_graph_with_one_step_not_measured_has_no_median():
    """A median over the steps that were measured would compare different steps."""
    report = _report([(2 << 20, 2 << 20), (None, 2 << 20), (2 << 20, 2 << 20)],
                     "the resident set", "step 2 too small")
    assert report.median_peaks() == (None, 2 << 20)
    text = format_report(report, "a", "b", VerifyOptions())
    assert "(ratio" not in text and "no median or ratio, not every step was measured" in text
    measured = _report([(2 << 20, 1 << 20)] * 3, "the resident set", None)
    text = format_report(measured, "a", "b", VerifyOptions())
    assert "original 2.0 MiB, rewritten 1.0 MiB (ratio 0.50)" in text
    assert "peak memory measured from: the resident set" in text
    assert "not measured" not in text
