"""Ordering a segment's copies after the gradient that reaches it, and gating
values on each other (``gate_by_data``): a segment's gradient outputs
(``--tupleize-grads``), the parameter updates on every gradient (``defer``).

``control`` mode gives the copies control inputs on the trigger (TF runtime);
``data`` mode ties each float input of the copies to the trigger as
``x + stop_gradient(tiny * s)``, ``s`` summing element 0 of each incoming
gradient and ``tiny`` the dtype's smallest normal number, exactly as
``recompute_grad(use_data_dep=True)`` does (XLA ignores control edges; ONNX has
none). The factor is the runtime's ``dependency_scale`` (onnxruntime: 0, see there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.passes.remat.marks import SCOPE, scope_of, unique
from graphpass.runtimes import RuntimeModel


@dataclass(frozen=True)
class Recomputed:
    """A segment as rewritten in control mode: what ``order_segments`` orders."""

    triggers: list[str]  # the nodes its copies wait for
    waiting: list[str]  # its nodes that wait for them (``order_by_control``)
    copies: list[str]


def order_by_control(graph: Graph, copy_of: dict[str, str], triggers: list[Tensor],
                     segment: str) -> tuple[int, list[str]]:
    """Copies that read no other copy wait for the trigger: each reads its
    activations (else its weights) through ``Dialect.ordered_read``, so that no
    copy carries a control input the runtime's rewrites would see (TF's remapper
    fuses no contraction with one, which its original had not). A copy that reads
    only constants waits by control edges (a gated constant is no longer one to
    the runtime's optimizer). Returns the reads it added and the nodes that wait
    for the trigger (those reads, then those copies)."""
    dialect = graph.dialect
    copies = set(copy_of.values())
    after = unique(t.node for t in triggers)
    scope = scope_of(segment, "order")
    gated: dict[Tensor, Tensor] = {}
    waiting_copies = []
    for copy in copy_of.values():
        slots = graph.input_slots(copy)
        if any(t.node in copies for t in slots.values()):
            continue
        outside = {slot: t for slot, t in slots.items()
                   if not dialect.is_constant(graph, t.node)}
        activations = {slot: t for slot, t in outside.items()
                       if not dialect.is_variable_value(graph, t.node)}
        chosen = activations or outside
        if not chosen:
            for name in after:
                graph.add_control_input(copy, name)
            waiting_copies.append(copy)
            continue
        for slot, tensor in chosen.items():
            if tensor not in gated:
                gated[tensor] = dialect.ordered_read(graph, f"{scope}/read", tensor, after)
            graph.set_input(copy, slot, gated[tensor])
    return len(gated), [t.node for t in gated.values()] + waiting_copies


def order_segments(graph: Graph, segments: list[Recomputed], gradients: list[str],
                   runtime: RuntimeModel) -> list[int]:
    """Each segment recomputed after another in the backward pass waits also for
    the parameters' gradients that depend on the other one's copies (control
    edges into its nodes that wait for its trigger), where the runtime's executor
    queues ready kernels newest first (TF's: ``RuntimeModel.queues_newest_first``).

    That executor follows the path to the next trigger and queues the rest: a
    weight's gradient off that path (a convolution's filter gradient, a batch
    norm's scale gradient) may run only when the backward pass is done, holding
    the copies it reads, so every segment's copies end up held at once, as if
    nothing were recomputed. ``gradients``: the ops the edges leave, those that
    finish the gradients the updates read (``rewrite._gradients_done``); not the
    updates, which Keras makes depend on every gradient through one
    ``IdentityN``. Each edge goes only where it closes no cycle, in the graph or
    in the runtime's once it merges kernels (``RuntimeModel.merged_with``: with oneDNN,
    a convolution's filter gradient and its bias gradient run as one, so an edge
    out of one of them into copies the other reads would deadlock). Returns the
    edges added per segment."""
    if len(segments) < 2 or not gradients:
        return [0] * len(segments)
    dialect = graph.dialect

    def is_back_edge(src: str, dst: str) -> bool:
        return dialect.is_back_edge(graph, src, dst)

    order = graph.topological_order(ignore_edge=is_back_edge)
    position = {n: i for i, n in enumerate(order)}
    turn = sorted(range(len(segments)),  # the order the backward pass reaches them
                  key=lambda i: min(position[t] for t in segments[i].triggers))
    merged = {g: {g, *runtime.merged_with(graph, g)} for g in gradients}
    if any(is_back_edge(name, user) for name in order for user in graph.users(name)):
        reach = None  # a loop's back edges: the walks below see its cycles
    else:
        reach = _Descent(graph, order, [segments[i].copies for i in range(len(segments))],
                         [segments[i].waiting for i in range(len(segments))])
    added = [0] * len(segments)
    for before, after in zip(turn, turn[1:]):
        waiting = segments[after].waiting
        if reach is None:
            depends = graph.descendants(segments[before].copies)
            cycle = graph.descendants(waiting) | set(waiting)
            chosen = [g for g in gradients if g in depends and not merged[g] & cycle]
        else:
            chosen = [g for g in gradients if reach.from_copies(g, before)
                      and not any(reach.from_waiting(m, after) for m in merged[g])]
        for gradient in chosen:
            for name in waiting:
                graph.add_control_input(name, gradient)
                added[after] += 1
                if reach is not None:
                    reach.add_edge(gradient, name)
    return added


class _Descent:
    """For each node, which segments' copies and which segments' waiting nodes it
    descends from (bitsets by segment), kept exact as :func:`order_segments` adds
    control edges: one sweep of the graph in topological order, then each new
    edge's bits pushed forward only as far as they are new. What
    ``graph.descendants`` of every segment's copies and waiting nodes would tell,
    without a walk of the backward pass per pair of segments."""

    def __init__(self, graph: Graph, order: list[str], copies: list[list[str]],
                 waiting: list[list[str]]) -> None:
        self.graph = graph
        self.seed: dict[str, tuple[int, int]] = {}
        for k, names in enumerate(copies):
            for name in names:
                c, w = self.seed.get(name, (0, 0))
                self.seed[name] = (c | 1 << k, w)
        for k, names in enumerate(waiting):
            for name in names:
                c, w = self.seed.get(name, (0, 0))
                self.seed[name] = (c, w | 1 << k)
        self.copies: dict[str, int] = {}
        self.waiting: dict[str, int] = {}
        for name in order:
            c = w = 0
            for producer in graph.producers(name):
                pc, pw = self._out(producer)
                c, w = c | pc, w | pw
            self.copies[name], self.waiting[name] = c, w

    def _out(self, name: str) -> tuple[int, int]:
        """The bits ``name`` passes on: what it descends from, and itself."""
        c, w = self.seed.get(name, (0, 0))
        return self.copies.get(name, 0) | c, self.waiting.get(name, 0) | w

    def from_copies(self, name: str, segment: int) -> bool:
        return bool(self.copies[name] >> segment & 1)

    def from_waiting(self, name: str, segment: int) -> bool:
        """``name`` descends from a waiting node of ``segment``, or is one."""
        own = self.seed.get(name, (0, 0))[1]
        return bool((self.waiting[name] | own) >> segment & 1)

    def add_edge(self, src: str, dst: str) -> None:
        stack = [(dst, *self._out(src))]
        while stack:
            name, c, w = stack.pop()
            if c & ~self.copies[name] == 0 and w & ~self.waiting[name] == 0:
                continue
            self.copies[name] |= c
            self.waiting[name] |= w
            out = self._out(name)
            stack.extend((user, *out) for user in self.graph.users(name))


def computed_by(graph: Graph, tensor: Tensor, runtime: RuntimeModel) -> Tensor:
    """The tensor ``tensor`` aliases, through ops that pass an input on."""
    while (port := runtime.output_alias(graph, tensor.node, tensor.port)) is not None \
            and port < len(graph.inputs(tensor.node)):
        tensor = graph.inputs(tensor.node)[port]
    return tensor


def tieable(graph: Graph, tensor: Tensor) -> bool:
    """A value data mode can tie copies that read it to their trigger by: a float
    computed or fed while the step runs (a constant is folded, not read)."""
    dialect = graph.dialect
    return dialect.is_float(graph, tensor) and not dialect.is_constant(graph, tensor.node)


def order_by_data(graph: Graph, copy_of: dict[str, str], triggers: list[Tensor],
                   segment: str, runtime: RuntimeModel) -> None:
    """Tie the copies' float inputs from outside to the trigger:
    ``x + stop_gradient(tiny * s)`` (recompute_grad's use_data_dep).

    Like ``recompute_grad``, which ties the function's arguments and not the
    variables it reads, only activations are tied: tying a weight would make a
    weight-sized temporary per segment. Weights are tied only when a segment
    reads nothing else. Constants are never tied: they are there from the start
    anyway, and a tied constant is no longer one to the runtime's optimizer, which
    would then compute the copy differently from its original (Grappler turns
    ``x / const`` into ``x * (1 / const)`` only for a constant).
    """
    dialect = graph.dialect
    copies = set(copy_of.values())
    external = unique(t for c in copy_of.values() for t in graph.inputs(c)
                      if t.node not in copies and tieable(graph, t))
    if not external:
        control = " or use --dependency control" \
            if "control" in runtime.dependency_modes(graph) else ""
        raise GraphpassError(
            f"segment {segment!r} has no float input to tie to the gradient in data mode; "
            f"mark a larger segment (one that reads a float tensor){control}"
        )
    activations = [t for t in external if not dialect.is_variable_value(graph, t.node)]
    # Who reads each external tensor, once (a scan of every copy per tensor would be
    # quadratic in the segment); copies in order, then slots as the graph lists them.
    readers: dict[Tensor, list[tuple[str, int]]] = {}
    for copy in copy_of.values():
        for slot, source in graph.input_slots(copy).items():
            readers.setdefault(source, []).append((copy, slot))
    scope = f"{SCOPE}{segment.rstrip('/')}/dep"
    signal: dict[str, Tensor] = {}
    for tensor in activations or external:
        dtype = dialect.dtype(graph, tensor)
        if dtype not in signal:
            signal[dtype] = _tiny_signal(graph, f"{scope}/{dtype}", triggers, dtype, runtime)
        tied = dialect.binary(graph, f"{scope}/tie", "add", tensor, signal[dtype])
        for copy, slot in readers[tensor]:
            graph.set_input(copy, slot, tied)


def _tiny_signal(graph: Graph, scope: str, tensors: list[Tensor], dtype: str,
                 runtime: RuntimeModel) -> Tensor:
    """``stop_gradient(scale * sum(first elements))`` in ``dtype`` (``scale``: the
    runtime's ``dependency_scale``, ``tiny`` by default): numerically nothing
    for any normal value, but a data dependency no compiler may drop."""
    dialect = graph.dialect
    firsts = [
        dialect.cast(graph, f"{scope}/cast", dialect.first_element(graph, f"{scope}/first", t),
                     dtype)
        for t in tensors
    ]
    total = dialect.add_n(graph, f"{scope}/sum", firsts)
    tiny = dialect.scalar(graph, f"{scope}/tiny", runtime.dependency_scale(dtype), dtype)
    return dialect.stop_gradient(graph, f"{scope}/stop",
                                 dialect.binary(graph, f"{scope}/scaled", "mul", total, tiny))


def tupleize(graph: Graph, segment: str, gradient_ops: list[str], dependency: str,
             runtime: RuntimeModel) -> None:
    """Gate the segment's gradient outputs so none is consumed before all exist."""
    dialect = graph.dialect
    ops = set(gradient_ops)
    # Values that flow back into the segment's own gradient ops are internal to
    # it; gating those on all the ops would be a cycle.
    internal = graph.ancestors(ops)
    outputs = unique(
        Tensor(op, port) for op in sorted(ops) for port in graph.used_ports(op)
        if dialect.is_float(graph, Tensor(op, port))
        and _leaves(graph.consumers(Tensor(op, port)), ops, internal)
    )
    scope = f"{SCOPE}{segment.rstrip('/')}/tuple"
    if dependency != "control":
        gate_by_data(graph, scope, outputs, lambda c: c not in ops, runtime)
        return
    producers = unique(t.node for t in outputs)
    for tensor in outputs:
        gated = dialect.identity(graph, f"{scope}/gate", tensor, producers)
        graph.replace_uses(tensor, gated,
                           where=lambda c: c not in ops and not c.startswith(scope))


def gate_by_data(graph: Graph, scope: str, tensors: list[Tensor],
                 readers: Callable[[str], bool], runtime: RuntimeModel) -> None:
    """Rewire the readers of each float of ``tensors`` that ``readers`` accepts to
    ``tensor + stop_gradient(tiny * s)``, ``s`` summing the first element of every
    float of ``tensors`` in the order given (one signal per dtype): none of those
    readers can run before all of those floats exist."""
    dialect = graph.dialect
    # Only floats carry the signal: a quantized, string or bool value has no tiny
    # number to add (those readers are not held back).
    tensors = [t for t in tensors if dialect.is_float(graph, t)]
    signal: dict[str, Tensor] = {}
    for tensor in tensors:
        dtype = dialect.dtype(graph, tensor)
        if dtype not in signal:
            signal[dtype] = _tiny_signal(graph, f"{scope}/{dtype}", tensors, dtype, runtime)
        gated = dialect.binary(graph, f"{scope}/gate", "add", tensor, signal[dtype])
        graph.replace_uses(tensor, gated,
                           where=lambda c: readers(c) and not c.startswith(scope))


def _leaves(readers: list[tuple[str, int]], ops: set[str], internal: set[str]) -> bool:
    outside = [c for c, _ in readers if c not in ops]
    return bool(outside) and not any(c in internal for c in outside)
