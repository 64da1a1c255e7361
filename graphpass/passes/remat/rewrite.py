"""The rewrite of marked segments: for each, a plan (copies, rewires, the trigger)
decided on the graph as the earlier segments left it, then the copies made,
ordered after the trigger (``order``) and read by the segment's gradient ops.

A segment's internal activations are no longer kept for the backward pass: the
recomputable part of the segment is copied into the backward pass and its own
gradient ops read the copies instead. The copies are *triggered per segment*:
they depend on the gradient flowing into that segment, so each segment is
recomputed when the backward pass reaches it (not all at once, which is why
Grappler's MANUAL mode saves nothing on a chain of blocks).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import partial

from graphpass.analysis.memory import tensor_bytes
from graphpass.analysis.shapes import infer_shapes
from graphpass.ir.graph import Graph, Tensor
from graphpass.passes.remat.marks import SCOPE, Segment, is_generated, scope_of, unique
from graphpass.passes.remat.order import (
    Recomputed,
    computed_by,
    order_by_control,
    order_by_data,
    order_segments,
    tupleize,
)
from graphpass.runtimes import RuntimeModel


@dataclass(frozen=True)
class Step:
    """What every segment's rewrite of one graph needs (decided once, before any)."""

    forward: set[str]
    backward: set[str]
    fetches: list[str]
    dependency: str
    #: Each parameter update (apply op) with the gradients it reads, and the
    #: optimizer's nodes. Found once: the rewrites add no update and change no
    #: gradient, and finding them again costs a walk of the whole graph.
    updates: dict[str, list[Tensor]]
    optimizer: set[str]
    #: The runtime the graph is written for (``graphpass.runtimes``): what it
    #: merges, fuses and queues decides how copies are ordered.
    runtime: RuntimeModel
    #: The memory estimate's trip count of loops whose count the graph does not fix.
    loop_trips: int | None = None

    @classmethod
    def of(cls, regions, dependency: str, runtime: RuntimeModel,
           loop_trips: int | None = None) -> Step:
        """The step region analysis found (``analysis.regions``' result)."""
        return cls(forward=set(regions.nodes("forward")),
                   backward=set(regions.nodes("backward")),
                   fetches=regions.fetches, dependency=dependency,
                   updates={a: g for s in regions.steps for a, g in s.updates.items()},
                   optimizer=set(regions.nodes("optimizer")), runtime=runtime,
                   loop_trips=loop_trips)

    @property
    def gradients(self) -> list[Tensor]:
        """The gradients the parameter updates read, each once."""
        return unique(t for tensors in self.updates.values() for t in tensors)


@dataclass
class _Plan:
    """What one segment's rewrite does, decided before the graph is touched."""

    copies: list[str]  # originals to copy, in graph order
    rewires: list[tuple[str, int, Tensor]]  # (consumer, slot, original tensor)
    triggers: list[Tensor]


def rewrite_segments(graph: Graph, segments: list[Segment], step: Step,
                     tupleize_grads: bool, released_bytes: bool = True,
                     batch_size: int | None = None) -> list[dict]:
    """Plan and apply each segment in turn (a plan sees the earlier rewrites).
    ``released_bytes``: size what each segment no longer keeps (an unknown batch
    dimension as ``batch_size``), which reads the segments' shapes (None otherwise:
    a ``--quiet`` rewrite shows no figures, so need not pay for inferring them)."""
    entries = []
    if released_bytes:  # the segments' shapes, while the graph is as read
        infer_shapes(graph, [name for segment in segments for name in segment.nodes])
    # Tupleized gradients tie a segment's gradient ops to each other, which
    # may run against the order the reachability shortcut relies on.
    reach = _Reach(graph, step.backward, ordered=not tupleize_grads)
    holders = _Holders(graph, [f for f in step.fetches if f not in step.forward])
    recomputed: dict[int, Recomputed] = {}
    for segment in segments:
        segment_plan = _plan(graph, segment, step, reach)
        entry, waiting = _apply(graph, segment, segment_plan, step, tupleize_grads,
                                released_bytes, holders, batch_size)
        entries.append(entry)
        if not segment_plan.rewires:
            entry["outputs_read"] = _outputs_read(graph, segment, step.backward)
        if entry["copied"]:
            reach.rewritten(segment_plan)
        if waiting and segment.in_turn:
            recomputed[len(entries) - 1] = Recomputed(
                unique(t.node for t in segment_plan.triggers), waiting, entry["copies"])
    if step.runtime.queues_newest_first and len(recomputed) > 1:
        added = order_segments(graph, list(recomputed.values()),
                               _gradients_done(graph, step), step.runtime)
        for index, count in zip(recomputed, added):
            entries[index]["waits_for_gradients"] = count
    return entries


