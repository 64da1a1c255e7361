"""The ONNX dialect: op knowledge for ONNX graphs (as read by
``graphpass.formats.onnx_io``), and the builders for the small ops passes insert.

* Types and shapes come from ``onnx.shape_inference``, run once over the whole
  model and recorded per node in ``node.meta["dtypes"]`` / ``node.meta["shapes"]``
  by the shapes analysis (``analysis/shapes.py``), as the TF dialect does.
* Constants the builders need (shapes, scalars) become initializers, written
  like the ones read: valid in every opset, and no extra nodes in the list.
* ONNX has no control dependencies and no gradient-stopping op. The
  ``stop_gradient`` builder emits an ``Identity``: an exported ONNX graph
  already holds its backward pass, so nothing differentiates it again and the
  identity only marks intent (named by the caller).
* Annotations: attribute keys starting with ``_`` (``_recompute_hint``) are
  read from and written to the NodeProto's ``metadata_props``, since the
  checker refuses undeclared attributes on standard ops (see ``get_attr``).
* Training structure: an ONNX training step returns each updated parameter and
  each piece of optimizer state as a graph output replacing the input or
  initializer it updates. ``graphpass.dialects.onnx_training`` finds them by what they
  read and write, in any update form and for the ``ai.onnx.preview.training``
  ops; the loss needs no name rule (region analysis finds it).

Long because ``ONNXDialect`` implements the whole ``Dialect`` protocol (op
kinds, dtypes, shapes, attributes and every builder a pass may call), each
method short; training structure is already apart (``onnx_training``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any
from weakref import WeakKeyDictionary

from graphpass.dialects.base import Dialect
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_io import model_from_graph
from graphpass.formats.onnx_order import INITIALIZER, INPUT, SOURCE_OPS, ort_schedule
from graphpass.ir.graph import Graph, Tensor, fresh_name, parse_tensor_name

DEFAULT_DOMAINS = ("", "ai.onnx")
# get_attr/set_attr keys with this prefix are node annotations (metadata_props).
ANNOTATION_PREFIX = "_"
# Ops whose output is random on every run (never recomputed: the copy would differ).
RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
    "Bernoulli", "Multinomial",
})
# Ops that run subgraphs; treated as stateful (their bodies are not analysed).
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})
# Ops the builders add whose output has their inputs' broadcast shape and dtype.
ELEMENTWISE_BUILT = frozenset({"Add", "Sub", "Mul", "Sum", "Identity"})
# Ops whose output onnxruntime's CPU kernels place in their input's buffer (``Alias(0, 0)``).
ALIAS_OPS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
# Ops whose CPU kernels may write their output into input 0's buffer (``MayInplace(0, 0)``:
# the activations, Clip, Softmax); the elementwise arithmetic ops may not.
INPLACE_OPS = frozenset({
    "Relu", "LeakyRelu", "Tanh", "Sigmoid", "HardSigmoid", "Elu", "Selu", "Softplus",
    "Softsign", "ThresholdedRelu", "Clip", "Softmax",
})
# The cost model's op classes (Dialect.op_class); Conv's kernel is input 1, NCHW.
MATMUL_OPS = frozenset({"MatMul", "Gemm", "Einsum", "MatMulInteger"})
CONV_OPS = frozenset({"Conv", "ConvTranspose"})
CHEAP_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Reciprocal", "Sqrt", "Exp", "Log", "Pow", "Abs",
    "Max", "Min", "Sum", "Cast", "Where", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu",
    "Elu", "Selu", "Softplus", "Gelu", "Softmax", "LogSoftmax", "BatchNormalization",
    "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "Reshape", "Transpose",
    "Unsqueeze", "Squeeze", "Identity", "Pad", "Slice", "Concat", "Split", "Expand", "Tile",
    "Flatten", "Shape", "Size", "MaxPool", "AveragePool", "Greater", "Less", "Equal", "Not",
    "And", "Or", "ConstantOfShape",
})


@cache
def _dtype_enums() -> dict[str, int]:
    """numpy-style dtype name -> ``TensorProto.DataType`` value."""
    import onnx

    names = {}
    for enum in onnx.TensorProto.DataType.values():
        name = _dtype_name(enum)
        if name is not None:
            names.setdefault(name, enum)
    return names


@cache
def _dtype_name(enum: int) -> str | None:
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(enum).name
    except (KeyError, ValueError, TypeError):  # UNDEFINED, STRING, new float8 kinds, ...
        return None


def dtype_enum(name: str) -> int:
    """The ONNX element type for a numpy-style dtype name ("float32" -> FLOAT)."""
    try:
        return _dtype_enums()[name]
    except KeyError:
        raise GraphpassError(f"no ONNX element type for dtype {name!r}") from None


class ONNXDialect(Dialect):
    name = "onnx"
    op_classes = {"matmul": MATMUL_OPS, "conv": CONV_OPS, "cheap": CHEAP_OPS}
    allows_empty_input_slots = True
    dependency_modes = ("data",)
    single_train_step = True
    reuses_freed_buffers = True

    def __init__(self) -> None:
        self._updates_cache: tuple | None = None

    # -- structure ---------------------------------------------------------

    def num_outputs(self, graph: Graph, name: str) -> int | None:
        return len(graph.node(name).outputs)

    def schedule(self, graph: Graph, nodes: set[str] | None = None,
                 known: frozenset[str] = frozenset(), fetched: frozenset[str] = frozenset()
                 ) -> list[str]:
        """onnxruntime's default order for the model the writer emits (a DFS from the
        leaves; see ``onnx_order.ort_schedule``), not a plain topological order."""
        order = ort_schedule(graph)
        return order if nodes is None else [n for n in order if n in nodes]

    def parse_tensor(self, graph: Graph, text: str) -> Tensor:
        """An ONNX tensor name first (what users see in Netron); else ``node[:port]``."""
        for node in graph.nodes():
            if text in node.outputs:
                return Tensor(node.name, node.outputs.index(text))
        return parse_tensor_name(text)

    def opset(self, graph: Graph, domain: str = "") -> int:
        """The opset version the model imports for ``domain`` (0 if none)."""
        for entry in graph.meta["model"].opset_import:
            if entry.domain in ((domain,) if domain else DEFAULT_DOMAINS):
                return entry.version
        return 0

    # -- op kinds ----------------------------------------------------------

    def is_stateful(self, graph: Graph, name: str) -> bool:
        """Random ops (``Dropout`` only in training mode), control flow, and ops
        outside the ONNX schemas (custom domains: unknown, so assumed stateful)."""
        node = graph.node(name)
        if node.op in SOURCE_OPS:
            return False
        if node.domain not in DEFAULT_DOMAINS + ("ai.onnx.ml",) or not _has_schema(node):
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

    def output_alias(self, graph: Graph, name: str, port: int) -> int | None:
        """onnxruntime's aliasing kernels (``ALIAS_OPS``), and a ``Transpose`` of the
        last two axes read only by ``MatMul``s: ORT's ``MatmulTransposeFusion``
        folds it into them (``FusedMatMul`` with ``transA``/``transB``), so its
        output is never allocated and the MatMuls read its input instead (the
        ``input^T @ grad`` of every weight gradient)."""
        node = graph.node(name)
        if port != 0 or node.domain not in DEFAULT_DOMAINS:
            return None
        if node.op in ALIAS_OPS or (node.op == "Transpose" and self._fused_transpose(graph, name)):
            return 0
        if node.op in ("Mul", "Div"):
            return self._fused_scale(graph, name)
        return None

    def _fused_scale(self, graph: Graph, name: str) -> int | None:
        """The scaled input's slot when ORT's ``MatMulScaleFusion`` folds this
        product with a scalar constant into a MatMul (``FusedMatMul`` with ``alpha``):
        its only reader is a MatMul (it scales an operand), or its scaled input is
        a MatMul's output read only here (it scales the result). Either way no
        buffer of its own: the MatMul reads or writes the scaled input's."""
        inputs = graph.input_slots(name)
        if len(inputs) != 2 or set(graph.node(name).outputs) & _output_names(graph):
            return None
        slots = [s for s in (0, 1) if not self._scalar_constant(graph, inputs[s])]
        if len(slots) != 1 or (graph.node(name).op == "Div" and slots != [0]):
            return None
        slot, scaled = slots[0], inputs[slots[0]]
        users = graph.data_users(name)
        if len(users) == 1 and graph.node(users[0]).op == "MatMul" and \
                list(graph.inputs(users[0])).count(Tensor(name, 0)) == 1:
            return slot
        producer = graph.node(scaled.node)
        if producer.op == "MatMul" and graph.data_users(scaled.node) == [name]:
            return slot
        return None

    def fuses_into_producer(self, graph: Graph, name: str, slot: int) -> bool:
        """ORT's ``MatMulScaleFusion`` (a scalar-constant ``Mul``/``Div`` of a MatMul's
        output read only there: ``lr * g`` of an SGD step) and ``MatMulAddFusion`` (an
        ``Add`` to a 2-D MatMul's output read only there, the other operand of
        shape ``[N]``, ``[1, N]``, ``[M, 1]`` or ``[M, N]``, as one Gemm:
        ``mu * v + g`` of a momentum step)."""
        node = graph.node(name)
        inputs = graph.input_slots(name)
        producer = inputs.get(slot)
        if node.domain not in DEFAULT_DOMAINS or producer is None or \
                graph.node(producer.node).op != "MatMul" or \
                graph.node(producer.node).domain not in DEFAULT_DOMAINS or \
                graph.consumers(producer) != [(name, slot)] or \
                set(graph.node(producer.node).outputs) & _output_names(graph):
            return False
        if node.op in ("Mul", "Div"):
            return self._fused_scale(graph, name) == slot
        return node.op == "Add" and len(inputs) == 2 and self._gemm_bias(graph, producer.node,
                                                                         inputs[1 - slot])

    def _gemm_bias(self, graph: Graph, matmul: str, bias: Tensor) -> bool:
        """``MatMulAddFusion``'s conditions on the MatMul (2-D float operands) and the
        other ``Add`` operand (a bias Gemm broadcasts one way)."""
        a, b = (self.shape(graph, t) for t in graph.inputs(matmul))
        shape = self.shape(graph, bias)
        if a is None or b is None or shape is None or len(a) != 2 or len(b) != 2 or \
                self.dtype(graph, bias) not in ("float32", "float16", "bfloat16"):
            return False
        m, n = a[0], b[1]
        return shape in ((n,), (1, n), (m, 1), (m, n)) and None not in (m, n)

    def _scalar_constant(self, graph: Graph, tensor: Tensor) -> bool:
        shape = self.shape(graph, tensor)
        return shape is not None and math.prod(shape) == 1 and \
            self.constant_value(graph, tensor) is not None

    def scratch_shapes(self, graph: Graph, name: str) -> list[tuple[Tensor, tuple]]:
        """onnxruntime's CPU ``Where`` broadcasts twice before it writes its output:
        ``condition ? X : 0`` and ``condition ? 0 : Y``, each a tensor of its own of
        the condition and that operand broadcast together (a ReLU gradient
        ``Where(x > 0, g, 0)`` holds two more tensors of ``g``'s size meanwhile)."""
        node = graph.node(name)
        inputs = graph.input_slots(name)
        if node.op != "Where" or node.domain not in DEFAULT_DOMAINS or len(inputs) != 3:
            return []
        condition = self.shape(graph, inputs[0])
        scratch = []
        for slot in (1, 2):
            operand = self.shape(graph, inputs[slot])
            if condition is None or operand is None:
                return []
            scratch.append((Tensor(name, 0), _broadcast(condition, operand)))
        return scratch

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        """Input 0 of onnxruntime's in-place kernels (``INPLACE_OPS``): its allocation
        planner gives their output the input's buffer when this read is its last."""
        node = graph.node(name)
        return (0,) if node.op in INPLACE_OPS and node.domain in DEFAULT_DOMAINS else ()

    def _fused_transpose(self, graph: Graph, name: str) -> bool:
        perm = self.get_attr(graph, name, "perm")
        users = graph.data_users(name)
        return perm is not None and len(perm) >= 2 and \
            list(perm) == [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2] and \
            bool(users) and all(graph.node(u).op == "MatMul" for u in users) and \
            not set(graph.node(name).outputs) & _output_names(graph)

    def is_variable(self, graph: Graph, name: str) -> bool:
        """An input or initializer that the step updates: a trained parameter or
        optimizer state; frozen weights of an inference model are constants."""
        return graph.node(name).op in SOURCE_OPS and name in self.updates(graph).variables

    def graph_inputs(self, graph: Graph) -> list[str]:
        """The ``graphpass.Input`` nodes (fed values), in the model's input order."""
        fed = {n.outputs[0]: n.name for n in graph.nodes() if n.op == INPUT}
        return [fed[v.name] for v in graph.meta["inputs"] if v.name in fed]

    def graph_outputs(self, graph: Graph) -> list[str]:
        """The nodes producing the model's outputs, in output order."""
        wanted = [v.name for v in graph.meta["outputs"]]
        producers = {value: n.name for n in graph.nodes() for value in n.outputs if value}
        return list(dict.fromkeys(producers[v] for v in wanted if v in producers))

    def returned_values(self, graph: Graph) -> list[Tensor]:
        """Every graph output an op computes: onnxruntime allocates it as the step's
        result and frees it only when the caller drops it (each updated parameter and
        piece of optimizer state of a training step lives to the end of the step)."""
        from graphpass.dialects.onnx_training import computed_outputs

        return computed_outputs(graph)

    def constant_value(self, graph: Graph, tensor: Tensor) -> Any:
        """The numpy value of an initializer or ``Constant`` output, else None."""
        from onnx import numpy_helper

        node = graph.node(tensor.node)
        if node.op == INITIALIZER:
            proto = graph.meta["initializers"].get(node.outputs[0])
            if proto is not None and proto.data_location != proto.EXTERNAL:
                return numpy_helper.to_array(proto)
        if node.op == "Constant" and "value" in node.attrs:
            return numpy_helper.to_array(node.attrs["value"].t)
        return None

    # -- training structure -------------------------------------------------

    def optimizer_applies(self, graph: Graph) -> dict[str, list[Tensor]]:
        """Parameter updates (with their gradients) and optimizer state updates
        (with none), found by what they read and write: see ``onnx_training``.
        Refuses a step whose updates cannot be attributed, naming the candidates."""
        updates = self.updates(graph)
        if updates.problem:
            raise GraphpassError(updates.problem)
        return updates.applies

    def applies_for(self, graph: Graph, train_ops: Sequence[str]) -> dict[str, list[Tensor]]:
        """With ``--train-op``: the named nodes are the updates (for steps whose
        updates structure alone cannot attribute)."""
        from graphpass.analysis.shapes import infer_shapes
        from graphpass.dialects.onnx_training import named_updates

        infer_shapes(graph)
        return named_updates(graph, list(train_ops)).applies if train_ops else \
            self.optimizer_applies(graph)

    def step_increments(self, graph: Graph) -> list[tuple[str, str]]:
        """``(increment, counter)`` for each optimizer state update that counts a
        one-element input or initializer up by a constant (``t' = t + 1``, Adam's
        step, the preview ops' ``T``): candidates for the global step."""
        found = []
        for source, update in self.updates(graph).state.items():
            inputs = graph.inputs(update)
            counted = [t for t in inputs if t.node != source]
            shape = self.shape(graph, Tensor(source, 0))
            if graph.node(update).op in ("Add", "Sum") and len(inputs) == 2 and \
                    len(counted) == 1 and self.constant_value(graph, counted[0]) is not None and \
                    shape is not None and math.prod(shape) == 1:
                found.append((update, source))
        return found

    def updates(self, graph: Graph):
        """The step's parameter and state updates and their gradients
        (``onnx_training.find_updates``), cached per graph and its outputs
        (``is_variable`` asks once per node). Updates are found from the graph
        outputs upward and stop at the gradients, so a pass that adds nodes below
        them (remat's copies, once per segment) keeps them; keying on the node
        count made every segment redo the search and a shape inference."""
        from graphpass.analysis.shapes import infer_shapes
        from graphpass.dialects.onnx_training import find_updates

        key = (id(graph), tuple(v.name for v in graph.meta["outputs"]))
        if self._updates_cache is None or self._updates_cache[0] != key:
            infer_shapes(graph)  # the update cones compare shapes
            self._updates_cache = (key, find_updates(graph))
        return self._updates_cache[1]

    # -- tensors -----------------------------------------------------------

    def dtype(self, graph: Graph, tensor: Tensor) -> str | None:
        return self._inferred(graph, tensor, "dtypes")

    def infer_shapes(self, graph: Graph, nodes: list[str] | None = None) -> None:
        """ONNX shape inference, once over the model whatever ``nodes`` asks for
        (it takes a model, not a subgraph): dtypes and shapes (None for symbolic
        dims) of every node's outputs."""
        _infer_types(graph)

    def _inferred(self, graph: Graph, tensor: Tensor, key: str):
        values = graph.node(tensor.node).meta.get(key) or []
        return values[tensor.port] if tensor.port < len(values) else None

    def dependency_scale(self, dtype: str) -> float:
        """0: data-mode ties are ``x + Identity(0 * s)``, exact for finite ``s``.

        ``tiny * s`` is subnormal whenever ``|s| < 1``, and added to the zeros a
        ReLU leaves it makes subnormal activations; onnxruntime on CPU does not
        flush them (``session.set_denormal_as_zero`` is off by default), so the
        recomputed MatMuls take the slow subnormal path (a 13x slower step on
        the benchmark MLP). ``0 * s`` is still a data dependency no ORT
        optimizer removes: constant folding needs constant inputs, and
        ``NoopElimination`` drops only an ``Add`` of a constant 0 or a ``Mul``
        by a constant 1 (it is also NaN if ``s`` is, like ``tiny * s``).
        """
        return 0.0

    def get_attr(self, graph: Graph, name: str, key: str, default: Any = None) -> Any:
        """The attribute as a Python value; strings decoded, tensors as TensorProto.

        Keys starting with ``_`` are annotations, not op attributes (TF's
        ``_recompute_hint``): the ONNX checker rejects attributes a standard op
        does not declare, so they live in the NodeProto's ``metadata_props``
        (a string -> string map, IR 10; older readers skip the field). Their
        value is the entry's string, e.g. ``_recompute_hint`` = ``"1"``.
        """
        import onnx

        if key.startswith(ANNOTATION_PREFIX):
            return _metadata_props(graph.node(name)).get(key, default)
        value = graph.node(name).attrs.get(key)
        if value is None:
            return default
        result = onnx.helper.get_attribute_value(value)
        if isinstance(result, bytes):
            return result.decode("utf-8", "replace")
        if isinstance(result, list) and result and isinstance(result[0], bytes):
            return [s.decode("utf-8", "replace") for s in result]
        return result

    def set_attr(self, graph: Graph, name: str, key: str, value: Any) -> None:
        """An op attribute; an ``_``-key annotation goes to ``metadata_props`` as ``str(value)``."""
        if key.startswith(ANNOTATION_PREFIX):
            _set_metadata_prop(graph.node(name), key, str(value))
            return
        graph.node(name).attrs[key] = _attribute(key, value)

    # -- builders ----------------------------------------------------------

    def copy_node(self, graph: Graph, name: str, new_name: str) -> str:
        """Same op, domain, attrs and extras (doc string, ...), fresh output names.

        An initializer's copy holds the same tensor under the new name; a graph
        input cannot be copied (it is fed).
        """
        import onnx

        node = graph.node(name)
        if node.op == INPUT or (node.op == INITIALIZER and
                                node.outputs[0] in graph.meta["sparse_initializers"]):
            raise GraphpassError(f"cannot copy {name!r}: it is a graph input or a sparse "
                                 "initializer, not a node")
        outputs = [_fresh_value(graph, new_name, port) if value else ""
                   for port, value in enumerate(node.outputs)]
        if node.op == INITIALIZER:
            proto = onnx.TensorProto()
            proto.CopyFrom(graph.meta["initializers"][node.outputs[0]])
            proto.name = outputs[0]
            _register_initializer(graph, proto)
        copy = graph.add_node(new_name, node.op, attrs=node.attrs, device=node.device,
                              domain=node.domain, outputs=outputs)
        # Same op on inputs of the same types and shapes: the inferred ones carry over,
        # so a pass that copies nodes does not re-run shape inference on the model.
        for key in ("onnx_extras", "onnx_arity", "dtypes", "shapes"):
            if key in node.meta:
                copy.meta[key] = node.meta[key]
        return new_name

    def _op(self, graph: Graph, name: str, op: str, inputs: list[Tensor], **attrs) -> Tensor:
        """A node of one output; an elementwise op's type recorded as inference
        would (``ELEMENTWISE_BUILT``), so a pass's trial copies need none."""
        name = graph.unique_name(name)
        graph.add_node(name, op, inputs, attrs={k: _attribute(k, v) for k, v in attrs.items()},
                       outputs=[_fresh_value(graph, name, 0)])
        shapes = [self.shape(graph, t) for t in inputs]
        if op in ELEMENTWISE_BUILT and None not in shapes:
            shape = shapes[0]
            for other in shapes[1:]:
                shape = _broadcast(shape, other)
            _record_type(graph, Tensor(name, 0), self.dtype(graph, inputs[0]), shape)
        return Tensor(name, 0)

    def constant(self, graph: Graph, name: str, value: Any, dtype: str) -> Tensor:
        """A new initializer (plus a graph input when IR < 4 requires one)."""
        import numpy as np
        import onnx

        array = np.asarray(value)
        key = graph.unique_name(name)
        value_name = _fresh_value(graph, key, 0)
        enum = dtype_enum(dtype)
        proto = onnx.helper.make_tensor(value_name, enum, array.shape, array.flatten().tolist())
        _register_initializer(graph, proto)
        graph.add_node(key, INITIALIZER, outputs=[value_name])
        _record_type(graph, Tensor(key, 0), dtype, array.shape)
        return Tensor(key, 0)

    def identity(self, graph: Graph, name: str, tensor: Tensor,
                 control_inputs: Sequence[str] = ()) -> Tensor:
        """An ``Identity``; refuses control inputs, which ONNX cannot express."""
        if control_inputs:
            raise GraphpassError(
                f"cannot order {name!r} after {list(control_inputs)[:3]}: ONNX has no control "
                "dependencies; use data-dependency mode"
            )
        return self._op(graph, name, "Identity", [tensor])

    def scalar(self, graph: Graph, name: str, value: float, dtype: str) -> Tensor:
        return self.constant(graph, name, value, dtype)

    def first_element(self, graph: Graph, name: str, tensor: Tensor) -> Tensor:
        """``Reshape(x, [-1])``, ``Slice [0:1]``, ``Reshape(., [])``, in the model's opset."""
        opset = self.opset(graph)
        flat = self._reshape(graph, f"{name}/flat", tensor, [-1], opset)
        shape = self.shape(graph, tensor)
        if shape is not None and None not in shape:
            _record_type(graph, flat, self.dtype(graph, tensor), (math.prod(shape),))
        if opset >= 10:
            head = self._op(graph, f"{name}/head", "Slice", [
                flat,
                self.constant(graph, f"{name}/starts", [0], "int64"),
                self.constant(graph, f"{name}/ends", [1], "int64"),
                self.constant(graph, f"{name}/axes", [0], "int64"),
            ])
        else:
            head = self._op(graph, f"{name}/head", "Slice", [flat], starts=[0], ends=[1],
                            axes=[0])
        if shape is not None and None not in shape and math.prod(shape):
            _record_type(graph, head, self.dtype(graph, tensor), (1,))
        first = self._reshape(graph, name, head, [], opset)
        # A scalar of the input's dtype: recorded as inference would (``cast`` reads it).
        node = graph.node(first.node)
        node.meta["dtypes"], node.meta["shapes"] = [self.dtype(graph, tensor)], [()]
        return first

    def _reshape(self, graph: Graph, name: str, tensor: Tensor, shape: list[int],
                 opset: int) -> Tensor:
        if opset >= 5:
            target = self.constant(graph, f"{name}/shape", shape, "int64")
            return self._op(graph, name, "Reshape", [tensor, target])
        return self._op(graph, name, "Reshape", [tensor], shape=shape)

    def add_n(self, graph: Graph, name: str, tensors: list[Tensor]) -> Tensor:
        if len(tensors) == 1:
            return tensors[0]
        return self._op(graph, name, "Sum", list(tensors))

    def cast(self, graph: Graph, name: str, tensor: Tensor, dtype: str) -> Tensor:
        import onnx

        if self.dtype(graph, tensor) == dtype:
            return tensor
        enum = dtype_enum(dtype)
        to = enum if self.opset(graph) >= 6 else onnx.TensorProto.DataType.Name(enum)
        cast = self._op(graph, name, "Cast", [tensor], to=to)
        graph.node(cast.node).meta["dtypes"] = [dtype]  # known without inference
        if self.shape(graph, tensor) is not None:
            graph.node(cast.node).meta["shapes"] = [self.shape(graph, tensor)]
        return cast

    def binary(self, graph: Graph, name: str, op: str, a: Tensor, b: Tensor) -> Tensor:
        onnx_op = {"add": "Add", "sub": "Sub", "mul": "Mul"}[op]
        return self._op(graph, name, onnx_op, [a, b])

    def stop_gradient(self, graph: Graph, name: str, tensor: Tensor) -> Tensor:
        """An ``Identity``: ONNX has no StopGradient, and its backward is already built."""
        return self._op(graph, name, "Identity", [tensor])


