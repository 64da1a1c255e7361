"""onnxruntime as a :class:`~graphpass.runtimes.base.RuntimeModel`: its default
node order for the model the writer emits, its allocation planner's free list,
and its kernels' aliasing, in-place outputs, fusions and scratch
(``ort_kernels``). The planner weighs its candidates by that model; the figures
a user reads (the step before and after) follow the order onnxruntime itself
gives (``oracle``: its graph optimizer's fusions move nodes in it), and a
rewrite onnxruntime cannot run is never written (``check_written``). Both ask
the onnxruntime installed here (``ort_step``).
"""

from __future__ import annotations

from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.onnx_order import SOURCE_OPS, file_order
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes import ort_kernels
from graphpass.runtimes.base import FREE_LIST, Execution, RuntimeGraph, RuntimeModel


class ORTModel(RuntimeModel):
    name = "onnxruntime"
    title = "onnxruntime's order and allocation planner"
    dependency = "data"
    heap = FREE_LIST
    #: Its graph optimizer fuses a MatMul into the Add or scale reading it alone
    #: (``ort_kernels.fuses_into_producer``), among others.
    fuser = "onnxruntime's graph optimizer"
    has_oracle = True
    hand_model = "graphpass's model of onnxruntime's order"
    oracle_name = "onnxruntime"

    def executions(self, graph: Graph, nodes: set[str], known: frozenset[str],
                   fetched: frozenset[str]) -> list[Execution]:
        order = ort_schedule(graph)
        return [Execution([n for n in order if n in nodes])]

    def output_alias(self, graph: Graph, name: str, port: int) -> int | None:
        return ort_kernels.output_alias(graph, name, port)

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        return ort_kernels.forwardable_inputs(graph, name)

    def scratch_shapes(self, graph: Graph, name: str) -> list[tuple[Tensor, tuple]]:
        return ort_kernels.scratch_shapes(graph, name)

    def fuses_into_producer(self, graph: Graph, name: str, slot: int) -> bool:
        return ort_kernels.fuses_into_producer(graph, name, slot)

    def dependency_scale(self, dtype: str) -> float:
        """0: data-mode ties are ``x + Identity(0 * s)``, exact for finite ``s``.

        ``tiny * s`` is subnormal whenever ``|s| < 1``, and added to the zeros a
        ReLU leaves it makes subnormal activations; onnxruntime on CPU does not
        flush them (``session.set_denormal_as_zero`` is off by default), so the
        recomputed MatMuls would take the slow subnormal path. ``0 * s`` is still
        a data dependency no ORT optimizer removes: constant folding needs
        constant inputs, and ``NoopElimination`` drops only an ``Add`` of a
        constant 0 or a ``Mul`` by a constant 1 (it is also NaN if ``s`` is, like
        ``tiny * s``).
        """
        return 0.0

    def recomputable(self, graph: Graph, name: str) -> bool:
        """Not what onnxruntime would fuse differently as a copy than as the
        original (``ort_kernels.fused_unlike_its_copy``)."""
        return super().recomputable(graph, name) and \
            not ort_kernels.fused_unlike_its_copy(graph, name)

    def oracle(self, graph: Graph, fetches: list[str]) -> RuntimeGraph:
        """``graph`` in the order the onnxruntime installed here runs it
        (``ort_step.optimized_order``), or in the hand model's, with the reason,
        where it cannot be asked. The order is of the model as written: onnxruntime
        runs every output's producers, whatever ``fetches`` a caller asks for."""
        from graphpass.installed import ONNXRUNTIME, installed

        if not installed(ONNXRUNTIME):
            return RuntimeGraph(graph, self.hand_model, "onnxruntime is not installed")
        from graphpass.runtimes import ort_step

        try:
            order = ort_step.optimized_order(_serialized(graph))
        except ort_step.StepFailed as failed:
            reason = f"onnxruntime {ort_step.version()} could not be asked: {failed}" \
                f"{ort_step.training_hint(str(failed))}"
            return RuntimeGraph(graph, self.hand_model, reason)
        return RuntimeGraph(graph, f"onnxruntime {ort_step.version()}'s order",
                            order=tuple(order))

    def check_written(self, graph: Graph, source: Path, reports: list[dict]) -> dict:
        """Step the rewrite once in the onnxruntime installed here (``ort_step``);
        where it fails and the input runs, refuse it, naming the failing node. The
        report's ``onnxruntime`` entry says whether it was stepped, and if not, why."""
        from graphpass.installed import ONNXRUNTIME, installed

        if not installed(ONNXRUNTIME):
            return _unstepped("onnxruntime is not installed (pip install 'graphpass[onnx]')")
        from graphpass.runtimes import ort_step

        try:
            ort_step.step_once(_serialized(graph))
        except ort_step.StepFailed as failed:
            rewrite_failed = str(failed)
        else:
            return {"stepped": True, "version": ort_step.version(),
                    "summary": [f"onnxruntime {ort_step.version()}: the rewrite loads "
                                "and runs a step"]}
        try:
            ort_step.step_once(source)
        except ort_step.StepFailed as failed:
            return _unstepped(f"onnxruntime {ort_step.version()} cannot run the input either "
                              f"({failed}{ort_step.training_hint(str(failed))})")
        raise GraphpassError(f"the rewrite does not run in onnxruntime {ort_step.version()}: "
                             f"{rewrite_failed}; the input runs, so nothing was written "
                             "(rewrite without this recompute, and report it)")


def _serialized(graph: Graph) -> bytes:
    """The rewrite as onnxruntime reads it, in memory, its external data loaded from
    beside the input (nothing is written before the output itself)."""
    from onnx.external_data_helper import load_external_data_for_model

    from graphpass.formats.onnx_io import model_from_graph
    from graphpass.runtimes.ort_step import StepFailed

    model = model_from_graph(graph)
    try:
        load_external_data_for_model(model, str(graph.format_state.source_dir))
    except Exception as exc:  # noqa: BLE001 - onnx's ValidationError, OSError: not stepped
        raise StepFailed(f"its external data does not load here: {_line(exc)}") from None
    if model.ByteSize() >= 2**31:
        raise StepFailed("it is over protobuf's 2 GiB with its data, more than this check "
                         "loads in memory")
    return model.SerializeToString()


def _line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _unstepped(reason: str) -> dict:
    return {"stepped": False, "reason": reason,
            "summary": [f"the rewrite was not stepped in onnxruntime: {reason}"]}


def ort_schedule(graph: Graph) -> list[str]:
    """The order onnxruntime runs the written model in, by default: a depth-first
    walk from the leaves, the last leaf of the file first, each node's producers
    latest-in-file first, a node running once its producers have (its
    ``GraphViewer`` order). Source nodes come first. ORT's own rewrites (fusions)
    can move a few nodes; the order of the rest stands."""
    order = file_order(graph)
    index = {name: i for i, name in enumerate(order)}
    sources = [n for n in order if graph.node(n).op in SOURCE_OPS]
    source_set = set(sources)
    stack = [(n, False) for n in order if n not in source_set and not graph.users(n)]
    visited: set[str] = set()
    schedule = []
    while stack:
        name, leaving = stack.pop()
        if leaving:
            schedule.append(name)
            continue
        if name in visited:
            continue
        visited.add(name)
        stack.append((name, True))
        producers = sorted((p for p in graph.producers(name) if graph.node(p).op not in SOURCE_OPS),
                           key=index.__getitem__)
        stack.extend((p, False) for p in producers if p not in visited)
    return sources + schedule
