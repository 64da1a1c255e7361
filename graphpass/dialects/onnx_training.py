"""Where an ONNX training step updates its parameters, found by structure.

An ONNX training step returns what it updates: each updated parameter and each
piece of optimizer state (moments, a step counter) is a graph output that
replaces the graph input or initializer of the same shape it was computed from
(the state-passing convention; the caller feeds the output back next step).
Nothing names the updates, and optimizers write them in many forms
(``p - lr * g``, ``p + u * -lr``, ``p - lr * m / (sqrt(v) + eps)``, a decayed
``p``, a rate from a schedule input), so they are found by what they read and
write, not by an op pattern:

* **The update cone** of a graph output: walking up from it through
  elementwise ops on tensors of its shape and dtype (optimizer math is
  elementwise; scalars such as the learning rate or a clipping factor are side
  inputs and are not entered). The cone ends in *sources* (inputs and
  initializers) and *leaves*: tensors of the output's shape computed by
  anything else (a ``MatMul``, a ``ReduceSum``: the gradient computation).
* **What it replaces**: the nearest same-shaped source of the cone (fewest ops
  away; a graph input before an initializer at equal distance). Outputs whose
  nearest source is unique claim it first; a claimed source is then out of the
  others' reach (an exponential moving average reads the parameter and its
  shadow equally close, but the parameter's own update claims it first).
* **Parameter or state**: a parameter is read outside the update cones (by the
  forward pass), and its update has leaves. Any other output that replaces a
  source updates optimizer state (``m``, ``v``, a step counter) if its cone
  reads no leaf but the parameters' ones (their gradients) or none (a step
  counter). Anything else that replaces a source, such as a loss scaled by a
  constant, is not an update.
* **The gradient** of a parameter update is a leaf of its cone, carried down
  through elementwise ops whose other inputs come from the gradient
  computation alone (``g * clip / max(norm, clip)``, a sum of partial
  gradients), so post-processing belongs to the gradient; an op mixing in a
  hyperparameter (``lr * g``), optimizer state (``g / sqrt(h)``) or the
  gradient itself (``g * g``) is the optimizer's.
* **Preview training ops** (``ai.onnx.preview.training`` ``Momentum``,
  ``Adam``, ``Adagrad``) are update ops; their ``G`` inputs are the gradients.
* **Gradient accumulators** (onnxruntime's training artifacts,
  ``formats.ort_artifacts``): a step that updates no parameter but adds each
  gradient into a buffer with ``com.microsoft`` ``InPlaceAccumulatorV2``; the
  accumulator is the update op, its buffer the state it updates, and the
  parameter named by the buffer (``<param>_grad.accumulation.buffer``) the
  parameter whose gradient it reads.
* **Returned gradients** (the same step without accumulators: a graph output
  ``<param>_grad`` for a graph input or initializer ``<param>``): the step's
  result is the gradients; the op computing each is its update op, with no
  state, so it stays in the backward pass and nothing after it is optimizer.

State updates are reported as updates without gradients, so region analysis
labels them optimizer (not backward) and never takes a moment for a gradient.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from graphpass.dialects.onnx_ops import DEFAULT_DOMAINS
from graphpass.formats.onnx_order import INPUT, SOURCE_OPS
from graphpass.formats.ort_artifacts import (
    ACCUMULATOR_BUFFER_SLOT,
    ACCUMULATOR_GRADIENT_SLOT,
    ACCUMULATOR_OP,
    BUFFER_SUFFIX,
    GRADIENT_SUFFIX,
    MS_DOMAIN,
)
from graphpass.ir.graph import Graph, Tensor

PREVIEW_DOMAIN = "ai.onnx.preview.training"
#: Preview training op -> number of per-parameter input groups (X, G, state...).
PREVIEW_OPS = {"Momentum": 3, "Adam": 4, "Adagrad": 3}
#: Ops computed element by element (with broadcasting): optimizer arithmetic.
ELEMENTWISE_OPS = frozenset({
    "Abs", "Add", "Cast", "Clip", "Div", "Exp", "Identity", "Log", "Max", "Mean", "Min",
    "Mul", "Neg", "Pow", "Reciprocal", "Sign", "Sqrt", "Sub", "Sum", "Where",
})


@dataclass
class Cone:
    """The update cone of one graph output (see the module docstring)."""

    output: Tensor
    #: source node -> ops between it and the output (the nearest path).
    sources: dict[str, int] = field(default_factory=dict)
    #: computed tensors of the output's shape where the elementwise walk ends.
    leaves: list[Tensor] = field(default_factory=list)
    #: every tensor of the walk (the output included).
    tensors: set[Tensor] = field(default_factory=set)


@dataclass
class Updates:
    """A step's updates: update node -> the gradients it reads (state updates:
    none), and the sources replaced (parameters and optimizer state)."""

    applies: dict[str, list[Tensor]] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    #: Why the updates cannot be attributed (and how to fix it), if they cannot.
    problem: str | None = None

    @property
    def variables(self) -> set[str]:
        return set(self.parameters) | set(self.state)


def find_updates(graph: Graph) -> Updates:
    """The step's parameter and state updates and their gradients.

    When an output that reads a gradient replaces one of several parameters
    equally well, ``problem`` says so, naming the candidates.
    """
    updates = _preview_updates(graph)
    cones = [c for c in (_cone(graph, t) for t in computed_outputs(graph)) if c.sources]
    replaced, ambiguous = _attribute(graph, cones)
    in_cones = {t.node for c in cones for t in c.tensors}
    readers_outside = {s for s in {s for c in cones for s in c.sources}
                       if any(user not in in_cones for user in graph.data_users(s))}
    parameters = [c for c in cones if replaced.get(c.output) in readers_outside and c.leaves]
    gradient_leaves = {t for c in parameters for t in c.leaves}
    state = [c for c in cones if c.output in replaced and c not in parameters
             and set(c.leaves) <= gradient_leaves]
    updates.problem = _ambiguity(ambiguous, cones, readers_outside)
    derived = graph.descendants({t.node for t in gradient_leaves}, follow_control=False)
    state_derived = graph.descendants({replaced[c.output] for c in state}, follow_control=False)
    for cone in parameters:
        updates.applies[cone.output.node] = _gradients(graph, cone, derived, state_derived)
        updates.parameters[replaced[cone.output]] = cone.output.node
    for cone in state:
        updates.applies.setdefault(cone.output.node, [])
        updates.state[replaced[cone.output]] = cone.output.node
    return updates


def named_updates(graph: Graph, train_ops: list[str]) -> Updates:
    """The updates a user named (``--train-op``): each named node's outputs are
    parameter updates whose gradients are their cones' leaves."""
    updates = _preview_updates(graph)
    outputs = set(computed_outputs(graph))
    for name in train_ops:
        if name not in graph or name in updates.applies:
            continue
        cones = [_cone(graph, Tensor(name, port)) for port in range(len(graph.node(name).outputs))
                 if Tensor(name, port) in outputs]
        leaves = list(dict.fromkeys(t for c in cones for t in c.leaves))
        if leaves:
            derived = graph.descendants({t.node for t in leaves}, follow_control=False)
            updates.applies[name] = list(dict.fromkeys(
                g for c in cones for g in _gradients(graph, c, derived, set())))
    return updates


