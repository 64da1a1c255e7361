"""A static arena as TensorFlow Lite plans one: tensor lifetimes over an op order,
packed into offsets of one buffer, whose size is what the interpreter allocates.

Format-agnostic: the caller gives the ops in the order they run (each op's input
and output tensors by any hashable key), the graph's inputs and outputs, and each
tensor's size in bytes. It follows TFLite's ``ArenaPlanner`` and
``SimpleMemoryArena``:

* lifetimes (``PlanAllocations``): inputs are allocated before the first op and, as
  the interpreter preserves its inputs, never freed; outputs are never freed; any
  other tensor lives from the op that writes it to the last op that reads it
  (reads are counted per input slot, so an op reading a tensor twice frees it once);
  tensors no op writes and that are not inputs (constants, which the model's
  buffers hold) take no arena space;
* order (``CreateTensorAllocationVector``): tensors living for the whole step first
  (by index), then by size, largest first, ties by the op that writes them;
* packing (``SimpleMemoryArena::Allocate``): each tensor takes the tightest gap
  between the offsets of the already placed tensors whose lifetimes overlap its
  own, aligned to ``TENSOR_ALIGNMENT`` bytes, else the end; the arena is the
  highest end reached.

``arena_profile`` applies it to a graph's step (the estimate the planner plans
with for ``--target litert``). What it does not see: a kernel's temporaries
(scratch tensors a kernel adds when it is prepared) and tensors with dynamic
shapes (allocated outside the arena).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from graphpass.analysis.memory import MemoryProfile, _fetch_nodes, _known_before, tensor_bytes
from graphpass.analysis.shapes import infer_shapes
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import RuntimeModel, runtime_for

#: ``kDefaultTensorAlignment``: every tensor's offset in the arena is a multiple of it.
TENSOR_ALIGNMENT = 64

#: An op of the order: ``(input tensors, output tensors)``.
ArenaOp = tuple[Sequence[Hashable], Sequence[Hashable]]

_FOREVER = 2**31 - 1


@dataclass(frozen=True)
class Placement:
    """One tensor in the arena: its offset and size, and the ops it lives over."""

    offset: int
    size: int
    first: int
    last: int


@dataclass
class ArenaPlan:
    """``size_bytes``: the arena; ``placements``: each tensor's place (arena tensors only)."""

    size_bytes: int
    placements: dict[Hashable, Placement]


def lifetimes(ops: Sequence[ArenaOp], inputs: Sequence[Hashable],
              outputs: Sequence[Hashable]) -> dict[Hashable, tuple[int, int]]:
    """``{tensor: (first op, last op)}`` of every tensor that needs arena space
    (module docstring); ``_FOREVER`` as the last op of one that is never freed."""
    readers: dict[Hashable, int] = {}
    for op_inputs, _ in ops:
        for tensor in op_inputs:
            readers[tensor] = readers.get(tensor, 0) + 1
    pinned = set(outputs) | set(inputs)
    first: dict[Hashable, int] = {t: 0 for t in inputs}
    last: dict[Hashable, int] = {}
    for index, (op_inputs, op_outputs) in enumerate(ops):
        for tensor in op_outputs:
            first.setdefault(tensor, index)
        for tensor in op_inputs:
            readers[tensor] -= 1
            if readers[tensor] == 0 and tensor in first and tensor not in pinned:
                last.setdefault(tensor, index)
    return {t: (start, last.get(t, _FOREVER)) for t, start in first.items()}


def plan_arena(ops: Sequence[ArenaOp], inputs: Sequence[Hashable],
               outputs: Sequence[Hashable], sizes: dict[Hashable, int],
               temporaries: dict[int, Sequence[int]] | None = None) -> ArenaPlan:
    """The arena TFLite plans for ``ops`` (module docstring). ``sizes`` holds each
    tensor's bytes; a tensor it lacks (a dynamic shape) takes no arena space.
    ``temporaries``: per op index, the bytes of the scratch tensors its kernel
    adds (living at that op only, placed with the rest as TFLite places them)."""
    spans = lifetimes(ops, inputs, outputs)
    sizes = dict(sizes)
    for op, scratch in sorted((temporaries or {}).items()):
        for j, size in enumerate(scratch):
            spans[("temporary", op, j)] = (op, op)
            sizes[("temporary", op, j)] = size
    index = {t: i for i, t in enumerate(spans)}
    placed = [t for t in spans if sizes.get(t)]

    def order(tensor: Hashable) -> tuple:
        start, end = spans[tensor]
        if start == 0 and end == _FOREVER:
            return (0, index[tensor], 0)
        return (1, -sizes[tensor], start)

    active: list[tuple[int, Placement]] = []  # (offset, placement), sorted by offset
    placements: dict[Hashable, Placement] = {}
    high = 0
    for tensor in sorted(placed, key=order):
        start, end = spans[tensor]
        offset = _best_offset(active, sizes[tensor], start, end)
        placement = Placement(offset, sizes[tensor], start, end)
        placements[tensor] = placement
        high = max(high, offset + placement.size)
        _insert(active, placement)
    return ArenaPlan(high, placements)


