"""The forward pass as a chain of units, and the values the backward pass keeps.

This is what the automatic remat planner plans on, and what ``graphpass
inspect --saved`` prints. It works from the graph's structure, never from
names, so a flat Keras graph, a block-scoped graph and a graph with
meaningless names analyse alike:

* **Saved values** (JAX's *residuals*): forward values that some backward op
  reads, so the step keeps them from the forward pass to the backward pass.
  Stored values (variables and their reads, constants, placeholders) are not
  allocated by the step and are left out.
* **Order**: the forward ops *as late as possible* (a topological order of the
  reversed graph, reversed): a value computed from the labels alone sits next
  to the loss that reads it instead of stretching across the whole network.
* **Narrow cuts**: a position in that order where at most ``width`` computed
  values cross (are produced before and read by forward ops after it), ``width``
  the smallest that gives enough cuts. A chain of layers has a cut after every
  op; a residual block has cuts only at its ends, where the shortcut rejoins;
  a value read by every layer (an attention mask) widens all cuts by one.
* **Units**: the ops between consecutive cuts. Recomputing a run of units
  releases what the backward reads inside it and keeps what crosses its ends.
* **Returned values** (``StepStructure.returned_values``: an ONNX step's updated
  parameters and optimizer state) are allocated by the backward pass and live
  to the end of the step, so they pile up as it proceeds. Each unit is charged
  their share by the bytes of the variables its ops read (a unit reading a
  quarter of the parameters gets a quarter of them); a variable read by several
  units goes to the first, where its gradient is complete.
* **Kernel temporaries** (``RuntimeModel.scratch_shapes``: onnxruntime's ``Where``,
  a ReLU gradient, holds two more tensors of its output's size while it runs)
  are charged to the unit whose gradient runs them: the earliest unit whose
  values the gradient op reads, directly or through other gradient ops. What
  else is live at that op (the unit's own saved values and those before it, not
  those after it, whose gradients have run) decides where a run of recomputed
  units had better end.

One sweep over the forward ops and their edges (plus a sort): linear in the
graph's size, with no walk per candidate.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from graphpass.analysis.buffers import scratch_bytes
from graphpass.analysis.cost import Sizes
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import RuntimeModel, runtime_for

#: Fewest cuts wanted before the cut width is raised (a plan needs choices).
MIN_CUTS = 16
#: The widest cut tried.
MAX_WIDTH = 8


@dataclass
class SavedValue:
    """A forward value the backward pass reads."""

    tensor: Tensor
    op: str
    shape: tuple | None
    bytes: int
    readers: list[str]  # the gradient ops that read it
    recomputable: bool

    def to_json(self) -> dict:
        return {"tensor": str(self.tensor), "op": self.op,
                "shape": None if self.shape is None else list(self.shape),
                "bytes": self.bytes, "readers": self.readers,
                "recomputable": self.recomputable}


@dataclass
class Unit:
    """Forward ops between two narrow cuts, ``order[start:end]``."""

    start: int
    end: int
    saved_bytes: int = 0  # saved values produced here
    pinned_bytes: int = 0  # of those, what recomputing cannot release (stateful producers)
    cut_saved_bytes: int = 0  # what crosses the cut after the unit, saved anyway
    cut_free_bytes: int = 0  # ... and what crosses it but the backward does not read
    flops: int = 0  # recomputing every recomputable op here
    cost: int = 0  # ... its time, by the roofline (``Sizes.work``: bytes moved)
    returned_bytes: int = 0  # returned values the backward allocates here (module docstring)
    scratch_bytes: int = 0  # the largest kernel temporaries of its gradient ops (docstring)
    #: A recomputed run holding this unit and starting at or after this unit index
    #: reads, through this unit, a value its copies can be ordered by (the planner
    #: sets it where the dependency mode needs one: ``remat/writable.py``).
    tie_start: int = 0


@dataclass
class ForwardChain:
    order: list[str]
    units: list[Unit]
    width: int
    saved: list[SavedValue] = field(default_factory=list)

    def nodes(self, first: int, last: int) -> list[str]:
        """The forward ops of units ``first..last`` (inclusive)."""
        return self.order[self.units[first].start:self.units[last].end]

    def label(self, first: int, last: int) -> str:
        """A display label for units ``first..last``: their first op, and their last
        op less the scope the two share (names are labels, never criteria)."""
        nodes = self.nodes(first, last)
        head, tail = nodes[0], nodes[-1]
        return head if head == tail else f"{head}..{tail[len(_common_scope([head, tail])):]}"

    @property
    def saved_bytes(self) -> int:
        return sum(v.bytes for v in self.saved)


def computed_forward(graph: Graph, forward: set[str]) -> list[str]:
    """Forward ops the step computes (not stored values), in graph order."""
    dialect = graph.dialect
    return [n for n in graph if n in forward and not dialect.is_source(graph, n)
            and not dialect.is_variable_value(graph, n)]


def forward_chain(graph: Graph, nodes: list[str], backward: set[str],
                  sizes: Sizes, ignore_reader=lambda name: False,
                  runtime: RuntimeModel | None = None) -> ForwardChain:
    """Segment ``nodes`` (the computed forward ops) into units at narrow cuts.

    ``ignore_reader(name)`` leaves readers out (nodes a pass generated);
    ``runtime``: what may be recomputed and what kernels hold (default: the
    format's runtime)."""
    runtime = runtime or runtime_for(graph)
    order = _as_late_as_possible(graph, nodes)
    if not order:  # nothing computed forward: no unit, nothing saved
        return ForwardChain(order, [], 0, [])
    position = {n: i for i, n in enumerate(order)}
    saved: list[SavedValue] = []
    saved_at = [0] * len(order)
    pinned_at = [0] * len(order)
    flops_at = [0] * len(order)
    cost_at = [0] * len(order)
    crossing = []  # (producer position, last forward reader position, bytes, saved)
    for i, name in enumerate(order):
        recomputable = runtime.recomputable(graph, name)
        if recomputable:
            flops_at[i] = sizes.flops(name)
            cost_at[i] = round(sizes.work(name, runtime))
        for port in graph.used_ports(name):
            tensor = Tensor(name, port)
            readers = [c for c, _ in graph.consumers(tensor) if not ignore_reader(c)]
            size = sizes.bytes(tensor)
            last = max((position[c] for c in readers if c in position), default=i)
            grads = sorted({c for c in readers if c in backward})
            if last > i:
                crossing.append((i, last, size, bool(grads)))
            if grads:
                saved.append(SavedValue(tensor, graph.node(name).op, sizes.shape(tensor), size,
                                        grads, recomputable))
                saved_at[i] += size
                pinned_at[i] += 0 if recomputable else size
    counts, saved_widths, free_widths = _crossings(len(order), crossing)
    width = _cut_width(counts)
    cuts = [i for i in range(len(order) - 1) if counts[i] <= width]
    units = []
    start = 0
    for end in cuts + [len(order) - 1]:
        unit = Unit(start, end + 1, sum(saved_at[start:end + 1]),
                    sum(pinned_at[start:end + 1]), saved_widths[end], free_widths[end],
                    sum(flops_at[start:end + 1]), sum(cost_at[start:end + 1]))
        units.append(unit)
        start = end + 1
    _charge_returned(graph, order, units, sizes)
    _charge_scratch(graph, order, units, backward, runtime)
    saved.sort(key=lambda v: (-v.bytes, position[v.tensor.node], v.tensor.port))
    return ForwardChain(order, [u for u in units if u.end > u.start], width, saved)


def _charge_returned(graph: Graph, order: list[str], units: list[Unit], sizes: Sizes) -> None:
    """Share the step's returned bytes among the units by the variables they read."""
    dialect = graph.dialect
    returned = sum(sizes.bytes(t) for t in dialect.step.returned_values(graph))
    if not returned:
        return
    charged: dict[str, int] = {}  # variable -> first unit reading it
    for index, unit in enumerate(units):
        for name in order[unit.start:unit.end]:
            for tensor in graph.inputs(name):
                if dialect.is_variable(graph, tensor.node):
                    charged.setdefault(tensor.node, index)
    weights = {v: sizes.bytes(Tensor(v, 0)) for v in charged}
    total = sum(weights.values())
    for variable, index in charged.items():
        if total:
            units[index].returned_bytes += returned * weights[variable] // total


def _charge_scratch(graph: Graph, order: list[str], units: list[Unit],
                    backward: set[str], runtime: RuntimeModel) -> None:
    """Charge each unit the largest temporaries (``RuntimeModel.scratch_shapes``) of the
    gradient ops that run once the backward pass has reached it: an op reading
    forward values of several units, directly or through other gradient ops, goes
    to the earliest of them, the last one the backward reaches."""
    scratch = {n: b for n in backward if (b := scratch_bytes(graph, n, runtime))}
    if not scratch:
        return
    unit_of = {}
    for index, unit in enumerate(units):
        for name in order[unit.start:unit.end]:
            unit_of[name] = index
    reached: dict[str, int] = {}  # gradient op -> earliest unit it reads
    for name in graph.topological_order():
        if name not in backward:
            continue
        sources = [unit_of[t.node] for t in graph.inputs(name) if t.node in unit_of] + \
            [reached[p] for p in graph.data_producers(name) if p in reached]
        if not sources:
            continue
        reached[name] = index = min(sources)
        units[index].scratch_bytes = max(units[index].scratch_bytes, scratch.get(name, 0))


def _as_late_as_possible(graph: Graph, nodes: list[str]) -> list[str]:
    """``nodes`` in a topological order that runs each as late as its readers allow
    (ties: graph order). Falls back to graph order on a cycle (v1 loops)."""
    members = set(nodes)
    index = {n: i for i, n in enumerate(nodes)}
    pending = {n: sum(1 for u in graph.users(n) if u in members) for n in nodes}
    ready = [(-index[n], n) for n in nodes if not pending[n]]
    heapq.heapify(ready)
    reverse = []
    while ready:
        _, name = heapq.heappop(ready)
        reverse.append(name)
        for producer in graph.producers(name):
            if producer in members:
                pending[producer] -= 1
                if not pending[producer]:
                    heapq.heappush(ready, (-index[producer], producer))
    if len(reverse) != len(nodes):
        return list(nodes)
    return reverse[::-1]


def _crossings(n: int, crossing: list[tuple[int, int, int, bool]]
               ) -> tuple[list[int], list[int], list[int]]:
    """Per cut position ``i`` (after op ``i``): how many values cross it, and the
    bytes of those the backward reads and of the others (difference arrays)."""
    diffs = [[0] * (n + 1) for _ in range(3)]
    for first, last, size, saved in crossing:
        for diff, amount in zip(diffs, (1, size if saved else 0, 0 if saved else size)):
            diff[first] += amount
            diff[last] -= amount
    sums = []
    for diff in diffs:
        running, values = 0, []
        for i in range(n):
            running += diff[i]
            values.append(running)
        sums.append(values)
    return sums[0], sums[1], sums[2]


def _cut_width(counts: list[int]) -> int:
    """The smallest width giving at least ``MIN_CUTS`` cuts (or a quarter of the ops)."""
    wanted = min(MIN_CUTS, len(counts) // 4)
    for width in range(1, MAX_WIDTH + 1):
        if sum(1 for c in counts[:-1] if c <= width) >= wanted:
            return width
    return MAX_WIDTH


def _common_scope(names: list[str]) -> str:
    """The longest ``scope/`` prefix of every name."""
    if not names:
        return ""
    first, last = min(names), max(names)
    prefix = first[:next((i for i, (a, b) in enumerate(zip(first, last)) if a != b),
                         min(len(first), len(last)))]
    return prefix[:prefix.rfind("/") + 1]
