"""Pinning the parameter updates next to their gradients, for runtimes whose
executor queues ready kernels newest first (``RuntimeModel.queues_newest_first``:
TF's executor with its Eigen pool).

An update (``ResourceApplyAdam``, or Keras' assign ops) reads its gradient and
the optimizer's state: its slots' handles, Adam's ``beta1_power`` read, the
learning rate. Those inputs do not depend on the backward pass. The handles and
constants are roots, which the executor hands its thread pool before it starts;
the reads become ready during the forward pass and are queued there too (a read
is an expensive kernel to TF). The pool's thread works its own later work first,
so a queued input may run only when everything queued after it has: after the
whole backward pass. Whether it does is decided while the step runs, by the
timing of TF's threads (most likely how far the session's thread, handing the
pool its roots, and the pool's thread, already working, interleave): the graph
the executor gets is the same in processes of either mode, its node order
included (docs/remat.md). So in some processes every update
waits for the end of the step and every weight gradient is held until then; in
others each update runs as its gradient appears (a peak several times lower on a
CNN whose weights outweigh its activations).

The rewrite makes the backward pass start only after those reads have run (one
``NoOp`` on the reads, a control input of each op that starts the backward
pass), so each update is ready the moment its gradient is, in every process. It
moves no value: optimizer state is read before the backward pass, where nothing
writes it. The estimate (``analysis.memory``) schedules the
updates that way, so for the original it is the lower of the two figures;
:func:`held_updates_peak` is the other one, and for a graph a session runs the
original's estimate is the higher (:func:`worst_case`): a budget judged on it
holds in every process. A function body is the exception (:func:`held_counts`):
TF2 calls it, and no call of Keras 3 ResNet50's step measured held its updates.

A TF2 step function runs on the same executor (the session inlines it). There an
update may also run while the backward pass still holds a read of the weight it
writes, and TF then copies the variable, in the processes whose order has it so;
so in a function body each weight's gradient also waits for those reads
(:func:`_gradients_after_weight_readers`).

The other way round, optimizer math that reads state alone (Keras' SGD computes
``momentum * velocity`` apart from ``lr * gradient``) is ready when the step
starts, and the executor runs it then: a weight-sized value per weight, held
through the whole backward pass until its update. Each such value waits for its
gradient instead (:func:`state_math_after_gradients`); its inputs are the same
state, which only its own update writes, so it computes the same value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from graphpass.analysis.memory import MemoryProfile, tensor_bytes
from graphpass.ir.graph import Graph, Tensor
from graphpass.passes.remat.marks import unique
from graphpass.passes.remat.order import computed_by, gate_by_data
from graphpass.passes.remat.rewrite import Step

PIN_SCOPE = "graphpass/pinned_updates"
#: The largest computed value worth pinning: a hyperparameter's scalar. A larger
#: one (``momentum * slot``) held through the backward pass would cost what
#: pinning saves.
SMALL_BYTES = 64
#: The smallest weight whose gradient waits for the weight's backward readers, and
#: the smallest optimizer value computed from state alone that waits for its
#: gradient. A smaller one costs little, and the edge stops Grappler's arithmetic
#: rewrites of the gradient (a batch norm's scale), which round differently.
ORDERED_WEIGHT_BYTES = 64 * 1024
#: How far above the estimate the held figure must be to be worth a line.
SHOWN_ABOVE = 0.01


def worst_case(as_gradients_appear: int, held: MemoryProfile | None) -> int:
    """The original's estimate: the higher of the step with each update run as its
    gradient appears and the step with every update held to the end (TF's
    executor runs one or the other per process; the rewrite is pinned to the
    first). Held is taken only where it is above by more than rounding."""
    if held is not None and held.peak_bytes > (1 + SHOWN_ABOVE) * as_gradients_appear:
        return held.peak_bytes
    return as_gradients_appear


def held_is_higher(as_gradients_appear: int, held: MemoryProfile | None) -> bool:
    """Whether the held step is above the other by more than rounding."""
    return worst_case(as_gradients_appear, held) != as_gradients_appear


def held_counts(graph: Graph) -> bool:
    """Whether the held step is a mode of the runtime the graph is written for, so
    that the original's estimate is the higher figure: yes for a graph a session
    runs (TF1's), no for a function body. TF2 calls a function (a SavedModel's
    signature, a ``tf.function``) through its eager runtime, which passes the
    variables in as arguments (inexpensive kernels, run inline as the step
    starts), and such a call of Keras 3 ResNet50's step ran every update as its
    gradient appeared in every process measured (docs/remat.md); a v1 session
    that imports a graph calling the function inlines the body behind the
    caller's ``VarHandleOp`` roots and holds the updates in some processes,
    which the summary still names."""
    return not graph.dialect.step.in_function_body(graph)


@dataclass(frozen=True)
class Pinned:
    """What pinning did: ``reads`` pinned (0: none), and the original's estimate
    with the updates held to the end of the step (None where not estimated, or
    where no update could be held)."""

    reads: int
    held: MemoryProfile | None
    #: The original's estimate with each update run as its gradient appears.
    as_gradients_appear: int | None = None
    #: Optimizer values computed from state alone made to wait for their gradients.
    waiting: int = 0
    #: Whether the held figure is a mode of the graph's own runtime (:func:`held_counts`).
    counted: bool = True

    @property
    def changed(self) -> bool:
        return bool(self.reads or self.waiting)

    @property
    def held_is_higher(self) -> bool:
        """The held figure is above the other (``worst_case``)."""
        low = self.as_gradients_appear
        return low is not None and held_is_higher(low, self.held)

    @property
    def held_is_estimate(self) -> bool:
        """The original's estimate is the held figure."""
        return self.counted and self.held_is_higher

    def original(self, figure: int) -> int:
        """``figure`` (an estimate of the original made another way: on the graph
        the runtime runs) as the original's estimate is: the held one where that
        is the planner's (``held_is_estimate``) and above ``figure``."""
        return worst_case(figure, self.held) if self.held_is_estimate else figure

    def summary(self, after: int | None = None) -> list[str]:
        """``after``: the rewrite's estimate, given as a ratio of the lower figure too."""
        lines = []
        if self.held_is_estimate:
            low = self.as_gradients_appear
            ratio = "" if after is None or not low else \
                f" ({after / low:.2f}x of it after the rewrite)"
            lines.append(
                f"the original's estimate holds every gradient to the end of the step, as "
                f"TF's executor runs it in the processes that queue the updates' inputs "
                f"behind the backward pass; in the others (the timing of its threads "
                f"decides, not the graph) each update runs as its gradient appears: "
                f"estimated {low / 2**20:.1f} MiB{ratio}")
        elif self.held_is_higher:
            lines.append(
                f"the step is a function, estimated as TF2 calls it (each update runs as "
                f"its gradient appears); a v1 session that imports a graph calling it "
                f"holds every gradient to the end of the step in some processes: "
                f"estimated {self.held.peak_bytes / 2**20:.1f} MiB"
                f"{', which the rewrite pins away' if self.reads else ''}")
        if self.reads:
            lines.append(f"updates pinned next to their gradients: the backward pass waits "
                         f"for the {self.reads} inputs of optimizer state they read, in "
                         f"every process")
        if self.waiting:
            lines.append(f"{self.waiting} optimizer values computed from state alone (such as "
                         f"momentum x velocity) wait for their gradients instead of being "
                         f"held through the backward pass")
        return lines

    def to_json(self) -> dict:
        return {"pinned_update_reads": self.reads, "state_values_waiting": self.waiting,
                "estimated_peak_bytes_updates_held":
                    None if self.held is None else self.held.peak_bytes,
                "estimated_peak_bytes_before_is_held": self.held_is_estimate,
                "estimated_peak_bytes_updates_as_gradients_appear": self.as_gradients_appear}


