"""The TensorFlow dialect: op knowledge from TF's own op registry, and the
builders for the small ops passes insert (with the attrs TF's importer needs).

Long because ``TFDialect`` implements the whole ``Dialect`` protocol and the two
capabilities only TF has (``ConditionalBuilder``, ``TargetLowering``) over one
set of OpDef helpers and op tables the memory estimator shares; the update
recognisers (``tf_updates``) and XLA support (``tf_xla``) are already apart.
"""

from __future__ import annotations

import gc
import re
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, NamedTuple

from graphpass.dialects.base import Dialect
from graphpass.dialects.capabilities import ConditionalBuilder, TargetLowering
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor

# Values that are fed or stored, not computed.
SOURCE_OPS = frozenset({
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "Const", "HostConst",
    "VariableV2", "Variable", "VarHandleOp", "TemporaryVariable", "_Arg",
})
REF_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "TemporaryVariable"})
VARIABLE_OPS = REF_VARIABLE_OPS | {"VarHandleOp"}  # ref or resource variables
LOOP_BACK_OPS = frozenset({"NextIteration", "RefNextIteration"})
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike"})
STEP_INCREMENT_OPS = frozenset({"AssignAdd", "AssignAddVariableOp"})
INTEGER_DTYPES = frozenset({"int32", "int64"})
# Kernels whose IsExpensive() is false: the executor runs them inline, on the thread
# that made them ready, before it takes up the next expensive node.
INLINE_OPS = frozenset({
    "Const", "HostConst", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Rank",
    "Size", "Reshape", "Squeeze", "ExpandDims", "ReadVariableOp", "VarHandleOp",
    "VariableV2", "Variable", "Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
    "_Arg", "_Retval", "StopGradient", "PreventGradient", "Snapshot", "Switch", "Merge",
    "Enter", "Exit", "NextIteration", "LoopCond", "ControlTrigger",
})
# Outputs that share the buffer of the same-numbered input (no copy is made).
ALIAS_OPS = frozenset({
    "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
    "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast", "Enter", "Exit",
    "NextIteration",
})
# Elementwise kernels that write their output into an input's buffer when they hold
# the only reference to it (``forward_input_or_allocate_output``): the input slots.
_UNARY_FORWARD = (
    "Abs", "Neg", "Sign", "Reciprocal", "Inv", "Square", "Sqrt", "Rsqrt", "Exp", "Expm1",
    "Log", "Log1p", "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Erf", "Erfc", "Floor", "Ceil",
    "Round", "Rint", "Relu", "Relu6", "Elu", "Selu", "Softplus", "Softsign", "LeakyRelu",
    "LogicalNot", "ClipByValue", "_UnaryOpsComposition", "Snapshot",
)
_BINARY_FORWARD = (
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "Maximum",
    "Minimum", "Pow", "SquaredDifference", "FloorDiv", "FloorMod", "TruncateDiv", "BiasAdd",
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SoftplusGrad", "SoftsignGrad",
    "LeakyReluGrad", "TanhGrad", "SigmoidGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad",
    "InvGrad", "LogicalAnd", "LogicalOr",
)
FORWARD_SLOTS = {op: (0,) for op in _UNARY_FORWARD} | {op: (0, 1) for op in _BINARY_FORWARD} \
    | {"Select": (1, 2), "SelectV2": (1, 2)}
#: Grappler keeps nodes with this attr (true) as they are (its "preserve set").
DO_NOT_REWRITE_ATTR = "_grappler_do_not_remove"
#: Ops read between two collections of their op <-> tensor cycles (``imported_shapes``).
_SHAPE_BATCH = 4096
_APPLY_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]")
# The cost model's op classes (Dialect.op_class). Gradients of matmuls are matmuls.
MATMUL_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
                        "_FusedMatMul"})
CONV_FORWARD_OPS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "_FusedConv2D"})
CONV_INPUT_GRAD_OPS = frozenset({"Conv2DBackpropInput", "Conv3DBackpropInputV2",
                                 "DepthwiseConv2dNativeBackpropInput"})
CONV_FILTER_GRAD_OPS = frozenset({"Conv2DBackpropFilter", "Conv3DBackpropFilterV2",
                                  "DepthwiseConv2dNativeBackpropFilter"})
# Worth recomputing (the `cheap` policy): elementwise math, activations,
# normalisation (and the reductions it is built of), reshapes and copies.
CHEAP_OPS = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg", "Reciprocal",
    "Square", "SquaredDifference", "Sqrt", "Rsqrt", "Exp", "Log", "Log1p", "Pow", "Abs",
    "Maximum", "Minimum", "Sign", "Floor", "Cast", "Select", "SelectV2", "Erf", "Erfc",
    "Tanh", "Sigmoid", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Softplus", "Softsign",
    "Gelu", "Softmax", "LogSoftmax", "BiasAdd", "FusedBatchNorm", "FusedBatchNormV2",
    "FusedBatchNormV3", "Mean", "Sum", "Max", "Min", "Prod", "Reshape", "Transpose",
    "ExpandDims", "Squeeze", "Identity", "Pad", "PadV2", "MirrorPad", "Slice", "StridedSlice",
    "ConcatV2", "Pack", "Unpack", "Split", "SplitV", "Tile", "BroadcastTo", "Fill",
    "ZerosLike", "OnesLike", "Shape", "ShapeN", "Size", "Rank", "MaxPool", "AvgPool",
    "StopGradient", "Greater", "GreaterEqual", "Less", "LessEqual", "Equal",
    "NotEqual", "LogicalAnd", "LogicalOr", "LogicalNot",
})
#: Ops that write a resource variable (their input 0 is the variable).
VARIABLE_WRITE_OPS = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterUpdate",
    "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin",
    "ResourceScatterMax", "ResourceScatterNdAdd", "ResourceScatterNdSub",
    "ResourceScatterNdUpdate", "ResourceStridedSliceAssign",
})
#: A function's result, as TF represents it inside a graph.
RESULT_OP = "_Retval"


def called_functions(op: str, attrs, functions) -> list[str]:
    """Library functions a node runs: its op (a function used as an op) and every
    function-valued attr (``f`` of a call, ``then_branch``/``else_branch`` of an
    ``If``, ``branches`` of a ``Case``, ``body``/``cond`` of a ``While``)."""
    found = [op] if op in functions else []
    for value in attrs.values():
        kind = value.WhichOneof("value")
        if kind == "func":
            found.append(value.func.name)
        elif kind == "list":
            found.extend(f.name for f in value.list.func)
    return [f for f in found if f in functions]


def writes_variables(op: str) -> bool:
    """``op`` writes a resource variable itself (not through a function it calls)."""
    return op in VARIABLE_WRITE_OPS or op.startswith(("ResourceApply", "ResourceSparseApply"))


@cache
def op_def(op: str):
    """TF's registered OpDef for ``op``, or None (custom op or library function)."""
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op)


