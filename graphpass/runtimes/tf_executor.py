"""TF's executor as a :class:`~graphpass.runtimes.base.RuntimeModel`: the order it
runs a step in with one inter-op thread on the graph Grappler hands it
(``tf_order``), its kernels' aliasing, forwarding and temporaries
(``tf_order``, ``tf_kernels``), resource variables copied on update, oneDNN's
merged gradients, and Grappler itself as the oracle (``tf_grappler``) and as the
judge of a rewrite's exactness (``tf_exactness``).

Under :class:`XLAModel` the same kernels run clustered by XLA, which ignores
control edges: a rewrite orders work by data dependencies there.
"""

from __future__ import annotations

import copy

from graphpass.dialects.tf_loops import FILLED_FROM
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import tf_kernels, tf_order
from graphpass.runtimes.base import BEST_FIT, Execution, IRCheck, RuntimeGraph, RuntimeModel
from graphpass.runtimes.tf_exactness import TFExactness
from graphpass.runtimes.tf_grappler import HAND_MODEL, ask_ahead, runtime_graph


class TFKernelFacts(RuntimeModel):
    """What TF's kernels do with buffers, shared by the runtimes that run TF's
    graph or a conversion of it: outputs that alias an input, elementwise kernels
    that write in place, containers filled from a tensor, and constant folding."""

    constant_folded_ops = frozenset({"Mul", "RealDiv", "Div"})
    fuser = "TF"

    def container_input(self, graph: Graph, tensor: Tensor) -> int | None:
        return FILLED_FROM.get(graph.node(tensor.node).op) if tensor.port == 0 else None

    def output_alias(self, graph: Graph, name: str, port: int) -> int | None:
        op = graph.node(name).op
        if op == "IdentityN":
            return port
        if op == "Switch":
            return 0
        return 0 if op in tf_order.ALIAS_OPS and port == 0 else None

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        node = graph.node(name)
        if node.op == "AddN":
            return tuple(range(len(graph.inputs(name))))
        return tf_order.FORWARD_SLOTS.get(node.op, ())

    def is_foldable(self, graph: Graph, name: str) -> bool:
        dialect = graph.dialect
        return bool(graph.inputs(name)) and not dialect.is_stateful(graph, name) \
            and not dialect.is_source(graph, name)