def pin_updates(graph: Graph, step: Step) -> int:
    """Make the backward pass wait for the updates' inputs of optimizer state.
    Returns how many were pinned (0: the graph is left as it is)."""
    reads = update_reads(graph, step)
    if not reads:
        return 0
    outside = _outside_loops(graph)
    starts = _backward_starts(graph, step, outside)
    if not starts:
        return 0
    gate = graph.dialect.noop(graph, graph.unique_name(f"{PIN_SCOPE}/reads_done"), reads)
    for name in starts:
        graph.add_control_input(name, gate)
    if graph.dialect.step.in_function_body(graph):  # where the copies were traced
        # the gate's edges enter no frame, so ``outside`` still holds
        _gradients_after_weight_readers(graph, step, outside | {gate})
    return len(reads)


def state_math_after_gradients(graph: Graph, step: Step) -> int:
    """Make each optimizer value computed from state alone, of at least
    ``ORDERED_WEIGHT_BYTES``, wait for the gradient whose update reads it (a
    control edge from the op that computes the gradient, past ops that pass it on
    such as Keras' ``IdentityN``, which Grappler then still bypasses). Where and
    when :func:`pin_updates` pins, but before a plan is made: every candidate is
    weighed with it. Returns how many values wait."""
    return add_waits(graph, state_math_waits(graph, step))


