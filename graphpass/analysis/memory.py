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
    return max((live for _, live in live_bytes_timeline(graph, fetches)), default=0)


def live_bytes_timeline(graph: Graph, fetches: list[str]) -> list[tuple[str, int]]:
    """``(node, live bytes)`` for every computed node of the step, in schedule order.

    The value is what is live just after the node's outputs are allocated (its
    inputs not yet released), the moment its peak could happen; the maximum
    over the list is :func:`estimated_peak_bytes`.
    """
    dialect = graph.dialect
    needed = graph.ancestors(fetches) | set(fetches)
    order = [n for n in dialect.schedule(graph) if n in needed]
    readers: dict[Tensor, int] = {}
    for name in order:
        for tensor in graph.inputs(name):
            readers[tensor] = readers.get(tensor, 0) + 1
    outputs_of = {n: [Tensor(n, p) for p in graph.used_ports(n)] for n in order}
    live = 0
    timeline = []
    for name in order:
        if dialect.is_source(graph, name):
            continue
        live += sum(tensor_bytes(graph, t) or 0 for t in outputs_of[name] if t in readers)
        timeline.append((name, live))
        for tensor in graph.inputs(name):
            readers[tensor] -= 1
            if readers[tensor] == 0 and not dialect.is_source(graph, tensor.node):
                live -= tensor_bytes(graph, tensor) or 0
    return timeline


def format_bytes(count: int | None) -> str:
    """Bytes for people (B, KiB, MiB, GiB); ``n/a`` for an unknown count."""
    if count is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
