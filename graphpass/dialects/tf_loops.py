"""TF's functional loops (control flow v2 ``While``/``StatelessWhile``) for the
memory estimate: how many times the body runs and what each run leaves behind.

A v2 ``While`` runs its ``body`` function once per iteration. For its gradient,
``while_v2`` rewrites the forward body to push each value the gradient needs
onto a TensorList accumulator (``TensorListPushBack`` onto an ``EmptyTensorList``
loop variable); the gradient ``While`` pops them back off. Outputs written by
``TensorListSetItem`` (a ``TensorArray`` of per-step outputs) grow the same way.
So each such output of the loop holds one element per iteration when the loop
ends: ``element bytes x trips``, read from the body's own shapes.

The trip count comes from the graph where it is static: the ``maximum_iterations``
input, or a condition ``counter < bound`` whose counter starts at a static value
and steps by one while the bound passes through unchanged (the bound's value is
TF's own constant evaluation of the outer graph: ``tf.get_static_value``; a
gradient loop's bound is its forward loop's final counter). Else the caller's
``loop_trips``, else unknown (the facts say so; their outputs then count as zero).

It reads the graph and the function library and never edits either.
"""

from __future__ import annotations

import math

from graphpass.dialects.base import LoopFacts
from graphpass.dialects.tf_ops import dtype_name
from graphpass.errors import GraphpassError
from graphpass.formats.tf_function import RESULT_SCOPE, graph_from_function
from graphpass.ir.dtypes import np_dtype
from graphpass.ir.graph import Graph, Tensor

WHILE_OPS = frozenset({"While", "StatelessWhile"})
#: Containers filled with a copy of a tensor (split into elements): op -> its slot.
FILLED_FROM = {"TensorListFromTensor": 0, "TensorArrayScatterV3": 2, "TensorArraySplitV3": 1}
#: List writes that keep one element per iteration: op -> the element's input slot.
_LIST_WRITES = {"TensorListPushBack": 1, "TensorListSetItem": 2}
_PASS_THROUGH = frozenset({"Identity", "Snapshot"})
_COUNTER_STEPS = frozenset({"Add", "AddV2"})
_SUMS = frozenset({"AddN", "Add", "AddV2"})


def loop_facts(graph: Graph, name: str, batch_size: int | None,
               loop_trips: int | None) -> LoopFacts | None:
    """The facts of ``name`` if it is a v2 ``While`` whose functions the library holds."""
    node = graph.node(name)
    if node.op not in WHILE_OPS:
        return None
    functions = _functions(graph)
    body_def = functions.get(node.attrs["body"].func.name)
    cond_def = functions.get(node.attrs["cond"].func.name)
    if body_def is None or cond_def is None:
        return None
    try:
        body = _import(body_def, functions, graph)
        cond = _import(cond_def, functions, graph)
    except GraphpassError:  # a body graphpass cannot read: the loop stays a plain node
        return None
    trips = _static_trips(graph, name, body, cond, batch_size, functions)
    source = "graph" if trips is not None else "option" if loop_trips is not None else "unknown"
    if trips is None:
        trips = loop_trips
    fetches = tuple(n for n in body if body.node(n).op == "_Retval")
    parallel = node.attrs["parallel_iterations"].i if "parallel_iterations" in node.attrs else 1
    popped = 0
    for tensor in graph.inputs(name):  # a gradient loop pops its forward loop's lists
        forward = graph.dialect.loop_facts(graph, tensor.node, batch_size, loop_trips) \
            if graph.node(tensor.node).op in WHILE_OPS else None
        popped += forward.per_trip.get(tensor.port, 0) if forward is not None else 0
    return LoopFacts(name, trips, source, _per_trip(body, body_def, batch_size), body, fetches,
                     max(1, parallel), _pending(body, batch_size), popped_bytes=popped)


def _functions(graph: Graph) -> dict:
    library = graph.format_state.library
    return {f.signature.name: f for f in library.function} if library is not None else {}


def _import(fdef, functions: dict, graph: Graph) -> Graph:
    """A function body as IR, on a copy of the container's state (importing names
    the state's function: the graph's own must stay as it is)."""
    return graph_from_function(fdef, functions, graph.format_state.copy())


