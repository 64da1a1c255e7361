"""The runtime-model protocol: what one runtime does with a step, in one place.

A :class:`RuntimeModel` answers what the memory estimate and the rewrite must know
of the runtime that will run the graph, and nothing about the file format (that is
the ``Dialect``'s):

* **schedules**: the order it runs a step's nodes in, one :class:`Execution` per
  order it may take where the graph does not decide which (``executions``);
* **a heap policy**: how freed buffers are reused (:data:`BEST_FIT`: TF's
  allocator, a buffer freed is free; :data:`FREE_LIST`: onnxruntime's planner,
  a freed buffer waits for the next value of its shape; :data:`ARENA`: TFLite's
  static arena), and what the allocator holds beyond its requests
  (``allocator_headroom``), as XLA's ``HeapSimulator`` takes a ``HeapAlgorithm``;
* **kernel facts**: aliasing, in-place outputs, scratch, copies made on update,
  constant folding, fed values the runtime copies;
* **ordering constraints** a rewrite must respect: kernels the runtime merges
  (``merged_with``: a path between them is a cycle there), ops it rewrites with
  their neighbours, ops it fuses into their producer, copies it would compile
  differently from their original (``recomputable``), and the dependency mode
  that orders work for it (``dependency``);
* **an oracle** (optional): the graph the real runtime runs, asked from it;
  and an **exactness check** (optional): whether a rewrite's nodes compute,
  in what the runtime executes, exactly what their originals do.

It never edits the graph and reads the host nowhere: the runtime's own settings
(oneDNN, threads) come from :class:`~graphpass.options.RuntimeConfig`, an
explicit option, so a plan is the same on every build machine.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from graphpass.ir.graph import Graph, Tensor
from graphpass.options import RuntimeConfig

#: Heap policies (``RuntimeModel.heap``).
BEST_FIT, FREE_LIST, ARENA = "best-fit", "free-list", "arena"

#: An extra IR check a runtime adds to the pipeline's verifier: the first problem
#: it finds in the graph, as one line, or None.
IRCheck = Callable[[Graph], "str | None"]


@dataclass(frozen=True)
class Execution:
    """What the runtime runs of a step: ``order``, its nodes in the order the runtime
    runs them; ``forwarded``: reads the runtime rewires past a node it removes
    before running (TF's dependency optimizer bypassing an ``Identity``: its users
    read its input), each value to the value really read. Removed nodes are not
    in ``order``: they run nowhere and hold nothing."""

    order: list[str]
    forwarded: dict[Tensor, Tensor] = field(default_factory=dict)

    def read(self, tensor: Tensor) -> Tensor:
        """The value the runtime really reads for ``tensor``."""
        return self.forwarded.get(tensor, tensor)


@dataclass
class RuntimeGraph:
    """An oracle's answer: ``graph``, the graph to estimate (the runtime's own, or
    the graph given where the runtime could not be asked); ``model``: what it is,
    for people; ``reason``: why the runtime was not asked (empty when it was)."""

    graph: Graph
    model: str
    reason: str = ""
    #: The order the runtime runs the nodes in, where it says so apart from its
    #: graph (onnxruntime's): its own names; a node of ``graph`` it does not name
    #: (fused) runs after its producers (``memory.replayed``). Empty: ``graph``'s.
    order: tuple[str, ...] = ()
    #: The node orders of the runtime's graph a model's schedules follow
    #: (``RuntimeModel.following``), each its node names in order: TF's, Grappler's
    #: output for the step and, where the step is a function, for a graph calling
    #: it. Analysis results, never written onto the nodes. Empty: none to follow.
    node_orders: tuple[tuple[str, ...], ...] = ()


class ExactnessCheck(Protocol):
    """A runtime's answer to "does this rewrite compute what the original did?",
    bound to one original (its executed graphs are asked once)."""

    #: The configurations checked, for people ("oneDNN on", "oneDNN off").
    configurations: tuple[str, ...]
    #: Why nothing could be checked (empty: checked).
    unchecked: str

    def differences(self, rewritten: Graph, stands_for: StandsFor) -> list[Difference]:
        """Where ``rewritten`` computes otherwise, under any configuration checked.
        ``stands_for``: the original node a node of the rewrite stands for, or None
        for a node added only to order others."""
        ...


#: Of a rewrite's nodes: the original a node stands for (a copy: the node it
#: copies), or None for a node added only to order others.
StandsFor = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Difference:
    """Where a node of a rewrite computes otherwise than its original, and why."""

    node: str  # in the rewrite: a copy, or an original whose context changed
    original: str
    reason: str  # the kernels on both sides, for people
    configuration: str
    #: The originals of the copies that may have caused it (itself, for a copy):
    #: which copies to stop making to remove the difference, one tuple per distance
    #: from the node at which there are any, nearest first.
    copied_by_distance: tuple[tuple[str, ...], ...]

    def describe(self) -> str:
        return f"{self.node}: {self.reason} ({self.configuration})"

    def copied(self, distances: int | None = None) -> tuple[str, ...]:
        """The originals of the copies at the nearest ``distances`` (None: all)."""
        return tuple(o for layer in self.copied_by_distance[:distances] for o in layer)

    @property
    def found_at(self) -> str:
        """What the difference is, whatever a round names its node: its original."""
        return self.original or self.node


class RuntimeModel:
    """A runtime's behaviour on a step under one configuration. The defaults
    describe a runtime that runs the graph as written, in topological order, with
    no aliasing, fusion or folding, freeing each buffer after its last reader."""

    #: Short name (``tf``, ``xla``, ``onnxruntime``, ``litert``) for reports.
    name: str = ""
    #: What the estimate simulates, for people ("TF's executor").
    title: str = ""
    #: The dependency mode a rewrite orders work with for this runtime (None: the
    #: dialect's default for the graph): data where the runtime drops control edges
    #: (XLA, TFLite's converter) or the format has none.
    dependency: str | None = None
    heap: str = BEST_FIT
    #: What the allocator holds beyond the bytes it is asked for, as a fraction of
    #: them (fragmentation); a memory budget is planned to ``budget / (1 + this)``.
    allocator_headroom: float = 0.0
    #: The executor queues ready kernels newest first (TF's, with its Eigen pool),
    #: so a kernel that became ready early may wait under all later work.
    queues_newest_first: bool = False
    #: A process may run the step with every update held to the end of the step
    #: (TF's v1 session on a graph it imports): the estimate weighs that schedule too.
    holds_updates: bool = False
    #: The runtime compiles a functional conditional's branches with the rest of
    #: the step (TF's executor lowers an ``If`` marked so before Grappler, as it does
    #: ``tf.cond``'s), not each branch on its own (XLA).
    inlines_conditionals: bool = False
    #: The model can ask the real runtime for the graph it runs (``oracle``).
    has_oracle: bool = False
    #: The ``RuntimeConfig`` fields this model reads (the summary shows them).
    reads_config: tuple[str, ...] = ()
    #: What the estimate of a graph the oracle did not answer for is, and what the
    #: oracle is, for people.
    hand_model: str = "graphpass's model of the runtime"
    oracle_name: str = "the runtime"
    #: Originals whose copies the exactness check found computing otherwise.
    computed_otherwise: frozenset[str] = frozenset()
    #: The oracle's node orders this model's schedules follow (``following``).
    follows: tuple[tuple[str, ...], ...] = ()

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        self.config = config or RuntimeConfig()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

    # -- schedules -------------------------------------------------------------

    def executions(self, graph: Graph, nodes: set[str], known: frozenset[str],
                   fetched: frozenset[str]) -> list[Execution]:
        """Every order the runtime may run ``nodes`` in, where which one it takes is
        decided outside the graph: the estimate runs each and keeps the highest.
        ``known``: nodes whose values exist before the step; ``fetched``: its targets."""
        return [Execution(self._topological(graph, nodes))]

    def schedule(self, graph: Graph, nodes: set[str] | None = None) -> list[str]:
        """``nodes`` (default: every node) in the order the runtime runs them."""
        nodes = set(graph) if nodes is None else nodes
        return self.executions(graph, nodes, frozenset(), frozenset())[0].order

    def _topological(self, graph: Graph, nodes: set[str]) -> list[str]:
        dialect = graph.dialect
        order = graph.topological_order(ignore_edge=lambda s, d: dialect.is_back_edge(graph, s, d))
        return [n for n in order if n in nodes]

    # -- kernel facts ----------------------------------------------------------

    def output_alias(self, graph: Graph, name: str, port: int) -> int | None:
        """The input slot whose buffer output ``port`` shares (Identity, Reshape), or None."""
        return None

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        """Input slots whose buffer ``name`` may reuse for its output 0 when it is
        their last reader (elementwise kernels writing in place)."""
        return ()

    def scratch_shapes(self, graph: Graph, name: str) -> list[tuple[Tensor, tuple]]:
        """Temporaries ``name``'s kernel allocates while it runs, besides its outputs,
        each as ``(tensor whose dtype it has, shape)``; freed when it returns."""
        return []

    def copied_on_update(self, graph: Graph, name: str) -> list[list[Tensor]]:
        """For each variable ``name`` updates in place: the values that read the
        variable's buffer without copying it; where one is still to be read, the
        runtime first copies the variable and the old buffer lives on."""
        return []

    def is_foldable(self, graph: Graph, name: str) -> bool:
        """The runtime replaces ``name`` by a constant when all its inputs are."""
        return False

    def container_input(self, graph: Graph, tensor: Tensor) -> int | None:
        """For a value that holds a copy of an input in a container of the runtime's
        own (TF's TensorList or TensorArray filled from a tensor, which loops read
        an element at a time): that input's slot; else None."""
        return None

    def runtime_fed(self, graph: Graph) -> list[str]:
        """The inputs whose fed values the runtime copies into buffers of its own,
        held for the whole step (so they count in its peak memory)."""
        return []

    # -- what a rewrite must respect ---------------------------------------------

    def merged_with(self, graph: Graph, name: str) -> list[str]:
        """Nodes the runtime merges with ``name`` into one kernel while they all wait
        on the same control inputs: a pass that gives ``name`` a control input gives
        it to these too, and no path may join them."""
        return []

    def rewritten_with_neighbours(self, graph: Graph, name: str) -> bool:
        """The runtime's graph optimizer may rewrite ``name`` together with the ops
        around it, which a control edge out of it stops."""
        return False

    def fuses_into_producer(self, graph: Graph, name: str, slot: int) -> bool:
        """The runtime folds ``name`` into the op producing its input ``slot``: a
        value put between the two would change how the fused op rounds."""
        return False

    #: Who may fuse a value into its one reader ("TF's Grappler"), for the caveat
    #: ``read_once_caveat`` prints; empty for a runtime that fuses nothing.
    fuser: str = ""

    def read_once_caveat(self, values: list[str]) -> str | None:
        """The rewrite summary's caveat for ``values``, each read once before the
        rewrite and read by copies too now: the runtime may have fused one into its
        one reader, and no longer can, so that reader may round otherwise. None
        where the runtime fuses nothing."""
        if not self.fuser or not values:
            return None
        more = " ..." if len(values) > 3 else ""
        return (f"not exact if {self.fuser} fuses {', '.join(values[:3])}{more} into its "
                "one reader: the copies read it too (mark from its producer on; check "
                "with verify)")

    #: Products the runtime's graph optimizer may fold a constant factor into (and
    #: push across neighbouring products), so a copy of one is not its original.
    constant_folded_ops: frozenset[str] = frozenset()

    def dependency_modes(self, graph: Graph) -> tuple[str, ...]:
        """The dependency modes a rewrite of ``graph`` for this runtime orders copies
        by: the runtime's own where it has one (a runtime that drops control edges
        keeps none of control mode's ordering), else the format's. What a message
        may suggest, and what the planner must write with."""
        return (self.dependency,) if self.dependency else graph.dialect.dependency_modes

    def refuses_dependency(self, dependency: str) -> str | None:
        """Why a rewrite ordered by ``dependency`` would not survive this runtime
        taking it in, with what to use instead; None where it would."""
        return None

    def dependency_scale(self, dtype: str) -> float:
        """The factor of data-mode ordering, ``x + stop_gradient(scale * s)``: the
        dtype's smallest normal number, as ``recompute_grad(use_data_dep=True)``
        (a runtime that flushes subnormals computes ``x`` exactly)."""
        import numpy as np  # not at import: ``graphpass --help`` loads no numpy

        from graphpass.ir.dtypes import np_dtype

        return float(np.finfo(np_dtype(dtype)).tiny)

    def recomputable(self, graph: Graph, name: str) -> bool:
        """Whether a copy of ``name`` computes what the original did on this runtime:
        the format allows a second copy (``Dialect.is_recomputable``), the runtime
        compiles the copy as it compiles the original, and its exactness check
        (``exactness``) did not find the copy computing otherwise."""
        return name not in self.computed_otherwise and \
            graph.dialect.is_recomputable(graph, name)

    def knowing_computed_otherwise(self, names: Iterable[str]) -> RuntimeModel:
        """This model, knowing also that copies of ``names`` compute otherwise than
        their originals (what ``exactness`` found on a rewrite)."""
        other = copy.copy(self)
        other.computed_otherwise = self.computed_otherwise | frozenset(names)
        return other

    def ir_checks(self) -> tuple[IRCheck, ...]:
        """Checks the pipeline's verifier runs after every pass, for this runtime."""
        return ()

    # -- the oracle --------------------------------------------------------------

    def oracle(self, graph: Graph, fetches: list[str]) -> RuntimeGraph | None:
        """The graph the real runtime runs for ``fetches``, asked from it; None for a
        runtime this model cannot ask (the hand model stands)."""
        return None

    def ask_ahead(self, graph: Graph, fetches: list[str], oracle: bool,
                  exactness: bool) -> None:
        """Start asking the runtime what the ``oracle`` and the ``exactness`` check
        will ask of ``graph``, without waiting: where the runtime answers in
        processes of its own, they work while this one plans."""

    def exactness(self, original: Graph, fetches: list[str]) -> ExactnessCheck | None:
        """A check of rewrites of ``original`` against what this runtime executes:
        whether each node of a rewrite computes exactly what it stands for in the
        original, asked from the runtime. None where this runtime cannot be asked."""
        return None

    def check_input(self, graph: Graph) -> None:
        """Raise ``GraphpassError`` (one line, with the fix) where this runtime cannot
        take ``graph`` at all; before any pass runs."""

    def check_written(self, graph: Graph, source: Path, reports: list[dict]) -> dict | None:
        """The runtime's own check of the rewritten ``graph`` before it is written
        (``source``: the input file; ``reports``: the passes' results): a report
        entry, None where this runtime checks nothing; raises ``GraphpassError``
        where the runtime would not run the output as planned."""
        return None

    def following(self, view: RuntimeGraph | None) -> RuntimeModel:
        """This model, its schedules following the node orders of the oracle's answer
        ``view`` (``RuntimeGraph.node_orders``, by node name: of the graph asked
        about, and of copies made from it), where the model's order depends on
        them; with ``view`` None, following none. A model held, not node meta: a
        graph's nodes never carry a schedule. Here: this model (no order to follow)."""
        return self

    def describe(self) -> dict:
        """What the report says of the runtime the plan targets: its name, heap
        policy and the configuration fields it reads."""
        config = self.config.to_json()
        return {"runtime": self.name, "heap": self.heap,
                **{key: config[key] for key in self.reads_config}}
