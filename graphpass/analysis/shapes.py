"""Shape (and, for ONNX, dtype) inference as an analysis.

The dialect runs its format's own inference (TF: import into a ``tf.Graph``;
ONNX: ``onnx.shape_inference``) and records each node's output shapes on the
node (``node.meta["shapes"]``), as torch.fx records shape metadata. Reading a
shape (``Dialect.shape``) never triggers inference: the analyses that need
shapes (regions, the memory estimate) ask for them here first. Nodes that a
builder added with their shapes recorded need no new inference; one without
makes the next request re-infer the graph.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph


def infer_shapes(graph: Graph) -> bool:
    """Run the dialect's inference when some node has no recorded shapes; returns
    whether it ran."""
    dialect = graph.dialect
    if all(dialect.has_shapes(graph, name) for name in graph):
        return False
    dialect.infer_shapes(graph)
    return True
