"""Target lowering: the last pass, fitting the rewritten step to its runtime.

``--target tf`` keeps control edges and v1 control flow and needs no lowering
unless ``--device`` asks for device strings. ``--target xla`` (implied by
``--device tpu``) marks the training step for XLA compilation as
``tf.xla.experimental.jit_scope`` does (the dialect's ``mark_xla_cluster``),
unless ``--xla-cluster none`` leaves clustering to the runtime,
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
from graphpass.dialects.capabilities import TargetLowering
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
    requires = (TargetLowering,)

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        regions = ctx.analyses.regions(graph)
        step = [n for n in graph if regions.label(n) in STEP_REGIONS]
        unsupported = graph.dialect.xla_unsupported(graph, step) if ctx.target == "xla" else []
        if unsupported and ctx.device == "tpu":
            raise GraphpassError(_unsupported_message(graph, unsupported))
        changed = False
        if ctx.device:
            changed |= graph.dialect.place(graph, step, DEVICE_TYPES[ctx.device])
        clustered, marked = [], ""
        if ctx.target == "xla" and self.options.xla_cluster == "step":
            left_out = {n for n, _ in unsupported}
            clustered = [n for n in step if n not in left_out
                         and graph.dialect.xla_clusterable(graph, n)
                         and regions.label(n) in CLUSTER_REGIONS]
            marked = graph.dialect.mark_xla_cluster(graph, clustered, XLA_SCOPE)
            changed |= bool(clustered)
        self.report = {
            "target": ctx.target,
            "device": ctx.device,
            "clustered": len(clustered),
            "not_compilable": [{"node": n, "op": op} for n, op in unsupported],
            "summary": _summary(ctx, clustered, marked, unsupported),
        }
        return changed


def _unsupported_message(graph: Graph, unsupported: list[tuple[str, str]]) -> str:
    listed = "; ".join(f"{op} at {name}" for name, op in unsupported[:10])
    more = f" (and {len(unsupported) - 10} more)" if len(unsupported) > 10 else ""
    return (f"{len(unsupported)} op(s) of the training step have no XLA kernel: {listed}{more}; "
            "move them out of the step, or use --xla-cluster none on a non-TPU device")


def _summary(ctx: PassContext, clustered: list[str], marked: str,
             unsupported: list) -> list[str]:
    lines = [f"target {ctx.target}" + (f", device {ctx.device}" if ctx.device else "")]
    if clustered:
        lines.append(f"{len(clustered)} step nodes marked for XLA ({marked})")
    if unsupported:
        ops = sorted({op for _, op in unsupported})
        lines.append(f"{len(unsupported)} step nodes have no XLA kernel and stay outside the "
                     f"cluster: {', '.join(ops[:8])}")
    return lines
