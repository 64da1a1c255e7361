"""TF's control flow v1 loops (``Enter``/``Merge``/``Switch``/``NextIteration``/
``Exit`` frames around a ``LoopCond``) for the memory estimate.

A v1 loop's nodes sit in the graph itself and the estimate walks them once. Its
gradient (``tf.gradients`` through ``while_loop``) keeps what each forward
iteration computed on a ``StackV2``: a ``StackPushV2`` in the forward frame per
value, its ``StackPopV2`` in the gradient frame. So each push holds its element's
bytes times the forward trip count from the push until its pop.

A loop is named by its ``LoopCond``. Its trip count comes from the graph where it
is static: a condition ``counter < bound`` whose counter is a ``Merge`` of a
static start and itself plus one, and whose bound enters the frame unchanged;
a gradient loop runs as many times as the loop whose stacks it pops. Else the
caller's ``loop_trips``, else unknown.

It reads the graph and never edits it; frames are found once per graph version.
"""

from __future__ import annotations

import weakref

from graphpass.dialects.base import LoopFacts
from graphpass.dialects.tf_loops import _const_int, _static_int, _value_bytes
from graphpass.ir.graph import Graph, Tensor

_ENTER = frozenset({"Enter", "RefEnter"})
_EXIT = frozenset({"Exit", "RefExit"})
_NEXT = frozenset({"NextIteration", "RefNextIteration"})
_THROUGH = frozenset({"Identity", "Switch", "RefSwitch", "Snapshot"})
_SUMS = frozenset({"AddN", "Add", "AddV2"})
#: Values that are a variable's buffer. (A TensorArray element read is cleared from
#: the array as it is read: the stack's reference is what keeps it.)
_ALIASED_READS = frozenset({"ReadVariableOp"})

_FRAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def loop_facts(graph: Graph, name: str, batch_size: int | None,
               loop_trips: int | None) -> LoopFacts | None:
    """The facts of the v1 loop whose ``LoopCond`` is ``name``."""
    frames = _frames(graph)
    frame = frames.get(name)
    if frame is None:
        return None
    members = [n for n in graph if frames.get(n) == frame]
    pushes = _pushes(graph, members, frames, batch_size)
    trips = _static_trips(graph, name, batch_size)
    if trips is None:
        trips = _popped_trips(graph, members, frames, batch_size)
    source = "graph" if trips is not None else "option" if loop_trips is not None else "unknown"
    entered = [graph.node(n) for n in members if graph.node(n).op in _ENTER]
    parallel = max((e.attrs["parallel_iterations"].i for e in entered
                    if "parallel_iterations" in e.attrs), default=1)
    every = {}
    for cond in (n for n in frames if graph.node(n).op == "LoopCond"):
        every.update(_pushes(graph, [n for n in graph if frames.get(n) == frames[cond]],
                             frames, batch_size))
    return LoopFacts(name, trips if trips is not None else loop_trips, source, {}, None,
                     in_flight=max(1, parallel), pending_bytes=_pending(graph, members, batch_size),
                     pushes=pushes, popped_bytes=_popped(graph, members, every))


def _frames(graph: Graph) -> dict[str, str]:
    """Node -> the name of the frame it runs in, for nodes inside a loop: an Enter
    starts its ``frame_name``, an Exit returns to the frame around it, any other
    node runs in its inputs' frame (its control inputs' if it has no data input)."""
    cached = _FRAMES.get(graph)
    if cached is not None and cached[0] == graph.version:
        return cached[1]
    frames: dict[str, str | None] = {}
    parent: dict[str, str | None] = {}
    order = graph.topological_order(
        ignore_edge=lambda s, d: graph.node(s).op in _NEXT)
    for name in order:
        sources = [t.node for t in graph.inputs(name)] or graph.control_inputs(name)
        src = next((s for s in sources if s in frames), None)
        frame = frames[src] if src is not None else None
        if src is not None and graph.node(src).op in _EXIT:
            frame = parent.get(frame)
        op = graph.node(name).op
        if op in _ENTER:
            inner = graph.node(name).attrs["frame_name"].s.decode()
            parent.setdefault(inner, frame)
            frame = inner
        frames[name] = frame
    found = {n: f for n, f in frames.items() if f is not None}
    _FRAMES[graph] = (graph.version, found)
    return found


def _through(graph: Graph, tensor: Tensor, ops=_THROUGH) -> Tensor:
    while graph.node(tensor.node).op in ops and graph.inputs(tensor.node):
        tensor = graph.inputs(tensor.node)[0]
    return tensor


def _stack(graph: Graph, handle: Tensor) -> str:
    """The ``StackV2`` a push or pop works on (its handle enters the frame)."""
    return _through(graph, handle, _THROUGH | _ENTER).node