def _gradients_done(graph: Graph, step: Step) -> list[str]:
    """The ops after which the parameters' gradients take only small steps more,
    that an ordering edge may leave: the op computing each gradient an update
    reads, or, where the runtime rewrites that op together with its neighbours
    (``RuntimeModel.rewritten_with_neighbours``: an edge out of it would stop that),
    the nearest ops above it that it does not (a batch norm's scale gradient
    scales a ``Sum``: the ``Sum``). Backward ops in the root frame only: an edge
    from there into a v1 ``while_loop`` frame other than into its ``Enter`` is
    one TF rejects."""
    dialect = graph.dialect
    pending = unique(computed_by(graph, t, step.runtime).node for t in step.gradients)
    if not pending:
        return []
    found, seen = [], set(pending)
    while pending:
        name = pending.pop()
        if name not in step.backward:
            continue
        if not step.runtime.rewritten_with_neighbours(graph, name):
            found.append(name)
            continue
        for producer in graph.producers(name):
            if producer not in seen:
                seen.add(producer)
                pending.append(producer)
    depths, found = dialect.frame_depths(graph), set(found)
    return [n for n in graph if n in found and depths.get(n, 0) == 0]


def _outputs_read(graph: Graph, segment: Segment, backward: set[str]) -> list[str]:
    """The segment's values gradient ops read: where nothing is recomputed, only
    its outputs, which forward ops after it read too and so are kept anyway
    (onnxruntime's gradients of a MatMul, Add, Relu block read only the Relu's)."""
    return [str(Tensor(n, p)) for n in segment.nodes for p in graph.used_ports(n)
            if any(c in backward for c, _ in graph.consumers(Tensor(n, p)))]


def _apply(graph: Graph, segment: Segment, plan: _Plan, step: Step,
           tupleize_grads: bool, released_bytes: bool, holders: _Holders,
           batch_size: int | None = None) -> tuple[dict, list[str]]:
    """Copy, order and rewire one segment as ``plan`` says; its report entry, and
    its nodes that wait for the trigger (control mode; ``order_by_control``)."""
    entry = {"segment": segment.name, "marked": len(segment.nodes), "copied": 0,
             "copies": [], "recomputes": [], "triggers": [str(t) for t in plan.triggers],
             "released": [], "released_bytes": 0 if released_bytes else None, "note": "",
             "readers_kept": 0, "ordering_reads": 0, "read_once": []}
    if not plan.rewires:
        entry["note"] = "no gradient op reads this segment's internal values"
        return entry, []
    if not plan.triggers:
        entry["note"] = "no gradient flows into this segment; left as is"
        return entry, []
    copied = set(plan.copies)
    # Computed values read once that copies will read too: the one reader TF may
    # have fused them into no longer is the only one (the runtime's view changes;
    # reported). Stored values (constants, variable reads) are fused into nothing.
    once = unique(str(t) for n in plan.copies for t in graph.inputs(n)
                  if t.node not in copied and len(graph.consumers(t)) == 1
                  and not _stored(graph, t.node))
    copy_of = _copy_nodes(graph, plan.copies)
    # How many read each original value now (as TF's rewrites count them).
    readers = {Tensor(o, p): len(graph.consumers(Tensor(o, p)))
               for o in copy_of for p in graph.used_ports(o)}
    reads, waiting = 0, []
    if step.dependency == "control":
        reads, waiting = order_by_control(graph, copy_of, plan.triggers, segment.name)
    else:
        order_by_data(graph, copy_of, plan.triggers, segment.name, step.runtime)
    released = sorted({orig for _, _, orig in plan.rewires})
    for consumer, slot, original in plan.rewires:
        graph.set_input(consumer, slot, Tensor(copy_of[original.node], original.port))
    kept = _keep_readers(graph, segment, copy_of, readers, holders)
    if tupleize_grads:
        tupleize(graph, segment.name, [c for c, _, _ in plan.rewires], step.dependency,
                 step.runtime)
    entry.update(copied=len(copy_of), copies=list(copy_of.values()), recomputes=list(copy_of),
                 released=[str(t) for t in released], readers_kept=kept,
                 ordering_reads=reads, read_once=once, waits_for_gradients=0)
    if released_bytes:
        entry["released_bytes"] = sum(tensor_bytes(graph, t, batch_size) or 0 for t in released)
    return entry, waiting