class OutputArg(NamedTuple):
    """What an OpDef output argument says of the tensors it stands for (its proto
    fields of those names, copied once per op by ``output_args``)."""

    name: str
    number_attr: str
    type_list_attr: str
    type_attr: str
    type: int
    is_ref: bool


@cache
def output_args(op: str) -> tuple[OutputArg, ...] | None:
    """The OpDef output arguments of ``op``, or None for unregistered ops: read once
    per op, since every dtype and output-count question asks for them and reading
    a proto's repeated field makes an object per argument each time."""
    definition = op_def(op)
    if definition is None:
        return None
    return tuple(OutputArg(a.name, a.number_attr, a.type_list_attr, a.type_attr, a.type,
                           a.is_ref) for a in definition.output_arg)


def output_count(op: str, attrs: dict) -> int | None:
    """How many outputs a node of ``op`` with ``attrs`` has, by its OpDef; None when
    the op is not registered or an attr the count needs is missing or of the wrong kind."""
    fixed = _fixed_output_count(op)
    if fixed is not None:
        return fixed
    args = output_args(op)
    if args is None:
        return None
    counts = [arg_count(arg, attrs) for arg in args]
    return None if None in counts else sum(counts)


@cache
def _fixed_output_count(op: str) -> int | None:
    """The output count of ``op`` when no attr decides it (most ops), else None."""
    args = output_args(op)
    if args is None or any(a.number_attr or a.type_list_attr for a in args):
        return None
    return len(args)


def arg_count(arg, attrs: dict) -> int | None:
    """How many tensors OpDef argument ``arg`` stands for on a node with ``attrs``:
    its ``number_attr``, the length of its ``type_list_attr``, else one; None when
    that attr is missing or of the wrong kind."""
    if arg.number_attr:
        value = attrs.get(arg.number_attr)
        ok = value is not None and value.WhichOneof("value") == "i"
        return value.i if ok else None
    if arg.type_list_attr:
        value = attrs.get(arg.type_list_attr)
        ok = value is not None and value.WhichOneof("value") == "list"
        return len(value.list.type) if ok else None
    return 1


def _required_count(arg, attrs: dict) -> int:
    """``arg_count`` of a node the caller expects to be well formed."""
    count = arg_count(arg, attrs)
    if count is None:
        raise KeyError(arg.number_attr or arg.type_list_attr)
    return count


def attrs_problem(op: str, attrs: dict) -> tuple[str, str] | None:
    """``(key, attr_problem)`` of the first attr (by key) of an ``op`` node with
    ``attrs`` that has a problem, or None: the check of every node a file holds,
    so the usual attr (a valid dtype, a shape, a tensor) is passed with one look."""
    dtype_attrs = _dtype_attrs(op)
    problems = []
    for key, value in attrs.items():
        kind = value.WhichOneof("value")
        wanted = dtype_attrs.get(key)
        if kind == "type":
            usable = wanted != "list(type)" and _is_dtype(value.type)
        elif kind == "list":
            usable = wanted != "type" and all(map(_is_dtype, value.list.type))
        else:  # a shape, a tensor, a string, ...: only a placeholder or a dtype attr's kind
            usable = kind != "placeholder" and wanted is None
        if not usable:
            problems.append((key, attr_problem(op, key, value)))
    return min(problems) if problems else None


def attr_problem(op: str, key: str, value) -> str | None:
    """What is wrong with attr ``key`` of an ``op`` node, for what TF's importer and the
    dialect assume of a graph (not a function body); None when it is usable."""
    kind = value.WhichOneof("value")
    if kind == "placeholder":
        return (f"is a function placeholder (${value.placeholder}), which only a function "
                "body may hold")
    if kind == "type" and not _is_dtype(value.type):
        return f"holds DataType {value.type}, which is not a TensorFlow dtype"
    if kind == "list":
        bad = [t for t in value.list.type if not _is_dtype(t)]
        if bad:
            return f"holds DataType {bad[0]}, which is not a TensorFlow dtype"
    wanted = _dtype_attrs(op).get(key)
    if wanted == "type" and kind != "type" or wanted == "list(type)" and kind != "list":
        return f"should hold a {wanted} but holds {kind or 'nothing'}"
    return None


@cache
def _dtype_attrs(op: str) -> dict[str, str]:
    """The OpDef's ``type`` and ``list(type)`` attrs of ``op``: name -> attr type."""
    definition = op_def(op)
    return {a.name: a.type for a in definition.attr if a.type in ("type", "list(type)")} \
        if definition else {}


@cache
def _is_dtype(enum: int) -> bool:
    from tensorflow.core.framework import types_pb2

    return enum != types_pb2.DT_INVALID and enum in types_pb2.DataType.values()