def _record_type(graph: Graph, tensor: Tensor, dtype: str | None, shape: tuple) -> None:
    """Record a built node's output type as shape inference would."""
    node = graph.node(tensor.node)
    node.meta["dtypes"], node.meta["shapes"] = [dtype], [tuple(shape)]


def _broadcast(a: tuple, b: tuple) -> tuple:
    """Numpy-style broadcast of two static shapes (unknown dims stay None)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _metadata_props(node) -> dict[str, str]:
    extras = node.meta.get("onnx_extras")
    return {e.key: e.value for e in extras.metadata_props} if extras is not None else {}


def _set_metadata_prop(node, key: str, value: str) -> None:
    """Set one ``metadata_props`` entry. Copy on write: ``Graph.copy`` shares the
    extras proto between the copies."""
    import onnx

    extras = onnx.NodeProto()
    if "onnx_extras" in node.meta:
        extras.CopyFrom(node.meta["onnx_extras"])
    for entry in extras.metadata_props:
        if entry.key == key:
            entry.value = value
            break
    else:
        extras.metadata_props.add(key=key, value=value)
    node.meta["onnx_extras"] = extras


def _register_initializer(graph: Graph, proto) -> None:
    """Add ``proto`` to the carried initializers (and to the graph inputs when IR < 4
    requires it), in place: ``Graph.copy`` copies ``meta``'s dicts and lists (copying
    them per added constant made the planner's trial rewrites quadratic)."""
    import onnx

    graph.meta["initializers"][proto.name] = proto
    if graph.meta["model"].ir_version < 4:
        info = onnx.helper.make_tensor_value_info(proto.name, proto.data_type, proto.dims)
        graph.meta["inputs"].append(info)