def _keep_readers(graph: Graph, segment: Segment, copy_of: dict[str, str],
                  readers: dict[Tensor, int], holders: _Holders) -> int:
    """Every original value and its copy keep as many readers as the value had
    (``Dialect.keep_readers``): the runtime's rewrites then treat both as they
    treated the original (a value that lost its backward readers to the copy
    would be fused into its forward reader; a copy missing a reader its original
    had, into its own)."""
    dialect = graph.dialect
    scope = scope_of(segment.name, "reader")
    kept = 0
    for tensor, count in readers.items():
        for value in (tensor, Tensor(copy_of[tensor.node], tensor.port)):
            missing = count - len(graph.consumers(value))
            if missing > 0:
                kept += dialect.keep_readers(graph, scope, value, missing,
                                             partial(holders.of, tensor.node))
    return kept


def _stored(graph: Graph, name: str) -> bool:
    """A stored value, or one computed from stored values only (a reshaped weight)."""
    dialect = graph.dialect

    def source(node: str) -> bool:
        return dialect.is_source(graph, node) or dialect.is_constant(graph, node) \
            or dialect.is_variable_value(graph, node)

    return source(name) or all(source(t.node) for t in graph.inputs(name))


class _Holders:
    """The fetched nodes (train ops) that depend on a node, asked per node: one
    walk per fetch, once, on the graph as read."""

    def __init__(self, graph: Graph, fetches: list[str]) -> None:
        self.graph = graph
        self.fetches = fetches
        self.ancestors: dict[str, set[str]] | None = None

    def of(self, name: str) -> list[str]:
        if self.ancestors is None:
            self.ancestors = {f: self.graph.ancestors({f}) for f in self.fetches}
        return [f for f in self.fetches if name in self.ancestors[f]]


def _plan(graph: Graph, segment: Segment, step: Step, reach: _Reach | None = None) -> _Plan:
    """Decide copies, rewires and triggers for one segment (graph untouched).
    ``reach``: shared by the segments of one rewrite (made here if not given)."""
    copies, rewires = segment_copies(graph, segment, step)
    return _Plan(copies, rewires, _triggers(graph, {c for c, _, _ in rewires}, step.backward,
                                            reach or _Reach(graph, step.backward)))