def _best_offset(active: list[tuple[int, Placement]], size: int, first: int,
                 last: int) -> int:
    """``SimpleMemoryArena::Allocate``'s choice: the gap that fits ``size`` with the
    least room to spare (as TFLite measures it, from the unaligned end of the
    placement before it), among placements whose lifetimes overlap; else the end."""
    best, best_fit, current = None, None, 0
    for offset, placement in active:
        if placement.last < first or placement.first > last:
            continue
        aligned = _align(current)
        if aligned + size <= offset and (best_fit is None or offset - aligned < best_fit):
            best, best_fit = aligned, offset - current
        current = max(current, offset + placement.size)
        if best_fit == 0:
            break
    return _align(current) if best is None else best


def _insert(active: list[tuple[int, Placement]], placement: Placement) -> None:
    """After every placement at the same or a lower offset (``std::upper_bound``)."""
    position = len(active)
    for i, (offset, _) in enumerate(active):
        if offset > placement.offset:
            position = i
            break
    active.insert(position, (placement.offset, placement))


def _align(offset: int) -> int:
    return -(-offset // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT


def arena_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                  runtime: RuntimeModel | None = None) -> MemoryProfile:
    """The step ``fetches`` run, as TFLite's arena would hold it: every op the
    fetches need in the converter's order (``runtime``'s schedule, default
    TFLite's), outputs that
    alias an input (Identity, Reshape) as that input, constants and what folds
    into them (``_folded``) outside the arena. ``peak_bytes`` is the arena's size;
    ``timeline`` the bytes of tensors alive at each op (what the planner's
    refinement reads positions from).
    """
    runtime = runtime or runtime_for(graph, "litert")
    infer_shapes(graph)
    dialect = graph.dialect
    targets = _fetch_nodes(graph, fetches)
    needed = graph.ancestors(targets) | set(targets)
    folded = _folded(graph, needed, batch_size, runtime)
    # data fed to the step (a function body's resource handles are arguments too)
    fed = [n for n in dialect.step.graph_inputs(graph)
           if n in needed and tensor_bytes(graph, Tensor(n, 0), batch_size) is not None]
    names = {}

    def key(tensor: Tensor) -> Tensor:
        while tensor in names:
            tensor = names[tensor]
        return tensor

    ops, order, scratch = [], [], {}
    for name in runtime.schedule(graph, needed):
        if name not in needed or name in fed or name in targets or (
                name in folded and not dialect.is_variable_value(graph, name)):
            continue
        if dialect.is_source(graph, name):
            continue
        slots = graph.input_slots(name)
        outputs = []
        for port in graph.used_ports(name):
            alias = runtime.output_alias(graph, name, port)
            if alias is not None and alias in slots:
                names[Tensor(name, port)] = slots[alias]
            else:
                outputs.append(Tensor(name, port))
        if _batch_matmul(graph, name):
            scratch[len(ops)] = [tensor_bytes(graph, t, batch_size) or 0
                                 for t in list(slots.values())[:2]]
        ops.append(([key(t) for t in slots.values()], outputs))
        order.append(name)
    results = [key(t) for n in targets for t in graph.inputs(n)] if targets else []
    inputs = [Tensor(n, 0) for n in fed]
    sizes = {}
    for _, outputs in ops:
        for tensor in outputs:
            sizes[tensor] = tensor_bytes(graph, tensor, batch_size) or 0
    for tensor in inputs:
        sizes[tensor] = tensor_bytes(graph, tensor, batch_size) or 0
    plan = plan_arena(ops, inputs, results, sizes, scratch)
    return _profile(plan, order)


def _folded(graph: Graph, needed: set[str], batch_size: int | None,
            runtime: RuntimeModel) -> frozenset[str]:
    """What the converter makes constants: what the runtime folds (``_known_before``)
    and, as its shapes are static, what reads only a shape (``ZerosLike``, ``Shape``)
    and everything computed from those alone."""
    dialect = graph.dialect
    known = _known_before(graph, needed, batch_size, runtime)
    folded = {n for n in known if not (dialect.is_source(graph, n)
                                       or dialect.is_variable_value(graph, n))}
    for name in graph.topological_order():
        if name in needed and name not in folded and (
                dialect.is_shape_only(graph, name) and all(
                    tensor_bytes(graph, Tensor(name, p), batch_size) is not None
                    for p in graph.used_ports(name))
                or runtime.is_foldable(graph, name) and graph.inputs(name)
                and all(t.node in folded for t in graph.inputs(name))):
            folded.add(name)
    return frozenset(folded | known)


def _batch_matmul(graph: Graph, name: str) -> bool:
    """A product the converter writes as ``BATCH_MATMUL``, whose kernel adds two
    scratch tensors of its operands' sizes: every one but ``x @ w^T`` (the
    ``FULLY_CONNECTED`` form, which adds none for floats)."""
    dialect = graph.dialect
    if dialect.op_class(graph, name) != "matmul":
        return False
    return not (dialect.get_attr(graph, name, "transpose_b", False)
                and not dialect.get_attr(graph, name, "transpose_a", False))


def _profile(plan: ArenaPlan, order: list[str]) -> MemoryProfile:
    """The plan as a ``MemoryProfile``: the arena as the peak, live bytes per op."""
    change = [0] * (len(order) + 1)
    for placement in plan.placements.values():
        if placement.first >= len(order):
            continue
        change[placement.first] += placement.size
        if placement.last < len(order):
            change[placement.last + 1] -= placement.size
    profile = MemoryProfile(peak_bytes=plan.size_bytes)
    live, most = 0, -1
    for i, name in enumerate(order):
        live += change[i]
        profile.timeline.append((name, live))
        if live > most:
            most, profile.peak_node = live, name
    return profile