@cache
def _dtype_name(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(enum).base_dtype.name


def _dtype_enum(name: str) -> int:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(name).as_datatype_enum


class TFDialect(Dialect, ConditionalBuilder, TargetLowering):
    name = "tf"
    dependency_modes = ("control", "data")
    op_classes = {"matmul": MATMUL_OPS,
                  "conv": CONV_FORWARD_OPS | CONV_INPUT_GRAD_OPS | CONV_FILTER_GRAD_OPS,
                  "cheap": CHEAP_OPS}
    constant_folded_ops = frozenset({"Mul", "RealDiv", "Div"})
    #: TF's CPU allocator with oneDNN (a best-fit-with-coalescing allocator, as on
    #: GPUs) hands a request a whole free block up to twice its size and grows in
    #: doubling regions, so its peak exceeds the step's allocation records. Measured
    #: by ``tools/bench_planner.py`` (2026-12-01): up to 1.178x the records on the
    #: planner's own plans (MobileNetV2 96x96 b32 ``auto``: 156.8 against 133.1 MiB;
    #: its budget plans 1.04-1.16x, ResNet50's 1.02-1.05x, the transformer's
    #: 1.05-1.16x, the MLP's 1.00-1.11x); hand-written per-block marks on MobileNetV2
    #: reached 1.231x. Which blocks a step ends up in depends on every earlier
    #: request (the steps before it included); replaying the records through a
    #: model of the allocator came within -3%..+5% only under one guess of when the
    #: initial values are released, and up to 8-10% off under others, so an
    #: allowance is declared instead of a model (README, "The automatic planner").
    allocator_headroom = 0.18

    # -- structure ---------------------------------------------------------

    def is_back_edge(self, graph: Graph, src: str, dst: str) -> bool:
        return graph.node(src).op in LOOP_BACK_OPS

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
        definition = op_def(graph.node(name).op)
        return definition is None or definition.is_stateful

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
        """Keras optimizers' slot updates and learning-rate arithmetic (``Apply*`` ops
        hold theirs)."""
        if any(_APPLY_OP.match(graph.node(a).op) for a in applies):
            return set()
        from graphpass.dialects.tf_updates import update_math

        return update_math(graph, applies)

    def variable_dtype(self, graph: Graph, name: str) -> str | None:
        """A resource argument holds the dtype its handle data says (recorded as
        ``_handle_dtypes`` when the function body was read)."""
        node = graph.node(name)
        if node.op == "Placeholder" and "_handle_dtypes" in node.attrs:
            types = node.attrs["_handle_dtypes"].list.type
            return _dtype_name(types[0]) if types else None
        return self.get_attr(graph, name, "dtype")

    def in_function_body(self, graph: Graph) -> bool:
        return graph.meta.get("function") is not None

    def default_dependency(self, graph: Graph) -> str:
        """Data for a function body that XLA must compile (``jit_compile=True``:
        XLA ignores control edges), else control."""
        function = graph.meta.get("function")
        return "data" if function and function.get("xla_must_compile") else "control"

    def is_fetch(self, graph: Graph, name: str) -> bool:
        """A function result (``_Retval``), or an ``Identity`` only results read."""
        op = graph.node(name).op
        if op != "Identity":
            return op == "_Retval"
        users = graph.data_users(name)
        return bool(users) and all(self.is_fetch(graph, u) for u in users)

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

    def runtime_fed(self, graph: Graph) -> list[str]:
        """Placeholders without a default: ``Session.run`` copies a fed array into a
        tensor from TF's CPU allocator unless numpy's buffer happens to have
        Eigen's 64-byte alignment (large numpy arrays do not), and holds it until
        the call returns, however early its last reader runs."""
        return [n.name for n in graph.nodes()
                if n.op == "Placeholder" and self.get_attr(graph, n.name, "dtype") != "resource"]

    def is_shape_only(self, graph: Graph, name: str) -> bool:
        """Reads only the shape of its input (how TF seeds gradients from the loss)."""
        return graph.node(name).op in SHAPE_ONLY_OPS

    # -- runtime memory ----------------------------------------------------

    def schedule(self, graph: Graph, nodes: set[str] | None = None,
                 known: frozenset[str] = frozenset(), fetched: frozenset[str] = frozenset()
                 ) -> list[str]:
        """The executor's order with one inter-op thread (``executor.cc``) on the graph
        Grappler hands it (``GrapplerView``): a node's newly ready successors,
        data edges before control edges, go to its thread's inline queue if their
        kernel is inexpensive; of the expensive ones the last continues on this
        thread (when nothing inline waits) and the others are queued on the pool,
        whose owner thread takes its own work back newest first (Eigen's run queue).
        Roots (variable handles, constants) are taken as run first: TF interleaves
        them with the forward pass, but they allocate nothing, and an update that
        waits for its slot variable's handle would hold its gradient to the end."""
        nodes = set(graph) if nodes is None else nodes
        view = GrapplerView(graph, nodes, known, fetched,
                            lambda s, d: self.is_back_edge(graph, s, d),
                            lambda n: self.is_stateful(graph, n))
        view.optimize()
        order = executor_order(graph, nodes - view.bypassed, view.successors(),
                               lambda n: n in view.noop or graph.node(n).op in INLINE_OPS)
        return with_bypassed(graph, order, view.bypassed)

    def is_constant(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        if node.op in ("Const", "HostConst"):
            return True
        if node.op not in ("Shape", "ShapeN", "Size", "Rank"):
            return False
        shapes = [self.shape(graph, t) for t in graph.inputs(name)]
        return all(s is not None and None not in s for s in shapes)

    def is_foldable(self, graph: Graph, name: str) -> bool:
        return bool(graph.inputs(name)) and not self.is_stateful(graph, name) \
            and not self.is_source(graph, name)

    def output_alias(self, graph: Graph, name: str, port: int) -> int | None:
        op = graph.node(name).op
        if op == "IdentityN":
            return port
        if op == "Switch":
            return 0
        return 0 if op in ALIAS_OPS and port == 0 else None

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        node = graph.node(name)
        if node.op == "AddN":
            return tuple(range(len(graph.inputs(name))))
        return FORWARD_SLOTS.get(node.op, ())

    # -- training structure -------------------------------------------------

    def optimizer_applies(self, graph: Graph) -> dict[str, list[Tensor]]:
        """Apply ops (``ApplyAdam``, ``ResourceSparseApplyMomentum``, ...) -> gradients."""
        return self._applies(graph, strict=True)

    def applies_for(self, graph: Graph, train_ops: Sequence[str]) -> dict[str, list[Tensor]]:
        """With ``--train-op``, plain-op updates that apply no gradient found are left
        to the optimizer instead of reported."""
        return self._applies(graph, strict=not train_ops)

    def _applies(self, graph: Graph, strict: bool) -> dict[str, list[Tensor]]:
        applies = {}
        for node in graph.nodes():
            if _APPLY_OP.match(node.op) and op_def(node.op) is not None:
                inputs = graph.inputs(node.name)
                # The gradient is "grad", except for (Resource)ApplyGradientDescent's "delta".
                slots = self.input_arg_slots(graph, node.name, "grad") or \
                    self.input_arg_slots(graph, node.name, "delta")
                applies[node.name] = [inputs[s] for s in slots if s < len(inputs)]
        if applies:
            return applies
        from graphpass.dialects.tf_updates import plain_updates

        updates = plain_updates(graph, strict=strict)
        listed = graph.meta.get("signatures")
        if not updates and listed and "function" not in graph.meta:
            raise GraphpassError(
                "no signature of this SavedModel holds a training step (signatures: "
                f"{', '.join(s['signature'] for s in listed)}); export the train function "
                "as one (signatures={'train': module.train}) or name it with --signature")
        return updates

    def split_steps(self, graph: Graph, applies: dict[str, list[Tensor]]) -> list[list[str]]:
        """Plain-op updates by the gradient computation they read (``Apply*`` ops
        keep one step per train op, as v1 graphs always had)."""
        if not applies or any(_APPLY_OP.match(graph.node(a).op) for a in applies):
            return [list(applies)]
        from graphpass.dialects.tf_updates import gradient_steps

        return gradient_steps(graph, applies)

    def ends_train_step(self, graph: Graph, name: str) -> bool:
        op = graph.node(name).op
        if op == RESULT_OP:  # the step ends when the function returns: one train op
            return name == _first_result(graph)
        return op == "NoOp" or \
            op.startswith(("Assign", "ResourceScatter", "Scatter")) or bool(_APPLY_OP.match(op))

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
        from graphpass.dialects.tf_updates import step_increments

        return found + [pair for pair in step_increments(graph) if pair not in found]

    # -- tensors -----------------------------------------------------------

    def output_dtypes(self, graph: Graph, name: str) -> list[str] | None:
        """Dtype of every output, from the OpDef and the node's attrs."""
        node = graph.node(name)
        args = output_args(node.op)
        if args is None:
            return None
        dtypes: list[str] = []
        for arg in args:
            count = node.attrs[arg.number_attr].i if arg.number_attr else 1
            if arg.type_list_attr:
                dtypes.extend(_dtype_name(t) for t in node.attrs[arg.type_list_attr].list.type)
            elif arg.type_attr:
                dtypes.extend([_dtype_name(node.attrs[arg.type_attr].type)] * count)
            else:
                dtypes.extend([_dtype_name(arg.type)] * count)
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
            count = _required_count(arg, node.attrs)
            if arg.name == arg_name:
                return list(range(slot, slot + count))
            slot += count
        return []

    def infer_shapes(self, graph: Graph, nodes: list[str] | None = None) -> None:
        """TF's own shape inference: the graph, or only ``nodes`` and what they are
        computed from (a shape depends on nothing else), is imported into a
        ``tf.Graph`` and every output's shape recorded on its node. Copies and the
        small ops of this dialect record their shapes when built, so adding them
        needs no new inference."""
        _infer_shapes(graph, nodes=nodes)

    def batch_shape(self, graph: Graph, tensor: Tensor, batch_size: int) -> tuple | None:
        """The static shape when the placeholders' unknown batch dimension is
        ``batch_size``: TF's shape inference run again with it (once per graph and
        size), so a reshape to ``[-1, width]`` gets batch x tokens rows, not batch."""
        node = graph.node(tensor.node)
        if batch_size not in node.meta.get("batch_shapes", {}):
            _infer_shapes(graph, batch_size)
        shapes = node.meta["batch_shapes"][batch_size]
        return shapes[tensor.port] if tensor.port < len(shapes) else None

    def get_attr(self, graph: Graph, name: str, key: str, default: Any = None) -> Any:
        value = graph.node(name).attrs.get(key)
        if value is None:
            return default
        kind = value.WhichOneof("value")
        if kind == "s":
            return value.s.decode("utf-8", "replace")
        if kind == "type":
            return _dtype_name(value.type)
        if kind in ("i", "f", "b"):
            return getattr(value, kind)
        if kind == "list":
            return [s.decode("utf-8", "replace") for s in value.list.s] or list(value.list.i)
        return value

    def set_attr(self, graph: Graph, name: str, key: str, value: Any) -> None:
        graph.forget_source()
        graph.node(name).attrs[key] = _attr(value)

    # -- builders ----------------------------------------------------------

    def copy_node(self, graph: Graph, name: str, new_name: str) -> str:
        node = graph.node(name)
        copy = graph.add_node(new_name, node.op, attrs=node.attrs, device=node.device)
        for key in ("shapes", "batch_shapes"):  # same op, same inputs: same shapes
            if key in node.meta:
                copy.meta[key] = node.meta[key]
        return new_name

    def keep_as_written(self, graph: Graph, name: str) -> None:
        """``_grappler_do_not_remove`` puts the node in Grappler's preserve set, which
        the remapper's fusions (and the other optimizers) never rewrite or remove.

        Not in a function body: there the preserve set also stops rewrites Grappler
        makes to the function as exported (keeping the ``AddV2`` nodes of a Keras 3
        transformer's layer norms changed its weights in the last bit), so a kept
        original would compute differently, not as before (tests/test_tf2.py)."""
        if not self.in_function_body(graph):
            graph.forget_source()
            graph.node(name).attrs[DO_NOT_REWRITE_ATTR] = _attr(True)

    def _op(self, graph, name, op, inputs, control_inputs=(), device="", output_shapes=None,
            **attrs) -> Tensor:
        """Add one node; ``output_shapes`` (when known) is recorded as inference would."""
        name = graph.unique_name(name)
        node = graph.add_node(name, op, inputs, control_inputs,
                              attrs={k: _attr(v) for k, v in attrs.items()}, device=device)
        if output_shapes is not None:
            node.meta["shapes"] = output_shapes
        return Tensor(name, 0)

    def _device(self, graph: Graph, tensor: Tensor) -> str:
        return graph.node(tensor.node).device

    def identity(self, graph, name, tensor, control_inputs=()) -> Tensor:
        return self._op(graph, name, "Identity", [tensor], control_inputs,
                        device=self._device(graph, tensor), T=self._dt(graph, tensor),
                        output_shapes=_derived_shapes(graph, [tensor], _same_shape))

    def constant(self, graph: Graph, name: str, value, dtype: str, device: str = "") -> Tensor:
        from tensorflow.python.framework import tensor_util

        proto = tensor_util.make_tensor_proto(value, dtype=dtype)
        shape = tuple(d.size for d in proto.tensor_shape.dim)
        return self._op(graph, name, "Const", [], device=device, dtype=_DType(dtype),
                        value=_Raw(proto), output_shapes=[shape])

    def scalar(self, graph, name, value, dtype) -> Tensor:
        return self.constant(graph, name, value, dtype)

    def first_element(self, graph, name, tensor) -> Tensor:
        device = self._device(graph, tensor)
        dtype = self._dt(graph, tensor)
        flat = self._op(graph, f"{name}/flat", "Reshape",
                        [tensor, self.constant(graph, f"{name}/minus_one", [-1], "int32", device)],
                        device=device, T=dtype, Tshape=_DType("int32"),
                        output_shapes=_derived_shapes(graph, [tensor], _flat_shape))
        head = self._op(graph, f"{name}/head", "Slice",
                        [flat, self.constant(graph, f"{name}/begin", [0], "int32", device),
                         self.constant(graph, f"{name}/size", [1], "int32", device)],
                        device=device, T=dtype, Index=_DType("int32"), output_shapes=[(1,)])
        scalar_shape = self.constant(graph, f"{name}/scalar_shape", [], "int32", device)
        return self._op(graph, name, "Reshape", [head, scalar_shape], device=device,
                        T=dtype, Tshape=_DType("int32"), output_shapes=[()])

    def add_n(self, graph, name, tensors) -> Tensor:
        if len(tensors) == 1:
            return tensors[0]
        return self._op(graph, name, "AddN", tensors, device=self._device(graph, tensors[0]),
                        N=len(tensors), T=self._dt(graph, tensors[0]),
                        output_shapes=_derived_shapes(graph, tensors[:1], _same_shape))

    def cast(self, graph, name, tensor, dtype) -> Tensor:
        if self.dtype(graph, tensor) == dtype:
            return tensor
        return self._op(graph, name, "Cast", [tensor], device=self._device(graph, tensor),
                        SrcT=self._dt(graph, tensor), DstT=_DType(dtype), Truncate=False,
                        output_shapes=_derived_shapes(graph, [tensor], _same_shape))

    def binary(self, graph, name, op, a, b) -> Tensor:
        tf_op = {"add": "AddV2", "sub": "Sub", "mul": "Mul", "div": "RealDiv",
                 "less_equal": "LessEqual"}[op]
        return self._op(graph, name, tf_op, [a, b], device=self._device(graph, a),
                        T=self._dt(graph, a),
                        output_shapes=_derived_shapes(graph, [a, b], _broadcast_shape))

    def stop_gradient(self, graph, name, tensor) -> Tensor:
        return self._op(graph, name, "StopGradient", [tensor],
                        device=self._device(graph, tensor), T=self._dt(graph, tensor),
                        output_shapes=_derived_shapes(graph, [tensor], _same_shape))

    def noop(self, graph: Graph, name: str, control_inputs: list[str], device: str = "") -> str:
        return self._op(graph, name, "NoOp", [], control_inputs, device=device,
                        output_shapes=[]).node

    # -- variables, control flow, summaries (the stale-gradient pass) ----------

    def has_outputs(self, graph: Graph, name: str) -> bool:
        """Whether ``name`` produces a value (an ``AssignAdd`` does, its resource
        twin ``AssignAddVariableOp`` does not)."""
        return bool(self.output_dtypes(graph, name))

    def is_ref(self, graph: Graph, tensor: Tensor) -> bool:
        """A ref tensor (a ``VariableV2`` output, an ``Assign`` result): it aliases a
        variable's buffer and cannot cross a function boundary."""
        arg = _output_arg(graph, tensor)
        return arg is not None and arg.is_ref

    def frame_depths(self, graph: Graph) -> dict[str, int]:
        """How deep in v1 ``while_loop`` frames each node runs (0: the root frame).

        A node runs in its data inputs' frame, one deeper after an ``Enter``, one
        shallower after an ``Exit``; a node without data inputs runs in its control
        inputs' frame (a loop constant hangs on the loop's pivot). An edge between
        frames other than into an Enter is invalid, so passes adding control edges
        check both ends here.
        """
        depths: dict[str, int] = {}
        order = graph.topological_order(ignore_edge=lambda s, d: self.is_back_edge(graph, s, d))
        for name in order:
            sources = [t.node for t in graph.inputs(name)] or graph.control_inputs(name)
            src = next((s for s in sources if s in depths), None)  # not a loop back-edge
            depth = 0
            if src is not None:
                op = graph.node(src).op
                depth = depths[src] + (op in ("Enter", "RefEnter")) - (op in ("Exit", "RefExit"))
            depths[name] = max(depth, 0)
        return depths

    def is_resource_variable(self, graph: Graph, name: str) -> bool:
        return graph.node(name).op == "VarHandleOp" or self.is_variable(graph, name) and \
            graph.node(name).op == "Placeholder"

    def read_variable(self, graph: Graph, name: str, variable: str,
                      control_inputs: list[str] = (), device: str | None = None) -> Tensor:
        """The variable's current value: ``ReadVariableOp`` of a resource, ``Identity``
        of a ref variable (which may alias the buffer: add 0 to keep a snapshot)."""
        node = graph.node(variable)
        dtype = _DType(self.variable_dtype(graph, variable))
        device = node.device if device is None else device
        if self.is_resource_variable(graph, variable):
            return self._op(graph, name, "ReadVariableOp", [Tensor(variable, 0)], control_inputs,
                            device=device, dtype=dtype)
        return self._op(graph, name, "Identity", [Tensor(variable, 0)], control_inputs,
                        device=device, T=dtype)

    def resource_variable(self, graph: Graph, name: str, value: float, dtype: str,
                          device: str = "") -> ResourceVariable:
        """A scalar resource variable laid out as ``tf.compat.v1.get_variable`` does
        (``name``, ``name/Initializer/...``, ``name/Assign``, ``name/Read/ReadVariableOp``),
        so a ``VariableDef`` can describe it. Its initializer runs nowhere yet."""
        from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2

        handle = graph.unique_name(name)
        scalar = attr_value_pb2.AttrValue(shape=tensor_shape_pb2.TensorShapeProto())
        self._op(graph, handle, "VarHandleOp", [], device=device, dtype=_DType(dtype),
                 shape=scalar, shared_name=handle, container="")
        initial = self.constant(graph, f"{handle}/Initializer/value", value, dtype, device)
        assign = self._op(graph, f"{handle}/Assign", "AssignVariableOp",
                          [Tensor(handle, 0), initial], device=device, dtype=_DType(dtype)).node
        read = self.read_variable(graph, f"{handle}/Read/ReadVariableOp", handle)
        return ResourceVariable(handle, assign, read, initial)

    def assign_add_variable(self, graph: Graph, name: str, variable: str, value: Tensor,
                            control_inputs: list[str] = ()) -> str:
        """``variable += value`` for a resource variable; the op has no output."""
        return self._op(graph, name, "AssignAddVariableOp", [Tensor(variable, 0), value],
                        control_inputs, device=graph.node(variable).device,
                        dtype=self._dt(graph, value)).node

    def switch(self, graph: Graph, name: str, data: Tensor, pred: Tensor,
               device: str = "") -> tuple[Tensor, Tensor]:
        """v1 ``Switch``: ``(false output, true output)``; the untaken one is dead, and
        every node reading it (data or control) is dead too: it does not run."""
        switch = self._op(graph, name, "Switch", [data, pred], device=device,
                          T=self._dt(graph, data))
        return Tensor(switch.node, 0), Tensor(switch.node, 1)

    def merge(self, graph: Graph, name: str, tensors: list[Tensor], device: str = "") -> Tensor:
        """v1 ``Merge``: live as soon as one input is live (the end of a conditional)."""
        return self._op(graph, name, "Merge", tensors, device=device, N=len(tensors),
                        T=self._dt(graph, tensors[0]))

    def scalar_summary(self, graph: Graph, name: str, tag: str, value: Tensor) -> Tensor:
        tags = self.constant(graph, f"{name}/tags", tag, "string", self._device(graph, value))
        return self._op(graph, name, "ScalarSummary", [tags, value],
                        device=self._device(graph, value), T=self._dt(graph, value))

    def functional_if(self, graph: Graph, name: str, pred: Tensor,
                      branches: tuple[list[str], list[str]], results: tuple[float, float],
                      device: str = "") -> Tensor:
        """Move two sets of nodes into the then/else functions of one functional ``If``
        (see :func:`graphpass.formats.tf_library.functional_if`); returns its output."""
        from graphpass.formats import tf_library

        return tf_library.functional_if(self, graph, name, pred, branches, results, device)

    # -- target lowering -------------------------------------------------------

    def place(self, graph: Graph, names: list[str], device_type: str) -> bool:
        """Give ``names`` the device type where they have none (``tf_xla.place``)."""
        from graphpass.dialects import tf_xla

        return tf_xla.place(graph, names, device_type)

    def xla_unsupported(self, graph: Graph, names: list[str]) -> list[tuple[str, str]]:
        """``(node, op)`` of ``names`` without an XLA kernel (``tf_xla.xla_unsupported``)."""
        from graphpass.dialects import tf_xla

        return tf_xla.xla_unsupported(graph, names)

    # -- MetaGraphDef collections ---------------------------------------------

    def register_global_variable(self, graph: Graph, variable: ResourceVariable) -> bool:
        """List a pass-made variable in the MetaGraphDef's global variables collection
        (non-trainable); False for a bare GraphDef. Savers are left alone."""
        from graphpass.formats import tf_library

        return tf_library.register_global_variable(graph, variable)

    def add_to_collection(self, graph: Graph, key: str, tensor: Tensor) -> bool:
        """Add a tensor to a MetaGraphDef node-list collection (``summaries``)."""
        from graphpass.formats import tf_library

        return tf_library.add_to_collection(graph, key, tensor)

    def _dt(self, graph: Graph, tensor: Tensor) -> _DType:
        dtype = self.dtype(graph, tensor)
        if dtype is None:
            raise ValueError(f"cannot tell the dtype of {tensor}")
        return _DType(dtype)


class ResourceVariable(NamedTuple):
    """The nodes of a variable a pass created (names as ``get_variable`` gives them)."""

    handle: str
    initializer: str
    read: Tensor
    initial_value: Tensor


def _output_arg(graph: Graph, tensor: Tensor):
    """The OpDef output argument that output ``tensor.port`` belongs to, and its index in
    it, or None for unknown ops."""
    located = _locate_output(graph, tensor)
    return located[0] if located else None


def _first_result(graph: Graph) -> str | None:
    """The function's result with the lowest index: it stands for all of them (they
    all wait for the step), so a step returning its loss and metrics is one train op."""
    results = [n for n in graph.nodes() if n.op == RESULT_OP]
    return min(results, key=lambda n: n.attrs["index"].i).name if results else None


def output_arg_sizes(node) -> list[tuple[Any, int]] | None:
    """``(OpDef output argument, number of tensors)`` for each output argument of a
    node's registered op, or None for unknown ops."""
    args = output_args(node.op)
    if args is None:
        return None
    return [(arg, _required_count(arg, node.attrs)) for arg in args]


def _locate_output(graph: Graph, tensor: Tensor):
    start = 0
    for arg, count in output_arg_sizes(graph.node(tensor.node)) or ():
        if tensor.port < start + count:
            return arg, tensor.port - start
        start += count
    return None


def _derived_shapes(graph: Graph, inputs: list[Tensor], rule) -> list | None:
    """``[rule(*input shapes)]`` when inference already recorded every input's shape;
    else None, and the new node is inferred with the whole graph when first asked."""
    shapes = []
    for tensor in inputs:
        recorded = graph.node(tensor.node).meta.get("shapes")
        if recorded is None:
            return None
        shapes.append(recorded[tensor.port] if tensor.port < len(recorded) else None)
    return [rule(*shapes)]


def _same_shape(shape: tuple | None) -> tuple | None:
    return shape


def _flat_shape(shape: tuple | None) -> tuple | None:
    """``Reshape(x, [-1])``."""
    if shape is None or any(d is None for d in shape):
        return (None,)
    size = 1
    for d in shape:
        size *= d
    return (size,)


def _broadcast_shape(a: tuple | None, b: tuple | None) -> tuple | None:
    """numpy broadcasting of two static shapes (None where a dim cannot be told)."""
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    dims = []
    for x, y in zip(a, b):
        if x == 1 or x == y:
            dims.append(y)
        elif y == 1:
            dims.append(x)
        else:
            dims.append(None)
    return tuple(dims)


def _infer_shapes(graph: Graph, batch_size: int | None = None,
                  nodes: list[str] | None = None) -> None:
    """TF's shape inference over the whole graph, recorded per node in ``meta["shapes"]``
    or, with ``batch_size`` (placeholders' unknown first dimension set to it), in
    ``meta["batch_shapes"][batch_size]``; with ``nodes``, over them and their data
    ancestors alone (control edges order, they decide no shape), recorded on
    ``nodes`` alone: reading an op's shapes back into Python is most of the cost,
    and loss detection's 1.7k candidates have a 20k-node upstream.

    Only TF's C importer runs (it infers each node's shapes as it adds the
    node): ``import_graph_def`` also builds colocation, device and control-flow
    data in Python for every op, which was three quarters of its time and
    decides no shape (tools/bench_scale.py).
    """
    wanted = None if nodes is None else set(nodes)
    upstream = None if wanted is None else graph.ancestors(wanted, follow_control=False) | wanted
    data = _serialized_graph_def(graph, batch_size, upstream)
    record_shapes(graph, imported_shapes(data, wanted), batch_size, wanted)


def record_shapes(graph: Graph, shapes: dict[str, list], batch_size: int | None = None,
                  only: set[str] | None = None) -> None:
    """``imported_shapes``'s result on the nodes (``only`` those, if given)."""
    for node in graph.nodes() if only is None else map(graph.node, only):
        inferred = _with_recorded_shapes(node, shapes.get(node.name, []))
        if batch_size is None:
            node.meta["shapes"] = inferred
        else:
            node.meta.setdefault("batch_shapes", {})[batch_size] = inferred


def _serialized_graph_def(graph: Graph, batch_size: int | None,
                          only: set[str] | None = None) -> bytes:
    """The graph lowered to a GraphDef (``only`` its nodes in that set, without
    control inputs), as the bytes TF's importer reads; the proto itself is gone
    before the import starts (it was a tenth of the peak memory of a 150k-node
    rewrite). A graph still as read serializes the GraphDef it was read from
    (``Graph.source``; lowering gives the same nodes: the round trip is
    lossless), a fifth of the time of shape inference."""
    from graphpass.formats.tf_io import graph_def_from_graph

    graph_def = graph.source()
    if graph_def is None:
        graph_def = graph_def_from_graph(graph)
    elif only is None and batch_size is not None:
        graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    if only is not None:
        graph_def = _data_subgraph(graph_def, only)  # a new proto: the source stays as read
    if batch_size is not None:
        for node in graph_def.node:
            dims = node.attr["shape"].shape.dim if node.op.startswith("Placeholder") else []
            if dims and dims[0].size < 0:
                dims[0].size = batch_size
    return graph_def.SerializeToString()


def _data_subgraph(graph_def, names: set[str]):
    """A new GraphDef of the nodes of ``graph_def`` in ``names`` (closed under data
    inputs), their control inputs dropped; versions and library kept."""
    subgraph = type(graph_def)()
    for field in ("versions", "library"):
        if graph_def.HasField(field):
            getattr(subgraph, field).CopyFrom(getattr(graph_def, field))
    for node_def in graph_def.node:
        if node_def.name in names:
            kept = subgraph.node.add()
            kept.CopyFrom(node_def)
            if any(t.startswith("^") for t in kept.input):
                data_inputs = [t for t in kept.input if not t.startswith("^")]
                del kept.input[:]
                kept.input.extend(data_inputs)
    return subgraph


def imported_shapes(data: bytes, wanted: set[str] | None = None) -> dict[str, list]:
    """Output shapes by node name of the GraphDef ``data`` (of its nodes in
    ``wanted`` alone, if given), from TF's C importer (none for the nodes it
    could not take).

    Each op is read through a Python ``Operation`` that is never registered with
    the ``tf.Graph`` (``Operation._from_c_op`` registers it, and colocation,
    device and control-flow data with it), so it dies once its shapes are read:
    the registered ops were a quarter of a 150k-node rewrite's peak memory, and
    freeing them (graph <-> op cycles) a cyclic-GC pass over all of them. An op
    and its output tensors still refer to each other, so they are collected a
    batch at a time (``_SHAPE_BATCH``) with the full collector paused.
    """
    import tensorflow as tf
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.framework import ops

    tf_graph = tf.Graph()
    options = c_api.TF_NewImportGraphDefOptions()
    buffer = c_api.TF_NewBufferFromString(data)
    del data  # the buffer holds a copy
    shapes: dict[str, list] = {}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with tf_graph._c_graph.get() as c_graph:
            c_api.TF_DeleteImportGraphDefResults(
                c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer, options))
        c_api.TF_DeleteBuffer(buffer)
        buffer = None
        c_ops = tf_graph.new_operations()
        if wanted is not None:
            c_ops = [c_op for c_op in c_ops if c_api.TF_OperationName(c_op) in wanted]
        for count, c_op in enumerate(c_ops, 1):
            name, found = _op_shapes(ops, tf_graph, c_op)
            shapes[name] = found
            if count % _SHAPE_BATCH == 0:
                gc.collect(0)
        gc.collect(0)
    except (ValueError, TypeError, tf.errors.OpError):
        pass  # custom ops or broken inputs: shapes stay unknown
    finally:
        if was_enabled:
            gc.enable()
        if buffer is not None:
            c_api.TF_DeleteBuffer(buffer)
        c_api.TF_DeleteImportGraphDefOptions(options)
    return shapes


def _op_shapes(ops, tf_graph, c_op) -> tuple[str, list]:
    """``c_op``'s name and output shapes, through an unregistered ``Operation``."""
    op = ops.Operation(c_op, ops.SymbolicTensor)
    op.graph = tf_graph
    op._init_outputs()
    return op.name, [None if unknown_rank else tuple(dims)
                     for dims, unknown_rank in (t._shape for t in op.outputs)]


def shape_tuple(proto) -> tuple | None:
    """A TensorShapeProto as a tuple (None for unknown dims), None for unknown rank."""
    if proto.unknown_rank:
        return None
    return tuple(d.size if d.size >= 0 else None for d in proto.dim)


def _with_recorded_shapes(node, inferred: list) -> list:
    """Inferred shapes, or where inference cannot tell (a variable read inside a
    function body, whose resource argument carries no shape here) the shapes the
    exporter recorded in ``_output_shapes``."""
    recorded = node.attrs.get("_output_shapes")
    if recorded is None or len(recorded.list.shape) != len(inferred):
        return inferred
    return [shape if shape is not None and None not in shape else shape_tuple(proto) or shape
            for shape, proto in zip(inferred, recorded.list.shape)]


class _DType(str):
    """Marks a string attr value as a dtype."""


class _TypeList(list):
    """Marks a list of dtype names as a ``list(type)`` attr value."""


class _Func(str):
    """Marks a string as a function name (``func`` attr)."""


class _Raw:
    """Wraps a proto (TensorProto) to store as an attr as-is."""

    def __init__(self, proto) -> None:
        self.proto = proto


def _attr(value: Any):
    """A Python value as a TF ``AttrValue``."""
    from tensorflow.core.framework import attr_value_pb2

    if isinstance(value, attr_value_pb2.AttrValue):
        return value
    if isinstance(value, _DType):
        return attr_value_pb2.AttrValue(type=_dtype_enum(str(value)))
    if isinstance(value, _Raw):
        return attr_value_pb2.AttrValue(tensor=value.proto)
    if isinstance(value, _TypeList):
        return attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(type=[_dtype_enum(t) for t in value]))
    if isinstance(value, _Func):
        return attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=str(value)))
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, float):
        return attr_value_pb2.AttrValue(f=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(s=[v.encode() for v in value]))
    raise TypeError(f"cannot store {value!r} as a TF attr")


