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

Time is a roofline: one run of an op costs the larger of its FLOPs over the
machine's balance and the bytes it reads and writes (``Sizes.work``, in bytes
moved), since on a CPU an elementwise op, a normalisation or a copy waits on
memory while a matmul or a convolution waits on arithmetic. A step's time is the
sum over its ops (one inter-op thread); what a rewrite adds to it is the work of
what it recomputes (``extra_step_time``). Only ratios are used, so the balance is
the one constant the figure depends on.
"""

from __future__ import annotations

import math

from graphpass.analysis.memory import tensor_bytes
from graphpass.analysis.shapes import infer_shapes
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import RuntimeModel

#: Op classes a dialect reports (``Dialect.op_class``).
MATMUL, CONV, CHEAP, OTHER = "matmul", "conv", "cheap", "other"
#: Floating-point operations per byte moved at which an op costs as much arithmetic
#: as memory traffic: a CPU core's vectorised multiply-adds against its share of
#: memory bandwidth (a roofline's ridge point).
BALANCE = 8


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

    def work(self, name: str, runtime: RuntimeModel) -> float:
        """One run of ``name`` in bytes moved (the roofline, see the module): its
        FLOPs over ``BALANCE`` or the bytes it reads and writes, whichever is larger."""
        return max(self.flops(name) / BALANCE, float(self.moved(name, runtime)))

    def moved(self, name: str, runtime: RuntimeModel) -> int:
        """Bytes one run of ``name`` reads and writes; an op whose outputs the runtime
        all aliases to inputs (Identity, Reshape) moves nothing."""
        graph = self.graph
        written = [Tensor(name, p) for p in graph.used_ports(name)
                   if runtime.output_alias(graph, name, p) is None]
        if not written:
            return 0
        return sum(self.bytes(t) for t in [*graph.inputs(name), *written])

    def memory_bound(self, name: str, runtime: RuntimeModel) -> bool:
        """Whether ``name`` waits on memory, not arithmetic (known sizes, FLOPs over
        ``BALANCE`` at most its bytes): running it again costs about what reading
        its inputs and writing its outputs once more costs."""
        moved = self.moved(name, runtime)
        return moved > 0 and self.flops(name) / BALANCE <= moved


class StepTime:
    """The step's predicted time (the roofline of the module, one op at a time),
    taken when made: what a rewrite then adds is judged against the step as it was."""

    def __init__(self, graph: Graph, fetches: list[str], batch_size: int | None,
                 runtime: RuntimeModel, sizes: Sizes | None = None) -> None:
        self.sizes = sizes or Sizes(graph, batch_size)
        self.runtime = runtime
        step = graph.ancestors(fetches) | set(fetches)
        self.total = sum(self.sizes.work(name, runtime) for name in step)

    def extra(self, recomputed: list[str]) -> float:
        """Running ``recomputed`` (nodes of the step as it was) once more, as a
        fraction of the step's time; 0 when the step's work is unknown."""
        added = sum(self.sizes.work(name, self.runtime) for name in recomputed)
        return added / self.total if self.total else 0.0
