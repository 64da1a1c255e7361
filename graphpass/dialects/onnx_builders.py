"""Building ONNX nodes: the small ops passes insert (elementwise arithmetic,
``Identity``, ``Cast``, ``Reshape``/``Slice`` to a scalar), constants as
initializers, node copies, and fresh value names for their outputs.

Constants become initializers, written like the ones read: valid in every
opset, and no extra nodes in the list. A built node's type is recorded as
inference would where it is known without inference, so a pass's trial copies
need none. Builders add nodes and initializers; they never remove or rewire an
existing node and never run inference.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from graphpass.dialects.onnx_attrs import attribute
from graphpass.dialects.onnx_ops import ELEMENTWISE_BUILT, dtype_enum, opset
from graphpass.dialects.onnx_shapes import broadcast, record_type, tensor_dtype, tensor_shape
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_order import INITIALIZER, INPUT
from graphpass.ir.graph import Tensor, fresh_name

if TYPE_CHECKING:
    from graphpass.ir.graph import Graph


def copy_node(graph: Graph, name: str, new_name: str) -> str:
    """Same op, domain, attrs and extras (doc string, ...), fresh output names.

    An initializer's copy holds the same tensor under the new name; a graph
    input cannot be copied (it is fed).
    """
    import onnx

    node = graph.node(name)
    if node.op == INPUT or (node.op == INITIALIZER and
                            node.outputs[0] in graph.format_state.sparse_initializers):
        raise GraphpassError(f"cannot copy {name!r}: it is a graph input or a sparse "
                             "initializer, not a node")
    outputs = [_fresh_value(graph, new_name, port) if value else ""
               for port, value in enumerate(node.outputs)]
    if node.op == INITIALIZER:
        proto = onnx.TensorProto()
        proto.CopyFrom(graph.format_state.initializers[node.outputs[0]])
        proto.name = outputs[0]
        _register_initializer(graph, proto)
    copy = graph.add_node(new_name, node.op, attrs=node.attrs, device=node.device,
                          domain=node.domain, outputs=outputs)
    # Same op on inputs of the same types and shapes: the inferred ones carry over,
    # so a pass that copies nodes does not re-run shape inference on the model.
    for key in ("onnx_extras", "onnx_arity", "dtypes", "shapes", "batch_shapes"):
        if key in node.meta:
            copy.meta[key] = node.meta[key]
    return new_name


def op(graph: Graph, name: str, op_type: str, inputs: list[Tensor], **attrs) -> Tensor:
    """A node of one output; an elementwise op's type recorded as inference
    would (``ELEMENTWISE_BUILT``)."""
    name = graph.unique_name(name)
    graph.add_node(name, op_type, inputs, attrs={k: attribute(k, v) for k, v in attrs.items()},
                   outputs=[_fresh_value(graph, name, 0)])
    shapes = [tensor_shape(graph, t) for t in inputs]
    if op_type in ELEMENTWISE_BUILT and None not in shapes:
        shape = shapes[0]
        for other in shapes[1:]:
            shape = broadcast(shape, other)
        record_type(graph, Tensor(name, 0), tensor_dtype(graph, inputs[0]), shape)
    return Tensor(name, 0)


def constant(graph: Graph, name: str, value: Any, dtype: str) -> Tensor:
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
    record_type(graph, Tensor(key, 0), dtype, array.shape)
    return Tensor(key, 0)


def first_element(graph: Graph, name: str, tensor: Tensor) -> Tensor:
    """``Reshape(x, [-1])``, ``Slice [0:1]``, ``Reshape(., [])``, in the model's opset."""
    version = opset(graph)
    flat = _reshape(graph, f"{name}/flat", tensor, [-1], version)
    shape = tensor_shape(graph, tensor)
    if shape is not None and None not in shape:
        record_type(graph, flat, tensor_dtype(graph, tensor), (math.prod(shape),))
    if version >= 10:
        head = op(graph, f"{name}/head", "Slice", [
            flat,
            constant(graph, f"{name}/starts", [0], "int64"),
            constant(graph, f"{name}/ends", [1], "int64"),
            constant(graph, f"{name}/axes", [0], "int64"),
        ])
    else:
        head = op(graph, f"{name}/head", "Slice", [flat], starts=[0], ends=[1], axes=[0])
    if shape is not None and None not in shape and math.prod(shape):
        record_type(graph, head, tensor_dtype(graph, tensor), (1,))
    first = _reshape(graph, name, head, [], version)
    # A scalar of the input's dtype: recorded as inference would (``cast`` reads it).
    node = graph.node(first.node)
    node.meta["dtypes"], node.meta["shapes"] = [tensor_dtype(graph, tensor)], [()]
    return first


def _reshape(graph: Graph, name: str, tensor: Tensor, shape: list[int], version: int) -> Tensor:
    if version >= 5:
        target = constant(graph, f"{name}/shape", shape, "int64")
        return op(graph, name, "Reshape", [tensor, target])
    import onnx

    # Reshape-1's attribute, typed here: an empty list (a scalar) tells onnx no type.
    attr = onnx.AttributeProto(name="shape", type=onnx.AttributeProto.INTS)
    attr.ints.extend(shape)
    return op(graph, name, "Reshape", [tensor], shape=attr)


def cast(graph: Graph, name: str, tensor: Tensor, dtype: str) -> Tensor:
    """A ``Cast`` to ``dtype`` (``tensor`` itself if it has that dtype)."""
    import onnx

    if tensor_dtype(graph, tensor) == dtype:
        return tensor
    enum = dtype_enum(dtype)
    to = enum if opset(graph) >= 6 else onnx.TensorProto.DataType.Name(enum)
    result = op(graph, name, "Cast", [tensor], to=to)
    graph.node(result.node).meta["dtypes"] = [dtype]  # known without inference
    if tensor_shape(graph, tensor) is not None:
        graph.node(result.node).meta["shapes"] = [tensor_shape(graph, tensor)]
    return result


def _register_initializer(graph: Graph, proto) -> None:
    """Add ``proto`` to the carried initializers (and to the graph inputs when IR < 4
    requires it), in place: ``Graph.copy`` copies the format state's dicts and lists, so a
    copy per added constant would make the planner's trial rewrites quadratic."""
    import onnx

    graph.format_state.initializers[proto.name] = proto
    if graph.format_state.model.ir_version < 4:
        info = onnx.helper.make_tensor_value_info(proto.name, proto.data_type, proto.dims)
        graph.format_state.inputs.append(info)


#: Per graph: value name -> the node producing it, gathered on the first
#: ``_fresh_value`` call and extended by each (gathering it per new value would
#: make adding nodes quadratic). A graph's copy starts its own.
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
