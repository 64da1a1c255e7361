"""TF shape inference over the IR: the graph (or the nodes asked for and what
they are computed from) lowered to a GraphDef and handed to TF's importer
(``formats.tf_importer``); and the shape rules the dialect's builders record
on the small ops they add, so adding them needs no new inference.

It records shape metadata on nodes and changes nothing else of the graph.
"""

from __future__ import annotations

from graphpass.formats.tf_importer import imported_shapes, record_shapes
from graphpass.formats.tf_io import graph_def_from_graph
from graphpass.ir.graph import Graph, Tensor


def derived_shapes(graph: Graph, inputs: list[Tensor], rule) -> list | None:
    """``[rule(*input shapes)]`` when inference already recorded every input's shape;
    else None, and the new node is inferred with the whole graph when first asked."""
    shapes = []
    for tensor in inputs:
        recorded = graph.node(tensor.node).meta.get("shapes")
        if recorded is None:
            return None
        shapes.append(recorded[tensor.port] if tensor.port < len(recorded) else None)
    return [rule(*shapes)]


def same_shape(shape: tuple | None) -> tuple | None:
    return shape


def flat_shape(shape: tuple | None) -> tuple | None:
    """``Reshape(x, [-1])``."""
    if shape is None or any(d is None for d in shape):
        return (None,)
    size = 1
    for d in shape:
        size *= d
    return (size,)


def broadcast_shape(a: tuple | None, b: tuple | None) -> tuple | None:
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


def infer_shapes(graph: Graph, nodes: list[str] | None = None) -> None:
    """TF's own shape inference: the graph, or only ``nodes`` and what they are
    computed from (a shape depends on nothing else), is imported into a
    ``tf.Graph`` and every output's shape recorded on its node."""
    _infer_shapes(graph, nodes=nodes)


def batch_shape(graph: Graph, tensor: Tensor, batch_size: int) -> tuple | None:
    """The static shape when the placeholders' unknown batch dimension is
    ``batch_size``: TF's shape inference run again with it (once per graph and
    size), so a reshape to ``[-1, width]`` gets batch x tokens rows, not batch."""
    node = graph.node(tensor.node)
    if batch_size not in node.meta.get("batch_shapes", {}):
        _infer_shapes(graph, batch_size)
    shapes = node.meta["batch_shapes"][batch_size]
    return shapes[tensor.port] if tensor.port < len(shapes) else None


def _infer_shapes(graph: Graph, batch_size: int | None = None,
                  nodes: list[str] | None = None) -> None:
    """TF's shape inference over the whole graph, recorded per node in ``meta["shapes"]``
    or, with ``batch_size`` (placeholders' unknown first dimension set to it), in
    ``meta["batch_shapes"][batch_size]``; with ``nodes``, over them and their data
    ancestors alone (control edges order, they decide no shape), recorded on
    ``nodes`` alone: reading an op's shapes back into Python is most of the cost,
    and loss detection asks for a few candidates of a large upstream.

    Only TF's C importer runs (it infers each node's shapes as it adds the
    node): ``import_graph_def`` also builds colocation, device and control-flow
    data in Python for every op, most of its time, and decides no shape.
    """
    wanted = None if nodes is None else set(nodes)
    upstream = None if wanted is None else graph.ancestors(wanted, follow_control=False) | wanted
    data = _serialized_graph_def(graph, batch_size, upstream)
    record_shapes(graph, imported_shapes(data, wanted), batch_size, wanted)



def _serialized_graph_def(graph: Graph, batch_size: int | None,
                          only: set[str] | None = None) -> bytes:
    """The graph lowered to a GraphDef (``only`` its nodes in that set, without
    control inputs), as the bytes TF's importer reads; the proto itself is gone
    before the import starts, so the two are never held at once. A graph still
    as read serializes the GraphDef it was read from (``Graph.source``; lowering
    gives the same nodes: the round trip is lossless), which saves lowering it."""
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

