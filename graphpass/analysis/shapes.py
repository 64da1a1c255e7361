"""Shape (and, for ONNX, dtype) inference as an analysis.

The dialect runs its format's own inference (TF: import into a ``tf.Graph``;
ONNX: ``onnx.shape_inference``) and records each node's output shapes on the
node (``node.meta["shapes"]``), as torch.fx records shape metadata. Reading a
shape (``Dialect.shape``) never triggers inference: the analyses that need
shapes (regions, the memory estimate) ask for them here first, for the whole
graph or, where a few values' shapes decide (loss detection's scalars), for
those values alone: a dialect may then infer only what they are computed from
(TF: a fraction of the graph for its loss candidates). Nodes that a
builder added with their shapes recorded need no new inference; one without
makes the next request re-infer.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphpass.ir.graph import Graph


def infer_shapes(graph: Graph, nodes: Iterable[str] | None = None) -> bool:
    """Run the dialect's inference when some node (of ``nodes``, default all) has
    no recorded shapes (``Dialect.ensure_shapes``); returns whether it ran."""
    return graph.dialect.ensure_shapes(graph, nodes)
