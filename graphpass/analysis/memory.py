"""Static tensor sizes and a liveness-based peak-memory estimate.

The estimate walks the dialect's schedule (``Dialect.schedule``: for TF a
topological order with ties broken by graph order, so nodes a pass appended
run as late as their users allow, which is how a per-segment recomputation
behaves; for ONNX onnxruntime's own order) and keeps a tensor live from its
producer until its last reader. Stored and fed values (variables, constants,
placeholders) are left out: they are not allocated by the step. Unknown
sizes count as zero, so the estimate is a lower bound on what it can see.
"""

from __future__ import annotations

import numpy as np

from graphpass.analysis.shapes import infer_shapes
from graphpass.ir.graph import Graph, Tensor


def np_dtype(dtype: str):
    """numpy dtype for a dialect dtype name (bfloat16 via ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def tensor_bytes(graph: Graph, tensor: Tensor) -> int | None:
    """Static size of ``tensor`` in bytes, or None when a dim or the dtype is unknown."""
    dialect = graph.dialect
    shape = dialect.shape(graph, tensor)
    dtype = dialect.dtype(graph, tensor)
    if shape is None or dtype is None or any(d is None or d < 0 for d in shape):
        return None
    try:
        itemsize = np_dtype(dtype).itemsize
    except TypeError:
        return None
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def estimated_peak_bytes(graph: Graph, fetches: list[str]) -> int:
    """Peak bytes of live step tensors when running ``fetches``: only what they need
    runs (as the TF runtime prunes), in the graph's deterministic schedule."""
    infer_shapes(graph)
    dialect = graph.dialect
    needed = graph.ancestors(fetches) | set(fetches)
    order = [n for n in dialect.schedule(graph) if n in needed]
    readers: dict[Tensor, int] = {}
    for name in order:
        for tensor in graph.inputs(name):
            readers[tensor] = readers.get(tensor, 0) + 1
    outputs_of = {n: [Tensor(n, p) for p in graph.used_ports(n)] for n in order}
    live = peak = 0
    for name in order:
        if dialect.is_source(graph, name):
            continue
        sizes = {t: tensor_bytes(graph, t) or 0 for t in outputs_of[name] if t in readers}
        live += sum(sizes.values())
        peak = max(peak, live)
        for tensor in graph.inputs(name):
            readers[tensor] -= 1
            if readers[tensor] == 0 and not dialect.is_source(graph, tensor.node):
                live -= tensor_bytes(graph, tensor) or 0
    return peak
