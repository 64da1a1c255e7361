"""Optimizer updates made of plain ops (Keras 3 and tf_keras optimizers): which
variable writes apply a gradient, and which tensors are those gradients.

Keras optimizers do not use ``Apply*`` ops: SGD with momentum is
``m = m * 0.9 - g * lr`` (``AssignVariableOp``) then ``w += m``
(``AssignAddVariableOp`` of a read of ``m`` ordered after its write); Adam, AdamW,
RMSprop and Adagrad are the same kind of arithmetic over slot variables, the
learning rate and the ``iterations`` counter; sparse gradients end in
``ResourceScatter*``. So updates are found by what they read, never by names:

* **the loss** is a float scalar computed from the step's inputs and variable
  values that is returned (or, at a graph's top level, fetched: nothing computes
  with it);
* **the forward pass** is what the losses are computed from; a written variable that
  it reads is **trainable**; every other variable read (slots, ``iterations``, the
  learning rate, a trainable variable read again after it was written) is
  **optimizer state**;
* **optimizer math** is whatever depends on optimizer state; a write of a
  trainable variable applies the **gradients** where its optimizer math meets
  values that do not depend on optimizer state: the gradient computation. The
  walk back from a write follows data edges, and from a read of a slot to the
  write of that slot it is ordered after (``ReadVariableOp(m, ^AssignVariableOp(m))``).

A write of a trainable variable whose value reaches no gradient (it is computed
from forward values or constants only, like a moving average) is not a gradient
update. A write whose value is computed from the step's inputs alone is not one
either (a gradient is computed from forward values: activations, weights), but
nothing tells whose step it is: it is reported, with ``--train-op``/``--loss``
as the way out. A function that trains two models returns two losses; its
updates are split into one step per gradient computation (:func:`gradient_steps`).
"""

from __future__ import annotations

from graphpass.dialects.tf_ops import (
    INTEGER_DTYPES,
    RESULT_OP,
    called_functions,
    dtype_enum,
    writes_variables,
)
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor

RESOURCE_SOURCE_OPS = frozenset({"VarHandleOp", "Placeholder", "_Arg"})


def is_variable_write(graph: Graph, name: str) -> bool:
    return writes_variables(graph.node(name).op)


def resource_variable(graph: Graph, tensor: Tensor) -> str | None:
    """The variable (``VarHandleOp`` or resource argument) a resource tensor refers
    to, through ``Identity`` chains; None when it is not a resource tensor."""
    seen = 0
    while graph.node(tensor.node).op == "Identity" and seen < len(graph):
        inputs = graph.inputs(tensor.node)
        if not inputs:
            return None
        tensor, seen = inputs[0], seen + 1
    node = graph.node(tensor.node)
    if node.op not in RESOURCE_SOURCE_OPS:
        return None
    dtype = node.attrs.get("dtype")
    if node.op != "VarHandleOp" and (dtype is None or dtype.type != _resource_enum()):
        return None
    return tensor.node


def _resource_enum() -> int:
    return dtype_enum("resource")


def returned_values(graph: Graph) -> list[Tensor]:
    """What the function returns (through ``Identity``), in result order."""
    values = []
    for node in graph.nodes():
        if node.op != RESULT_OP:
            continue
        tensor = graph.inputs(node.name)[0]
        while graph.node(tensor.node).op == "Identity" and graph.inputs(tensor.node):
            tensor = graph.inputs(tensor.node)[0]
        values.append(tensor)
    return values


class _Accesses:
    """Every variable write and read of the graph, by variable (one sweep).

    A node that runs library functions which write variables (the ``If`` of
    ``LossScaleOptimizer``, applying only finite gradients) counts as a write of
    every variable it is passed."""

    def __init__(self, graph: Graph) -> None:
        self.writes: dict[str, list[str]] = {}
        self.variable_of: dict[str, str] = {}
        self.reads: set[str] = set()
        writing = _writing_functions(graph)
        for node in graph.nodes():
            inputs = graph.inputs(node.name)
            if not inputs or node.op in ("Identity", RESULT_OP):
                continue
            if set(called_functions(node.op, node.attrs, writing)):
                for tensor in inputs:
                    variable = resource_variable(graph, tensor)
                    if variable is not None:
                        self.writes.setdefault(variable, []).append(node.name)
                continue
            variable = resource_variable(graph, inputs[0])
            if variable is None:
                continue
            self.variable_of[node.name] = variable
            if is_variable_write(graph, node.name):
                self.writes.setdefault(variable, []).append(node.name)
            else:
                self.reads.add(node.name)

    def written_before(self, graph: Graph, read: str) -> list[str]:
        """Writes of the same variable that ``read`` is ordered after directly."""
        variable = self.variable_of[read]
        return [c for c in graph.control_inputs(read)
                if self.variable_of.get(c) == variable and c not in self.reads]


def _writing_functions(graph: Graph) -> dict:
    """The library's functions that write variables, themselves or through calls."""
    library = graph.meta.get("library")
    functions = {f.signature.name: f for f in library.function} if library is not None else {}
    # Writers spread from the functions that write themselves to their callers,
    # iteratively: call chains may be deep, and a malformed library cyclic.
    callers: dict[str, set[str]] = {}
    writing = []
    for name, fdef in functions.items():
        if any(writes_variables(n.op) for n in fdef.node_def):
            writing.append(name)
        for n in fdef.node_def:
            for callee in called_functions(n.op, n.attr, functions):
                callers.setdefault(callee, set()).add(name)
    found = set(writing)
    while writing:
        for caller in callers.get(writing.pop(), ()):
            if caller not in found:
                found.add(caller)
                writing.append(caller)
    return {name: fdef for name, fdef in functions.items() if name in found}


def _losses(graph: Graph, accesses: _Accesses) -> list[Tensor]:
    """Float scalars computed from variable reads that the step returns; at a graph's
    top level (no results), the float scalars that nothing computes with."""
    dialect = graph.dialect
    returned = returned_values(graph)
    candidates = returned if any(graph.node(n).op == RESULT_OP for n in graph) else [
        Tensor(n, 0) for n in graph
        if not any(dialect.is_float(graph, Tensor(u, 0)) for u in graph.data_users(n))]
    computed = [t for t in candidates
                if dialect.is_float(graph, t) and not dialect.is_source(graph, t.node)]
    graph.dialect.ensure_shapes(graph, [t.node for t in computed])
    found = [t for t in computed if not dialect.shape(graph, t)]  # scalar or unknown rank
    upstream = graph.ancestors({t.node for t in found}, follow_control=False)
    if not upstream & accesses.reads:
        return []
    return [t for t in found
            if graph.ancestors([t.node], follow_control=False) & accesses.reads]


def plain_updates(graph: Graph, *, strict: bool = True) -> dict[str, list[Tensor]]:
    """``{write of a trainable variable: the gradient tensors it applies}`` for
    optimizers that update with plain ops; empty when there is no such update.

    A write whose value is neither a gradient nor forward values (an assignment
    from the step's inputs alone) is reported unless not ``strict`` (the user
    named the training step): then it is left out, with the optimizer."""
    accesses = _Accesses(graph)
    if not accesses.writes:
        return {}
    losses = _losses(graph, accesses)
    if not losses:
        return {}
    forward = _forward(graph, losses)
    trainable = {accesses.variable_of[r] for r in accesses.reads if r in forward} & \
        set(accesses.writes)
    state_reads = {r for r in accesses.reads if r not in forward}
    optimizer_math = graph.descendants(state_reads, follow_control=False) | state_reads
    updates = {}
    for variable in sorted(trainable):
        for write in accesses.writes[variable]:
            gradients = _gradients(graph, accesses, write, optimizer_math, forward)
            if gradients and _reads_forward_values(graph, gradients, forward):
                updates[write] = gradients
            elif not gradients and _reads_only_forward(graph, write, optimizer_math, forward):
                continue  # a moving average or a reset: not a gradient update
            elif strict:
                raise GraphpassError(
                    f"the update {write!r} of variable {_saved_name(graph, variable)!r} "
                    "applies no gradient that region analysis can find; name the training "
                    "step with --train-op and --loss")
    return updates


def _reads_forward_values(graph: Graph, gradients: list[Tensor], forward: set[str]) -> bool:
    """Whether the gradients are computed from forward values (activations, variable
    reads), as a gradient computation is; a value computed from the step's inputs
    and constants alone is not a gradient."""
    producers = {t.node for t in gradients}
    upstream = graph.ancestors(producers, follow_control=False) | producers
    return any(not graph.dialect.is_source(graph, n) for n in upstream & forward)


def _saved_name(graph: Graph, variable: str) -> str:
    """A function argument's variable as the SavedModel names it, else ``variable``."""
    function = graph.meta.get("function") or {}
    return function.get("variables", {}).get(variable, variable)


def _forward(graph: Graph, losses: list[Tensor]) -> set[str]:
    """The losses and what they are computed from (data edges)."""
    ends = {t.node for t in losses}
    return graph.ancestors(ends, follow_control=False) | ends


def gradient_steps(graph: Graph, updates: dict[str, list[Tensor]]) -> list[list[str]]:
    """Split ``updates`` (from :func:`plain_updates`) into training steps: two updates
    belong to one step when their gradients share gradient computation. Each
    ``tape.gradient`` call builds its own backward ops from its own seed, so the
    gradients of one loss are connected through them, and those of another loss
    (a second model, a GAN's other player) are not, even where the forward passes
    overlap. Nodes without inputs (constants, arguments) connect nothing. The steps
    come in the order of their first update."""
    forward = _forward(graph, _losses(graph, _Accesses(graph)))
    producers = {t.node for tensors in updates.values() for t in tensors}
    backward = {n for n in graph.ancestors(producers, follow_control=False) | producers
                if n not in forward and graph.inputs(n)}
    root: dict[str, str] = {}

    def find(name: str) -> str:
        while root.get(name, name) != name:
            root[name] = root.get(root[name], root[name])
            name = root[name]
        return name

    for name in backward:
        for producer in graph.data_producers(name):
            if producer in backward:
                root[find(producer)] = find(name)
    steps: dict[str, list[str]] = {}
    for write, tensors in updates.items():
        steps.setdefault(find(tensors[0].node), []).append(write)
    return list(steps.values())


def _gradients(graph: Graph, accesses: _Accesses, write: str, optimizer_math: set[str],
               forward: set[str], seen: set[str] | None = None) -> list[Tensor]:
    """Walk back from ``write`` through optimizer math (and from slot reads to the
    slot writes before them) to the tensors computed without optimizer state;
    ``seen`` collects the math walked through."""
    dialect = graph.dialect
    found: list[Tensor] = []
    seen = set() if seen is None else seen
    stack = [write]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        # Resource handles are not values read.
        inputs = [t for t in graph.inputs(name) if resource_variable(graph, t) is None]
        if name in accesses.reads:
            stack.extend(accesses.written_before(graph, name))
        for tensor in inputs:
            if tensor.node in optimizer_math:
                stack.append(tensor.node)
            elif tensor not in found and tensor.node not in forward \
                    and not dialect.is_source(graph, tensor.node) \
                    and dialect.is_float(graph, tensor):
                found.append(tensor)
    return found


def update_math(graph: Graph, writes: list[str]) -> set[str]:
    """The optimizer math ``writes`` (found by :func:`plain_updates`) compute their
    values with: slot reads and writes, learning-rate arithmetic, ... -- what must
    run only if a step's update is applied."""
    accesses = _Accesses(graph)
    forward = _forward(graph, _losses(graph, accesses))
    state_reads = {r for r in accesses.reads if r not in forward}
    optimizer_math = graph.descendants(state_reads, follow_control=False) | state_reads
    seen: set[str] = set()
    for write in writes:
        _gradients(graph, accesses, write, optimizer_math, forward, seen)
    return {n for n in seen if not graph.dialect.is_source(graph, n)} - set(writes)


def _reads_only_forward(graph: Graph, write: str, optimizer_math: set[str],
                        forward: set[str]) -> bool:
    """Whether ``write``'s value is computed from the forward pass, optimizer state
    and constants only."""
    upstream = graph.ancestors([write], follow_control=False) - forward - optimizer_math
    return all(graph.dialect.is_source(graph, n) for n in upstream)


def step_increments(graph: Graph) -> list[tuple[str, str]]:
    """``(write, integer scalar variable)`` for ``v = v + c`` written with plain ops
    (``AssignVariableOp(v, AddV2(ReadVariableOp(v), c))``, Keras's ``iterations``)
    and ``AssignAddVariableOp`` of an integer variable."""
    writes = []
    for node in graph.nodes():
        if node.op not in ("AssignVariableOp", "AssignAddVariableOp"):
            continue
        inputs = graph.inputs(node.name)
        if len(inputs) < 2 or graph.dialect.get_attr(graph, node.name, "dtype") \
                not in INTEGER_DTYPES:
            continue
        variable = resource_variable(graph, inputs[0])
        if variable is not None:
            writes.append((node, inputs[1], variable))
    graph.dialect.ensure_shapes(graph, [value.node for _, value, _ in writes])
    # A counter is a scalar (a random generator's state, also counted up, is not).
    return [(node.name, variable) for node, value, variable in writes
            if graph.dialect.shape(graph, value) == ()
            and (node.op == "AssignAddVariableOp" or _adds_to_itself(graph, value, variable))]


def _adds_to_itself(graph: Graph, value: Tensor, variable: str) -> bool:
    node = graph.node(value.node)
    if node.op not in ("Add", "AddV2"):
        return False
    reads = [t for t in graph.inputs(value.node) if graph.node(t.node).op == "ReadVariableOp"
             and resource_variable(graph, graph.inputs(t.node)[0]) == variable]
    return len(reads) == 1
