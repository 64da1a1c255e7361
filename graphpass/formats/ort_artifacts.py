"""ONNX Runtime's on-device training artifacts: which of the files
``onnxruntime.training.artifacts.generate_artifacts`` writes a model is.

* ``training_model.onnx``: the step. Forward, loss, backward, and each trainable
  parameter's gradient accumulated into a ``<param>_grad.accumulation.buffer``
  graph input by a ``com.microsoft`` ``InPlaceAccumulatorV2`` (its flag input
  ``lazy_reset_grad`` overwrites instead of adding). Parameters are graph inputs
  fed from the checkpoint; the first graph output is the loss.
* A step returning gradients: the same step before ``generate_artifacts`` adds the
  accumulators (``onnxblock``'s gradient graph), each gradient a graph output
  ``<param>_grad`` for the caller to apply; ORT's gradient builder names them so.
* ``eval_model.onnx``: the forward pass and the loss, no gradients.
* ``optimizer_model.onnx``: one optimizer node (``AdamWOptimizer``,
  ``SGDOptimizerV2``) over sequences of parameters, gradients and moments.

A leaf: names and a classification of a ``ModelProto`` by its ops and value
names, for the reader (``inspect`` says which artifact it read) and the ONNX
dialect (the step's structure, the one-line refusals). Imports nothing of
graphpass and never runs onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

MS_DOMAIN = "com.microsoft"
ACCUMULATOR_OP = "InPlaceAccumulatorV2"
#: ``InPlaceAccumulatorV2`` inputs: the buffer, the gradient, the overwrite flag.
ACCUMULATOR_BUFFER_SLOT, ACCUMULATOR_GRADIENT_SLOT = 0, 1
BUFFER_SUFFIX = "_grad.accumulation.buffer"
#: ORT's gradient builder names the gradient of value ``v`` ``v_grad``.
GRADIENT_SUFFIX = "_grad"
RESET_INPUT = "lazy_reset_grad"
OPTIMIZER_OPS = frozenset({"AdamWOptimizer", "SGDOptimizerV2", "AdamOptimizer",
                           "LambOptimizer", "SGDOptimizer"})
#: onnxblock names a loss block's output ``onnx::loss::N``.
LOSS_PREFIX = "onnx::loss::"

TRAINING, EVAL, OPTIMIZER = "training model", "eval model", "optimizer model"
GRADIENTS = "training model returning gradients"
FILES = {TRAINING: "training_model.onnx", EVAL: "eval_model.onnx",
         OPTIMIZER: "optimizer_model.onnx"}


def artifact_kind(model) -> str | None:
    """``TRAINING``, ``GRADIENTS``, ``EVAL``, ``OPTIMIZER`` or None (not one of ORT's
    artifacts)."""
    graph = model.graph
    ops = {(n.domain, n.op_type) for n in graph.node}
    if any(domain == MS_DOMAIN and op in OPTIMIZER_OPS for domain, op in ops):
        return OPTIMIZER
    if (MS_DOMAIN, ACCUMULATOR_OP) in ops or \
            any(i.name.endswith(BUFFER_SUFFIX) for i in graph.input):
        return TRAINING
    if gradient_outputs(model):
        return GRADIENTS
    if any(o.name.startswith(LOSS_PREFIX) for o in graph.output) and \
            not any(op.endswith("Grad") for _, op in ops):
        return EVAL
    return None


def gradient_outputs(model) -> dict[str, str]:
    """Graph output ``<param>_grad`` -> ``<param>``, for each graph input or
    initializer ``<param>`` (the gradients a step returns), in output order."""
    graph = model.graph
    sources = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    return {o.name: o.name.removesuffix(GRADIENT_SUFFIX) for o in graph.output
            if o.name.endswith(GRADIENT_SUFFIX)
            and o.name.removesuffix(GRADIENT_SUFFIX) in sources}


def describe(kind: str) -> str:
    """``onnxruntime training artifact: training model``."""
    return f"onnxruntime training artifact: {kind}"


def not_a_step(kind: str, source_dir: Path) -> str:
    """Why an eval or optimizer model has no step to rewrite, and which file to rewrite."""
    beside = Path(source_dir) / FILES[TRAINING]
    target = str(beside) if beside.exists() else f"the {FILES[TRAINING]} beside it"
    what = ("the forward pass and loss, without gradients" if kind == EVAL else
            "the optimizer's update, run after the step")
    return (f"this is onnxruntime's {FILES[kind]} ({what}), not the training step; "
            f"rewrite {target}, and keep this file as it is")
