"""``graphpass inspect``: a plain description of a graph and its regions."""

from __future__ import annotations

from collections import Counter

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph


def describe(graph: Graph, *, loss: str | None = None, train_ops: list[str] | None = None,
             global_step: str | None = None, xla: bool = False, saved: bool = False,
             batch_size: int | None = None) -> dict:
    """A JSON-able summary: counts, graph inputs/outputs, variables, regions; with
    ``xla``, the step's ops that have no XLA kernel; with ``saved``, every forward
    value the backward pass keeps (``saved_values``).

    A graph without a training step still gets described (``regions`` None,
    ``regions_error`` says why); an override that does not fit the graph is
    the caller's error and raises.
    """
    from graphpass.analysis.regions import analyze

    dialect = graph.dialect
    control_edges = sum(1 for *_, d in graph.nx.edges(data=True) if d["control"])
    container = graph.format_state.describe()
    info = {
        "format": graph.format,
        "container": container.pop("container"),
        "nodes": len(graph),
        "control_edges": control_edges,
        "ops": dict(sorted(Counter(n.op for n in graph.nodes()).items(),
                           key=lambda kv: (-kv[1], kv[0]))),
        "inputs": dialect.step.graph_inputs(graph),
        "outputs": dialect.step.graph_outputs(graph),
        "variables": [n for n in graph if dialect.is_variable(graph, n)],
    }
    info.update(container)  # a MetaGraph's signatures, the step's function
    try:
        regions = analyze(graph, loss=loss, train_ops=train_ops, global_step=global_step)
    except GraphpassError as exc:
        if loss or train_ops or global_step:
            raise
        info["regions"] = None
        info["regions_error"] = str(exc)
        if xla or saved:
            option = "--xla" if xla else "--saved"
            raise GraphpassError(f"{option} needs the training step: {exc}") from None
        return info
    if dialect.shape_source(graph) is not None:
        info["shapes_of_runtime_ops"] = dialect.shape_source(graph)
    info["regions"] = {
        "counts": regions.counts(),
        "losses": sorted({str(s.loss) for s in regions.steps}),
        "train_ops": [s.train_op for s in regions.steps],
        "apply_ops": sum(len(s.applies) for s in regions.steps),
        "updates": [a for s in regions.steps for a in s.applies],
        "gradients": list(dict.fromkeys(str(t) for s in regions.steps for t in s.gradients)),
        "global_step": regions.global_step,
    }
    if graph.format_state.variable_of(regions.global_step or "") is not None:
        info["regions"]["global_step_variable"] = \
            graph.format_state.variable_of(regions.global_step)
    if xla:
        from graphpass.dialects.capabilities import TargetLowering
        from graphpass.passes.lower import STEP_REGIONS

        if not isinstance(dialect, TargetLowering):
            raise GraphpassError(f"--xla checks TF graphs for XLA kernels; this graph is "
                                 f"{graph.format}")
        step = [n for n in graph if regions.label(n) in STEP_REGIONS]
        info["xla_unsupported"] = [{"node": n, "op": op}
                                   for n, op in dialect.xla_unsupported(graph, step)]
    if saved:
        fetches = [s.train_op for s in regions.steps] + [s.loss.node for s in regions.steps]
        info["saved"] = saved_values(graph, fetches, set(regions.nodes("forward")),
                                     set(regions.nodes("backward")), batch_size)
    return info


def saved_values(graph: Graph, fetches: list[str], forward: set[str], backward: set[str],
                 batch_size: int | None = None) -> dict:
    """JAX's ``print_saved_residuals`` for a graph: every forward value a gradient op
    reads (so the step keeps it from the forward to the backward pass), its
    producer op, shape, bytes and readers, largest first, and the total."""
    from graphpass.analysis.cost import Sizes
    from graphpass.analysis.forward import computed_forward, forward_chain
    from graphpass.analysis.memory import check_batch_size

    check_batch_size(graph, fetches, batch_size)
    chain = forward_chain(graph, computed_forward(graph, forward), backward,
                          Sizes(graph, batch_size))
    return {"total_bytes": chain.saved_bytes, "count": len(chain.saved),
            "values": [v.to_json() for v in chain.saved]}
