"""The checks an ONNX model must pass before it becomes IR: what onnx's own
checker or shape inference would raise from deep inside, and numbers the
analyses could not hold, refused at the edge with one line each.

* a model-local function may not call itself, directly or through others
  (onnx's shape inference raises ``ValidationError`` on such a model);
* every tensor dimension is non-negative and every tensor's element count is
  one a device could hold (a dim of 2^63-1 overflowed the planner's int64 arrays);
* every external-data location (of an initializer or an attribute tensor, in
  any graph, subgraph or function) is a plain relative file name (no NUL or
  other control characters; the path checks of ``onnx_data`` then keep it
  inside the model's directory);
* every tensor the model holds (initializers, sparse ones, attribute values, in
  subgraphs and functions too) has a ``data_type`` onnx knows and a payload of
  the size its dims and dtype give (``raw_data`` bytes, or values in the field
  the dtype uses), as numpy would otherwise fail to read it far from here;
* every node of an op onnx defines has as many inputs and outputs as the op's
  schema allows and attributes of the kinds it declares (``perm`` of a
  Transpose holds ints), and no node outside a function refers to a function's
  attribute (``ref_attr_name``): the runtime models read attributes by the
  schema's kinds.

It reads the ``ModelProto`` and changes nothing; walks are iterative.
"""

from __future__ import annotations

import math
from functools import cache

from graphpass.errors import GraphpassError
from graphpass.formats.onnx_data import external_tensors
from graphpass.ir.order import first_cycle

#: The most elements a tensor may hold: 2^45 (256 TiB of float64) is beyond any
#: device, and sums of many such byte counts still fit an int64.
MAX_ELEMENTS = 2**45
#: The longest file name common file systems hold, in bytes.
NAME_MAX = 255
_FIX = "re-export the model"


def check_model(model, where: str) -> None:
    """A user error for the first problem of ``model`` (see the module)."""
    _check_function_cycles(model, where)
    for value, dims in _declared_shapes(model):
        _check_dims(value, dims, where)
    _check_external_locations(model, where)
    for label, tensor in _tensors(model):
        _check_payload(label, tensor, where)
    _check_nodes(model, where)


def _check_function_cycles(model, where: str) -> None:
    local = {(f.domain, f.name): f for f in model.functions}
    calls = {key: sorted({(n.domain, n.op_type) for n in _nodes(f.node)
                          if (n.domain, n.op_type) in local})
             for key, f in local.items()}
    cycle = first_cycle(calls)
    if cycle:
        callee = cycle[0]
        named = " -> ".join(f"{d}::{n}" for d, n in cycle)
        raise GraphpassError(f"{where}: model-local function {callee[0]}::{callee[1]} "
                             f"calls itself ({named}); ONNX functions may not be "
                             f"recursive: {_FIX}")


def _nodes(nodes):
    """Every node of ``nodes`` and of the subgraphs in their attributes (If, Loop,
    Scan bodies), iteratively."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        for attr in node.attribute:
            for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                stack.extend(graph.node)


def _declared_shapes(model):
    """``(value name, dims)`` of every declared value and initializer, subgraphs
    included; a symbolic or missing dim is None."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for value in [*graph.input, *graph.output, *graph.value_info]:
            tensor_type = value.type.tensor_type
            if tensor_type.HasField("shape"):
                yield value.name, [d.dim_value if d.HasField("dim_value") else None
                                   for d in tensor_type.shape.dim]
        for tensor in graph.initializer:
            yield tensor.name, list(tensor.dims)
        for node in graph.node:
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else attr.graphs)


def _check_dims(value: str, dims: list, where: str) -> None:
    known = [d for d in dims if d is not None]
    if any(d < 0 for d in known):
        raise GraphpassError(f"{where}: value {value!r} has a negative dimension "
                             f"({min(known)}); {_FIX}")
    if known and math.prod(known) > MAX_ELEMENTS:
        raise GraphpassError(f"{where}: value {value!r} has shape {dims}: "
                             f"{math.prod(known)} elements, more than any device holds "
                             f"(at most {MAX_ELEMENTS}); {_FIX}")


def _check_external_locations(model, where: str) -> None:
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and not entry.value.isprintable():
                raise GraphpassError(f"{where}: tensor {tensor.name!r}: external data "
                                     f"location {entry.value!r} holds a NUL or control "
                                     f"character, which no file name may; {_FIX}")
            if entry.key == "location" and any(
                    len(part.encode()) > NAME_MAX for part in entry.value.split("/")):
                raise GraphpassError(f"{where}: tensor {tensor.name!r}: external data "
                                     f"location {entry.value!r} has a name longer than "
                                     f"{NAME_MAX} bytes, which no file system holds; {_FIX}")
            if entry.key in ("offset", "length") and not (entry.value.isdigit()
                                                          and entry.value.isascii()):
                raise GraphpassError(f"{where}: tensor {tensor.name!r}: external data "
                                     f"{entry.key} {entry.value!r} is not a non-negative "
                                     f"integer; {_FIX}")