def segment_copies(graph: Graph, segment: Segment, step: Step
                   ) -> tuple[list[str], list[tuple[str, int, Tensor]]]:
    """The originals a segment's rewrite copies (graph order) and the gradient
    ops' reads it rewires to them, on the graph as it is."""
    forward, backward, runtime = step.forward, step.backward, step.runtime
    if segment.kept is None:
        recomputable = {n for n in segment.nodes if runtime.recomputable(graph, n)}
        released = _internal_values(graph, segment, recomputable, forward)

        def recompute(tensor: Tensor) -> bool:
            return tensor.node in recomputable
    else:
        released = segment.released or []

        def recompute(tensor: Tensor) -> bool:
            return tensor not in segment.kept and tensor.node in forward \
                and not is_generated(tensor.node) and runtime.recomputable(graph, tensor.node)
    rewires = [(consumer, slot, tensor) for tensor in released
               for consumer, slot in graph.consumers(tensor)
               if consumer in backward and not is_generated(consumer)]
    needed = _upstream(graph, {t.node for _, _, t in rewires}, recompute)
    order = segment.nodes if segment.kept is None else graph
    return [n for n in order if n in needed], rewires


def _internal_values(graph: Graph, segment: Segment, recomputable: set[str],
                     forward: set[str]) -> list[Tensor]:
    """The values a segment recomputes: those of its recomputable nodes that no
    forward node outside it reads (those are boundaries, kept anyway)."""
    members = set(segment.nodes)
    return [Tensor(name, port) for name in segment.nodes if name in recomputable
            for port in graph.used_ports(name)
            if not _is_boundary(graph.consumers(Tensor(name, port)), members, forward)]


def _triggers(graph: Graph, consumers: set[str], backward: set[str],
              reach: _Reach) -> list[Tensor]:
    """The gradient flowing into the segment: computed float backward tensors that
    the segment's gradient ops read and that do not depend on them.

    Fused gradient ops (TF ``ReluGrad(grad, relu)``) read the incoming gradient
    next to the activation. Decomposed ones (ONNX: ``Greater(z, 0)`` then
    ``Where(., grad, 0)``; ``Mul(t, t)`` then ``Mul(grad, 1 - .)``) read the
    activation alone and the gradient joins further down; then the nearest
    layer of their backward descendants that reads such a gradient gives the
    trigger. There, values computed from forward tensors and constants only
    (``Transpose(h)``) are not gradients and are passed over while a real one
    exists. Stored values (constants, variable reads) trigger only when
    nothing else can: they order little (a TF graph whose gradients wait on
    the moving-average updates, ``control_dependencies(update_ops)``, has
    every gradient downstream of its segments' own update ops).
    """
    dialect = graph.dialect
    after = reach.downstream(consumers)

    def entering(nodes: set[str], sources: bool = False) -> list[Tensor]:
        return unique(
            t for c in sorted(nodes) for t in graph.inputs(c)
            if t.node in backward and t.node not in after
            and (sources or not dialect.is_source(graph, t.node))
            and dialect.is_float(graph, t)
        )

    direct = entering(consumers)
    if direct:
        return direct
    fallback: list[Tensor] = []
    seen, layer = set(consumers), set(consumers)
    while layer:
        layer = {u for n in layer for u in graph.data_users(n)
                 if u in backward and u not in seen}
        seen |= layer
        found = entering(layer)
        gradients = [t for t in found if reach.carries_gradient(t.node)]
        if gradients:
            return gradients
        fallback = fallback or found
    return fallback or entering(consumers, sources=True)