#: Ops Grappler's dependency optimizer bypasses (``IsIdentity``, ``IsNoOp``).
BYPASSED_OPS = frozenset({"Identity", "RefIdentity", "NoOp"})
#: Inputs an Identity is never bypassed after (``SafeToRemoveIdentity``: variable reads).
_NOT_BYPASSED_AFTER = VARIABLE_OPS | {"ReadVariableOp", "_Recv", "_HostRecv", "Switch",
                                      "RefSwitch"}


class GrapplerView:
    """The dependencies of ``nodes`` after Grappler's rewrites that move work in time:

    * ``known`` nodes (stored and folded values) wait for nothing: constant folding
      makes them constants, which run first, so the dependency optimizer prunes
      control edges into and out of them;
    * a control input that another input already implies is dropped (transitive
      reduction);
    * a stateless node whose outputs no one reads becomes a NoOp (its data inputs
      control inputs), as the dependency optimizer's ``SafeToConvertToNoOp`` does;
    * NoOp and Identity nodes are bypassed when fan-in x fan-out <= fan-in +
      fan-out (``BypassingNodeIsBeneficial``; never a fetched node or an Identity
      after a variable read): their users read their input directly and wait on
      their control inputs (``bypassed``: out of the executor's graph).

    Conversion and bypass repeat until nothing changes, as the optimizer's work
    list does.
    """

    def __init__(self, graph: Graph, nodes: set[str], known: frozenset[str],
                 fetched: frozenset[str], is_back_edge: Callable[[str, str], bool],
                 is_stateful: Callable[[str], bool]) -> None:
        self.fetched, self.known = fetched, known
        self.members = [n for n in graph if n in nodes]
        self.ops = {n: graph.node(n).op for n in self.members}
        # What a sweep may convert: fixed by the op alone (stateless, not bypassed
        # itself) and not fetched; converted nodes join what may be bypassed.
        self.stateless = {n for n in self.members if n not in fetched and
                          self.ops[n] not in BYPASSED_OPS and not is_stateful(n)}
        self.position = {n: i for i, n in enumerate(self.members)}
        self.inputs: dict[str, list[tuple[str, bool]]] = {}
        self.users: dict[str, set[str]] = {n: set() for n in self.members}
        self.noop: set[str] = set()
        self.bypassed: set[str] = set()
        for name in self.members:
            data, control = ([], []) if name in known else graph.input_nodes(name)
            entries = [(p, False) for p in data] + [(c, True) for c in control]
            self.inputs[name] = [(p, c) for p, c in entries if p in nodes and not
                                 is_back_edge(p, name) and not (c and p in known)]
            for producer, _ in self.inputs[name]:
                self.users[producer].add(name)

    def successors(self) -> dict[str, list[str]]:
        """Each node's successors after the rewrites: data successors before control
        successors (the executor propagates data edges first), each in graph order."""
        members = [n for n in self.members if n not in self.bypassed]
        data: dict[str, list[str]] = {n: [] for n in members}
        control: dict[str, list[str]] = {n: [] for n in members}
        for name in members:
            entries = self.inputs[name]
            readers = {p for p, is_control in entries if not is_control}
            for producer in dict.fromkeys(p for p, _ in entries):
                (data if producer in readers else control)[producer].append(name)
        return {n: data[n] + control[n] for n in members}

    def optimize(self, rounds: int = 8) -> None:
        """The dependency optimizer as the meta optimizer runs it (twice): drop control
        inputs other inputs imply, then convert and bypass until nothing changes (at
        most ``rounds`` sweeps). A sweep visits only the nodes whose op allows a
        change, in graph order."""
        sweep = [n for n in self.members if n in self.stateless or
                 (n not in self.fetched and self.ops[n] in BYPASSED_OPS)]
        for _ in range(2):
            self._reduce()
            for _ in range(rounds):
                changed = False
                for name in sweep:
                    if self._convertible(name):
                        self.noop.add(name)
                        self.inputs[name] = [(p, True) for p in dict.fromkeys(
                            p for p, _ in self.inputs[name]) if p not in self.known]
                        changed = True
                    if self._bypassable(name):
                        self._bypass(name)
                        changed = True
                if not changed:
                    break

    def _reduce(self) -> None:
        """Drop each control input that another input already depends on
        (``DependencyOptimizer::TransitiveReduction``), with ancestor bitsets.
        A producer is no ancestor of itself (the graph is acyclic), so "an ancestor
        of another input" is "in the union of the inputs' ancestors": one union
        per node, not one test per pair of inputs (quadratic in a train op's
        hundreds of control inputs). A node's bit is made when used and its
        ancestors are dropped once its last reader is done: kept, the bitsets of a
        150k-node graph took 1.4 GB (each as long as the graph is)."""
        position = self.position
        readers = Counter(p for n in self.members
                          for p in dict.fromkeys(q for q, _ in self.inputs[n]))
        ancestors: dict[str, int] = {}
        for name in self._topological():
            entries = self.inputs[name]
            producers = dict.fromkeys(p for p, _ in entries)
            implied = 0
            for producer in producers:
                implied |= ancestors[producer]
            mask = implied
            for producer in producers:
                mask |= 1 << position[producer]
                readers[producer] -= 1
                if not readers[producer]:
                    del ancestors[producer]
            if readers[name]:
                ancestors[name] = mask
            if not any(c for _, c in entries):
                continue
            kept = []
            for producer, is_control in entries:
                if is_control and implied >> position[producer] & 1:
                    self.users[producer].discard(name)
                    continue
                kept.append((producer, is_control))
            self.inputs[name] = kept

    def _topological(self) -> list[str]:
        pending = {n: len(dict.fromkeys(p for p, _ in self.inputs[n])) for n in self.members}
        ready = [n for n in self.members if not pending[n]]
        order = []
        while ready:
            name = ready.pop()
            order.append(name)
            for user in self.users[name]:
                pending[user] -= 1
                if not pending[user]:
                    ready.append(user)
        return order

    def _op(self, name: str) -> str:
        return "NoOp" if name in self.noop else self.ops[name]

    def _convertible(self, name: str) -> bool:
        if name not in self.stateless or name in self.noop or not self.users[name]:
            return False
        return all((name, False) not in self.inputs[u] for u in self.users[name])

    def _bypassable(self, name: str) -> bool:
        op, entries, users = self._op(name), self.inputs[name], self.users[name]
        if op not in BYPASSED_OPS or name in self.fetched or not users:
            return False
        if op != "NoOp" and (not entries or entries[0][1] or
                             self.ops[entries[0][0]] in _NOT_BYPASSED_AFTER):
            return False
        return len(entries) * len(users) <= len(entries) + len(users)

    def _bypass(self, name: str) -> None:
        """Rewire ``name``'s users to its inputs (``DependencyOptimizer::OptimizeNode``)."""
        entries = self.inputs[name]
        forwarded = None if self._op(name) == "NoOp" else entries[0][0]
        for user in sorted(self.users[name], key=self.position.__getitem__):
            rewired = []
            for producer, is_control in self.inputs[user]:
                if producer != name:
                    rewired.append((producer, is_control))
                elif forwarded is not None:
                    rewired.append((forwarded, is_control))
            present = {p for p, _ in rewired}
            for producer, _ in entries:
                if producer not in present:
                    rewired.append((producer, True))
                    present.add(producer)
                self.users[producer].add(user)
            self.inputs[user] = rewired
        for producer, _ in entries:
            self.users[producer].discard(name)
        self.inputs[name], self.users[name] = [], set()
        self.bypassed.add(name)


