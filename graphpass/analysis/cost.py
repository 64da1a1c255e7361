"""The planner's cost model: bytes per tensor and floating-point operations per op.

Bytes come from static shapes; a dimension the graph leaves unknown is the
batch dimension when it leads the shape and ``batch_size`` is given (the
``--batch-size`` option), and unknown otherwise (the tensor counts as 0 bytes,
so every estimate is a lower bound on what it cannot see).

FLOPs come from the dialect's op classes (``Dialect.op_class``): contractions
(matmul, batched matmul, einsum and their gradients, which are contractions
too) cost ``2 * sqrt(|a| |b| |out| / batch)``, which is ``2 M N K`` for
``[M, K] x [K, N]``; convolutions (forward and both gradients) cost
``2 |y| |kernel| / C_y`` with ``y`` the output-side activation; everything
else costs one operation per output element.
"""

from __future__ import annotations

import math

from graphpass.analysis.memory import tensor_bytes
from graphpass.analysis.shapes import infer_shapes
from graphpass.ir.graph import Graph, Tensor

#: Op classes a dialect reports (``Dialect.op_class``).
MATMUL, CONV, CHEAP, OTHER = "matmul", "conv", "cheap", "other"


class Sizes:
    """Static tensor sizes of one graph, with the batch size for unknown batch dims."""

    def __init__(self, graph: Graph, batch_size: int | None = None) -> None:
        infer_shapes(graph)
        self.graph = graph
        self.batch_size = batch_size

    def shape(self, tensor: Tensor) -> tuple[int, ...] | None:
        """Static shape (unknown batch dims from ``batch_size``); None if unknown."""
        dialect = self.graph.dialect
        shape = dialect.shape(self.graph, tensor)
        if shape is not None and self.batch_size and any(d is None or d < 0 for d in shape):
            shape = dialect.batch_shape(self.graph, tensor, self.batch_size)
        if shape is None or any(d is None or d < 0 for d in shape):
            return None
        return tuple(shape)

    def elements(self, tensor: Tensor) -> int | None:
        shape = self.shape(tensor)
        return None if shape is None else math.prod(shape)

    def bytes(self, tensor: Tensor) -> int:
        """Bytes of ``tensor``; 0 when its shape or dtype is unknown."""
        return tensor_bytes(self.graph, tensor, self.batch_size) or 0

    def flops(self, name: str) -> int:
        """Floating-point operations of one run of node ``name`` (0 when unknown)."""
        graph = self.graph
        kind = graph.dialect.op_class(graph, name)
        if kind == MATMUL:
            return self._matmul_flops(name)
        if kind == CONV:
            return self._conv_flops(name)
        return sum(self.elements(Tensor(name, p)) or 0 for p in graph.used_ports(name))

    def _matmul_flops(self, name: str) -> int:
        inputs = self.graph.inputs(name)[:2]
        out = self.shape(Tensor(name, 0))
        sizes = [self.elements(t) for t in inputs]
        if out is None or len(sizes) < 2 or None in sizes:
            return 0
        batch = math.prod(out[:-2]) if len(out) > 2 else 1
        product = float(sizes[0]) * float(sizes[1]) * float(math.prod(out))
        return int(2 * math.sqrt(product / max(batch, 1)))

    def _conv_flops(self, name: str) -> int:
        y, kernel, channel_axis = self.graph.dialect.conv_operands(self.graph, name)
        y_shape, k_elements = self.shape(y), self.elements(kernel)
        if y_shape is None or k_elements is None or not y_shape[channel_axis]:
            return 0
        return 2 * math.prod(y_shape) * k_elements // y_shape[channel_axis]
