"""Target lowering: the last pass, fitting the rewritten step to its runtime.

``--target tf`` keeps control edges and v1 control flow and needs no lowering
unless ``--device`` asks for device strings. ``--target xla`` (implied by
``--device tpu``) marks the training step for XLA compilation with the
attributes ``tf.xla.experimental.jit_scope`` sets (``_XlaCompile``,
``_XlaScope``), unless ``--xla-cluster none`` leaves clustering to the runtime,
and checks that every op of the step has an XLA kernel: on TPU an op without
one is an error listing each offending node; on CPU/GPU such nodes simply stay
outside the cluster and are reported.

The choices that must be made *before* lowering (data-dependency remat, the
functional ``If`` form of conditionals) are made by the rewrite passes from the
same resolved target, in the ``PassContext``. This pass never adds or removes nodes: it only sets
attributes and device strings, and only on nodes of the training step (forward,
backward, optimizer); initializers, savers and summaries are untouched.
"""

from __future__ import annotations

from graphpass.analysis.manager import REGIONS, SHAPES
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph
from graphpass.options import LowerOptions
from graphpass.passes.base import Pass
from graphpass.passes.context import PassContext

XLA_SCOPE = "graphpass_step"
DEVICE_TYPES = {"cpu": "CPU", "gpu": "GPU", "tpu": "TPU"}
STEP_REGIONS = ("forward", "backward", "optimizer")
# The compiled cluster: XLA refuses a cluster that receives one resource variable
# twice ("Duplicate variable passed to XLA cluster"), which apply ops that read and
# update the same variable do; the optimizer stays with the runtime, as under jit_scope
# around the model.
CLUSTER_REGIONS = ("forward", "backward")


class LowerPass(Pass):
    """Lower the step for its target: XLA clustering attributes and device strings."""

    name = "lower"

    options: LowerOptions
    preserves = frozenset({REGIONS, SHAPES})  # attributes and devices only

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        if graph.format != "tf":
            raise GraphpassError(f"--target/--device lowering is for TF graphs; {graph.format} "
                                 "graphs are written as they are")
        regions = ctx.analyses.regions(graph)
        step = [n for n in graph if regions.label(n) in STEP_REGIONS]
        unsupported = xla_unsupported(graph, step) if ctx.target == "xla" else []
        if unsupported and ctx.device == "tpu":
            raise GraphpassError(_unsupported_message(graph, unsupported))
        changed = False
        if ctx.device:
            changed |= _place(graph, step, DEVICE_TYPES[ctx.device])
        clustered = []
        if ctx.target == "xla" and self.options.xla_cluster == "step":
            left_out = {n for n, _ in unsupported}
            clustered = [n for n in step if n not in left_out and _clusterable(graph, n)
                         and regions.label(n) in CLUSTER_REGIONS]
            for name in clustered:
                graph.dialect.set_attr(graph, name, "_XlaCompile", True)
                graph.dialect.set_attr(graph, name, "_XlaScope", XLA_SCOPE)
                graph.dialect.set_attr(graph, name, "_XlaSeparateCompiledGradients", False)
            changed |= bool(clustered)
        self.report = {
            "target": ctx.target,
            "device": ctx.device,
            "clustered": len(clustered),
            "not_compilable": [{"node": n, "op": op} for n, op in unsupported],
            "summary": _summary(ctx, clustered, unsupported),
        }
        return changed


def _clusterable(graph: Graph, name: str) -> bool:
    """Fed values and ref variables stay outside the cluster (as jit_scope leaves them)."""
    node = graph.node(name)
    return not node.op.startswith("Placeholder") and node.op not in ("VariableV2", "Variable")


def _place(graph: Graph, names: list[str], device_type: str) -> bool:
    """Give ``names`` the device type, keeping every field they already have
    (a ``/job:ps`` placement stays on the ps; an explicit CPU stays CPU)."""
    from tensorflow.python.framework.device_spec import DeviceSpecV2

    wanted = DeviceSpecV2(device_type=device_type, device_index=0)
    changed = False
    for name in names:
        node = graph.node(name)
        current = DeviceSpecV2.from_string(node.device)
        if current.device_type:
            continue
        node.device = current.make_merged_spec(wanted).to_string()
        changed = True
    return changed


def xla_unsupported(graph: Graph, names: list[str]) -> list[tuple[str, str]]:
    """``(node, op)`` for each of ``names`` whose op has no XLA kernel.

    TF lists XLA kernels under the ``XLA_CPU_JIT`` device once XLA is
    initialised (TPU kernels are not in the CPU build; the CPU JIT's set is the
    closest proxy). Fed and stored values never enter a cluster and are skipped.
    """
    compilable = _xla_ops()
    dialect = graph.dialect
    return [(n, graph.node(n).op) for n in names
            if graph.node(n).op not in compilable and not dialect.is_source(graph, n)]


_XLA_OPS: set[str] | None = None


def _xla_ops() -> set[str]:
    global _XLA_OPS
    if _XLA_OPS is None:
        _XLA_OPS = _registered_xla_ops()
    return _XLA_OPS


def _registered_xla_ops() -> set[str]:
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    _initialise_xla(tf)
    listed = kernels.get_all_registered_kernels().kernel
    return {k.op for k in listed if k.device_type == "XLA_CPU_JIT"}


def _initialise_xla(tf) -> None:
    """XLA registers its kernels when first used: compile one tiny cluster."""
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), tf.xla.experimental.jit_scope():
        value = tf.constant(1.0) + 1.0
    with tf1.Session(graph=graph) as session:
        session.run(value)


def _unsupported_message(graph: Graph, unsupported: list[tuple[str, str]]) -> str:
    listed = "; ".join(f"{op} at {name}" for name, op in unsupported[:10])
    more = f" (and {len(unsupported) - 10} more)" if len(unsupported) > 10 else ""
    return (f"{len(unsupported)} op(s) of the training step have no XLA kernel: {listed}{more}; "
            "move them out of the step, or use --xla-cluster none on a non-TPU device")


def _summary(ctx: PassContext, clustered: list[str], unsupported: list) -> list[str]:
    lines = [f"target {ctx.target}" + (f", device {ctx.device}" if ctx.device else "")]
    if clustered:
        lines.append(f"{len(clustered)} step nodes marked for XLA (_XlaScope={XLA_SCOPE})")
    if unsupported:
        ops = sorted({op for _, op in unsupported})
        lines.append(f"{len(unsupported)} step nodes have no XLA kernel and stay outside the "
                     f"cluster: {', '.join(ops[:8])}")
    return lines