def _preview_updates(graph: Graph) -> Updates:
    """``ai.onnx.preview.training`` update ops: inputs ``R, T, X..., G..., state...``;
    and gradient accumulators (``_accumulate``) or returned gradients."""
    updates = _accumulate(graph)
    if not updates.applies:
        updates = _returned_gradients(graph)
    for node in graph.nodes():
        groups = PREVIEW_OPS.get(node.op) if node.domain == PREVIEW_DOMAIN else None
        if groups is None:
            continue
        slots = graph.input_slots(node.name)
        count = (max(slots, default=1) - 1) // groups
        updates.applies[node.name] = [slots[2 + count + i] for i in range(count)
                                      if 2 + count + i in slots]
        for i in range(count):
            if 2 + i in slots:
                updates.parameters[slots[2 + i].node] = node.name
        for i in range(2 * count, groups * count):
            if 2 + i in slots:
                updates.state[slots[2 + i].node] = node.name
    return updates


def _accumulate(graph: Graph) -> Updates:
    """``InPlaceAccumulatorV2(buffer, gradient, reset)``: an update of ``buffer``
    reading ``gradient``, for the parameter the buffer is named after."""
    updates = Updates()
    for node in graph.nodes():
        if node.op != ACCUMULATOR_OP or node.domain != MS_DOMAIN:
            continue
        slots = graph.input_slots(node.name)
        gradient = slots.get(ACCUMULATOR_GRADIENT_SLOT)
        updates.applies[node.name] = [gradient] if gradient is not None else []
        buffer = slots.get(ACCUMULATOR_BUFFER_SLOT)
        if buffer is None:
            continue
        updates.state[buffer.node] = node.name
        parameter = buffer.node.removesuffix(BUFFER_SUFFIX)
        if parameter != buffer.node and parameter in graph:
            updates.parameters[parameter] = node.name
    return updates


