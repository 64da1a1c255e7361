"""The runtime layer: one :class:`RuntimeModel` per runtime a graph is written
for (TF's executor, XLA, onnxruntime, TFLite), behind one protocol
(``base``). The analyses and passes ask the model the pipeline chose
(``PassContext.runtime``) and never a runtime's name; adding a runtime is a
model here and a row in :func:`runtime_model`.

Sits above the formats and dialects (a model reads format facts through the
``Dialect``) and below the analyses.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph
from graphpass.options import RuntimeConfig
from graphpass.runtimes.base import (
    ARENA,
    BEST_FIT,
    FREE_LIST,
    Difference,
    ExactnessCheck,
    Execution,
    RuntimeGraph,
    RuntimeModel,
)

__all__ = ["ARENA", "BEST_FIT", "FREE_LIST", "Difference", "ExactnessCheck", "Execution",
           "RuntimeGraph", "RuntimeModel", "runtime_for", "runtime_model"]


def runtime_model(format: str, target: str = "tf",
                  config: RuntimeConfig | None = None) -> RuntimeModel:
    """The model of the runtime that runs a ``format`` graph written for ``target``
    (``tf``, ``xla``, ``litert``; an ONNX graph is onnxruntime's whatever the
    target), under ``config`` (default: the documented ``RuntimeConfig()``)."""
    if format == "onnx":
        from graphpass.runtimes.ort import ORTModel

        return ORTModel(config)
    if target == "litert":
        from graphpass.runtimes.tflite import TFLiteModel

        return TFLiteModel(config)
    from graphpass.runtimes.tf_executor import TFExecutorModel, XLAModel

    return (XLAModel if target == "xla" else TFExecutorModel)(config)


def runtime_for(graph: Graph, target: str = "tf",
                config: RuntimeConfig | None = None) -> RuntimeModel:
    """:func:`runtime_model` for ``graph``'s format."""
    return runtime_model(graph.format, target, config)
