"""The buffers of one simulated step, and the tensor sizes they are made of: what
the runtime allocates, holds and frees as it runs the schedule (the model is
described in ``graphpass.analysis.memory``, which builds the schedule and the
loops' figures and runs this simulation)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

from graphpass.dialects.base import LoopFacts
from graphpass.ir.dtypes import np_dtype
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import FREE_LIST, Execution, RuntimeModel


def tensor_bytes(graph: Graph, tensor: Tensor, batch_size: int | None = None) -> int | None:
    """Static size of ``tensor`` in bytes, or None when a dim or the dtype is unknown.

    ``batch_size`` stands in for the inputs' unknown batch dimension (a graph
    exported with ``None`` batch placeholders); see ``Dialect.batch_shape``."""
    dialect = graph.dialect
    shape = dialect.shape(graph, tensor)
    dtype = dialect.dtype(graph, tensor)
    if shape is None or dtype is None:
        return None
    if batch_size is not None and any(d is None or d < 0 for d in shape):
        shape = dialect.batch_shape(graph, tensor, batch_size)
    if shape is None or any(d is None or d < 0 for d in shape):
        return None
    itemsize = element_size(dtype)
    return None if itemsize is None else math.prod(shape) * itemsize


@cache
def element_size(dtype: str) -> int | None:
    try:
        return np_dtype(dtype).itemsize
    except TypeError:
        return None


@dataclass
class MemoryProfile:
    """One simulated step: ``timeline`` holds ``(node, live bytes)`` after each node
    allocated its outputs (before its inputs are freed), in run order; ``fed_bytes``:
    the fed values in every figure (the peak of the kernels' own allocations is
    ``peak_bytes - fed_bytes``)."""

    peak_bytes: int = 0
    fed_bytes: int = 0
    peak_node: str | None = None
    timeline: list[tuple[str, int]] = field(default_factory=list)
    loops: list[LoopFacts] = field(default_factory=list)
    #: What was simulated (``runtime_memory.runtime_memory_profile``); empty: the graph as given.
    model: str = ""
    #: The peak in each order the runtime may run the step in (``RuntimeModel.executions``),
    #: where it may take more than one; ``peak_bytes`` is the highest of them.
    order_peaks: tuple[int, ...] = ()
    #: The values the step allocates whose size is unknown (counted as 0 B), by
    #: name, in the order they were allocated.
    unsized: list[str] = field(default_factory=list)

    def unsized_note(self, shown: int = 5) -> str | None:
        """The summary's line naming :attr:`unsized`, None if every value is sized."""
        if not self.unsized:
            return None
        more = f" and {len(self.unsized) - shown} more" if len(self.unsized) > shown else ""
        return (f"{len(self.unsized)} tensors of unknown size counted as 0 B in the "
                f"estimate: {', '.join(self.unsized[:shown])}{more}")


def scratch_bytes(graph: Graph, name: str, runtime: RuntimeModel) -> int:
    """Bytes of the temporaries ``name``'s kernel holds while it runs
    (``RuntimeModel.scratch_shapes``), on top of its inputs and outputs."""
    dialect = graph.dialect
    total = 0
    for tensor, shape in runtime.scratch_shapes(graph, name):
        dtype = dialect.dtype(graph, tensor)
        itemsize = element_size(dtype) if dtype is not None else None
        if itemsize is not None and all(d is not None and d >= 0 for d in shape):
            total += math.prod(shape) * itemsize
    return total


def _value_name(graph: Graph, tensor: Tensor) -> str:
    """The format's name of ``tensor``: its ONNX value name, else ``node:port``."""
    outputs = graph.node(tensor.node).outputs
    named = tensor.port < len(outputs) and outputs[tensor.port]
    return outputs[tensor.port] if named else f"{tensor.node}:{tensor.port}"