def add_waits(graph: Graph, waits: dict[str, set[str]]) -> int:
    """Add the control edges of ``waits`` (:func:`state_math_waits`, found once for
    the planner's many trial copies, whose optimizer ops are the original's)."""
    for value in sorted(waits):
        for producer in sorted(waits[value]):
            graph.add_control_input(value, producer)
    return len(waits)


def state_math_waits(graph: Graph, step: Step) -> dict[str, set[str]]:
    """What :func:`state_math_after_gradients` would add: each value to the ops
    computing the gradients it is to wait for (empty: it changes nothing)."""
    if not update_reads(graph, step):
        return {}
    outside = _outside_loops(graph)
    after_backward = graph.descendants(step.backward) | step.backward
    waits: dict[str, set[str]] = {}
    for gradient in step.gradients:
        producer = computed_by(graph, gradient, step.runtime).node
        if producer not in outside or producer not in step.backward:
            continue
        for value in _state_values(graph, step, gradient, after_backward):
            if value in outside:
                waits.setdefault(value, set()).add(producer)
    return waits


def _state_values(graph: Graph, step: Step, gradient: Tensor,
                  after_backward: set[str]) -> set[str]:
    """The optimizer ops that compute from state alone a value that an optimizer op
    combining it with ``gradient`` reads: of at least ``ORDERED_WEIGHT_BYTES``,
    read by the optimizer only, not a variable, a read of one or a constant."""
    dialect = graph.dialect
    combining, stack = set(), [user for user, _ in graph.consumers(gradient)]
    while stack:
        name = stack.pop()
        if name in combining or name not in step.optimizer:
            continue
        combining.add(name)
        stack.extend(graph.data_users(name))
    found = set()
    for producer in {t.node for name in combining for t in graph.inputs(name)}:
        if producer in step.optimizer and producer not in after_backward and \
                not dialect.is_variable(graph, producer) and \
                not dialect.is_variable_value(graph, producer) and \
                not dialect.is_constant(graph, producer) and \
                all(u in step.optimizer for u in graph.data_users(producer)) and \
                (tensor_bytes(graph, Tensor(producer, 0)) or 0) >= ORDERED_WEIGHT_BYTES:
            found.add(producer)
    return found


def _gradients_after_weight_readers(graph: Graph, step: Step, outside: set[str]) -> int:
    """Make each weight's gradient (of at least ``ORDERED_WEIGHT_BYTES``) wait for
    the backward ops that still read the weight. An update that finds its
    variable's buffer shared with a live read copies the variable (TF's
    copy-on-write): a weight-sized buffer, or none, as the executor's order
    falls. The edge goes to the gradient, not the update: Grappler's dependency
    optimizer drops it from an update that every gradient reaches through one op
    (Keras' ``IdentityN``), which it then bypasses. Returns the edges added."""
    dialect = graph.dialect
    added = 0
    for update, gradients in step.updates.items():
        inputs = graph.inputs(update)
        if update not in step.optimizer or not inputs or len(gradients) != 1 or \
                not dialect.is_variable(graph, inputs[0].node):
            continue
        size = tensor_bytes(graph, gradients[0])
        if size is None or size < ORDERED_WEIGHT_BYTES:
            continue
        producer = computed_by(graph, gradients[0], step.runtime).node
        if producer not in outside:
            continue
        # The ops the runtime merges with the gradient's op wait on the same edges
        # (``RuntimeModel.merged_with``), else it computes each apart, rounding otherwise.
        waiting = [producer, *step.runtime.merged_with(graph, producer)]
        later = graph.descendants(set(waiting)) | set(waiting)
        for reader in _weight_readers(graph, inputs[0].node, step):
            if reader in outside and reader not in later:
                for name in waiting:
                    graph.add_control_input(name, reader)
                    added += 1
    return added