#: Elements per stored byte (``raw_data``) or per ``int32_data`` value of packed
#: sub-byte dtypes: INT4/UINT4/FLOAT4E2M1 pack two, INT2/UINT2 four.
_PACKED = {21: 2, 22: 2, 23: 2, 25: 4, 26: 4}
#: Sub-byte dtypes whose packing graphpass does not read: their size is not checked.
_UNCHECKED = {27, 28}
_COMPLEX = {14, 15}
_STRING, _EXTERNAL = 8, 1


def _tensors(model):
    """``(label, TensorProto)`` of every tensor ``model`` holds (module docstring)."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for tensor in graph.initializer:
            yield f"initializer {tensor.name!r}", tensor
        for sparse in graph.sparse_initializer:
            yield f"sparse initializer {sparse.values.name!r} (values)", sparse.values
            yield f"sparse initializer {sparse.values.name!r} (indices)", sparse.indices
        for node in graph.node:
            yield from _attribute_tensors(node)
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else attr.graphs)
    for function in model.functions:
        for node in _nodes(function.node):
            yield from _attribute_tensors(node)


def _attribute_tensors(node):
    for attr in node.attribute:
        owner = f"node {node.name or node.op_type!r} attribute {attr.name!r}"
        if attr.HasField("t"):
            yield owner, attr.t
        for tensor in attr.tensors:
            yield owner, tensor
        if attr.HasField("sparse_tensor"):
            yield owner, attr.sparse_tensor.values


def _check_payload(label: str, tensor, where: str) -> None:
    """A user error where ``tensor``'s dtype is unknown or its payload is not the
    size its dims give (external data is checked where it is read)."""
    from onnx import helper

    dtype = tensor.data_type
    if dtype not in _known_dtypes():
        raise GraphpassError(f"{where}: {label} has data_type {dtype}, which is not an "
                             f"ONNX tensor type; {_FIX}")
    if tensor.data_location == _EXTERNAL or dtype in _UNCHECKED:
        return
    count = math.prod(tensor.dims)
    per = _PACKED.get(dtype, 1)
    if tensor.raw_data:
        if dtype == _STRING:
            raise GraphpassError(f"{where}: {label} holds strings in raw_data, which only "
                                 f"numbers may use; {_FIX}")
        itemsize = 1 if dtype in _PACKED else helper.tensor_dtype_to_np_dtype(dtype).itemsize
        expected, held, unit = -(-count // per) * itemsize, len(tensor.raw_data), "bytes"
    else:
        field = helper.tensor_dtype_to_field(dtype)
        expected = -(-count // per) * (2 if dtype in _COMPLEX else 1)
        held, unit = len(getattr(tensor, field)), f"values in {field}"
    if held != expected:
        raise GraphpassError(f"{where}: {label} has dims {list(tensor.dims)} of "
                             f"{helper.tensor_dtype_to_string(dtype).split('.')[-1]}, so "
                             f"{expected} {unit}, but holds {held}; {_FIX}")


@cache
def _known_dtypes() -> frozenset[int]:
    from onnx import helper

    return frozenset(helper.get_all_tensor_dtypes())


def _check_nodes(model, where: str) -> None:
    """Arity and attribute kinds against the schema, in the graph and its subgraphs."""
    from onnx import AttributeProto

    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    for node in _nodes(model.graph.node):
        label = f"node {node.name or node.op_type!r} ({node.op_type})"
        for attr in node.attribute:
            if attr.ref_attr_name:
                raise GraphpassError(f"{where}: {label}: attribute {attr.name!r} refers to "
                                     f"a function's attribute {attr.ref_attr_name!r}, which "
                                     f"only a function body may; {_FIX}")
        schema = _schema(node.op_type, node.domain or "ai.onnx",
                         opsets.get(node.domain or "ai.onnx"))
        if schema is None:
            continue
        for what, count, low, high in (
                ("inputs", len(node.input), schema.min_input, schema.max_input),
                ("outputs", len(node.output), schema.min_output, schema.max_output)):
            if not low <= count <= high:
                wanted = f"{low}" if low == high else f"{low} to {high}"
                raise GraphpassError(f"{where}: {label} has {count} {what}, but "
                                     f"{node.op_type}-{schema.since_version} takes {wanted}; "
                                     f"{_FIX}")
        for attr in node.attribute:
            declared = schema.attributes.get(attr.name)
            if declared is not None and attr.type != declared.type:
                got = AttributeProto.AttributeType.Name(attr.type) \
                    if attr.type in AttributeProto.AttributeType.values() else str(attr.type)
                raise GraphpassError(
                    f"{where}: {label}: attribute {attr.name!r} holds {got}, but "
                    f"{node.op_type} declares it {declared.type.name}; {_FIX}")


@cache
def _schema(op_type: str, domain: str, version: int | None):
    """The op's schema at the model's opset for its domain; None where onnx has none."""
    from onnx import defs

    if version is None or not 0 < version < 2**31:  # no opset onnx could have defined
        return None
    try:
        return defs.get_schema(op_type, version, "" if domain == "ai.onnx" else domain)
    except defs.SchemaError:
        return None
