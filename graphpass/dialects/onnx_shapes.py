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
from weakref import WeakKeyDictionary

from graphpass.dialects.onnx_ops import dtype_name, tensor_type
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_io import model_from_graph
from graphpass.formats.onnx_order import INITIALIZER
from graphpass.formats.ort_artifacts import MS_DOMAIN
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
    types, source = _types(graph, model_from_graph(graph))
    _SOURCES.pop(graph, None)
    if source is not None:
        _SOURCES[graph] = source
    for node in graph.nodes():
        known = [types.get(v, (None, None)) for v in node.outputs]
        node.meta["dtypes"] = [dtype for dtype, _ in known]
        node.meta["shapes"] = [shape for _, shape in known]
        node.meta.pop("batch_shapes", None)  # of the graph as it was


def batch_shape(graph: Graph, tensor: Tensor, batch_size: int) -> tuple | None:
    """The static shape when the inputs' unknown batch (first) dimension is
    ``batch_size``: inference run again with it (once per graph and size), so a
    value whose batch is not its first dimension (an LSTM's ``[seq, batch,
    hidden]``) or that is computed from the batch (``ConstantOfShape`` of a
    ``Shape``) gets it too."""
    node = graph.node(tensor.node)
    if batch_size not in node.meta.get("batch_shapes", {}):
        types, _ = _types(graph, _with_batch(model_from_graph(graph), batch_size))
        for each in graph.nodes():
            each.meta.setdefault("batch_shapes", {})[batch_size] = [
                types.get(v, (None, None))[1] for v in each.outputs]
    shapes = node.meta["batch_shapes"][batch_size]
    return shapes[tensor.port] if tensor.port < len(shapes) else None


def _with_batch(model, batch_size: int):
    """``model`` with its inputs' unknown first dimension set to ``batch_size``, and
    every dimension named as one of those (ONNX: one name, one size) too."""
    graph = model.graph
    named = set()
    for value in graph.input:
        dims = _dims(value)
        if dims and not dims[0].HasField("dim_value"):
            named.add(dims[0].dim_param)
            dims[0].dim_value = batch_size
    named.discard("")
    for value in [*graph.output, *graph.value_info]:
        for dim in _dims(value):
            if dim.HasField("dim_param") and dim.dim_param in named:
                dim.dim_value = batch_size
    return model


def _dims(value) -> list:
    """The dims of a ``ValueInfoProto`` of a tensor, empty for any other."""
    return value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []


def _types(graph: Graph, model) -> tuple[dict, str | None]:
    """Every value's ``(dtype, shape)`` in ``model`` (``graph`` lowered, perhaps
    with its batch fixed) by ONNX inference, then onnxruntime's for its own ops;
    and what typed those (``shape_source``), None if ONNX inference alone did."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, GraphpassError):
        model = None  # malformed or huge: everything stays unknown
    types = {}
    if model is not None:
        for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            types[info.name] = tensor_type(info.type)
    for name, tensor in graph.format_state.initializers.items():
        types[name] = (dtype_name(tensor.data_type), tuple(tensor.dims))
    return types, None if model is None else _contrib_types(model, types)


def _contrib_types(model, types: dict) -> str | None:
    """Types of onnxruntime's own ops ONNX inference left unknown
    (``onnx_contrib_shapes``). Then, while dims stay unknown (onnxruntime's
    inference stopped, or left a dim symbolic that ONNX inference can tell), ONNX
    inference and ORT's conventions take turns from what is typed (each may let
    the other go further), up to ``MAX_INFERENCE_ROUNDS``. Returns what typed the
    contrib ops (None where there are none, or nothing was left unknown)."""
    from graphpass.dialects.onnx_contrib_shapes import contrib_types, convention_types, unknown_dims

    values = [v for n in model.graph.node for v in n.output if v]

    def unknown() -> float:
        return sum(unknown_dims(types.get(v, (None, None))[1]) for v in values)

    if unknown() == 0 or not any(n.domain == MS_DOMAIN for n in model.graph.node):
        return None
    source = contrib_types(model, types)
    for _ in range(MAX_INFERENCE_ROUNDS):
        before = unknown()
        if before == 0:
            break
        _reinfer(model, values, types)
        convention_types(model.graph.node, types)
        if unknown() >= before:
            break
    return source


#: The most rounds of ONNX inference ``_contrib_types`` runs without onnxruntime's.
MAX_INFERENCE_ROUNDS = 32


def _reinfer(model, values: list[str], types: dict) -> None:
    """ONNX inference again, seeded with every type known so far."""
    import onnx
    from onnx import helper

    from graphpass.dialects.onnx_contrib_shapes import better
    from graphpass.dialects.onnx_ops import dtype_enum

    seeded = onnx.ModelProto()
    seeded.CopyFrom(model)
    del seeded.graph.value_info[:]
    seeded.graph.value_info.extend(
        helper.make_tensor_value_info(v, dtype_enum(types[v][0]), list(types[v][1]))
        for v in values if types.get(v, (None, None))[1] is not None and types[v][0])
    try:
        seeded = onnx.shape_inference.infer_shapes(seeded, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError):
        return
    for info in seeded.graph.value_info:
        found = tensor_type(info.type)
        if better(types.get(info.name), found):
            types[info.name] = found


def shape_source(graph: Graph) -> str | None:
    """What typed the graph's ``com.microsoft`` ops at the last inference (None if
    ONNX inference alone did)."""
    return _SOURCES.get(graph)


#: Per graph: what typed its com.microsoft ops (``shape_source``).
_SOURCES: WeakKeyDictionary = WeakKeyDictionary()
