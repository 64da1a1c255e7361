"""The ONNX op table: which ops are random, control flow, shape-only, aliasing,
in-place or cheap, the cost model's op classes, dtype names and the opset a
model imports.

A leaf: constants and look-ups over op names, dtype enums and a model's opset
imports. It builds nothing, infers nothing and imports nothing of graphpass but
the IR and the errors, so formats may import it (never the dialect class).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from graphpass.errors import GraphpassError

if TYPE_CHECKING:
    from graphpass.ir.graph import Graph

DEFAULT_DOMAINS = ("", "ai.onnx")
# get_attr/set_attr keys with this prefix are node annotations (metadata_props).
ANNOTATION_PREFIX = "_"
# Ops whose output is random on every run (never recomputed: the copy would differ).
#: onnxruntime's ``com.microsoft`` ops that compute their outputs from their inputs
#: alone (no state, no randomness), so copies compute what the originals did:
#: the forward ops exporters and ORT's own transformers write (torch's ``Gelu``).
PURE_MS_OPS = frozenset({
    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "FusedMatMul", "FusedGemm", "BiasAdd",
    "SkipLayerNormalization", "Scale",
})
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
        name = dtype_name(enum)
        if name is not None:
            names.setdefault(name, enum)
    return names


@cache
def dtype_name(enum: int) -> str | None:
    """The numpy-style dtype name of an ONNX element type (None where numpy has none)."""
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_np_dtype(enum).name
    except (KeyError, ValueError, TypeError):  # UNDEFINED, STRING, new float8 kinds, ...
        return None


def tensor_type(type_proto) -> tuple[str | None, tuple | None]:
    """``(dtype name, dims)`` of an ONNX ``TypeProto``; None for what it leaves
    unknown (a dim without a value is None), ``(None, None)`` for a non-tensor."""
    if type_proto.WhichOneof("value") != "tensor_type":
        return None, None
    tensor = type_proto.tensor_type
    dtype = dtype_name(tensor.elem_type) if tensor.elem_type else None
    if not tensor.HasField("shape"):
        return dtype, None
    return dtype, tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)


def dtype_enum(name: str) -> int:
    """The ONNX element type for a numpy-style dtype name ("float32" -> FLOAT)."""
    try:
        return _dtype_enums()[name]
    except KeyError:
        raise GraphpassError(f"no ONNX element type for dtype {name!r}") from None


def has_schema(node) -> bool:
    """Whether ONNX knows ``node``'s op (a standard op, or one of an ONNX-defined domain)."""
    import onnx

    return onnx.defs.has(node.op, node.domain if node.domain != "ai.onnx" else "")


def opset(graph: Graph, domain: str = "") -> int:
    """The opset version the model imports for ``domain`` (0 if none)."""
    for entry in graph.format_state.model.opset_import:
        if entry.domain in ((domain,) if domain else DEFAULT_DOMAINS):
            return entry.version
    return 0