def _has_schema(node) -> bool:
    import onnx

    return onnx.defs.has(node.op, node.domain if node.domain != "ai.onnx" else "")


def _output_names(graph: Graph) -> frozenset[str]:
    """The graph's output value names, gathered once per outputs list (the memory
    estimate asks per node)."""
    outputs = graph.meta["outputs"]
    cached = _OUTPUT_NAMES.get(graph)
    if cached is None or cached[0] is not outputs or cached[1] != len(outputs):
        cached = _OUTPUT_NAMES[graph] = (outputs, len(outputs),
                                         frozenset(v.name for v in outputs))
    return cached[2]


#: Per graph: (its outputs list, its length, their names), for ``_output_names``.
_OUTPUT_NAMES: WeakKeyDictionary = WeakKeyDictionary()


#: Per graph: value name -> the node producing it, gathered on the first
#: ``_fresh_value`` call and extended by each (gathering it per new value made
#: adding nodes quadratic). A graph's copy starts its own.
_PRODUCERS: WeakKeyDictionary = WeakKeyDictionary()


def _fresh_value(graph: Graph, node_name: str, port: int) -> str:
    """A tensor name no node produces yet: the node name (port 0) or ``node:port``."""
    producers = _PRODUCERS.get(graph)
    if producers is None:
        producers = _PRODUCERS[graph] = {v: n.name for n in graph.nodes() for v in n.outputs}
    base = node_name if port == 0 else f"{node_name}:{port}"
    name = fresh_name(base, lambda value: _produced(graph, producers, value))
    producers[name] = node_name
    return name