def _per_trip(body: Graph, body_def, batch_size: int | None) -> dict[int, int]:
    """Output port -> bytes of the element its list gains per iteration, for each
    result that writes one element into the list passed in at the same position.
    An element is counted where its buffer is new each iteration: not a variable's
    value, not a loop variable whose next value another list already holds (that
    buffer is counted there) and not a loop invariant (one buffer for all)."""
    args = [a for a in body if body.node(a).op == "Placeholder"]
    writes = {}
    for port, arg in enumerate(body_def.signature.output_arg):
        write = _through(body, body.inputs(RESULT_SCOPE + arg.name)[0])
        op = body.node(write.node).op
        if op in _LIST_WRITES and port < len(args) and \
                _through(body, body.inputs(write.node)[0]).node == args[port]:
            writes[port] = (write.node, _through(body, body.inputs(write.node)[_LIST_WRITES[op]]))
    held = {element for _, element in writes.values()}
    found = {}
    for port, (write, element) in writes.items():
        if body.node(element.node).op == "ReadVariableOp":
            continue
        if element.node in args:
            following = _result(body, args.index(element.node))
            if following is None or following.node == element.node or following in held:
                continue
        dtype = body.node(write).attrs.get("element_dtype")
        size = _value_bytes(body, element, dtype and dtype_name(dtype.type), batch_size)
        if size is not None:
            found[port] = size
    return found


def _pending(body: Graph, batch_size: int | None) -> int:
    """Bytes per iteration of the addends of running sums: results ``k`` computed
    as ``AddN``/``Add`` of loop variable ``k`` and values of this iteration."""
    args = [a for a in body if body.node(a).op == "Placeholder"]
    total = 0
    for index in range(len(args)):
        result = _result(body, index)
        if result is None or body.node(result.node).op not in _SUMS:
            continue
        operands = [_through(body, t) for t in body.inputs(result.node)]
        if Tensor(args[index], 0) not in operands:
            continue
        for operand in operands:
            if operand.node not in args and body.node(operand.node).op != "Const":
                size = _value_bytes(body, operand, body.dialect.dtype(body, operand),
                                    batch_size)
                total += size or 0
    return total


def _value_bytes(body: Graph, value: Tensor, dtype: str | None,
                 batch_size: int | None) -> int | None:
    """Static bytes of one value of the body: its recorded shape, an unknown
    first dimension taken as ``batch_size``."""
    shape = body.dialect.shape(body, value)
    if shape is None or dtype is None:
        return None
    dims = [batch_size if i == 0 and (d is None or d < 0) else d for i, d in enumerate(shape)]
    if any(d is None or d < 0 for d in dims):
        return None
    try:
        itemsize = np_dtype(dtype).itemsize
    except TypeError:  # a list of lists, a resource: nothing static to count
        return None
    return math.prod(dims) * itemsize


def _through(graph: Graph, tensor: Tensor) -> Tensor:
    """``tensor`` seen through Identity chains."""
    while graph.node(tensor.node).op in _PASS_THROUGH and graph.inputs(tensor.node):
        tensor = graph.inputs(tensor.node)[0]
    return tensor


def _static_trips(graph: Graph, name: str, body: Graph, cond: Graph,
                  batch_size: int | None, functions: dict) -> int | None:
    """The smallest static bound of ``maximum_iterations`` and the condition."""
    inputs = graph.inputs(name)
    bounds = []
    maximum = _static_int(graph, inputs[1], batch_size) if len(inputs) > 1 else None
    if maximum is not None and maximum >= 0:
        bounds.append(maximum)
    results = [n for n in cond if cond.node(n).op == "_Retval"]
    if results:
        bounds += _condition_bounds(graph, name, body, cond,
                                    _through(cond, cond.inputs(results[0])[0]), batch_size)
    return min(bounds) if bounds else None


def _condition_bounds(graph: Graph, name: str, body: Graph, cond: Graph, test: Tensor,
                      batch_size: int | None) -> list[int]:
    """Trip counts each ``counter < bound`` conjunct of the condition implies."""
    op = cond.node(test.node).op
    if op == "LogicalAnd":
        return [b for t in cond.inputs(test.node)
                for b in _condition_bounds(graph, name, body, cond, _through(cond, t),
                                           batch_size)]
    if op != "Less":
        return []
    args = {n: i for i, n in enumerate(a for a in cond if cond.node(a).op == "Placeholder")}
    counter, bound = (_through(cond, t).node for t in cond.inputs(test.node))
    if counter not in args or bound not in args:
        return []
    body_args = [a for a in body if body.node(a).op == "Placeholder"]
    start = _counter_start(graph, name, body, body_args, args[counter], batch_size)
    if start is None or not _passes_through(body, body_args, args[bound]):
        return []
    limit = _static_int(graph, graph.inputs(name)[args[bound]], batch_size)
    return [] if limit is None else [max(0, limit - start)]


def _result(body: Graph, index: int) -> Tensor | None:
    results = [n for n in body if body.node(n).op == "_Retval"
               and body.node(n).attrs["index"].i == index]
    return _through(body, body.inputs(results[0])[0]) if results else None


