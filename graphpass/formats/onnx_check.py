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
  inside the model's directory).

It reads the ``ModelProto`` and changes nothing; walks are iterative.
"""

from __future__ import annotations

import math

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
