"""TF's op table: op kinds, OpDef lookups, dtype names and attr checks.

A leaf: it imports nothing of graphpass but the IR and errors, so formats (the
readers and writers) and the dialect both read TF's op knowledge from here. It
must not know passes, analyses, builders or TF's runtime (``graphpass.runtimes``).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any, NamedTuple

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
#: Grappler keeps nodes with this attr (true) as they are (its "preserve set").
DO_NOT_REWRITE_ATTR = "_grappler_do_not_remove"
APPLY_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]")
#: Kernels that read a resource variable, change it and write it back in place
#: (``PrepareToUpdateVariable``): they copy it first where another tensor still holds
#: its buffer. Sparse updates and ``AssignVariableOp`` take other paths.
READ_MODIFY_WRITE_OP = re.compile(r"^(ResourceApply[A-Z]\w*|Assign(Add|Sub)VariableOp)$")
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
#: Ops that restore a checkpoint (a Saver's restore op assigns their values).
RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})


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


def required_count(arg, attrs: dict) -> int:
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
    problems = [(key, "is missing, and the op has no default for it")
                for key in _required_attrs(op) if key not in attrs]
    for key, value in attrs.items():
        kind = value.WhichOneof("value")
        wanted = dtype_attrs.get(key)
        if kind == "type":
            usable = wanted != "list(type)" and is_dtype(value.type) \
                and value.type in _allowed_dtypes(op).get(key, (value.type,))
        elif kind == "list":
            usable = wanted != "type" and all(map(is_dtype, value.list.type))
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
    if kind == "type" and not is_dtype(value.type):
        return f"holds DataType {value.type}, which is not a TensorFlow dtype"
    allowed = _allowed_dtypes(op).get(key)
    if kind == "type" and allowed is not None and value.type not in allowed:
        from tensorflow.core.framework import types_pb2

        names = sorted(map(types_pb2.DataType.Name, allowed))
        listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return (f"holds {types_pb2.DataType.Name(value.type)}, which {op} does not take "
                f"(it takes {listed})")
    if kind == "list":
        bad = [t for t in value.list.type if not is_dtype(t)]
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
def _allowed_dtypes(op: str) -> dict[str, frozenset[int]]:
    """The OpDef's ``type`` attrs that allow only some dtypes: name -> those dtypes
    (TF's importer refuses a node holding another)."""
    definition = op_def(op)
    if not definition:
        return {}
    return {a.name: frozenset(a.allowed_values.list.type) for a in definition.attr
            if a.type == "type" and a.allowed_values.list.type}


@cache
def _required_attrs(op: str) -> tuple[str, ...]:
    """The OpDef's attrs without a default value: a node of ``op`` must hold each."""
    definition = op_def(op)
    return tuple(a.name for a in definition.attr if not a.HasField("default_value")) \
        if definition else ()


@cache
def is_dtype(enum: int) -> bool:
    from tensorflow.core.framework import types_pb2

    return enum != types_pb2.DT_INVALID and enum in types_pb2.DataType.values()


@cache
def dtype_name(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(enum).base_dtype.name


def dtype_enum(name: str) -> int:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(name).as_datatype_enum


def output_arg(graph: Graph, tensor: Tensor):
    """The OpDef output argument that output ``tensor.port`` belongs to, and its index in
    it, or None for unknown ops."""
    located = locate_output(graph, tensor)
    return located[0] if located else None



def output_arg_sizes(node) -> list[tuple[Any, int]] | None:
    """``(OpDef output argument, number of tensors)`` for each output argument of a
    node's registered op, or None for unknown ops."""
    args = output_args(node.op)
    if args is None:
        return None
    return [(arg, required_count(arg, node.attrs)) for arg in args]


def locate_output(graph: Graph, tensor: Tensor):
    """``(OpDef output argument, index in it)`` of output ``tensor.port``, or None for
    unknown ops."""
    start = 0
    for arg, count in output_arg_sizes(graph.node(tensor.node)) or ():
        if tensor.port < start + count:
            return arg, tensor.port - start
        start += count
    return None


def shape_tuple(proto) -> tuple | None:
    """A TensorShapeProto as a tuple (None for unknown dims), None for unknown rank."""
    if proto.unknown_rank:
        return None
    return tuple(d.size if d.size >= 0 else None for d in proto.dim)


class DType(str):
    """Marks a string attr value as a dtype."""


class TypeList(list):
    """Marks a list of dtype names as a ``list(type)`` attr value."""


class Func(str):
    """Marks a string as a function name (``func`` attr)."""


class Raw:
    """Wraps a proto (TensorProto) to store as an attr as-is."""

    def __init__(self, proto) -> None:
        self.proto = proto


def attr_value(value: Any):
    """A Python value as a TF ``AttrValue``."""
    from tensorflow.core.framework import attr_value_pb2

    if isinstance(value, attr_value_pb2.AttrValue):
        return value
    if isinstance(value, DType):
        return attr_value_pb2.AttrValue(type=dtype_enum(str(value)))
    if isinstance(value, Raw):
        return attr_value_pb2.AttrValue(tensor=value.proto)
    if isinstance(value, TypeList):
        return attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(type=[dtype_enum(t) for t in value]))
    if isinstance(value, Func):
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

