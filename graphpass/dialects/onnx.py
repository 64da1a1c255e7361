"""The ONNX dialect: ``ONNXDialect``, the ``Dialect`` protocol for ONNX graphs (as
read by ``graphpass.formats.onnx_io``), answered from the modules beside it:

* ``onnx_ops``: the op table (op kinds, dtype names, opsets); formats may read it;
* ``onnx_shapes``: dtypes, static shapes and constant values of tensors, from
  ``onnx.shape_inference`` run once over the whole model and recorded per node
  in ``node.meta["dtypes"]`` / ``node.meta["shapes"]``;
* ``onnx_builders``: the small ops passes insert, constants as initializers;
* ``onnx_attrs``: attributes, and the ``_``-keyed annotations (``_recompute_hint``)
  kept in the NodeProto's ``metadata_props``, since the checker refuses
  undeclared attributes on standard ops;
* ``onnx_step`` (the dialect's ``step``) and ``onnx_training``: the training
  structure. An ONNX training step returns each updated parameter and each
  piece of optimizer state as a graph output replacing the input or initializer
  it updates; they are found by what they read and write, in any update form and
  for the ``ai.onnx.preview.training`` ops. The loss needs no name rule (region
  analysis finds it).

ONNX has no control dependencies and no gradient-stopping op. The
``stop_gradient`` builder emits an ``Identity``: an exported ONNX graph already
holds its backward pass, so nothing differentiates it again and the identity
only marks intent (named by the caller).

This module decides nothing the modules above do not: it maps the protocol onto
them. It imports no analysis (dialects sit below the analyses); its ``step``
runs shape inference itself where the training structure needs shapes, and
caches that structure per graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphpass.dialects import onnx_builders as builders
from graphpass.dialects.base import Dialect
from graphpass.dialects.onnx_attrs import get_attr, set_attr
from graphpass.dialects.onnx_ops import (
    CHEAP_OPS,
    CONTROL_FLOW_OPS,
    CONV_OPS,
    DEFAULT_DOMAINS,
    MATMUL_OPS,
    PURE_MS_OPS,
    RANDOM_OPS,
    SHAPE_ONLY_OPS,
    dtype_enum,
    has_schema,
    opset,
)
from graphpass.dialects.onnx_shapes import batch_shape, constant_value, inferred, shape_source
from graphpass.dialects.onnx_shapes import infer_types as _infer_types
from graphpass.dialects.onnx_step import ONNXStep
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_order import SOURCE_OPS
from graphpass.formats.ort_artifacts import MS_DOMAIN
from graphpass.ir.graph import Graph, Tensor, parse_tensor_name

__all__ = ["DEFAULT_DOMAINS", "ONNXDialect", "dtype_enum"]


class ONNXDialect(Dialect):
    name = "onnx"
    op_classes = {"matmul": MATMUL_OPS, "conv": CONV_OPS, "cheap": CHEAP_OPS}
    allows_empty_input_slots = True
    dependency_modes = ("data",)

    def __init__(self) -> None:
        self.step = ONNXStep(self)

    # -- structure ---------------------------------------------------------

    def num_outputs(self, graph: Graph, name: str) -> int | None:
        return len(graph.node(name).outputs)

    def parse_tensor(self, graph: Graph, text: str) -> Tensor:
        """An ONNX tensor name first (what users see in Netron), then a node's name
        (names may hold ``:``: onnxruntime's ``onnx::SoftmaxCrossEntropyLoss::4``);
        else ``node[:port]``."""
        for node in graph.nodes():
            if text in node.outputs:
                return Tensor(node.name, node.outputs.index(text))
        return Tensor(text, 0) if text in graph else parse_tensor_name(text)

    def opset(self, graph: Graph, domain: str = "") -> int:
        """The opset version the model imports for ``domain`` (0 if none)."""
        return opset(graph, domain)

    # -- op kinds ----------------------------------------------------------

    def is_stateful(self, graph: Graph, name: str) -> bool:
        """Random ops (``Dropout`` only in training mode), control flow, and ops
        outside the ONNX schemas (custom domains: unknown, so assumed stateful) but
        onnxruntime's pure ones (``PURE_MS_OPS``)."""
        node = graph.node(name)
        if node.op in SOURCE_OPS or (node.domain == MS_DOMAIN and node.op in PURE_MS_OPS):
            return False
        if node.domain not in DEFAULT_DOMAINS + ("ai.onnx.ml",) or not has_schema(node):
            return True
        if node.op == "Dropout":
            return self._dropout_trains(graph, name)
        return node.op in RANDOM_OPS or node.op in CONTROL_FLOW_OPS

    def _dropout_trains(self, graph: Graph, name: str) -> bool:
        if self.opset(graph) < 7:  # is_test, default 0: training unless set
            return self.get_attr(graph, name, "is_test", 0) == 0
        mode = graph.input_slots(name).get(2)  # opset >= 12: training_mode input
        if mode is None:
            return False
        value = self.constant_value(graph, mode)
        return value is None or bool(value)

    def is_source(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        return node.op in SOURCE_OPS or (node.op == "Constant" and node.domain in DEFAULT_DOMAINS)

    def is_shape_only(self, graph: Graph, name: str) -> bool:
        return graph.node(name).op in SHAPE_ONLY_OPS

    def is_variable(self, graph: Graph, name: str) -> bool:
        """An input or initializer that the step updates: a trained parameter or
        optimizer state; frozen weights of an inference model are constants."""
        return graph.node(name).op in SOURCE_OPS and name in self.step.updates(graph).variables

    # -- tensors (onnx_shapes) -------------------------------------------------

    def dtype(self, graph: Graph, tensor: Tensor) -> str | None:
        return inferred(graph, tensor, "dtypes")

    def infer_shapes(self, graph: Graph, nodes: list[str] | None = None) -> None:
        """ONNX shape inference, once over the model whatever ``nodes`` asks for
        (it takes a model, not a subgraph): dtypes and shapes (None for symbolic
        dims) of every node's outputs."""
        _infer_types(graph)

    def batch_shape(self, graph: Graph, tensor: Tensor, batch_size: int) -> tuple | None:
        """The shape with the inputs' unknown batch dimension set to ``batch_size``,
        wherever it lands (``onnx_shapes.batch_shape``: inference run again)."""
        return batch_shape(graph, tensor, batch_size)

    def constant_value(self, graph: Graph, tensor: Tensor) -> Any:
        """The numpy value of an initializer or ``Constant`` output, else None."""
        return constant_value(graph, tensor)

    def shape_source(self, graph: Graph) -> str | None:
        """onnxruntime's symbolic shape inference, or ORT's conventions alone and why
        (``onnx_contrib_shapes``)."""
        return shape_source(graph)

    # -- attributes (onnx_attrs) -----------------------------------------------

    def get_attr(self, graph: Graph, name: str, key: str, default: Any = None) -> Any:
        """The attribute as a Python value (see ``onnx_attrs.get_attr``); ``_``-keys
        are annotations in ``metadata_props``."""
        return get_attr(graph, name, key, default)

    def set_attr(self, graph: Graph, name: str, key: str, value: Any) -> None:
        """An op attribute; an ``_``-key annotation goes to ``metadata_props`` as ``str(value)``."""
        set_attr(graph, name, key, value)

    # -- builders (onnx_builders) ----------------------------------------------

    def copy_node(self, graph: Graph, name: str, new_name: str) -> str:
        """Same op, domain, attrs and extras, fresh output names (``onnx_builders``)."""
        return builders.copy_node(graph, name, new_name)

    def constant(self, graph: Graph, name: str, value: Any, dtype: str) -> Tensor:
        """A new initializer (plus a graph input when IR < 4 requires one)."""
        return builders.constant(graph, name, value, dtype)

    def identity(self, graph: Graph, name: str, tensor: Tensor,
                 control_inputs: Sequence[str] = ()) -> Tensor:
        """An ``Identity``; refuses control inputs, which ONNX cannot express."""
        if control_inputs:
            raise GraphpassError(
                f"cannot order {name!r} after {list(control_inputs)[:3]}: ONNX has no control "
                "dependencies; use data-dependency mode"
            )
        return builders.op(graph, name, "Identity", [tensor])

    def scalar(self, graph: Graph, name: str, value: float, dtype: str) -> Tensor:
        return builders.constant(graph, name, value, dtype)

    def first_element(self, graph: Graph, name: str, tensor: Tensor) -> Tensor:
        """``Reshape(x, [-1])``, ``Slice [0:1]``, ``Reshape(., [])``, in the model's opset."""
        return builders.first_element(graph, name, tensor)

    def add_n(self, graph: Graph, name: str, tensors: list[Tensor]) -> Tensor:
        if len(tensors) == 1:
            return tensors[0]
        return builders.op(graph, name, "Sum", list(tensors))

    def cast(self, graph: Graph, name: str, tensor: Tensor, dtype: str) -> Tensor:
        return builders.cast(graph, name, tensor, dtype)

    def binary(self, graph: Graph, name: str, op: str, a: Tensor, b: Tensor) -> Tensor:
        onnx_op = {"add": "Add", "sub": "Sub", "mul": "Mul"}[op]
        return builders.op(graph, name, onnx_op, [a, b])

    def stop_gradient(self, graph: Graph, name: str, tensor: Tensor) -> Tensor:
        """An ``Identity``: ONNX has no StopGradient, and its backward is already built."""
        return builders.op(graph, name, "Identity", [tensor])