def with_bypassed(graph: Graph, order: list[str], bypassed: set[str]) -> list[str]:
    """``order`` with each bypassed node (``GrapplerView``) right after the last of its
    inputs: out of the executor's graph, it stands for its input's value (an Identity
    aliases it) as soon as that exists."""
    index = {n: i for i, n in enumerate(order)}
    place: dict[str, tuple[int, int]] = {}  # bypassed node -> (position after, depth)

    def placed(name: str) -> tuple[int, int]:
        if name not in place:
            spots = [(index[p], 0) if p in index else placed(p)
                     for p in graph.producers(name) if p in index or p in bypassed]
            after, depth = max(spots, default=(-1, 0))
            place[name] = (after, depth + 1)
        return place[name]

    position = {n: i for i, n in enumerate(graph) if n in bypassed}
    extra: dict[int, list[str]] = {}
    for name in sorted(bypassed, key=lambda n: (placed(n)[1], position[n])):
        extra.setdefault(place[name][0], []).append(name)
    merged = extra.get(-1, [])
    for i, name in enumerate(order):
        merged.append(name)
        merged.extend(extra.get(i, ()))
    return merged


def executor_order(graph: Graph, nodes: set[str], successors: dict[str, list[str]],
                   inline: Callable[[str], bool]) -> list[str]:
    """Simulate TF's executor on ``nodes`` with one inter-op thread (see
    ``TFDialect.schedule``); ``inline(n)``: n's kernel is inexpensive."""
    from collections import deque

    pending = dict.fromkeys(nodes, 0)
    for users in successors.values():
        for user in users:
            pending[user] += 1
    pool: deque[str] = deque()
    ready = deque(n for n in graph if n in nodes and pending[n] == 0)
    order: list[str] = []
    while ready or pool:
        if not ready:
            ready.append(pool.popleft())
        while ready:
            name = ready.popleft()
            order.append(name)
            expensive = None
            for user in successors[name]:
                pending[user] -= 1
                if pending[user]:
                    continue
                if inline(user):
                    ready.append(user)
                    continue
                if expensive is not None:
                    pool.appendleft(expensive)
                expensive = user
            if expensive is not None:
                if ready:
                    pool.appendleft(expensive)
                else:
                    ready.append(expensive)
    return order