class _Reach:
    """The two reachability questions of the trigger search, answered for the
    graph as the earlier segments' rewrites left it, without a walk of the whole
    graph per segment (which would make rewriting quadratic in the segments).

    * ``downstream(consumers)``: the nodes that depend on ``consumers``, walked
      only as far as asked: a node depends only on nodes before it in a
      topological order, so asking about ``x`` walks the consumers' descendants
      that come before ``x``. A rewrite keeps the order of the original graph
      valid as long as each segment's triggers come before its rewired
      consumers (what copies and ties connect); checked after every segment,
      and once it fails (or the graph has a cycle) the walk is unbounded.
    * ``carries_gradient(name)``: computed from some backward value (not from
      forward values and constants alone, as a ``Transpose`` of an activation
      or a weight is). One walk before any rewrite; a rewrite adds ancestors
      to an original node only through the copies and ties it added, which the
      walk from ``name`` follows up to the original nodes (a rewired consumer
      reads an activation, so it is itself computed backward).
    """

    def __init__(self, graph: Graph, backward: set[str], ordered: bool = True) -> None:
        self.graph = graph
        self.computed = {n for n in backward if not graph.dialect.is_source(graph, n)}
        self.from_computed = graph.descendants(self.computed)
        self.original = set(graph)
        self.position: dict[str, int] | None = None
        if ordered:
            try:
                self.position = {n: i for i, n in enumerate(graph.topological_order())}
            except ValueError:  # a cycle (TF loops): no order to bound the walks by
                pass

    def downstream(self, consumers: set[str]) -> _Downstream:
        return _Downstream(self.graph, consumers, self.position)

    def rewritten(self, plan: _Plan) -> None:
        """After ``plan`` was applied: does the original order still hold?"""
        position = self.position
        if position is not None and max(position[t.node] for t in plan.triggers) >= \
                min(position[c] for c, _, _ in plan.rewires):
            self.position = None

    def carries_gradient(self, name: str) -> bool:
        if name in self.from_computed:
            return True
        seen, stack = {name}, [name]
        while stack:
            for producer in self.graph.producers(stack.pop()):
                if producer in self.computed or producer in self.from_computed:
                    return True
                if producer not in self.original and producer not in seen:
                    seen.add(producer)
                    stack.append(producer)
        return False


class _Downstream:
    """``descendants(consumers) | consumers``, walked lazily (see ``_Reach``)."""

    def __init__(self, graph: Graph, consumers: set[str],
                 position: dict[str, int] | None) -> None:
        self.graph = graph
        self.position = position
        self.members = set(consumers)
        self.pending = sorted((self._key(c, 0), c) for c in consumers)

    def _key(self, name: str, parent_key: float) -> float:
        """Position in the order; a node a rewrite added walks with its producer."""
        if self.position is None:
            return 0
        return self.position.get(name, parent_key)

    def __contains__(self, name: str) -> bool:
        if name in self.members:
            return True
        bound = math.inf if self.position is None else self.position.get(name, math.inf)
        while self.pending and self.pending[0][0] <= bound:
            key, node = heapq.heappop(self.pending)
            for user in self.graph.users(node):
                if user not in self.members:
                    self.members.add(user)
                    heapq.heappush(self.pending, (self._key(user, key), user))
        return name in self.members


def _is_boundary(readers: list[tuple[str, int]], members: set[str], forward: set[str]) -> bool:
    """Read by a forward node outside the segment (the next segment, the loss): a
    value kept anyway as a checkpoint, so recomputing it saves nothing."""
    return any(c in forward and c not in members for c, _ in readers)


def _upstream(graph: Graph, names: set[str], recompute) -> set[str]:
    """``names`` and the producers of the values they read that ``recompute``
    accepts, transitively: what must be copied to recompute ``names``."""
    seen = set(names)
    stack = list(names)
    while stack:
        for tensor in graph.inputs(stack.pop()):
            if tensor.node not in seen and recompute(tensor):
                seen.add(tensor.node)
                stack.append(tensor.node)
    return seen


def _copy_nodes(graph: Graph, originals: list[str]) -> dict[str, str]:
    """Copy ``originals`` (in graph order) under ``graphpass/remat/``; inputs inside
    the copied set point at the copies, everything else at the original tensors."""
    dialect = graph.dialect
    copy_of = {}
    for name in originals:  # one at a time: a name taken here is not free for the next
        copy_of[name] = graph.unique_name(SCOPE + name)
        dialect.copy_node(graph, name, copy_of[name])
    for name in originals:
        for slot, tensor in graph.input_slots(name).items():
            source = copy_of.get(tensor.node)
            graph.set_input(copy_of[name], slot,
                            Tensor(source, tensor.port) if source else tensor)
        for control in graph.control_inputs(name):
            graph.add_control_input(copy_of[name], copy_of.get(control, control))
    return copy_of
