"""What an ONNX file carries besides the graph's nodes, typed: the ModelProto's
skeleton (opsets, functions, metadata, ...), the graph's inputs, outputs and
value_info, the initializers, and where external data is found.

The reader fills an :class:`ONNXState` (``Graph.format_state``) and the writer
re-emits from it; the dialect reads and extends it (an initializer a builder
adds). It must not hold anything an analysis computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphpass.formats import ort_artifacts


@dataclass
class ONNXState:
    """An ONNX model's data outside the nodes."""

    model: Any = None  # the ModelProto without nodes, initializers, inputs, outputs, value_info
    inputs: list = field(default_factory=list)  # ValueInfoProto, in the file's order
    outputs: list = field(default_factory=list)
    value_info: list = field(default_factory=list)
    initializers: dict[str, Any] = field(default_factory=dict)  # name -> TensorProto
    sparse_initializers: dict[str, Any] = field(default_factory=dict)
    source_dir: Path = Path(".")  # where relative external-data locations point
    #: Which onnxruntime training artifact the model is (``ort_artifacts``), if one.
    artifact: str | None = None
    #: The external-data locations of the model as read (its data files are
    #: inputs: a write beside them never removes one).
    source_locations: tuple[str, ...] = ()

    def copy(self) -> ONNXState:
        """Independent containers (a builder may add to them), shared protos."""
        return ONNXState(self.model, list(self.inputs), list(self.outputs),
                         list(self.value_info), dict(self.initializers),
                         dict(self.sparse_initializers), self.source_dir, self.artifact,
                         self.source_locations)

    def provenance(self) -> frozenset[str]:
        """Fields that say where the graph came from, not what it is (``diff``)."""
        return frozenset({"source_dir", "source_locations"})

    def describe(self) -> dict:
        """What ``inspect`` says of the container."""
        if self.artifact is None:
            return {"container": "onnx"}
        return {"container": f"onnx, {ort_artifacts.describe(self.artifact)}"}

    def variable_of(self, argument: str) -> str | None:
        """ONNX steps have no functions between their variables and their body."""
        return None