class _Buffer:
    """An allocation: its size, how many live values hold it, and (where the runtime
    reuses freed buffers) the shape key a later value must match to take it over."""

    __slots__ = ("size", "holders", "key")

    def __init__(self, size: int, key: tuple | None = None) -> None:
        self.size, self.holders, self.key = size, 0, key


class Simulation:
    """Walks the schedule once, allocating and freeing buffers as the runtime does
    (the model: ``graphpass.analysis.memory``'s module docstring)."""

    def __init__(self, graph: Graph, execution: Execution, targets: list[str],
                 constant: frozenset[str], kept: set[Tensor], batch_size: int | None,
                 runtime: RuntimeModel) -> None:
        self.graph, self.dialect, self.order = graph, graph.dialect, execution.order
        self.runtime = runtime
        self.kept, self.batch_size = kept, batch_size
        self.kept_of: dict[str, list[Tensor]] = {}
        for tensor in sorted(kept):
            self.kept_of.setdefault(tensor.node, []).append(tensor)
        # What each node really reads, by slot (past the nodes the runtime bypasses).
        self.slots = {name: {slot: execution.read(t)
                             for slot, t in graph.input_slots(name).items()}
                      for name in self.order}
        self.idle = self._control_only(targets)
        self.constant = constant
        self.readers: dict[Tensor, int] = {}  # reads by the nodes that really run
        for name in self.order:
            if name not in self.idle and name not in self.constant:
                for tensor in self.slots[name].values():
                    self.readers[tensor] = self.readers.get(tensor, 0) + 1
        self.buffers: dict[Tensor, _Buffer] = {}
        self.live = 0
        self.ran: set[str] = set()
        self.loops: dict[str, tuple[LoopFacts, int]] = {}
        self.stacked: dict[Tensor, int] = {}  # a v1 push: what its stack holds
        self.pops: dict[str, list[Tensor]] = {}  # a pop: the pushes whose stacks it frees
        self.stacks_at: dict[str, list[Tensor]] = {}  # a v1 loop: its pushes
        # Planned reuse: shape key -> freed buffers (most recent last), and the step
        # after which each waiting buffer was freed.
        self.planned = runtime.heap == FREE_LIST
        self.free: dict[tuple, list[_Buffer]] = {}
        self.freed_at: dict[_Buffer, int] = {}
        self.unsized: dict[str, None] = {}  # ordered, once each

    def _control_only(self, targets: list[str]) -> set[str]:
        """Stateless nodes whose values nothing that runs reads (they only order
        others through control edges, as the gradient of a constant factor does):
        Grappler's dependency optimizer turns them into NoOps, so they read nothing."""
        readers: dict[str, set[str]] = {}
        for name, slots in self.slots.items():
            for tensor in slots.values():
                readers.setdefault(tensor.node, set()).add(name)
        idle, fetched = set(), set(targets)
        for name in reversed(self.order):
            if name in fetched or self.dialect.is_stateful(self.graph, name):
                continue
            if readers.get(name, set()) <= idle:
                idle.add(name)
        return idle

    def add_loops(self, loops: dict[str, tuple[LoopFacts, int]]) -> None:
        """The loops of the step; a v1 push (nodes walked once) holds its element
        times the trip count from its loop's condition (the walk may place a push
        that nothing reads late) until its pop has run."""
        self.loops = loops
        running = {n for n in self.order if n not in self.idle and n not in self.constant}
        for name, (facts, _) in loops.items():
            for push, (size, pops) in facts.pushes.items():
                ran = [p for p in pops if p in running]
                if push in running and ran:
                    self.stacks_at.setdefault(name, []).append(Tensor(push, 0))
                    self.stacked[Tensor(push, 0)] = size * (facts.trips or 0)
                    self.readers[Tensor(push, 0)] = self.readers.get(Tensor(push, 0), 0) + len(ran)
                    for pop in ran:
                        self.pops.setdefault(pop, []).append(Tensor(push, 0))

    def _bytes(self, tensor: Tensor) -> int:
        if tensor in self.stacked:
            return self.stacked[tensor]
        slot = self.runtime.container_input(self.graph, tensor)
        if slot is not None:  # a copy of that input, held as long as the container
            tensor = self.graph.input_slots(tensor.node).get(slot, tensor)
        size = tensor_bytes(self.graph, tensor, self.batch_size)
        if size is None and tensor.node in self.loops:
            size = self.loops[tensor.node][0].held_bytes(tensor.port)
        if size is None and self._is_data(tensor):
            self.unsized[_value_name(self.graph, tensor)] = None
        return size or 0

    def _is_data(self, tensor: Tensor) -> bool:
        """Whether ``tensor`` is a buffer of elements: not a handle (a resource,
        a variant), whose size is none to know."""
        dtype = self.dialect.dtype(self.graph, tensor)
        return dtype is None or element_size(dtype) is not None

    def _fed_bytes(self) -> int:
        """Bytes of the fed values the runtime holds for the step (module docstring)."""
        needed = set(self.order)
        return sum(self._bytes(Tensor(name, 0))
                   for name in self.runtime.runtime_fed(self.graph) if name in needed)

    def run(self) -> MemoryProfile:
        profile = MemoryProfile(fed_bytes=self._fed_bytes(),
                                loops=[facts for facts, _ in self.loops.values()])
        self.live = profile.fed_bytes
        for name in self.order:
            if name in self.constant or name in self.idle:
                continue
            inputs = self.slots[name]
            for port in self.graph.used_ports(name):
                self._output(name, Tensor(name, port), inputs)
            for tensor in self.kept_of.get(name, ()):
                if tensor not in self.buffers:
                    self._output(name, tensor, inputs)
            for tensor in self.stacks_at.get(name, ()):
                self._output(name, tensor, {})
            self._copy_shared_variables(name)
            self.ran.add(name)
            running = self.live + scratch_bytes(self.graph, name, self.runtime) + \
                (self.loops[name][1] if name in self.loops else 0)
            profile.timeline.append((name, running))
            if running > profile.peak_bytes:
                profile.peak_bytes, profile.peak_node = running, name
            for tensor in [*inputs.values(), *self.pops.get(name, ())]:
                self.readers[tensor] -= 1
                if self.readers[tensor] == 0:
                    self._release(tensor, len(profile.timeline) - 1)
            for port in self.graph.used_ports(name):
                if not self.readers.get(Tensor(name, port)):
                    self._release(Tensor(name, port), len(profile.timeline) - 1)
        if self.planned:
            self._free_unclaimed(profile)
        profile.unsized = list(self.unsized)
        return profile

    def _copy_shared_variables(self, name: str) -> None:
        """Where ``name`` updates a variable whose buffer a value still to be read
        shares (``RuntimeModel.copied_on_update``), the runtime writes a copy, which is
        the variable from then on: the old buffer is the step's now, freed with
        the last of those values (or written into by an op that forwards it)."""
        for reads in self.runtime.copied_on_update(self.graph, name):
            pending = [t for read in reads for t in self._sharing(read)
                       if self.readers.get(t) and t not in self.buffers]
            if not pending:
                continue
            buffer = _Buffer(self._bytes(reads[0]))
            self.live += buffer.size
            for tensor in pending:
                buffer.holders += 1
                self.buffers[tensor] = buffer

    def _sharing(self, read: Tensor) -> list[Tensor]:
        """``read`` and the values that have run so far aliasing it (an ``Identity``)."""
        found, stack = [read], [read]
        while stack:
            tensor = stack.pop()
            for user in self.graph.data_users(tensor.node):
                if user not in self.ran:
                    continue
                slots = self.slots[user]
                for port in self.graph.used_ports(user):
                    slot = self.runtime.output_alias(self.graph, user, port)
                    if slot is not None and slots.get(slot) == tensor:
                        found.append(Tensor(user, port))
                        stack.append(Tensor(user, port))
        return found

    def _free_unclaimed(self, profile: MemoryProfile) -> None:
        """Buffers still waiting on the free list at the end were freed for real
        when their last value died: take them out of the timeline from the next
        step on, and find the peak again."""
        drop = [0] * (len(profile.timeline) + 1)
        for buffer, step in self.freed_at.items():
            drop[step + 1] += buffer.size
        freed, profile.peak_bytes, profile.peak_node = 0, 0, None
        for i, (name, live) in enumerate(profile.timeline):
            freed += drop[i]
            profile.timeline[i] = (name, live - freed)
            if live - freed > profile.peak_bytes:
                profile.peak_bytes, profile.peak_node = live - freed, name

    def _output(self, name: str, tensor: Tensor, inputs: dict[int, Tensor]) -> None:
        """Give ``tensor`` a buffer: its aliased input's, a forwarded input's, or new."""
        slot = self.runtime.output_alias(self.graph, name, tensor.port)
        if slot is not None and slot in inputs:
            buffer = self.buffers.get(inputs[slot])
            if buffer is None:  # aliases a stored value: not the step's memory
                return
        else:
            size = self._bytes(tensor)
            buffer = None
            if not (self.planned and tensor in self.kept):  # ORT allocates outputs anew
                buffer = self._forwarded(name, size, inputs) if tensor.port == 0 else None
                if buffer is None and self.planned:
                    buffer = self._reused(tensor)
            if buffer is None:
                buffer = _Buffer(size, self._shape_key(tensor) if self.planned else None)
                self.live += size
        buffer.holders += 1
        self.buffers[tensor] = buffer

    def _forwarded(self, name: str, size: int, inputs: dict[int, Tensor]) -> _Buffer | None:
        """An input buffer ``name`` may write into: same size, and this read is the
        last reference to it (no other reader, fetch or alias holds it)."""
        for slot in self.runtime.forwardable_inputs(self.graph, name):
            tensor = inputs.get(slot)
            buffer = self.buffers.get(tensor) if tensor is not None else None
            if buffer is not None and buffer.size == size and buffer.holders == 1 \
                    and self.readers[tensor] == 1 and tensor not in self.kept:
                return buffer
        return None

    def _shape_key(self, tensor: Tensor) -> tuple | None:
        """What a freed buffer and a new value must share for ORT to reuse it: the
        exact shape (not just the size) and the element size; None for scalars
        and unknown shapes, which ORT never reuses."""
        dialect = self.dialect
        shape, dtype = dialect.shape(self.graph, tensor), dialect.dtype(self.graph, tensor)
        if shape is not None and self.batch_size is not None and \
                any(d is None or d < 0 for d in shape):
            shape = dialect.batch_shape(self.graph, tensor, self.batch_size)
        if not shape or dtype is None or any(d is None or d < 0 for d in shape):
            return None
        return tuple(shape), element_size(dtype)

    def _reused(self, tensor: Tensor) -> _Buffer | None:
        """The most recently freed buffer of ``tensor``'s shape key, if any waits."""
        waiting = self.free.get(self._shape_key(tensor)) if self.free else None
        if not waiting:
            return None
        buffer = waiting.pop()
        del self.freed_at[buffer]
        return buffer

    def _release(self, tensor: Tensor, step: int) -> None:
        """Drop ``tensor``'s hold on its buffer; the last holder frees it, or with
        planned reuse puts it on the free list (still allocated) after ``step``."""
        if tensor in self.kept:
            return
        buffer = self.buffers.pop(tensor, None)
        if buffer is None:
            return
        buffer.holders -= 1
        if buffer.holders > 0:
            return
        if self.planned and buffer.key is not None:
            self.free.setdefault(buffer.key, []).append(buffer)
            self.freed_at[buffer] = step
        else:
            self.live -= buffer.size