def _counter_start(graph: Graph, name: str, body: Graph, body_args: list[str], index: int,
                   batch_size: int | None) -> int | None:
    """The start of loop variable ``index`` if the body adds one to it, else None."""
    step = _result(body, index)
    if step is None or body.node(step.node).op not in _COUNTER_STEPS:
        return None
    operands = [_through(body, t) for t in body.inputs(step.node)]
    names = [t.node for t in operands]
    if body_args[index] not in names:
        return None
    other = operands[1 - names.index(body_args[index])]
    if _const_int(body, other) != 1:
        return None
    return _static_int(graph, graph.inputs(name)[index], batch_size)


def _passes_through(body: Graph, body_args: list[str], index: int) -> bool:
    result = _result(body, index)
    return result is not None and result.node == body_args[index]


def _const_int(graph: Graph, tensor: Tensor) -> int | None:
    node = graph.node(tensor.node)
    if node.op != "Const":
        return None
    from tensorflow.python.framework import tensor_util

    proto = node.attrs["value"].tensor
    if any(dim.size != 1 for dim in proto.tensor_shape.dim):
        return None  # not a scalar, or a shape TF itself would refuse (a negative dim)
    try:
        value = tensor_util.MakeNdarray(proto)
    except (ValueError, TypeError):
        return None  # a value that does not fit its dtype: TF's importer refuses it too
    return int(value) if value.size == 1 and value.dtype.kind in "iu" else None


def _static_int(graph: Graph, tensor: Tensor, batch_size: int | None) -> int | None:
    """A scalar integer the graph fixes before the step: a constant, a loop's final
    counter (its start plus its trips), else what TF's constant evaluation finds."""
    tensor = _through(graph, tensor)
    node = graph.node(tensor.node)
    if node.op == "Const":
        return _const_int(graph, tensor)
    if node.op in WHILE_OPS:
        facts = loop_facts(graph, tensor.node, batch_size, None)
        if facts is None or facts.trips is None or facts.body is None:
            return None
        args = [a for a in facts.body if facts.body.node(a).op == "Placeholder"]
        start = _counter_start(graph, tensor.node, facts.body, args, tensor.port, batch_size)
        return None if start is None else start + facts.trips
    return _evaluated(graph, tensor, batch_size)


def _evaluated(graph: Graph, tensor: Tensor, batch_size: int | None) -> int | None:
    """TF's constant evaluation of ``tensor`` on its data ancestors (placeholders'
    unknown batch dimension set to ``batch_size``): its static value, else the
    value TF computes when every ancestor is a stateless op of no input data;
    None where it depends on data."""
    import numpy as np
    import tensorflow as tf

    from graphpass.formats.tf_io import graph_def_from_graph

    upstream = graph.ancestors({tensor.node}, follow_control=False) | {tensor.node}
    if any(graph.node(n).op in WHILE_OPS for n in upstream):
        return None
    graph_def = graph.source() or graph_def_from_graph(graph)
    kept = type(graph_def)()
    kept.library.CopyFrom(graph_def.library)
    kept.versions.CopyFrom(graph_def.versions)
    for node_def in graph_def.node:
        if node_def.name in upstream:
            copy = kept.node.add()
            copy.CopyFrom(node_def)
            del copy.input[:]
            copy.input.extend(t for t in node_def.input if not t.startswith("^"))
            dims = copy.attr["shape"].shape.dim if copy.op.startswith("Placeholder") else []
            if dims and dims[0].size < 0 and batch_size is not None:
                dims[0].size = batch_size
    computes = not any(graph.dialect.is_stateful(graph, n) or
                       graph.node(n).op.startswith("Placeholder") for n in upstream)
    try:
        value = _evaluate(tf, kept, tensor, computes)
    except (tf.errors.OpError, ValueError):
        return None  # TF cannot evaluate it alone (a value inside a lowered loop's frame)
    if value is None or np.size(value) != 1 or np.asarray(value).dtype.kind not in "iu":
        return None
    return int(value)


def _evaluate(tf, graph_def, tensor: Tensor, computes: bool):
    """``tensor``'s static value in ``graph_def``, else, where ``computes`` (every
    ancestor a stateless op of no input data), the value a session computes."""
    with tf.Graph().as_default() as imported:
        tf.graph_util.import_graph_def(graph_def, name="")
        result = imported.get_tensor_by_name(f"{tensor.node}:{tensor.port}")
        value = tf.get_static_value(result)
        if value is None and computes:
            with tf.compat.v1.Session(graph=imported) as session:  # constants only
                value = session.run(result)
    return value