def _weight_readers(graph: Graph, variable: str, step: Step) -> list[str]:
    """The backward ops holding a read of ``variable``: its reads, the ops that
    pass a read on, and their readers."""
    dialect = graph.dialect
    holding = [r for r in graph.users(variable) if dialect.is_variable_value(graph, r)]
    seen = set(holding)
    while holding:
        name = holding.pop()
        for user in graph.data_users(name):
            if user in seen:
                continue
            seen.add(user)
            if any(step.runtime.output_alias(graph, user, port) is not None
                   for port in graph.used_ports(user)):
                holding.append(user)
    return [n for n in graph if n in seen and n in step.backward]


def update_reads(graph: Graph, step: Step) -> list[str]:
    """The ops an update reads besides its gradient that the runtime may queue
    under the backward pass: those of :func:`_pinnable`, which depend on no
    gradient and feed no forward or backward op. None where the executor does not
    queue newest first, where the step orders by data (XLA and TFLite schedule
    themselves), or once pinned (a second run changes nothing). Inputs inside a
    v1 ``while_loop`` frame are left alone: the gate runs in the root frame."""
    if not step.runtime.queues_newest_first or step.dependency != "control" or \
            any(n.startswith(PIN_SCOPE) for n in graph):
        return []
    after_backward = graph.descendants(step.backward) | step.backward
    updates = [n for n in graph if n in step.optimizer and n in after_backward]
    outside = _outside_loops(graph)
    read = unique(t for update in updates for t in graph.inputs(update)
                  if t.node not in after_backward and t.node in outside)
    return unique(t.node for t in read if _pinnable(graph, t, step))


def held_updates_peak(graph: Graph, step: Step, batch_size: int | None,
                      estimate: Callable[[Graph, list[str], int | None], MemoryProfile]
                      ) -> MemoryProfile | None:
    """The estimate with every update waiting for the last gradient: the step as
    TF's executor runs it in the processes that queue the updates' reads to the
    end. None where no read could be queued (pinned, or no such reads)."""
    if not update_reads(graph, step):
        return None
    held = graph.copy()
    gate_by_data(held, f"{PIN_SCOPE}/held", list(step.gradients),
                 lambda reader: reader in step.optimizer, step.runtime)
    return estimate(held, step.fetches, batch_size)


def _pinnable(graph: Graph, tensor: Tensor, step: Step) -> bool:
    """A value no forward or backward op reads (an initializer may) that costs
    nothing to hold: a variable (a slot's handle), a read of one (it aliases the
    variable), a constant (its kernel holds it), or a hyperparameter's scalar.
    Variables and constants wait for nothing, yet the executor queues them behind
    its own work too: they are the roots it hands its pool before it starts."""
    dialect = graph.dialect
    name = tensor.node
    if any(user in step.forward or user in step.backward for user in graph.users(name)):
        return False
    if dialect.is_variable(graph, name) or dialect.is_variable_value(graph, name) or \
            dialect.is_constant(graph, name):
        return True
    size = tensor_bytes(graph, tensor)
    return size is not None and size <= SMALL_BYTES


def _backward_starts(graph: Graph, step: Step, outside: set[str]) -> list[str]:
    """The backward ops that wait for no other backward op but constants (which
    the runtime folds or runs first): every gradient's computation starts from
    one of them. Only those ``outside`` loop frames can wait for the gate: one in
    a gradient loop runs after its loop's pivot, downstream of the loop's
    ``Enter`` ops, which can."""
    dialect = graph.dialect
    computed = {n for n in step.backward if not dialect.is_constant(graph, n)}
    return [n for n in graph if n in computed and n in outside
            and not any(p in computed for p in graph.producers(n))]


def _outside_loops(graph: Graph) -> set[str]:
    """The ops in the root frame: TF rejects an edge from there into a v1
    ``while_loop`` frame other than into its ``Enter``."""
    return {name for name, depth in graph.dialect.frame_depths(graph).items() if depth == 0}
