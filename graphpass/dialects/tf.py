"""The TensorFlow dialect: what passes and analyses ask of a TF graph's ops (op
kinds, dtypes, shapes), answered from TF's own op registry (``tf_ops``) and its
shape inference (``tf_shapes``). The training step's structure (the
optimizer-update recognisers of ``tf_updates``) is its ``step`` (``tf_step``).
What TF's runtime does with the graph is the runtime models'
(``graphpass.runtimes``).

The builders and the stale pass's conditionals are a mixin (``tf_builders``);
XLA support is ``tf_xla``. This module answers questions; it reads no file.
"""

from __future__ import annotations

from typing import Any

from graphpass.dialects import (
    tf_loops,
    tf_loops_v1,
    tf_shapes,
    tf_xla,
)
from graphpass.dialects.base import Dialect, LoopFacts
from graphpass.dialects.capabilities import ConditionalBuilder, TargetLowering
from graphpass.dialects.tf_builders import TFBuilders
from graphpass.dialects.tf_ops import (
    CHEAP_OPS,
    CONV_FILTER_GRAD_OPS,
    CONV_FORWARD_OPS,
    CONV_INPUT_GRAD_OPS,
    LOOP_BACK_OPS,
    MATMUL_OPS,
    REF_VARIABLE_OPS,
    SHAPE_ONLY_OPS,
    SOURCE_OPS,
    VARIABLE_OPS,
    attr_value,
    dtype_name,
    op_def,
    output_args,
    output_count,
    required_count,
)
from graphpass.dialects.tf_step import TFStep
from graphpass.ir.graph import Graph, Tensor


