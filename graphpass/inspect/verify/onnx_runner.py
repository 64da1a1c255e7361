"""``graphpass verify`` for ONNX: both models run in onnxruntime on the same inputs
and every output both models declare is compared (independent of the ONNX IR
reader, so a reader bug cannot hide in both sides). The original runs in two
sessions first; if they differ, it is not deterministic and the comparison stops."""

from __future__ import annotations

from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.inspect.progress import Progress
from graphpass.inspect.verify.compare import InputMaker, compare_step, first_difference
from graphpass.inspect.verify.report import VerifyOptions, VerifyReport
from graphpass.runtimes.ort_step import ORT_DTYPES

NOT_MEASURED = ("onnxruntime's arena keeps what the first run took, so an inference "
                "session's step is not measured here")


def verify_onnx(original: Path, rewritten: Path, options: VerifyOptions) -> VerifyReport:
    """Run both ONNX models in onnxruntime on the same inputs; compare every shared output.

    Peak memory is not measured here: onnxruntime has no allocator statistics,
    and its resident-set peak is only meaningful in a process of its own with
    the CPU arena off (as ``python -m tools.bench.onnx_remat`` runs it); the report
    says ``None`` and why (:data:`NOT_MEASURED`).
    """
    import onnxruntime as ort

    sessions = [_session(ort, p) for p in (original, original, rewritten)]
    outputs = [[o.name for o in s.get_outputs()] for s in sessions]
    common = [n for n in outputs[0] if n in outputs[2]]
    report = VerifyReport("onnx", common, sorted(set(outputs[0]) - set(common)),
                          sorted(set(outputs[2]) - set(common)),
                          memory_not_measured=NOT_MEASURED)
    specs = [{i.name: (ORT_DTYPES.get(i.type, i.type), _static(i.shape))
              for i in s.get_inputs()} for s in sessions]
    inputs = InputMaker(specs[0], options, specs[2])
    with Progress("verify step", total=options.steps, quiet=options.quiet) as progress:
        for step in range(1, options.steps + 1):
            progress.update(step, "running")
            feeds = inputs.next()
            results = [dict(zip(names, s.run(names, {i.name: feeds[i.name]
                                                     for i in s.get_inputs()})))
                       for s, names in zip(sessions, (outputs[0], outputs[0], common))]
            differs = first_difference({n: (results[0][n], results[1][n])
                                        for n in outputs[0]}, options)
            if differs is not None:
                report.nondeterministic = f"{differs} at step {step}"
                break
            values = {n: (results[0][n], results[2][n]) for n in common}
            report.steps.append(compare_step(step, values, ([], []), (None, None), options))
    return report


def _session(ort, path: Path):
    """An inference session of ``path``; a model onnxruntime refuses is one line."""
    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own Fail, InvalidGraph, NotImplemented...
        reason = next((line for line in str(exc).splitlines() if line.strip()),
                      type(exc).__name__)
        raise GraphpassError(f"onnxruntime cannot load {path}: {reason.strip()}") from None


def _static(shape) -> tuple | None:
    return tuple(d if isinstance(d, int) else None for d in shape) if shape is not None else None

