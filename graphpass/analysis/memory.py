"""Static tensor sizes and a simulation of the runtime's memory over one step.

The estimate replays the step as the runtime runs it: in the dialect's schedule
(``Dialect.schedule``: for TF the executor's own order with one inter-op
thread, on the graph Grappler hands it, where the values known before the step
run first; for ONNX onnxruntime's order), over only the nodes the fetches need,
and counts what the runtime really allocates:

* fed values the runtime copies into buffers of its own (``Dialect.runtime_fed``:
  TF's placeholders without a default) are live for the whole step, as the
  runtime holds them until the step returns: they are part of the peak the CPU
  allocator measures (``MemoryProfile.fed_bytes``; TF's per-kernel allocation
  records leave them out);
* other values known before the step are not allocated by it: what is stored
  (variables and reads of them), fed without a copy (onnxruntime's inputs) and
  constants, including what the runtime folds into constants (ops whose inputs
  are all constant, up to ``MAX_FOLDED_BYTES``, as TF's and Grappler's constant
  folding do);
* a kernel's temporaries (``Dialect.scratch_shapes``: onnxruntime's ``Where``)
  count at its own step only;
* an output that aliases an input (Identity, Reshape, ...) shares its buffer;
* an elementwise op that is the last reader of an input of its output's size
  writes into that input's buffer (TF's buffer forwarding), unless another
  live value still holds that buffer;
* a buffer is freed when its last holder's last reader has run; fetched
  values and the values the dialect says the step returns whatever is fetched
  (``Dialect.returned_values``: ONNX's graph outputs) live to the end of the step;
* a runtime that plans its buffers ahead (``Dialect.reuses_freed_buffers``:
  onnxruntime's allocation planner) puts a freed buffer on a free list instead,
  most recently freed first; the next value of exactly its shape and element size
  (not a returned value, not a scalar) takes it over, and it stays allocated
  from its first value's production to its last value's last read, gap included
  (ORT frees a buffer after the last read of any value planned into it). A
  buffer no later value takes is freed where its last value died. Returned
  values always get a buffer of their own, never an input's.

A loop (``Dialect.loop_facts``: TF's ``While``) runs as one node of the step: its
outputs that accumulate one element per iteration (what its gradient pops) hold
the element's bytes times the trip count, and its body's own peak over one
iteration counts at its step, once (an iteration's values are freed before the
next one's peak, except what it accumulates). ``MemoryProfile.loops`` lists the
loops with their trip counts; a loop whose trip count neither the graph nor
``loop_trips`` gives counts its accumulators as zero.

Unknown sizes count as zero, so the estimate is a lower bound on what it can
see; ``batch_size`` gives the inputs' unknown batch dimension (``check_batch_size``
names an input that needs it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

from graphpass.analysis.shapes import infer_shapes
from graphpass.dialects.base import LoopFacts
from graphpass.errors import GraphpassError
from graphpass.ir.dtypes import np_dtype
from graphpass.ir.graph import Graph, Tensor

#: The largest constant TF's constant folding creates (``kMaxConstantSize``).
MAX_FOLDED_BYTES = 10 * 2**20


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
    itemsize = _itemsize(dtype)
    return None if itemsize is None else math.prod(shape) * itemsize


@cache
def _itemsize(dtype: str) -> int | None:
    try:
        return np_dtype(dtype).itemsize
    except TypeError:
        return None


def check_batch_size(graph: Graph, fetches: list[str], batch_size: int | None) -> None:
    """Raise a GraphpassError naming the first input the fetches need whose size is
    unknown, unless ``batch_size`` fills it (the planner cannot plan blind)."""
    infer_shapes(graph)
    targets = _fetch_nodes(graph, fetches)
    needed = graph.ancestors(targets) | set(targets)
    for name in graph.dialect.graph_inputs(graph):
        if name not in needed:
            continue
        for port in graph.used_ports(name) or [0]:
            tensor = Tensor(name, port)
            dtype = graph.dialect.dtype(graph, tensor)
            if dtype is None or _itemsize(dtype) is None:
                continue  # a handle (a function body's resource argument), not data
            if tensor_bytes(graph, tensor, batch_size) is None:
                shape = graph.dialect.shape(graph, tensor)
                shown = "unknown rank" if shape is None else \
                    "[" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + "]"
                fix = "give --batch-size N" if batch_size is None else \
                    "only its batch (first) dimension can be filled by --batch-size"
                raise GraphpassError(f"input {name} has shape {shown}, so tensor sizes are "
                                     f"unknown; {fix}")


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


def estimated_peak_bytes(graph: Graph, fetches: list[str], batch_size: int | None = None,
                         loop_trips: int | None = None) -> int:
    """Peak bytes the runtime allocates at once while running ``fetches``."""
    return memory_profile(graph, fetches, batch_size, loop_trips).peak_bytes


def memory_timeline(graph: Graph, fetches: list[str],
                    batch_size: int | None = None) -> list[tuple[str, int]]:
    """``(node, live bytes)`` for every node the step runs, in run order (for plots)."""
    return memory_profile(graph, fetches, batch_size).timeline


def memory_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                   loop_trips: int | None = None) -> MemoryProfile:
    """Simulate one step running ``fetches`` (``node`` or ``node:port`` names);
    ``loop_trips``: the trip count of loops whose count the graph does not fix."""
    infer_shapes(graph)
    targets = _fetch_nodes(graph, fetches)
    needed = graph.ancestors(targets) | set(targets)
    known = _known_before(graph, needed, batch_size)
    order = graph.dialect.schedule(graph, needed, known, frozenset(targets))
    simulation = _Simulation(graph, order, targets, known, _kept(graph, fetches), batch_size)
    simulation.add_loops(_loops(graph, order, batch_size, loop_trips))
    return simulation.run()


def _loops(graph: Graph, order: list[str], batch_size: int | None,
           loop_trips: int | None) -> dict[str, tuple[LoopFacts, int]]:
    """The loops the step runs, each with what it holds at its own step only: its
    body's peak over one iteration (the body estimated as a step of its own; the
    values passed in are not its), the accumulators no later node reads, and what
    the iterations in flight at once add (``_in_flight_bytes``)."""
    loops: dict[str, tuple[LoopFacts, int]] = {}
    for name in order:
        facts = graph.dialect.loop_facts(graph, name, batch_size, loop_trips)
        if facts is None:
            continue
        body = 0
        if facts.body is not None:
            inner = memory_profile(facts.body, list(facts.body_fetches), batch_size, loop_trips)
            body = inner.peak_bytes - inner.fed_bytes
        used = set(graph.used_ports(name))  # the rest is freed as the loop ends
        body += sum(facts.held_bytes(p) or 0 for p in facts.per_trip if p not in used)
        loops[name] = (facts, body + _in_flight_bytes(facts))
    return loops


def _in_flight_bytes(facts: LoopFacts) -> int:
    """TF runs up to ``parallel_iterations`` iterations at once: the executor runs
    ahead along them while a running sum (a weight gradient's total) trails, so
    each iteration ahead holds its addends, and has freed the elements it popped
    (``LoopFacts.popped_bytes``). The measured peak lands anywhere up to the worst
    case, which is what counts here."""
    ahead = min(facts.in_flight, facts.trips or 1) - 1
    return max(0, ahead * (facts.pending_bytes - facts.popped_bytes))


def _known_before(graph: Graph, needed: set[str], batch_size: int | None) -> frozenset[str]:
    """Nodes whose outputs exist before the step: stored, fed or folded values
    (module docstring), found forward from the constants (a node folds once the
    last of its inputs is known). The runtime's schedule treats them as run first."""
    dialect = graph.dialect
    stored = {n for n in needed
              if dialect.is_source(graph, n) or dialect.is_variable_value(graph, n)}
    known = {n for n in needed if dialect.is_constant(graph, n)}
    stack = list(known)
    while stack:
        for user in graph.data_users(stack.pop()):
            if user in needed and user not in known and dialect.is_foldable(graph, user) \
                    and all(t.node in known for t in graph.inputs(user)) and all(
                        (tensor_bytes(graph, Tensor(user, p), batch_size) or 0)
                        <= MAX_FOLDED_BYTES for p in graph.used_ports(user)):
                known.add(user)
                stack.append(user)
    return frozenset(stored | known)


def _fetch_nodes(graph: Graph, fetches: list[str]) -> list[str]:
    """The nodes of ``fetches``: a node's own name first, since names may hold ``:``
    (onnxruntime's ``onnx::SoftmaxCrossEntropyLoss::4``), else a tensor's node."""
    names = [f.lstrip("^") for f in fetches]
    return [n if n in graph else graph.dialect.parse_tensor(graph, n).node for n in names]


def _kept(graph: Graph, fetches: list[str]) -> set[Tensor]:
    """Fetched tensors (``loss:0``) and the dialect's returned values: handed to
    the caller, so they outlive the step."""
    return {graph.dialect.parse_tensor(graph, f) for f in fetches
            if ":" in f and f not in graph} | set(graph.dialect.returned_values(graph))


def scratch_bytes(graph: Graph, name: str) -> int:
    """Bytes of the temporaries ``name``'s kernel holds while it runs
    (``Dialect.scratch_shapes``), on top of its inputs and outputs."""
    dialect = graph.dialect
    total = 0
    for tensor, shape in dialect.scratch_shapes(graph, name):
        dtype = dialect.dtype(graph, tensor)
        itemsize = _itemsize(dtype) if dtype is not None else None
        if itemsize is not None and all(d is not None and d >= 0 for d in shape):
            total += math.prod(shape) * itemsize
    return total


class _Buffer:
    """An allocation: its size, how many live values hold it, and (where the runtime
    reuses freed buffers) the shape key a later value must match to take it over."""

    __slots__ = ("size", "holders", "key")

    def __init__(self, size: int, key: tuple | None = None) -> None:
        self.size, self.holders, self.key = size, 0, key


class _Simulation:
    """Walks the schedule once, allocating and freeing buffers (module docstring)."""

    def __init__(self, graph: Graph, order: list[str], targets: list[str],
                 constant: frozenset[str], kept: set[Tensor], batch_size: int | None) -> None:
        self.graph, self.dialect, self.order = graph, graph.dialect, order
        self.kept, self.batch_size = kept, batch_size
        self.kept_of: dict[str, list[Tensor]] = {}
        for tensor in sorted(kept):
            self.kept_of.setdefault(tensor.node, []).append(tensor)
        self.idle = self._control_only(targets)
        self.constant = constant
        self.readers: dict[Tensor, int] = {}  # reads by the nodes that really run
        for name in order:
            if name not in self.idle and name not in self.constant:
                for tensor in graph.inputs(name):
                    self.readers[tensor] = self.readers.get(tensor, 0) + 1
        self.buffers: dict[Tensor, _Buffer] = {}
        self.live = 0
        self.loops: dict[str, tuple[LoopFacts, int]] = {}
        self.stacked: dict[Tensor, int] = {}  # a v1 push: what its stack holds
        self.pops: dict[str, list[Tensor]] = {}  # a pop: the pushes whose stacks it frees
        self.stacks_at: dict[str, list[Tensor]] = {}  # a v1 loop: its pushes
        # Planned reuse: shape key -> freed buffers (most recent last), and the step
        # after which each waiting buffer was freed.
        self.planned = self.dialect.reuses_freed_buffers
        self.free: dict[tuple, list[_Buffer]] = {}
        self.freed_at: dict[_Buffer, int] = {}

    def _control_only(self, targets: list[str]) -> set[str]:
        """Stateless nodes whose values nothing that runs reads (they only order
        others through control edges, as the gradient of a constant factor does):
        Grappler's dependency optimizer turns them into NoOps, so they read nothing."""
        graph, dialect = self.graph, self.dialect
        needed, idle, fetched = set(self.order), set(), set(targets)
        for name in reversed(self.order):
            if name in fetched or dialect.is_stateful(graph, name):
                continue
            if all(user in idle or user not in needed for user in graph.data_users(name)):
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
        slot = self.dialect.container_input(self.graph, tensor)
        if slot is not None:  # a copy of that input, held as long as the container
            tensor = self.graph.input_slots(tensor.node).get(slot, tensor)
        size = tensor_bytes(self.graph, tensor, self.batch_size)
        if size is None and tensor.node in self.loops:
            size = self.loops[tensor.node][0].held_bytes(tensor.port)
        return size or 0

    def _fed_bytes(self) -> int:
        """Bytes of the fed values the runtime holds for the step (module docstring)."""
        needed = set(self.order)
        return sum(self._bytes(Tensor(name, 0))
                   for name in self.dialect.runtime_fed(self.graph) if name in needed)

    def run(self) -> MemoryProfile:
        profile = MemoryProfile(fed_bytes=self._fed_bytes(),
                                loops=[facts for facts, _ in self.loops.values()])
        self.live = profile.fed_bytes
        for name in self.order:
            if name in self.constant or name in self.idle:
                continue
            inputs = self.graph.input_slots(name)
            for port in self.graph.used_ports(name):
                self._output(name, Tensor(name, port), inputs)
            for tensor in self.kept_of.get(name, ()):
                if tensor not in self.buffers:
                    self._output(name, tensor, inputs)
            for tensor in self.stacks_at.get(name, ()):
                self._output(name, tensor, {})
            running = self.live + scratch_bytes(self.graph, name) + \
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
        return profile

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
        slot = self.dialect.output_alias(self.graph, name, tensor.port)
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
        for slot in self.dialect.forwardable_inputs(self.graph, name):
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
        return tuple(shape), _itemsize(dtype)

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


def format_bytes(count: int | None) -> str:
    """Bytes for people (B, KiB, MiB, GiB); ``n/a`` for an unknown count."""
    if count is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
