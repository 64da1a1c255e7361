"""``graphpass verify``: does the rewritten graph train exactly like the original?

A rewrite is only trustworthy if, step after step, it computes the same
losses and leaves every variable with the same value. This package runs both
graphs side by side and compares them after every step:

* ``tf_runner``: TF graphs, each in its own ``Session``, variables copied from
  the original, peak memory from each step's ``RunMetadata``;
* ``saved_model``: TF2 SavedModels whose training step is a signature;
* ``onnx_runner``: ONNX models in onnxruntime;
* ``ort_training_runner``: onnxruntime's training artifacts in its training API;
* ``compare``: the shared inputs and the comparison of values;
* ``report``: options, the per-step report and its printed table.
"""

from __future__ import annotations

import os
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.ort_artifacts import GRADIENTS, TRAINING, artifact_kind
from graphpass.inspect.verify.report import VerifyOptions, VerifyReport, format_report
from graphpass.installed import (
    require_onnx,
    require_onnxruntime,
    require_onnxruntime_training,
    require_tensorflow,
)

__all__ = ["VerifyOptions", "VerifyReport", "enable_cpu_autojit", "format_report",
           "verify_files"]

_CPU_JIT_FLAG = "--tf_xla_cpu_global_jit"


def verify_files(original: str | Path, rewritten: str | Path,
                 options: VerifyOptions) -> VerifyReport:
    """Run both models ``options.steps`` steps and compare them (TF or ONNX by content)."""
    from graphpass.formats.container import detect
    from graphpass.formats.files import ONNX, SAVEDMODEL

    if options.xla:
        enable_cpu_autojit()  # before anything imports TF (detect may)
    kind_a, _ = detect(Path(original))
    kind_b, _ = detect(Path(rewritten))
    if (kind_a == ONNX) != (kind_b == ONNX):
        raise GraphpassError(f"{original} is {kind_a} but {rewritten} is {kind_b}; "
                             "verify compares two models of the same format")
    if kind_a == ONNX:
        if options.xla:
            raise GraphpassError("--xla applies to TF graphs; ONNX models run in onnxruntime")
        from graphpass.analysis.step_location import load

        for path in (original, rewritten):  # the reader's checks, before onnxruntime's
            load(path)
        kinds = _artifact_kinds(Path(original), Path(rewritten))
        if len(set(kinds)) > 1:
            named = {TRAINING: "an onnxruntime training artifact",
                     GRADIENTS: "an onnxruntime gradient graph", None: "a plain ONNX model"}
            raise GraphpassError(f"{original} is {named.get(kinds[0], kinds[0])} but "
                                 f"{rewritten} is {named.get(kinds[1], kinds[1])}; verify "
                                 "compares two models of the same kind")
        kinds = set(kinds)
        if kinds == {TRAINING}:
            require_onnxruntime_training("verifying")
            from graphpass.inspect.verify.ort_training_runner import verify_ort_training

            checkpoint = Path(options.checkpoint) if options.checkpoint else None
            return verify_ort_training(Path(original), Path(rewritten), options, checkpoint)
        if GRADIENTS in kinds:  # run as inference sessions, with ORT's training kernels
            require_onnxruntime_training("verifying")
        require_onnxruntime("verifying")
        from graphpass.inspect.verify.onnx_runner import verify_onnx

        return verify_onnx(Path(original), Path(rewritten), options)
    require_tensorflow("verifying")
    if kind_a == kind_b == SAVEDMODEL:
        from graphpass.inspect.verify.saved_model import (
            training_signature,
            verify_saved_models,
        )

        key = training_signature(Path(original), options.signature, options.tag)
        if key is not None:
            return verify_saved_models(Path(original), Path(rewritten), key, options)
    from graphpass.analysis.step_location import load
    from graphpass.inspect.verify.tf_runner import verify_tf

    return verify_tf(load(original, tag=options.tag), load(rewritten, tag=options.tag),
                     options)


def _artifact_kinds(original: Path, rewritten: Path) -> list[str | None]:
    """Which of onnxruntime's training artifacts each ONNX file is (``ort_artifacts``)."""
    require_onnx("verifying")
    import onnx

    return [artifact_kind(onnx.load(str(p), load_external_data=False))
            for p in (original, rewritten)]


def enable_cpu_autojit() -> None:
    """XLA auto-clustering on CPU needs ``TF_XLA_FLAGS=--tf_xla_cpu_global_jit``.

    TF reads that flag once, when it first builds a session; the CLI calls this
    before TF is imported. On GPU ``global_jit_level`` alone is enough.
    """
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if _CPU_JIT_FLAG not in flags.split():
        os.environ["TF_XLA_FLAGS"] = f"{flags} {_CPU_JIT_FLAG}".strip()

