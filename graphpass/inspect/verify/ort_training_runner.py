"""``graphpass verify`` for onnxruntime's on-device training artifacts: the training
models train through ``onnxruntime.training.api`` (``Module``, ``Optimizer``) from
the same checkpoint with the same optimizer model and batches, the original
twice, and after every step their outputs (the loss, then any
``additional_output_names``), each parameter's accumulated gradient and each
parameter are compared.

As for TF, each step runs the original twice first: if the two runs differ, the
original is not deterministic and the comparison stops there.

The checkpoint and ``optimizer_model.onnx`` are found beside the original
(``--checkpoint`` names another checkpoint). ``eval_model.onnx`` is never
loaded: verify runs training steps only, and ORT writes eval models it cannot
load itself (a training-mode ``BatchNormalization``). Each step's peak memory is
measured afterwards in a process of its own per model (``ort_memory``).
Runs nothing but onnxruntime-training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphpass.errors import GraphpassError
from graphpass.inspect.progress import Progress
from graphpass.inspect.verify import ort_memory
from graphpass.inspect.verify.compare import InputMaker, compare_step, first_difference
from graphpass.inspect.verify.report import VerifyOptions, VerifyReport

_NP_DTYPES = {1: "float32", 11: "float64", 10: "float16", 7: "int64", 6: "int32", 9: "bool"}


def verify_ort_training(original: Path, rewritten: Path, options: VerifyOptions,
                        checkpoint: Path | None = None) -> VerifyReport:
    """Train both training models ``options.steps`` steps; compare after each."""
    artifacts = ort_memory.Artifacts(checkpoint or original.parent / "checkpoint",
                                     original.parent / "optimizer_model.onnx")
    for needed, what in ((artifacts.checkpoint, "checkpoint (give it with --checkpoint)"),
                         (artifacts.optimizer, "optimizer model")):
        if not needed.exists():
            raise GraphpassError(f"{needed} not found: verifying a training artifact needs "
                                 f"the {what} beside {original}")
    a, again, b = (_Run(path, artifacts) for path in (original, original, rewritten))
    if a.inputs != b.inputs:
        raise GraphpassError(f"{rewritten} reads inputs {b.inputs}, the original {a.inputs}; "
                             "a rewritten training model keeps the original's inputs")
    common = [n for n in a.outputs if n in b.outputs]
    if not common or common[0] != a.outputs[0] or b.outputs[0] != a.outputs[0]:
        raise GraphpassError(f"{rewritten}'s first output (its loss) is {b.outputs[0]}, the "
                             f"original's {a.outputs[0]}; a rewritten training model keeps "
                             "the original's outputs")
    report = VerifyReport("onnx training", [_output_key(n) for n in common] + a.parameter_keys(),
                          [_output_key(n) for n in a.outputs if n not in common],
                          [_output_key(n) for n in b.outputs if n not in common])
    inputs = InputMaker(_input_specs(original, a.inputs), options)
    batches = []
    with Progress("verify step", total=options.steps, quiet=options.quiet) as progress:
        for step in range(1, options.steps + 1):
            progress.update(step, "running")
            feeds = inputs.next()
            batch = [feeds[n] for n in a.inputs]
            values_a, values_again = a.step(batch, step), again.step(batch, step)
            differs = first_difference({k: (v, values_again[k]) for k, v in values_a.items()},
                                       options)
            if differs is not None:
                report.nondeterministic = f"{differs} at step {step}"
                break
            values_b = b.step(batch, step)
            loss = _output_key(a.outputs[0])
            report.steps.append(compare_step(
                step, {k: (v, values_b.get(k)) for k, v in values_a.items()},
                ([np.ravel(values_a[loss])[0]], [np.ravel(values_b[loss])[0]]),
                (None, None), options))
            batches.append(batch)
    if batches:
        ort_memory.fill_peaks(report, (original, rewritten), artifacts, batches)
    return report


def _output_key(name: str) -> str:
    return f"output {name}"


class _Run:
    """One training model with its own checkpoint state, module and optimizer."""

    def __init__(self, path: Path, artifacts: ort_memory.Artifacts) -> None:
        from onnxruntime.training import api

        self.path = path
        try:
            self.state = api.CheckpointState.load_checkpoint(str(artifacts.checkpoint))
            self.module = api.Module(str(path), self.state, None)
            self.optimizer = api.Optimizer(str(artifacts.optimizer), self.module)
        except RuntimeError as exc:  # ORT's load errors: a model that does not fit
            raise GraphpassError(f"onnxruntime-training cannot train {path} from "
                                 f"{artifacts.checkpoint} with {artifacts.optimizer}: "
                                 f"{ort_memory.ort_reason(exc)}") from None
        self.module.train()
        self.inputs = list(self.module.input_names())
        self.outputs = list(self.module.output_names())

    def parameter_keys(self) -> list[str]:
        parameters = sorted(self.state.parameters)
        return [f"gradient {name}" for name, p in parameters if p.requires_grad] + \
            [f"parameter {name}" for name, _ in parameters]

    def step(self, batch: list, step: int) -> dict[str, np.ndarray]:
        """One training step: the outputs, each accumulated gradient (before the
        optimizer), each parameter (after it)."""
        try:
            outputs = self.module(*batch)
        except RuntimeError as exc:
            raise GraphpassError(f"{self.path} failed at step {step}: "
                                 f"{ort_memory.ort_reason(exc)}") from None
        # A Module returns a lone array for one output, a tuple for more
        # (``additional_output_names``).
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        values = {_output_key(n): np.asarray(v) for n, v in zip(self.outputs, outputs)}
        parameters = sorted(self.state.parameters)
        values.update({f"gradient {name}": np.array(p.grad, copy=True)
                       for name, p in parameters if p.requires_grad})
        self.optimizer.step()
        self.module.lazy_reset_grad()
        values.update({f"parameter {name}": np.array(p.data, copy=True)
                       for name, p in parameters})
        return values


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
