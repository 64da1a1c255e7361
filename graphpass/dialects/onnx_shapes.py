"""What is known of an ONNX tensor before running the model: its dtype and static
shape (from ``onnx.shape_inference``, recorded on the node), and its value when
an initializer or ``Constant`` holds it.

Inference runs over the whole model (it takes a model, not a subgraph) and
records each node's output ``meta["dtypes"]`` / ``meta["shapes"]``, as torch.fx
records shape metadata; the readers here only read what was recorded. Nothing
here adds, removes or rewires a node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphpass.dialects.onnx_ops import dtype_name
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_io import model_from_graph
from graphpass.formats.onnx_order import INITIALIZER
from graphpass.formats.ort_artifacts import GRADIENT_SUFFIX
from graphpass.ir.graph import Tensor

if TYPE_CHECKING:
    from graphpass.ir.graph import Graph


def inferred(graph: Graph, tensor: Tensor, key: str):
    """What inference (or a builder) recorded for ``tensor`` under ``key``
    (``"dtypes"`` or ``"shapes"``), None if nothing was."""
    values = graph.node(tensor.node).meta.get(key) or []
    return values[tensor.port] if tensor.port < len(values) else None


def tensor_shape(graph: Graph, tensor: Tensor) -> tuple | None:
    """The recorded static shape (None for unknown dims; None if the rank is unknown)."""
    return inferred(graph, tensor, "shapes")


def tensor_dtype(graph: Graph, tensor: Tensor) -> str | None:
    return inferred(graph, tensor, "dtypes")


def constant_value(graph: Graph, tensor: Tensor) -> Any:
    """The numpy value of an initializer or ``Constant`` output, else None."""
    from onnx import numpy_helper

    node = graph.node(tensor.node)
    if node.op == INITIALIZER:
        proto = graph.format_state.initializers.get(node.outputs[0])
        if proto is not None and proto.data_location != proto.EXTERNAL:
            return numpy_helper.to_array(proto)
    if node.op == "Constant" and "value" in node.attrs:
        return numpy_helper.to_array(node.attrs["value"].t)
    return None


def record_type(graph: Graph, tensor: Tensor, dtype: str | None, shape: tuple) -> None:
    """Record a built node's output type as shape inference would."""
    node = graph.node(tensor.node)
    node.meta["dtypes"], node.meta["shapes"] = [dtype], [tuple(shape)]


def broadcast(a: tuple, b: tuple) -> tuple:
    """Numpy-style broadcast of two static shapes (unknown dims stay None)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def infer_types(graph: Graph) -> None:
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
    for name, tensor in graph.format_state.initializers.items():
        types[name] = (dtype_name(tensor.data_type), tuple(tensor.dims))
    if model is not None:
        _training_types(model.graph.node, types)
    for node in graph.nodes():
        known = [types.get(v, (None, None)) for v in node.outputs]
        node.meta["dtypes"] = [dtype for dtype, _ in known]
        node.meta["shapes"] = [shape for _, shape in known]


#: onnxruntime training ops outside ONNX's schemas -> {output port: the input port
#: whose type it has} (ORT's own schemas: ``Scale`` keeps its input's type;
#: ``BatchNormInternal``'s saved and running statistics are per channel, like its scale).
TRAINING_OP_TYPES = {"Scale": {0: 0}, "BatchNormInternal": {0: 0, 1: 1, 2: 1, 3: 1, 4: 1}}


def _training_types(nodes, types: dict) -> None:
    """Types ONNX shape inference leaves unknown in onnxruntime's training graphs: a
    gradient ``v_grad`` has ``v``'s type (any ``*Grad`` op), and the ops of
    ``TRAINING_OP_TYPES`` their inputs'. onnxruntime's symbolic shape inference knows
    none of the gradient ops, so it cannot serve here."""
    for node in nodes:
        same_as = TRAINING_OP_TYPES.get(node.op_type, {}) if node.domain == "com.microsoft" \
            else {}
        for port, value in enumerate(node.output):
            if not value or types.get(value, (None, None))[1] is not None:
                continue
            source = value[:-len(GRADIENT_SUFFIX)] if value.endswith(GRADIENT_SUFFIX) else None
            if port in same_as and same_as[port] < len(node.input):
                source = node.input[same_as[port]]
            if source is not None and types.get(source, (None, None))[1] is not None:
                types[value] = types[source]


def _type_of(type_proto) -> tuple[str | None, tuple | None]:
    if type_proto.WhichOneof("value") != "tensor_type":
        return None, None
    tensor_type = type_proto.tensor_type
    dtype = dtype_name(tensor_type.elem_type) if tensor_type.elem_type else None
    if not tensor_type.HasField("shape"):
        return dtype, None
    return dtype, tuple(d.dim_value if d.HasField("dim_value") else None
                        for d in tensor_type.shape.dim)
