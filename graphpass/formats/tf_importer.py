"""TF's C graph importer run over a serialized GraphDef: the output shapes it
infers for each node, recorded on the IR's nodes (``node.meta["shapes"]``).

Both the reader (shapes asked for while the file's GraphDef is still at hand)
and the TF dialect's shape inference (the IR lowered again) use it. It only
reads what TF's importer says of a GraphDef: it must not lower the IR, nor know
the dialect or the analyses.
"""

from __future__ import annotations

import gc

from graphpass.dialects.tf_ops import shape_tuple
from graphpass.ir.graph import Graph

#: Ops read between two collections of their op <-> tensor cycles (``imported_shapes``).
_SHAPE_BATCH = 4096


def record_shapes(graph: Graph, shapes: dict[str, list], batch_size: int | None = None,
                  only: set[str] | None = None) -> None:
    """``imported_shapes``'s result on the nodes (``only`` those, if given)."""
    for node in graph.nodes() if only is None else map(graph.node, only):
        inferred = _with_recorded_shapes(node, shapes.get(node.name, []))
        if batch_size is None:
            node.meta["shapes"] = inferred
        else:
            node.meta.setdefault("batch_shapes", {})[batch_size] = inferred



def imported_shapes(data: bytes, wanted: set[str] | None = None) -> dict[str, list]:
    """Output shapes by node name of the GraphDef ``data`` (of its nodes in
    ``wanted`` alone, if given), from TF's C importer (none for the nodes it
    could not take).

    Each op is read through a Python ``Operation`` that is never registered with
    the ``tf.Graph`` (``Operation._from_c_op`` registers it, and colocation,
    device and control-flow data with it), so it dies once its shapes are read:
    registered ops would stay alive with the graph, and freeing them (graph <-> op
    cycles) would take a cyclic-GC pass over all of them. An op
    and its output tensors still refer to each other, so they are collected a
    batch at a time (``_SHAPE_BATCH``) with the full collector paused.
    """
    import tensorflow as tf
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.framework import ops

    tf_graph = tf.Graph()
    options = c_api.TF_NewImportGraphDefOptions()
    buffer = c_api.TF_NewBufferFromString(data)
    del data  # the buffer holds a copy
    shapes: dict[str, list] = {}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with tf_graph._c_graph.get() as c_graph:
            c_api.TF_DeleteImportGraphDefResults(
                c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer, options))
        c_api.TF_DeleteBuffer(buffer)
        buffer = None
        c_ops = tf_graph.new_operations()
        if wanted is not None:
            c_ops = [c_op for c_op in c_ops if c_api.TF_OperationName(c_op) in wanted]
        for count, c_op in enumerate(c_ops, 1):
            name, found = _op_shapes(ops, tf_graph, c_op)
            shapes[name] = found
            if count % _SHAPE_BATCH == 0:
                gc.collect(0)
        gc.collect(0)
    except (ValueError, TypeError, tf.errors.OpError):
        pass  # custom ops or broken inputs: shapes stay unknown
    finally:
        if was_enabled:
            gc.enable()
        if buffer is not None:
            c_api.TF_DeleteBuffer(buffer)
        c_api.TF_DeleteImportGraphDefOptions(options)
    return shapes


def _op_shapes(ops, tf_graph, c_op) -> tuple[str, list]:
    """``c_op``'s name and output shapes, through an unregistered ``Operation``."""
    op = ops.Operation(c_op, ops.SymbolicTensor)
    op.graph = tf_graph
    op._init_outputs()
    return op.name, [None if unknown_rank else tuple(dims)
                     for dims, unknown_rank in (t._shape for t in op.outputs)]



def _with_recorded_shapes(node, inferred: list) -> list:
    """Inferred shapes, or where inference cannot tell (a variable read inside a
    function body, whose resource argument carries no shape here) the shapes the
    exporter recorded in ``_output_shapes``."""
    recorded = node.attrs.get("_output_shapes")
    if recorded is None or len(recorded.list.shape) != len(inferred):
        return inferred
    return [shape if shape is not None and None not in shape else shape_tuple(proto) or shape
            for shape, proto in zip(inferred, recorded.list.shape)]