class TFDialect(TFBuilders, Dialect, ConditionalBuilder, TargetLowering):
    name = "tf"
    dependency_modes = ("control", "data")
    op_classes = {"matmul": MATMUL_OPS,
                  "conv": CONV_FORWARD_OPS | CONV_INPUT_GRAD_OPS | CONV_FILTER_GRAD_OPS,
                  "cheap": CHEAP_OPS}

    def __init__(self) -> None:
        self.step = TFStep(self)

    # -- structure ---------------------------------------------------------

    def is_back_edge(self, graph: Graph, src: str, dst: str) -> bool:
        return graph.node(src).op in LOOP_BACK_OPS

    def loop_facts(self, graph: Graph, name: str, batch_size: int | None = None,
                   loop_trips: int | None = None) -> LoopFacts | None:
        """Control flow v2 ``While`` loops (``tf_loops``) and v1 loops by their
        ``LoopCond`` (``tf_loops_v1``), recorded on the node per batch size and trip
        count given (a body's import and a constant evaluation cost more than a
        step's walk)."""
        op = graph.node(name).op
        if op not in tf_loops.WHILE_OPS and op != "LoopCond":
            return None
        known = graph.node(name).meta.setdefault("loop_facts", {})
        if (batch_size, loop_trips) not in known:
            find = tf_loops.loop_facts if op != "LoopCond" else tf_loops_v1.loop_facts
            known[batch_size, loop_trips] = find(graph, name, batch_size, loop_trips)
        return known[batch_size, loop_trips]

    def num_outputs(self, graph: Graph, name: str) -> int | None:
        """From the OpDef and the node's count attrs, else ``_output_shapes``."""
        node = graph.node(name)
        counted = output_count(node.op, node.attrs)
        if counted is not None:
            return counted
        shapes = node.attrs.get("_output_shapes")
        return len(shapes.list.shape) if shapes is not None else None

    # -- op kinds ----------------------------------------------------------

    def is_stateful(self, graph: Graph, name: str) -> bool:
        """As Grappler's ``IsFreeOfSideEffect`` sees it: a stateful OpDef, or a ref
        input, which the op may write through (TF1's ``ApplyMomentum`` on a ref
        variable is not a stateful op to its OpDef, yet it is the update)."""
        definition = op_def(graph.node(name).op)
        return definition is None or definition.is_stateful or \
            any(arg.is_ref for arg in definition.input_arg)

    def is_source(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        if node.op in SOURCE_OPS:
            return True
        # `W/read`: an Identity of a ref variable is the variable's value.
        return node.op == "Identity" and self._reads_ref_variable(graph, name)

    def _reads_ref_variable(self, graph: Graph, name: str) -> bool:
        inputs = graph.inputs(name)
        return bool(inputs) and graph.node(inputs[0].node).op in REF_VARIABLE_OPS

    def is_variable(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        if node.op in VARIABLE_OPS:
            return True
        # In a function body, a variable is a resource argument.
        return node.op == "Placeholder" and self.get_attr(graph, name, "dtype") == "resource"

    def variable_dtype(self, graph: Graph, name: str) -> str | None:
        """A resource argument holds the dtype its handle data says (recorded as
        ``_handle_dtypes`` when the function body was read)."""
        node = graph.node(name)
        if node.op == "Placeholder" and "_handle_dtypes" in node.attrs:
            types = node.attrs["_handle_dtypes"].list.type
            return dtype_name(types[0]) if types else None
        return self.get_attr(graph, name, "dtype")

    def conv_operands(self, graph: Graph, name: str) -> tuple[Tensor, Tensor, int]:
        """Forward: (output, filter input). Input gradient: (out_backprop, filter).
        Filter gradient: (out_backprop, its output, the filter's shape)."""
        op = graph.node(name).op
        inputs = graph.inputs(name)
        channels = 1 if self.get_attr(graph, name, "data_format", "NHWC") \
            .startswith("NC") else -1
        if op in CONV_INPUT_GRAD_OPS:
            return inputs[2], inputs[1], channels
        if op in CONV_FILTER_GRAD_OPS:
            return inputs[2], Tensor(name, 0), channels
        return Tensor(name, 0), inputs[1], channels

    def is_variable_value(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        if self.is_variable(graph, name) or node.op == "ReadVariableOp":
            return True
        return node.op == "Identity" and self._reads_ref_variable(graph, name)

    def is_shape_only(self, graph: Graph, name: str) -> bool:
        """Reads only the shape of its input (how TF seeds gradients from the loss)."""
        return graph.node(name).op in SHAPE_ONLY_OPS

    def is_constant(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        if node.op in ("Const", "HostConst"):
            return True
        if node.op not in ("Shape", "ShapeN", "Size", "Rank"):
            return False
        shapes = [self.shape(graph, t) for t in graph.inputs(name)]
        return all(s is not None and None not in s for s in shapes)

    # -- tensors -----------------------------------------------------------

    def output_dtypes(self, graph: Graph, name: str) -> list[str] | None:
        """Dtype of every output, from the OpDef and the node's attrs."""
        node = graph.node(name)
        args = output_args(node.op)
        if args is None:
            return None
        dtypes: list[str] = []
        for arg in args:
            count = _attr(node, arg.number_attr).i if arg.number_attr else 1
            if arg.type_list_attr:
                dtypes.extend(dtype_name(t) for t in _attr(node, arg.type_list_attr).list.type)
            elif arg.type_attr:
                dtypes.extend([dtype_name(_attr(node, arg.type_attr).type)] * count)
            else:
                dtypes.extend([dtype_name(arg.type)] * count)
        return dtypes

    def dtype(self, graph: Graph, tensor: Tensor) -> str | None:
        try:
            dtypes = self.output_dtypes(graph, tensor.node)
        except KeyError:  # an attr the OpDef names is missing
            return None
        if dtypes is None or tensor.port >= len(dtypes):
            return None
        return dtypes[tensor.port]

    def input_arg_slots(self, graph: Graph, name: str, arg_name: str) -> list[int]:
        """The input slots that OpDef argument ``arg_name`` occupies."""
        node = graph.node(name)
        definition = op_def(node.op)
        slot = 0
        for arg in definition.input_arg if definition else ():
            count = required_count(arg, node.attrs)
            if arg.name == arg_name:
                return list(range(slot, slot + count))
            slot += count
        return []

    def infer_shapes(self, graph: Graph, nodes: list[str] | None = None) -> None:
        """TF's own shape inference (``tf_shapes.infer_shapes``). Copies and the
        small ops of this dialect record their shapes when built, so adding them
        needs no new inference."""
        tf_shapes.infer_shapes(graph, nodes)

    def batch_shape(self, graph: Graph, tensor: Tensor, batch_size: int) -> tuple | None:
        """TF's shape inference run again with the placeholders' unknown batch
        dimension set to ``batch_size`` (``tf_shapes.batch_shape``)."""
        return tf_shapes.batch_shape(graph, tensor, batch_size)

    def get_attr(self, graph: Graph, name: str, key: str, default: Any = None) -> Any:
        value = graph.node(name).attrs.get(key)
        if value is None:
            return default
        kind = value.WhichOneof("value")
        if kind == "s":
            return value.s.decode("utf-8", "replace")
        if kind == "type":
            return dtype_name(value.type)
        if kind in ("i", "f", "b"):
            return getattr(value, kind)
        if kind == "list":
            return [s.decode("utf-8", "replace") for s in value.list.s] or list(value.list.i)
        return value

    def set_attr(self, graph: Graph, name: str, key: str, value: Any) -> None:
        graph.forget_source()
        graph.node(name).attrs[key] = attr_value(value)

    # -- target lowering -------------------------------------------------------

    def place(self, graph: Graph, names: list[str], device_type: str) -> bool:
        """Give ``names`` the device type where they have none (``tf_xla.place``)."""
        return tf_xla.place(graph, names, device_type)

    def xla_unsupported(self, graph: Graph, names: list[str]) -> list[tuple[str, str]]:
        """``(node, op)`` of ``names`` without an XLA kernel (``tf_xla.xla_unsupported``)."""
        return tf_xla.xla_unsupported(graph, names)

    def xla_clusterable(self, graph: Graph, name: str) -> bool:
        return tf_xla.clusterable(graph, name)

    def mark_xla_cluster(self, graph: Graph, names: list[str], scope: str) -> str:
        """``_XlaCompile``, ``_XlaScope`` as ``jit_scope`` sets them (``tf_xla.mark_cluster``)."""
        return tf_xla.mark_cluster(graph, names, scope)


def _attr(node, name: str):
    """The node's attr ``name``, else its OpDef's default: a SavedModel's function
    bodies leave out attrs at their default (a Keras 3 ``MaxPool`` has no ``T``).
    KeyError where neither has it."""
    if name in node.attrs:
        return node.attrs[name]
    definition = op_def(node.op)
    for attr in definition.attr if definition else ():
        if attr.name == name and attr.HasField("default_value"):
            return attr.default_value
    raise KeyError(name)