def _returned_gradients(graph: Graph) -> Updates:
    """Each graph output ``<param>_grad`` (``ort_artifacts.gradient_outputs``): an
    update of ``<param>`` by the op computing it, reading that output."""
    updates = Updates()
    outputs = {graph.node(t.node).outputs[t.port]: t for t in computed_outputs(graph)}
    for value in graph.format_state.outputs:
        gradient = outputs.get(value.name)
        parameter = value.name.removesuffix(GRADIENT_SUFFIX)
        if gradient is None or parameter == value.name or parameter not in graph or \
                graph.node(parameter).op not in SOURCE_OPS:
            continue
        updates.applies.setdefault(gradient.node, []).append(gradient)
        updates.parameters[parameter] = gradient.node
    return updates


def computed_outputs(graph: Graph) -> list[Tensor]:
    """The model's outputs that an op computes, in output order."""
    producers = {value: Tensor(n.name, port) for n in graph.nodes()
                 if n.op not in SOURCE_OPS for port, value in enumerate(n.outputs) if value}
    return [producers[v.name] for v in graph.format_state.outputs if v.name in producers]


def _cone(graph: Graph, output: Tensor) -> Cone:
    """Walk up from ``output`` through elementwise ops on tensors of its shape and
    dtype (breadth first, so each source's depth is its nearest distance)."""
    dialect = graph.dialect
    kind = (dialect.shape(graph, output), dialect.dtype(graph, output))
    cone = Cone(output, tensors={output})
    if kind[0] is None or None in kind[0]:
        return cone
    queue = deque([(output, 0)])
    while queue:
        tensor, depth = queue.popleft()
        node = graph.node(tensor.node)
        if node.op in SOURCE_OPS:
            cone.sources.setdefault(node.name, depth)
            continue
        if node.op not in ELEMENTWISE_OPS or node.domain not in DEFAULT_DOMAINS:
            cone.leaves.append(tensor)
            continue
        for source in graph.input_slots(node.name).values():
            if source not in cone.tensors and \
                    (dialect.shape(graph, source), dialect.dtype(graph, source)) == kind:
                cone.tensors.add(source)
                queue.append((source, depth + 1))
    return cone


def _attribute(graph: Graph, cones: list[Cone]) -> tuple[dict[Tensor, str], dict[Tensor, list]]:
    """Which source each output replaces: its nearest ones (graph inputs before
    initializers), unique claims first, claimed sources removed from the rest."""
    nearest = {c.output: _nearest(graph, c.sources) for c in cones}
    replaced: dict[Tensor, str] = {}
    changed = True
    while changed:
        changed = False
        claimed = set(replaced.values())
        for output, candidates in nearest.items():
            left = [s for s in candidates if s not in claimed]
            if output not in replaced and len(left) == 1:
                replaced[output] = left[0]
                claimed.add(left[0])
                changed = True
            nearest[output] = left
    ambiguous = {o: c for o, c in nearest.items() if o not in replaced and len(c) > 1}
    return replaced, ambiguous


def _nearest(graph: Graph, sources: dict[str, int]) -> list[str]:
    if not sources:
        return []
    depth = min(sources.values())
    closest = sorted(s for s, d in sources.items() if d == depth)
    fed = [s for s in closest if graph.node(s).op == INPUT]
    return fed or closest


def _ambiguity(ambiguous: dict[Tensor, list], cones: list[Cone],
               readers_outside: set[str]) -> str | None:
    """The first output that reads a gradient and could update several parameters."""
    for cone in cones:
        candidates = ambiguous.get(cone.output, [])
        if cone.leaves and len([s for s in candidates if s in readers_outside]) > 1:
            return (f"cannot tell which parameter graph output {cone.output.node!r} updates "
                    f"(candidates: {', '.join(candidates)}, same shape and equally close); "
                    "name the step's update nodes with --train-op (repeatable)")
    return None


def _gradients(graph: Graph, cone: Cone, derived: set[str],
               state_derived: set[str]) -> list[Tensor]:
    """Each leaf of ``cone``, carried down through elementwise ops whose other
    inputs are computed from the gradients alone (clipping, summed partials)."""
    found = []
    for leaf in cone.leaves:
        tensor = leaf
        while True:
            nexts = [user for user, _ in graph.consumers(tensor)
                     if Tensor(user, 0) in cone.tensors
                     and _post_processes(graph, user, tensor, derived, state_derived)]
            if len(nexts) != 1:
                break
            tensor = Tensor(nexts[0], 0)
        found.append(tensor)
    return list(dict.fromkeys(found))


def _post_processes(graph: Graph, user: str, gradient: Tensor, derived: set[str],
                    state_derived: set[str]) -> bool:
    """Whether ``user`` post-processes ``gradient`` rather than applying it: a cast,
    or an op whose other inputs come from the gradients alone."""
    inputs = list(graph.input_slots(user).values())
    others = [t for t in inputs if t != gradient]
    if not others:
        return graph.node(user).op in ("Identity", "Cast")
    return inputs.count(gradient) == 1 and all(
        t.node in derived and t.node not in state_derived for t in others)
