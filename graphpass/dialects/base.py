"""The dialect interface: everything a pass needs to know about a format.

Passes are written once against this interface. A dialect answers questions
about ops (stateful? random? does it mutate a variable?), reads dtypes and
static shapes, and builds the handful of small ops the passes insert.
Builders add nodes to the graph and return the new tensor. How the format
writes a training step as a whole (its updates, its counter, what it is fed and
returns, where it lives) is the dialect's ``step``, a :class:`StepStructure`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphpass.ir.graph import Graph, Tensor, parse_tensor_name

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class LoopFacts:
    """A loop node's trip count (None: unknown), where it came from (``graph``,
    ``option`` or ``unknown``), the bytes one iteration adds to each output port
    (its accumulators), and the body as a graph with its results (for the
    body's own per-iteration peak). ``in_flight``: how many iterations the
    runtime may run at once; ``pending_bytes``: what one iteration computes
    off the loop's carried chain and hands to a running sum (a weight gradient
    added into the loop's total), which waits for the sum while later
    iterations run."""

    name: str
    trips: int | None
    trips_from: str
    per_trip: dict[int, int]
    body: Graph | None
    body_fetches: tuple[str, ...] = ()
    in_flight: int = 1
    pending_bytes: int = 0
    #: v1 loops (nodes in the graph itself): push node -> (bytes it stacks per
    #: iteration, the nodes that pop them)
    pushes: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    #: bytes per iteration the loop pops off its forward loop's accumulators
    popped_bytes: int = 0

    def stacked_bytes(self) -> int:
        """What the loop accumulates per iteration, in all."""
        return sum(self.per_trip.values()) + sum(size for size, _ in self.pushes.values())

    def held_bytes(self, port: int) -> int | None:
        """What output ``port`` holds when the loop ends (None: not an accumulator)."""
        if port not in self.per_trip:
            return None
        return self.per_trip[port] * (self.trips or 0)


class StepStructure(ABC):
    """The training step as a format writes it: which nodes update the variables
    and count the steps, what the step is fed and hands back, and where it lives
    (a graph, or a function's body).

    Kept apart from :class:`Dialect` because they are facts of the whole step,
    found by walking the graph, where the dialect answers for one op or tensor
    at a time: region analysis, the passes and the memory estimate ask them;
    builders never do. Each dialect builds one for itself (``Dialect.step``) and
    lends it its op kinds and shapes."""

    #: All train ops form one training step (ONNX: each updated parameter is a graph
    #: output of its own, with no op grouping them); else each train op is a step.
    single_train_step: bool = False

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    # -- updates and the step counter ----------------------------------------

    @abstractmethod
    def optimizer_applies(self, graph: Graph) -> dict[str, list[Tensor]]:
        """Each optimizer update node, with the gradient tensors it consumes."""

    def applies_for(self, graph: Graph, train_ops: Sequence[str]) -> dict[str, list[Tensor]]:
        """The apply ops when the user named the train ops (``--train-op``); a
        format whose updates can be attributed only with that help overrides this."""
        return self.optimizer_applies(graph)

    def split_steps(self, graph: Graph, applies: dict[str, list[Tensor]]) -> list[list[str]]:
        """The training steps among the apply ops one train op runs: one, unless a
        train op's updates come from separate gradient computations (a function
        that trains two models)."""
        return [list(applies)]

    def ends_train_step(self, graph: Graph, name: str) -> bool:
        """Whether a sink downstream of the apply ops can be a train op (an update
        or a grouping node, not a stray read)."""
        return True

    def counter_increments(self, graph: Graph) -> list[tuple[str, str]]:
        """``(increment node, counter variable)`` pairs that may be global_step."""
        return []

    def update_math(self, graph: Graph, applies: list[str]) -> set[str]:
        """Ops the apply ops compute their updates with, beyond the gradients (slot
        updates written as plain ops); empty where each apply op holds its math."""
        return set()

    # -- what the step is fed and hands back, and where it lives -------------

    def graph_inputs(self, graph: Graph) -> list[str]:
        """What the graph is fed (TF placeholders, ONNX graph inputs)."""
        return []

    def graph_outputs(self, graph: Graph) -> list[str]:
        """What the graph produces (ONNX graph outputs; TF: nodes nobody reads)."""
        return [n for n in graph if not graph.users(n)]

    def returned_values(self, graph: Graph) -> list[Tensor]:
        """Computed values the runtime hands to the caller whatever is fetched, so
        they stay allocated from their producer to the end of the step. None by
        default (a TF step returns only what is fetched, named with a port)."""
        return []

    def is_fetch(self, graph: Graph, name: str) -> bool:
        """``name`` only hands a value out of the graph (a function's result)."""
        return False

    def in_function_body(self, graph: Graph) -> bool:
        """The graph is a function's body: passes cannot add variables to it (a
        function's variables are arguments its callers pass) and express
        conditionals as functional ``If``."""
        return False

    def default_dependency(self, graph: Graph) -> str:
        """The dependency mode remat uses when none is asked for."""
        return self.dialect.dependency_modes[0]


class Dialect(ABC):
    """Format-specific knowledge of single ops and tensors, behind one interface:
    op kinds, dtypes and shapes, attributes, builders."""

    name: str = ""
    #: ONNX leaves optional input slots empty; TF input lists have no holes.
    allows_empty_input_slots: bool = False
    #: Which dependency kinds the format can express ("control", "data").
    dependency_modes: tuple[str, ...] = ("data",)
    #: The training step as this format writes it (built by each dialect).
    step: StepStructure

    # -- structure ---------------------------------------------------------

    def is_back_edge(self, graph: Graph, src: str, dst: str) -> bool:
        """True for loop back-edges, which topological orders ignore."""
        return False

    def loop_facts(self, graph: Graph, name: str, batch_size: int | None = None,
                   loop_trips: int | None = None) -> LoopFacts | None:
        """For a loop node: its trip count (from the graph, else ``loop_trips``), what
        each iteration adds to its outputs (the accumulators its gradient pops) and
        its body; None for any other node, and for formats whose loops the memory
        estimate does not model (here: none)."""
        return None

    def num_outputs(self, graph: Graph, name: str) -> int | None:
        """Number of outputs of ``name`` when cheaply known, else None."""
        return None

    def parse_tensor(self, graph: Graph, text: str) -> Tensor:
        """A tensor named on the command line (``node`` or ``node:port``)."""
        return parse_tensor_name(text)

    # -- op kinds ----------------------------------------------------------

    @abstractmethod
    def is_stateful(self, graph: Graph, name: str) -> bool:
        """Reads or writes state, or is random: never duplicated by a pass."""

    @abstractmethod
    def is_source(self, graph: Graph, name: str) -> bool:
        """A value that is fed or stored rather than computed (placeholder,
        variable, constant, initializer). Recomputing one gains nothing."""

    def is_recomputable(self, graph: Graph, name: str) -> bool:
        """Whether a pass may run a second copy of ``name`` for the same result."""
        return not self.is_stateful(graph, name) and not self.is_source(graph, name)

    def is_shape_only(self, graph: Graph, name: str) -> bool:
        """Reads only the shape of its input, never the values."""
        return False

    def op_class(self, graph: Graph, name: str) -> str:
        """What the cost model and the ``cheap`` recompute policy know of an op:
        "matmul" (contractions), "conv", "cheap" (elementwise, activations,
        normalisation, reductions, reshapes: worth recomputing) or "other"."""
        op = graph.node(name).op
        for kind in ("matmul", "conv", "cheap"):
            if op in self.op_classes.get(kind, ()):
                return kind
        return "other"

    #: op type -> class, per class (see ``op_class``)
    op_classes: dict[str, frozenset[str]] = {}
    def conv_operands(self, graph: Graph, name: str) -> tuple[Tensor, Tensor, int]:
        """For a convolution or one of its gradients: the output-side activation
        (forward output or incoming gradient), the kernel, and the channel axis of
        the former. The cost model charges ``2 |y| |kernel| / C_y``."""
        inputs = graph.inputs(name)
        return Tensor(name, 0), inputs[1], 1

    def is_constant(self, graph: Graph, name: str) -> bool:
        """``name``'s value is known before the step runs (a constant, or the shape of
        a fully static tensor): a runtime may fold the ops it feeds."""
        return False

    def is_variable(self, graph: Graph, name: str) -> bool:
        """A trainable or optimizer state variable."""
        return False

    def is_variable_value(self, graph: Graph, name: str) -> bool:
        """``name``'s output is a variable's value (the variable, or a read of it)."""
        return self.is_variable(graph, name)

    def variable_dtype(self, graph: Graph, name: str) -> str | None:
        """The dtype of the values variable ``name`` holds."""
        return self.get_attr(graph, name, "dtype")

    # -- tensors -----------------------------------------------------------

    @abstractmethod
    def dtype(self, graph: Graph, tensor: Tensor) -> str | None:
        """The numpy-style dtype name of ``tensor`` ("float32"), or None if unknown."""

    def shape(self, graph: Graph, tensor: Tensor) -> tuple | None:
        """Static shape, None for unknown dims; None if even the rank is unknown.

        Reads what inference recorded (``node.meta["shapes"]``); it never runs
        inference itself: analyses ask for it first (``analysis/shapes.py``)."""
        shapes = graph.node(tensor.node).meta.get("shapes") or []
        return shapes[tensor.port] if tensor.port < len(shapes) else None

    def shape_source(self, graph: Graph) -> str | None:
        """What typed the ops the format's own inference cannot (ONNX: onnxruntime's
        ``com.microsoft`` ops), at the last inference; None if nothing had to."""
        return None

    def has_shapes(self, graph: Graph, name: str) -> bool:
        """Whether inference (or the node's builder) recorded ``name``'s shapes."""
        return "shapes" in graph.node(name).meta

    def ensure_shapes(self, graph: Graph, nodes: Iterable[str] | None = None) -> bool:
        """Run :meth:`infer_shapes` when some node (of ``nodes``, default all) has no
        recorded shapes; returns whether it ran. What the shapes analysis
        (``analysis/shapes.py``) and the dialect's own recognisers ask for."""
        wanted = graph if nodes is None else list(nodes)
        if all(self.has_shapes(graph, name) for name in wanted):
            return False
        self.infer_shapes(graph, None if nodes is None else wanted)
        return True

    def infer_shapes(self, graph: Graph, nodes: list[str] | None = None) -> None:
        """Record the output shapes (``node.meta["shapes"]``) of ``nodes``, at least,
        or of every node; the default format knows none."""
        for node in graph.nodes():
            node.meta["shapes"] = []

    def batch_shape(self, graph: Graph, tensor: Tensor, batch_size: int) -> tuple | None:
        """The static shape when the inputs' unknown batch (first) dimension is
        ``batch_size``; here the shape with an unknown first dimension filled in."""
        shape = self.shape(graph, tensor)
        if shape and (shape[0] is None or shape[0] < 0):
            return (batch_size, *shape[1:])
        return shape

    def is_float(self, graph: Graph, tensor: Tensor) -> bool:
        return self.dtype(graph, tensor) in FLOAT_DTYPES

    @abstractmethod
    def get_attr(self, graph: Graph, name: str, key: str, default: Any = None) -> Any:
        """An attribute as a plain Python value (str, int, float, bool, list)."""

    @abstractmethod
    def set_attr(self, graph: Graph, name: str, key: str, value: Any) -> None:
        """Set an attribute from a plain Python value."""

    # -- builders ----------------------------------------------------------

    @abstractmethod
    def copy_node(self, graph: Graph, name: str, new_name: str) -> str:
        """Add a node with ``name``'s op, attrs and device but no inputs."""

    def renamed_copy(self, graph: Graph, name: str, new_name: str) -> str:
        """``copy_node`` for a node moving to ``new_name`` (the original goes next):
        what the format carries on a node beyond op, attrs and device moves too.
        The default format carries nothing more."""
        return self.copy_node(graph, name, new_name)

    def keep_readers(self, graph: Graph, name: str, tensor: Tensor, count: int,
                     holders: Callable[[], list[str]]) -> int:
        """Give ``tensor`` ``count`` more readers that the runtime's graph optimizer
        counts but that hold nothing, run by ``holders()`` (fetched nodes that depend
        on ``tensor`` already; asked only where needed, as it costs a walk). Remat
        calls it where a value lost readers to a copy, or a copy has fewer than its
        original: the runtime's rewrites decide by the
        number of readers (a remapper fuses an op into its only reader), and each
        node must be rewritten as its original was. Returns how many nodes it
        added; a runtime without such rewrites needs none (the default)."""
        return 0

    def ordered_read(self, graph: Graph, name: str, tensor: Tensor,
                     after: list[str]) -> Tensor:
        """``tensor`` read only once ``after`` ran: what a copy reads in control mode,
        so that no copy carries a control input itself (which the runtime's
        rewrites see: TF's remapper fuses no contraction with one)."""
        return self.identity(graph, name, tensor, after)

    @abstractmethod
    def identity(
        self, graph: Graph, name: str, tensor: Tensor, control_inputs: list[str] = ()
    ) -> Tensor: ...

    @abstractmethod
    def first_element(self, graph: Graph, name: str, tensor: Tensor) -> Tensor:
        """A scalar holding element 0 of ``tensor`` (any rank)."""

    @abstractmethod
    def add_n(self, graph: Graph, name: str, tensors: list[Tensor]) -> Tensor: ...

    @abstractmethod
    def cast(self, graph: Graph, name: str, tensor: Tensor, dtype: str) -> Tensor: ...

    @abstractmethod
    def binary(self, graph: Graph, name: str, op: str, a: Tensor, b: Tensor) -> Tensor:
        """``op`` is one of "add", "sub", "mul"."""

    @abstractmethod
    def scalar(self, graph: Graph, name: str, value: float, dtype: str) -> Tensor: ...

    @abstractmethod
    def stop_gradient(self, graph: Graph, name: str, tensor: Tensor) -> Tensor: ...
