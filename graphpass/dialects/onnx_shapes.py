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
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model_from_graph(graph), data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, GraphpassError):
        model = None  # malformed or huge: everything stays unknown
    types = {}
    if model is not None:
        for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            types[info.name] = tensor_type(info.type)
    for name, tensor in graph.format_state.initializers.items():
        types[name] = (dtype_name(tensor.data_type), tuple(tensor.dims))
    _SOURCES.pop(graph, None)
    if model is not None:
        _contrib_types(graph, model, types)
    for node in graph.nodes():
        known = [types.get(v, (None, None)) for v in node.outputs]
        node.meta["dtypes"] = [dtype for dtype, _ in known]
        node.meta["shapes"] = [shape for _, shape in known]


def _contrib_types(graph: Graph, model, types: dict) -> None:
    """Types of onnxruntime's own ops ONNX inference left unknown
    (``onnx_contrib_shapes``). Then, while dims stay unknown (onnxruntime's
    inference stopped, or left a dim symbolic that ONNX inference can tell), ONNX
    inference and ORT's conventions take turns from what is typed (each may let
    the other go further), up to ``MAX_INFERENCE_ROUNDS``. What typed the contrib
    ops is kept for ``shape_source``."""
    from graphpass.dialects.onnx_contrib_shapes import contrib_types, convention_types, unknown_dims

    values = [v for n in model.graph.node for v in n.output if v]

    def unknown() -> float:
        return sum(unknown_dims(types.get(v, (None, None))[1]) for v in values)

    if unknown() == 0 or not any(n.domain == MS_DOMAIN for n in model.graph.node):
        return
    _SOURCES[graph] = contrib_types(model, types)
    for _ in range(MAX_INFERENCE_ROUNDS):
        before = unknown()
        if before == 0:
            return
        _reinfer(model, values, types)
        convention_types(model.graph.node, types)
        if unknown() >= before:
            return


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
