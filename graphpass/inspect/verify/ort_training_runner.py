"""``graphpass verify`` for onnxruntime's on-device training artifacts: both
training models train through ``onnxruntime.training.api`` (``Module``,
``Optimizer``) from the same checkpoint with the same optimizer model and
batches, and after every step their losses, accumulated gradients and
parameters are compared.

The checkpoint, ``optimizer_model.onnx`` and ``eval_model.onnx`` are found beside
the original (``--checkpoint`` names another checkpoint). Each step's peak is
the rise of the process's resident set during it (``VmHWM`` reset before the
step), None where ``/proc`` cannot say. Runs nothing but onnxruntime-training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphpass.errors import GraphpassError
from graphpass.inspect.progress import Progress
from graphpass.inspect.verify.compare import InputMaker, compare_step
from graphpass.inspect.verify.report import VerifyOptions, VerifyReport

_NP_DTYPES = {1: "float32", 11: "float64", 10: "float16", 7: "int64", 6: "int32", 9: "bool"}


def verify_ort_training(original: Path, rewritten: Path, options: VerifyOptions,
                        checkpoint: Path | None = None) -> VerifyReport:
    """Train both training models ``options.steps`` steps; compare after each."""
    from onnxruntime.training import api

    directory = original.parent
    checkpoint = checkpoint or directory / "checkpoint"
    optimizer_model = directory / "optimizer_model.onnx"
    for needed, what in ((checkpoint, "checkpoint (give it with --checkpoint)"),
                         (optimizer_model, "optimizer model")):
        if not needed.exists():
            raise GraphpassError(f"{needed} not found: verifying a training artifact needs "
                                 f"the {what} beside {original}")
    eval_model = directory / "eval_model.onnx"
    runs = []
    for path in (original, rewritten):
        try:
            state = api.CheckpointState.load_checkpoint(str(checkpoint))
            module = api.Module(str(path), state,
                                str(eval_model) if eval_model.exists() else None)
            runs.append((state, module, api.Optimizer(str(optimizer_model), module)))
        except RuntimeError as exc:  # ORT's load errors: a model that does not fit
            reason = str(exc).strip().splitlines()[-1].rpartition(" was false. ")[2]
            raise GraphpassError(f"onnxruntime-training cannot train {path} from {checkpoint} "
                                 f"with {optimizer_model}: {reason}") from None
        module.train()
    names = [list(m.input_names()) for _, m, _ in runs]
    if names[0] != names[1]:
        raise GraphpassError(f"{rewritten} reads inputs {names[1]}, the original {names[0]}; "
                             "a rewritten training model keeps the original's inputs")
    report = VerifyReport("onnx training", ["loss", "gradients", "parameters"], [], [])
    inputs = InputMaker(_input_specs(original, names[0]), options)
    with Progress("verify step", total=options.steps, quiet=options.quiet) as progress:
        for step in range(1, options.steps + 1):
            progress.update(step, "running")
            feeds = inputs.next()
            results = [_step(state, module, optimizer, [feeds[n] for n in names[0]])
                       for state, module, optimizer in runs]
            values = {key: (results[0][key], results[1][key])
                      for key in ("loss", "gradients", "parameters")}
            report.steps.append(compare_step(
                step, values, ([results[0]["loss"]], [results[1]["loss"]]),
                (results[0]["peak"], results[1]["peak"]), options))
    return report


def _step(state, module, optimizer, feeds: list) -> dict:
    """One training step: loss, the accumulated gradients (the checkpoint's order),
    the updated parameters."""
    before = _status_kib("VmRSS")
    _reset_high_water_mark()
    loss = np.asarray(module(*feeds))
    peak = _status_kib("VmHWM")
    gradients = np.concatenate([np.ravel(parameter.grad) for _, parameter in
                                sorted(state.parameters) if parameter.requires_grad])
    optimizer.step()
    module.lazy_reset_grad()
    parameters = np.array(module.get_contiguous_parameters().numpy(), copy=True)
    return {"loss": loss, "gradients": gradients, "parameters": parameters,
            "peak": None if peak is None or before is None else (peak - before) * 1024}


def _input_specs(path: Path, names: list[str]) -> dict[str, tuple[str, tuple | None]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    specs = {}
    for value in model.graph.input:
        if value.name in names:
            tensor = value.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else None
                          for d in tensor.shape.dim) if tensor.HasField("shape") else None
            specs[value.name] = (_NP_DTYPES.get(tensor.elem_type, "float32"), shape)
    return specs


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass
