"""Optimizer updates made of plain ops (Keras 3 and tf_keras optimizers): which
variable writes apply a gradient, and which tensors are those gradients.

Keras optimizers do not use ``Apply*`` ops: SGD with momentum is
``m = m * 0.9 - g * lr`` (``AssignVariableOp``) then ``w += m``
(``AssignAddVariableOp`` of a read of ``m`` ordered after its write); Adam, AdamW,
RMSprop and Adagrad are the same kind of arithmetic over slot variables, the
learning rate and the ``iterations`` counter; sparse gradients end in
``ResourceScatter*``. TF 1.x optimizers with a sparse path of plain ops do the same
beside their ``Apply*`` ops (Adam: ``m = m * beta1`` then ``ScatterAdd(m, indices,
g * (1 - beta1))``, ``AssignSub(var, ...)``; SGD: ``ScatterSub``/``ResourceScatterAdd``
of the ``IndexedSlices`` values), on ref variables too, where a read is the
``Identity`` of the variable (``W/read``) or the output of a write of it. So updates
are found by what they read, never by names:

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

A write of one variable applies one gradient: where its walk meets several values
computed without optimizer state (Adam's ``g`` and ``square(g)``; an embedding's
``UnsortedSegmentSum`` of the ``IndexedSlices`` values and of their squares), they are
all computed from one tensor, and that tensor is its gradient (``tf_gradient_chain``).
"""

from __future__ import annotations

from graphpass.dialects.tf_gradient_chain import is_constant, one_gradient
from graphpass.dialects.tf_ops import (
    APPLY_OP,
    INTEGER_DTYPES,
    REF_VARIABLE_OPS,
    RESULT_OP,
    called_functions,
    dtype_enum,
    writes_variables,
)
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor

RESOURCE_SOURCE_OPS = frozenset({"VarHandleOp", "Placeholder", "_Arg"})
#: Ops that write a ref variable (input 0 is its ref), ``Apply*`` ops aside.
REF_WRITE_OPS = frozenset({
    "Assign", "AssignAdd", "AssignSub", "ScatterAdd", "ScatterSub", "ScatterUpdate",
    "ScatterMul", "ScatterDiv", "ScatterMin", "ScatterMax", "ScatterNdAdd", "ScatterNdSub",
    "ScatterNdUpdate", "StridedSliceAssign",
})


def is_variable_write(graph: Graph, name: str) -> bool:
    op = graph.node(name).op
    return writes_variables(op) or op in REF_WRITE_OPS or bool(APPLY_OP.match(op))


def variable_of(graph: Graph, tensor: Tensor) -> str | None:
    """The variable a resource handle or a ref refers to; None for other tensors."""
    variable = resource_variable(graph, tensor)
    if variable is None and graph.node(tensor.node).op in REF_VARIABLE_OPS:
        return tensor.node
    return variable


def applied_variables(graph: Graph, applies) -> set[str]:
    """Every variable the ``Apply*`` ops ``applies`` write (the trained one and its
    slots)."""
    return {v for a in applies for v in (variable_of(graph, t) for t in graph.inputs(a))
            if v is not None}


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
    every variable it is passed (``calls``). An ``Identity`` of a resource handle
    is the handle; of a ref, it reads the variable."""

    def __init__(self, graph: Graph) -> None:
        self.writes: dict[str, list[str]] = {}
        self.variable_of: dict[str, str] = {}
        self.reads: set[str] = set()
        self.written: set[str] = set()
        self.calls: set[str] = set()
        writing = _writing_functions(graph)
        for node in graph.nodes():
            inputs = graph.inputs(node.name)
            if not inputs or node.op == RESULT_OP:
                continue
            if node.op != "Identity" and set(called_functions(node.op, node.attrs, writing)):
                self.calls.add(node.name)
                for tensor in inputs:
                    variable = resource_variable(graph, tensor)
                    if variable is not None:
                        self.writes.setdefault(variable, []).append(node.name)
                continue
            if node.op == "Identity" and graph.node(inputs[0].node).op not in REF_VARIABLE_OPS:
                continue  # a resource handle passed on, or a value
            variable = variable_of(graph, inputs[0])
            if variable is None:
                continue
            self.variable_of[node.name] = variable
            if is_variable_write(graph, node.name):
                self.writes.setdefault(variable, []).append(node.name)
                self.written.add(node.name)
            else:
                self.reads.add(node.name)

    def written_before(self, graph: Graph, access: str) -> list[str]:
        """Writes of the same variable that ``access`` is ordered after directly."""
        variable = self.variable_of[access]
        return [c for c in graph.control_inputs(access)
                if self.variable_of.get(c) == variable and c in self.written]


def _writing_functions(graph: Graph) -> dict:
    """The library's functions that write variables, themselves or through calls."""
    library = graph.format_state.library
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
    # A value written to a variable (Nadam's momentum schedule) is no loss either.
    candidates = returned if any(graph.node(n).op == RESULT_OP for n in graph) else [
        Tensor(n, 0) for n in graph
        if not any(dialect.is_float(graph, Tensor(u, 0)) or u in accesses.written
                   for u in graph.data_users(n))]
    # A ref write's output (``Assign`` of Adam's beta powers) is a variable, not a loss.
    computed = [t for t in candidates if dialect.is_float(graph, t)
                and not dialect.is_source(graph, t.node) and t.node not in accesses.written]
    graph.dialect.ensure_shapes(graph, [t.node for t in computed])
    found = [t for t in computed if not dialect.shape(graph, t)]  # scalar or unknown rank
    if not found:
        return []
    # One sweep for every candidate: computed from a variable read is downstream of one.
    from_reads = graph.descendants(accesses.reads, follow_control=False)
    return [t for t in found if t.node in from_reads]


def plain_updates(graph: Graph, *, strict: bool = True,
                  skip: frozenset[str] | set[str] = frozenset(),
                  applied: list[Tensor] | None = None) -> dict[str, list[Tensor]]:
    """``{write of a trainable variable: the gradient tensors it applies}`` for
    optimizers that update with plain ops; empty when there is no such update.
    Variables in ``skip`` (those ``Apply*`` ops train) are left out; ``applied``
    are the gradients those ``Apply*`` ops read: what shares their computation
    is a gradient too, even where a loss linear in a variable makes it a
    constant (``tf.gradients`` seeds from ``Fill(shape, 1)``, not the loss).

    A write whose value is neither a gradient nor forward values (an assignment
    from the step's inputs alone) is reported unless not ``strict`` (the user
    named the training step, or ``Apply*`` ops show it): then it is left out,
    with the optimizer."""
    accesses = _Accesses(graph)
    if not set(accesses.writes) - set(skip):
        return {}
    losses = _losses(graph, accesses)
    if not losses:
        return {}
    forward = _forward(graph, losses)
    trainable = {accesses.variable_of[r] for r in accesses.reads if r in forward} & \
        set(accesses.writes)
    optimizer_math = _optimizer_math(graph, accesses, forward)
    backward = _computed_backward(graph, applied or [], forward)
    # Whatever is computed from the gradient computation is no constant.
    constants: dict[str, bool] = dict.fromkeys(backward, False)
    fed = {n.name for n in graph.nodes() if n.op == "Placeholder"
           and graph.dialect.get_attr(graph, n.name, "dtype") != "resource"}
    step_values = forward | accesses.reads | accesses.written | fed
    updates = {}
    for variable in sorted(trainable - set(skip)):
        for write in accesses.writes[variable]:
            gradients = _gradients(graph, accesses, write, optimizer_math, forward,
                                   constants=constants)
            if gradients and (_reads_forward_values(graph, gradients, forward)
                              or _shares(graph, gradients, backward)):
                updates[write] = gradients if write in accesses.calls \
                    else one_gradient(graph, gradients, forward, constants)
            elif not gradients and _reads_only_forward(graph, write, optimizer_math, forward):
                continue  # a moving average or a reset: not a gradient update
            elif _initializer(graph, write, step_values):
                continue
            elif strict:
                raise GraphpassError(
                    f"the update {write!r} of variable {_saved_name(graph, variable)!r} "
                    "applies no gradient that region analysis can find; name the training "
                    "step with --train-op and --loss")
    return updates


def _optimizer_math(graph: Graph, accesses: _Accesses, forward: set[str]) -> set[str]:
    """What depends on optimizer state: the variable reads outside the forward pass
    (a ref write's output reads its variable too) and what they feed (data edges)."""
    state = {a for a in accesses.reads | accesses.written if a not in forward}
    return graph.descendants(state, follow_control=False) | state


def _computed_backward(graph: Graph, gradients: list[Tensor], forward: set[str]) -> set[str]:
    """The computed (not source) nodes ``gradients`` are computed from, outside the
    forward pass."""
    producers = {t.node for t in gradients}
    upstream = graph.ancestors(producers, follow_control=False) | producers
    return {n for n in upstream - forward if not graph.dialect.is_source(graph, n)}


def _shares(graph: Graph, gradients: list[Tensor], backward: set[str]) -> bool:
    """Whether ``gradients`` are computed from the computation ``backward``."""
    return bool(backward) and _reaches(graph, {t.node for t in gradients}, backward.__contains__)


def _initializer(graph: Graph, write: str, step_values: set[str]) -> bool:
    """Whether ``write`` is a variable's initializer or restore (a TF 1.x graph holds
    them beside the step): its value reads none of ``step_values`` (the variables'
    reads and writes, the forward pass, the inputs fed to the step), only
    constants, random ops and checkpoint reads."""
    values = {t.node for t in graph.inputs(write) if variable_of(graph, t) is None}
    return not _reaches(graph, values, step_values.__contains__)


def _reads_forward_values(graph: Graph, gradients: list[Tensor], forward: set[str]) -> bool:
    """Whether the gradients are computed from forward values (activations, variable
    reads), as a gradient computation is; a value computed from the step's inputs
    and constants alone is not a gradient."""
    is_source = graph.dialect.is_source
    return _reaches(graph, {t.node for t in gradients},
                    lambda n: n in forward and not is_source(graph, n))


def _saved_name(graph: Graph, variable: str) -> str:
    """A function argument's variable as the SavedModel names it, else ``variable``."""
    function = graph.format_state.function
    return function.variables.get(variable, variable) if function else variable


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
               forward: set[str], seen: set[str] | None = None,
               constants: dict[str, bool] | None = None) -> list[Tensor]:
    """Walk back from ``write`` through optimizer math (and from slot reads, or the
    outputs of ref writes, to the slot writes before them) to the tensors computed
    without optimizer state and not from constants alone (Nadam's ``1 - 0.96``);
    ``seen`` collects the math walked through, ``constants`` what is constant."""
    dialect = graph.dialect
    found: list[Tensor] = []
    seen = set() if seen is None else seen
    constants = {} if constants is None else constants
    stack = [write]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        # Resource handles and refs are not values read.
        inputs = [t for t in graph.inputs(name) if variable_of(graph, t) is None]
        if name in accesses.reads or name in accesses.written:
            stack.extend(accesses.written_before(graph, name))
        for tensor in inputs:
            # A ref write's output is the variable's value after it (Adam's ``m_t``).
            if tensor.node in optimizer_math or tensor.node in accesses.written:
                stack.append(tensor.node)
            elif tensor not in found and tensor.node not in forward \
                    and not dialect.is_source(graph, tensor.node) \
                    and dialect.is_float(graph, tensor) \
                    and not is_constant(graph, tensor.node, constants):
                found.append(tensor)
    return found


def update_math(graph: Graph, writes: list[str]) -> set[str]:
    """The optimizer math ``writes`` (found by :func:`plain_updates`) compute their
    values with: slot reads and writes, learning-rate arithmetic, ... -- what must
    run only if a step's update is applied."""
    accesses = _Accesses(graph)
    forward = _forward(graph, _losses(graph, accesses))
    optimizer_math = _optimizer_math(graph, accesses, forward)
    seen: set[str] = set()
    constants: dict[str, bool] = {}
    for write in writes:
        _gradients(graph, accesses, write, optimizer_math, forward, seen, constants)
    return {n for n in seen if not graph.dialect.is_source(graph, n)} - set(writes)


def _reads_only_forward(graph: Graph, write: str, optimizer_math: set[str],
                        forward: set[str]) -> bool:
    """Whether ``write``'s value is computed from the forward pass, optimizer state
    and constants only (the walk stops at the forward pass: all it reads is forward)."""
    is_source = graph.dialect.is_source
    return not _reaches(graph, graph.data_producers(write), lambda n: n not in optimizer_math
                        and not is_source(graph, n), forward)


def _reaches(graph: Graph, starts, found, stop: set[str] = frozenset()) -> bool:
    """Whether ``starts`` or what they are computed from (data edges; not past the
    nodes ``stop``) has a node for which ``found`` holds; the walk ends at the first."""
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        name = stack.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        if found(name):
            return True
        stack.extend(graph.data_producers(name))
    return False


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
