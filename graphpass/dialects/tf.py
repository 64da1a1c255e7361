"""The TensorFlow dialect: what passes and analyses ask of a TF graph (op kinds,
dtypes, shapes, training structure), answered from TF's own op registry
(``tf_ops``), its shape inference (``tf_shapes``) and the optimizer-update
recognisers (``tf_updates``). What TF's runtime does with the graph is the
runtime models' (``graphpass.runtimes``).

The builders and the stale pass's conditionals are a mixin (``tf_builders``);
XLA support is ``tf_xla``. This module answers questions; it reads no file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphpass.dialects import (
    tf_loops,
    tf_loops_v1,
    tf_shapes,
    tf_updates,
    tf_xla,
)
from graphpass.dialects.base import Dialect, LoopFacts
from graphpass.dialects.capabilities import ConditionalBuilder, TargetLowering
from graphpass.dialects.tf_builders import TFBuilders
from graphpass.dialects.tf_ops import (
    APPLY_OP,
    CHEAP_OPS,
    CONV_FILTER_GRAD_OPS,
    CONV_FORWARD_OPS,
    CONV_INPUT_GRAD_OPS,
    INTEGER_DTYPES,
    LOOP_BACK_OPS,
    MATMUL_OPS,
    REF_VARIABLE_OPS,
    RESULT_OP,
    SHAPE_ONLY_OPS,
    SOURCE_OPS,
    STEP_INCREMENT_OPS,
    VARIABLE_OPS,
    attr_value,
    dtype_name,
    op_def,
    output_args,
    output_count,
    required_count,
)
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor


class TFDialect(TFBuilders, Dialect, ConditionalBuilder, TargetLowering):
    name = "tf"
    dependency_modes = ("control", "data")
    op_classes = {"matmul": MATMUL_OPS,
                  "conv": CONV_FORWARD_OPS | CONV_INPUT_GRAD_OPS | CONV_FILTER_GRAD_OPS,
                  "cheap": CHEAP_OPS}
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

    def update_math(self, graph: Graph, applies: list[str]) -> set[str]:
        """The slot updates and learning-rate arithmetic of updates made of plain ops
        (Keras optimizers; the sparse path of TF 1.x Adam and SGD); ``Apply*`` ops
        hold theirs."""
        plain = [a for a in applies if not APPLY_OP.match(graph.node(a).op)]
        return tf_updates.update_math(graph, plain) if plain else set()

    def variable_dtype(self, graph: Graph, name: str) -> str | None:
        """A resource argument holds the dtype its handle data says (recorded as
        ``_handle_dtypes`` when the function body was read)."""
        node = graph.node(name)
        if node.op == "Placeholder" and "_handle_dtypes" in node.attrs:
            types = node.attrs["_handle_dtypes"].list.type
            return dtype_name(types[0]) if types else None
        return self.get_attr(graph, name, "dtype")

    def in_function_body(self, graph: Graph) -> bool:
        return graph.format_state.function is not None

    def default_dependency(self, graph: Graph) -> str:
        """Data for a function body that XLA must compile (``jit_compile=True``:
        XLA ignores control edges), else control."""
        function = graph.format_state.function
        return "data" if function and function.xla_must_compile else "control"

    def is_fetch(self, graph: Graph, name: str) -> bool:
        """A function result (``_Retval``), or an ``Identity`` only results read."""
        op = graph.node(name).op
        if op != "Identity":
            return op == "_Retval"
        # Iterative, each Identity once: a malformed graph may loop Identities.
        seen, stack, results = {name}, [name], False
        while stack:
            users = graph.data_users(stack.pop())
            if not users:
                return False
            for user in users:
                user_op = graph.node(user).op
                if user_op == "_Retval":
                    results = True
                elif user_op != "Identity":
                    return False
                elif user not in seen:
                    seen.add(user)
                    stack.append(user)
        return results

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

    def graph_inputs(self, graph: Graph) -> list[str]:
        return [n.name for n in graph.nodes() if n.op.startswith("Placeholder")]

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

    # -- training structure -------------------------------------------------

    def optimizer_applies(self, graph: Graph) -> dict[str, list[Tensor]]:
        """Apply ops (``ApplyAdam``, ``ResourceSparseApplyMomentum``, ...) -> gradients."""
        return self._applies(graph, strict=True)

    def applies_for(self, graph: Graph, train_ops: Sequence[str]) -> dict[str, list[Tensor]]:
        """With ``--train-op``, plain-op updates that apply no gradient found are left
        to the optimizer instead of reported."""
        return self._applies(graph, strict=not train_ops)

    def _applies(self, graph: Graph, strict: bool) -> dict[str, list[Tensor]]:
        """``Apply*`` ops, and plain-op updates of the variables they do not train (a
        TF 1.x optimizer's sparse path: Adam's ``ScatterAdd``, SGD's ``ScatterSub``)."""
        applies = {}
        for node in graph.nodes():
            if APPLY_OP.match(node.op) and op_def(node.op) is not None:
                inputs = graph.inputs(node.name)
                # The gradient is "grad", except for (Resource)ApplyGradientDescent's "delta".
                slots = self.input_arg_slots(graph, node.name, "grad") or \
                    self.input_arg_slots(graph, node.name, "delta")
                applies[node.name] = [inputs[s] for s in slots if s < len(inputs)]
        if applies:
            trained = tf_updates.applied_variables(graph, applies)
            plain = tf_updates.plain_updates(graph, strict=False, skip=trained, applied=[
                t for tensors in applies.values() for t in tensors])
            if not plain:
                return applies
            return {n: applies[n] if n in applies else plain[n] for n in graph
                    if n in applies or n in plain}
        updates = tf_updates.plain_updates(graph, strict=strict)
        listed = graph.format_state.signatures
        if not updates and listed and graph.format_state.function is None:
            raise GraphpassError(
                "no signature of this SavedModel holds a training step (signatures: "
                f"{', '.join(s['signature'] for s in listed)}); export the train function "
                "as one (signatures={'train': module.train}) or name it with --signature")
        return updates

    def split_steps(self, graph: Graph, applies: dict[str, list[Tensor]]) -> list[list[str]]:
        """Plain-op updates by the gradient computation they read (``Apply*`` ops
        keep one step per train op, as v1 graphs always had)."""
        if not applies or any(APPLY_OP.match(graph.node(a).op) for a in applies):
            return [list(applies)]
        return tf_updates.gradient_steps(graph, applies)

    def ends_train_step(self, graph: Graph, name: str) -> bool:
        op = graph.node(name).op
        if op == RESULT_OP:  # the step ends when the function returns: one train op
            return name == _first_result(graph)
        return op == "NoOp" or \
            op.startswith(("Assign", "ResourceScatter", "Scatter")) or bool(APPLY_OP.match(op))

    def step_increments(self, graph: Graph) -> list[tuple[str, str]]:
        """``(increment op, integer variable)`` pairs: candidates for global_step."""
        found = []
        for node in graph.nodes():
            if node.op not in STEP_INCREMENT_OPS:
                continue
            inputs = graph.inputs(node.name)
            variable = inputs[0].node if inputs else None
            if variable and self.is_variable(graph, variable) and \
                    self.get_attr(graph, variable, "dtype") in INTEGER_DTYPES:
                found.append((node.name, variable))
        return found + [pair for pair in tf_updates.step_increments(graph) if pair not in found]

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


def _first_result(graph: Graph) -> str | None:
    """The function's result with the lowest index: it stands for all of them (they
    all wait for the step), so a step returning its loss and metrics is one train op."""
    results = [n for n in graph.nodes() if n.op == RESULT_OP]
    return min(results, key=lambda n: n.attrs["index"].i).name if results else None


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