def _pushes(graph: Graph, members: list[str], frames: dict[str, str],
            batch_size: int | None) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Push -> (bytes it stacks per iteration, its pops), for the pushes of this
    frame whose element is a new buffer each iteration: not a variable's value,
    not a loop variable whose next value is pushed too."""
    pops: dict[str, list[str]] = {}
    for name in graph:
        if graph.node(name).op == "StackPopV2":
            pops.setdefault(_stack(graph, graph.inputs(name)[0]), []).append(name)
    writes = [n for n in members if graph.node(n).op == "StackPushV2"]
    pushed = {_through(graph, graph.inputs(n)[1], frozenset({"Identity"})) for n in writes}
    found = {}
    for push in writes:
        element = graph.inputs(push)[1]
        source = _through(graph, element)
        if graph.node(source.node).op in _ALIASED_READS:
            continue
        if graph.node(source.node).op == "Merge" and _next_value(graph, source.node) in pushed:
            continue
        size = _bytes(graph, element, batch_size)
        if size:
            found[push] = (size, tuple(pops.get(_stack(graph, graph.inputs(push)[0]), ())))
    return found


def _next_value(graph: Graph, merge: str) -> Tensor | None:
    """The value a loop variable's ``Merge`` takes in the next iteration."""
    for tensor in graph.inputs(merge):
        if graph.node(tensor.node).op in _NEXT:
            return _through(graph, graph.inputs(tensor.node)[0], frozenset({"Identity"}))
    return None


def _static_trips(graph: Graph, cond: str, batch_size: int | None) -> int | None:
    bounds = _bounds(graph, _through(graph, graph.inputs(cond)[0]), batch_size)
    return min(bounds) if bounds else None


def _bounds(graph: Graph, test: Tensor, batch_size: int | None) -> list[int]:
    """Trip counts each ``counter < bound`` conjunct of the condition implies."""
    op = graph.node(test.node).op
    if op == "LogicalAnd":
        return [b for t in graph.inputs(test.node)
                for b in _bounds(graph, _through(graph, t), batch_size)]
    if op != "Less":
        return []
    counter, bound = (_through(graph, t) for t in graph.inputs(test.node))
    if graph.node(counter.node).op != "Merge":
        return []
    start = _counter_start(graph, counter.node, batch_size)
    limit = _outer_int(graph, bound, batch_size)
    return [] if start is None or limit is None else [max(0, limit - start)]


def _counter_start(graph: Graph, merge: str, batch_size: int | None) -> int | None:
    """The start of a counter ``Merge(Enter(start), NextIteration(merge + 1))``."""
    step = _next_value(graph, merge)
    entered = [t for t in graph.inputs(merge) if graph.node(t.node).op in _ENTER]
    if step is None or not entered or graph.node(step.node).op not in _SUMS:
        return None
    operands = [_through(graph, t) for t in graph.inputs(step.node)]
    if Tensor(merge, 0) not in operands or len(operands) != 2:
        return None
    other = operands[1 - operands.index(Tensor(merge, 0))]
    if _outer_int(graph, other, batch_size) != 1:
        return None
    return _outer_int(graph, graph.inputs(entered[0].node)[0], batch_size)


def _outer_int(graph: Graph, tensor: Tensor, batch_size: int | None) -> int | None:
    """A static integer entering the frame (a constant in it, or entered from outside)."""
    tensor = _through(graph, tensor, _THROUGH | _ENTER)
    if graph.node(tensor.node).op == "Const":
        return _const_int(graph, tensor)
    return _static_int(graph, tensor, batch_size)


def _popped_trips(graph: Graph, members: list[str], frames: dict[str, str],
                  batch_size: int | None) -> int | None:
    """A gradient loop's trip count: that of the loop whose stacks it pops."""
    for name in members:
        if graph.node(name).op != "StackPopV2":
            continue
        stack = _stack(graph, graph.inputs(name)[0])
        for user in graph.data_users(stack):
            for push in graph.data_users(user):
                if graph.node(push).op == "StackPushV2" and push in frames:
                    cond = _loop_cond(graph, frames, frames[push])
                    if cond is not None:
                        return _static_trips(graph, cond, batch_size)
    return None


def _loop_cond(graph: Graph, frames: dict[str, str], frame: str) -> str | None:
    return next((n for n, f in frames.items() if f == frame
                 and graph.node(n).op == "LoopCond"), None)


def _popped(graph: Graph, members: list[str], pushes: dict[str, tuple[int, tuple]]) -> int:
    """Bytes per iteration this loop pops off stacks (freed as its iterations run):
    ``pushes`` are every loop's."""
    mine = set(members)
    return sum(size for size, pops in pushes.values() if mine.intersection(pops))


def _bytes(graph: Graph, tensor: Tensor, batch_size: int | None) -> int | None:
    return _value_bytes(graph, tensor, graph.dialect.dtype(graph, tensor), batch_size)


def _pending(graph: Graph, members: list[str], batch_size: int | None) -> int:
    """Bytes per iteration of the addends of running sums: a sum whose next value
    is a ``Merge`` of its own (``x = x + g``), without that ``Merge``."""
    total = 0
    for name in members:
        if graph.node(name).op not in _NEXT:
            continue
        step = _through(graph, graph.inputs(name)[0], frozenset({"Identity"}))
        if graph.node(step.node).op not in _SUMS:
            continue
        merges = [u for u in graph.data_users(name) if graph.node(u).op == "Merge"]
        operands = [_through(graph, t) for t in graph.inputs(step.node)]
        if not merges or Tensor(merges[0], 0) not in operands:
            continue
        total += sum(_bytes(graph, t, batch_size) or 0 for t in operands
                     if t != Tensor(merges[0], 0) and
                     graph.node(_through(graph, t, _THROUGH | _ENTER).node).op != "Const")
    return total