class TFExecutorModel(TFKernelFacts):
    name = "tf"
    title = "TF's executor"
    # control edges order work, but a function XLA must compile orders by data
    # (``StepStructure.default_dependency``)
    dependency = None
    heap = BEST_FIT
    #: TF's CPU allocator with oneDNN (a best-fit-with-coalescing allocator, as on
    #: GPUs) hands a request a whole free block up to twice its size and grows in
    #: doubling regions, so its peak exceeds the step's allocation records; which
    #: blocks a step gets depends on every earlier request, so an allowance is
    #: declared instead of a model (``python -m tools.bench.planner`` measures it).
    allocator_headroom = 0.18
    queues_newest_first = True
    holds_updates = True
    inlines_conditionals = True
    has_oracle = True
    reads_config = ("onednn", "intra_op_threads")
    hand_model = HAND_MODEL
    oracle_name = "Grappler"
    #: Each order of ``follows``, node name to place (``tf_order.runtime_ordered``).
    positions: tuple[dict[str, int], ...] = ()

    # -- schedules -------------------------------------------------------------

    def executions(self, graph: Graph, nodes: set[str], known: frozenset[str],
                   fetched: frozenset[str]) -> list[Execution]:
        """One per order of Grappler's output this model follows (``following``: the
        step as written, and as called from a graph where it is a function) that
        places some of ``nodes``, else the one in the graph's order."""
        orders = [p for p in self.positions if any(n in p for n in nodes)] or [{}]
        return [self.execution(graph, nodes, known, fetched, p) for p in orders]

    def execution(self, graph: Graph, nodes: set[str], known: frozenset[str],
                  fetched: frozenset[str], positions: dict[str, int]) -> Execution:
        """The executor's order with one inter-op thread on the graph Grappler hands
        it (``tf_order.execution``), its nodes placed by ``positions`` (one order of
        Grappler's output): the nodes Grappler bypasses are not in it."""
        dialect = graph.dialect
        return tf_order.execution(graph, nodes, known, fetched,
                                  lambda s, d: dialect.is_back_edge(graph, s, d),
                                  lambda n: dialect.is_stateful(graph, n),
                                  self.config.onednn, positions)

    # -- kernel facts ----------------------------------------------------------

    def scratch_shapes(self, graph: Graph, name: str) -> list[tuple[Tensor, tuple]]:
        """Only on the graph the oracle returned (``tf_kernels.mark_temporaries``):
        the hand model's graph carries none, so plans made on it do not depend on
        the kernels' temporaries."""
        return graph.node(name).meta.get(tf_kernels.META_KEY, [])

    def copied_on_update(self, graph: Graph, name: str) -> list[list[Tensor]]:
        return tf_order.copied_on_update(graph, name)

    def runtime_fed(self, graph: Graph) -> list[str]:
        """Placeholders without a default: ``Session.run`` copies a fed array into a
        tensor from TF's CPU allocator unless numpy's buffer happens to have
        Eigen's 64-byte alignment (large numpy arrays do not), and holds it until
        the call returns, however early its last reader runs."""
        dialect = graph.dialect
        return [n.name for n in graph.nodes() if n.op == "Placeholder"
                and dialect.get_attr(graph, n.name, "dtype") != "resource"]

    # -- what a rewrite must respect ---------------------------------------------

    def merged_with(self, graph: Graph, name: str) -> list[str]:
        return tf_order.merged_gradients(graph, name) if self.config.onednn else []

    def rewritten_with_neighbours(self, graph: Graph, name: str) -> bool:
        return graph.node(name).op in tf_order.REWRITTEN_WITH_NEIGHBOURS

    def ir_checks(self) -> tuple[IRCheck, ...]:
        return (self.merged_on_a_path,)

    def merged_on_a_path(self, graph: Graph) -> str | None:
        """The first pair of nodes the runtime runs as one kernel (:meth:`merged_with`:
        oneDNN's filter and bias gradients) that a path joins: merged, the kernel
        would wait on itself, and TF rejects the step (a cycle) or never runs it.
        Checked after passes only: an input graph is as its exporter made it."""
        for name in graph:
            partners = self.merged_with(graph, name)
            if not partners:
                continue
            after = graph.descendants([name])
            for other in partners:
                if other in after:
                    return (f"node {other!r} depends on {name!r}, which the runtime runs "
                            f"with it as one kernel: a cycle there")
        return None

    # -- the oracle --------------------------------------------------------------

    def oracle(self, graph: Graph, fetches: list[str]) -> RuntimeGraph:
        return runtime_graph(graph, fetches, self.config)

    def exactness(self, original: Graph, fetches: list[str]) -> TFExactness:
        return TFExactness(original, fetches, self.config)

    def ask_ahead(self, graph: Graph, fetches: list[str], oracle: bool,
                  exactness: bool) -> None:
        ask_ahead(graph, fetches, self.config, oracle, exactness)

    def following(self, view: RuntimeGraph | None) -> TFExecutorModel:
        """This model following the orders of Grappler's output ``view``
        (``RuntimeGraph.node_orders``; none where TF was not asked): which of
        several ready branches TF's executor follows depends on them."""
        other = copy.copy(self)
        other.follows = view.node_orders if view is not None else ()
        other.positions = tuple({n: i for i, n in enumerate(order)} for order in other.follows)
        return other


class XLAModel(TFExecutorModel):
    """The step compiled by XLA: TF's kernels and Grappler's graph stand for the
    estimate, and control edges order nothing (XLA drops them)."""

    name = "xla"
    title = "TF's executor (XLA clusters estimated as TF's kernels)"
    dependency = "data"
    inlines_conditionals = False
    fuser = "TF or XLA"