def _produced(graph: Graph, producers: dict[str, str], value: str) -> bool:
    """Whether a node of the graph outputs ``value`` now: the index may name a
    node that was removed since, or that is not added yet."""
    owner = producers.get(value)
    return owner is not None and owner in graph and value in graph.node(owner).outputs


def _attribute(key: str, value: Any):
    """A Python value as an ``AttributeProto`` (kept as-is if it already is one)."""
    import onnx

    if isinstance(value, onnx.AttributeProto):
        return value
    try:
        return onnx.helper.make_attribute(key, value)
    except (ValueError, TypeError) as exc:
        raise TypeError(f"cannot store {value!r} as ONNX attribute {key!r}: {exc}") from None


def _infer_types(graph: Graph) -> None:
    """Run ONNX shape inference once; record each node's output dtypes and shapes."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model_from_graph(graph), data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, GraphpassError):
        model = None  # malformed or huge: everything stays unknown
    types = {}
    if model is not None:
        for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            types[info.name] = _type_of(info.type)
    for name, tensor in graph.meta["initializers"].items():
        types[name] = (_dtype_name(tensor.data_type), tuple(tensor.dims))
    for node in graph.nodes():
        known = [types.get(v, (None, None)) for v in node.outputs]
        node.meta["dtypes"] = [dtype for dtype, _ in known]
        node.meta["shapes"] = [shape for _, shape in known]


def _type_of(type_proto) -> tuple[str | None, tuple | None]:
    if type_proto.WhichOneof("value") != "tensor_type":
        return None, None
    tensor_type = type_proto.tensor_type
    dtype = _dtype_name(tensor_type.elem_type) if tensor_type.elem_type else None
    if not tensor_type.HasField("shape"):
        return dtype, None
    return dtype, tuple(d.dim_value if d.HasField("dim_value") else None
                        for d in tensor_type.shape.dim)
