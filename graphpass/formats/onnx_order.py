"""The order of an ONNX graph's nodes in the file (onnxruntime's schedule of it is
the runtime model's: ``runtimes/ort``).

The reader and writer (``onnx_io``) and the dialect share the conventions
defined here (the source ops standing for inputs and initializers, the read
index marking nodes read from a file), so that the writer and the order do not
import each other.

Node order: ONNX requires a topological order. The writer keeps the IR's
insertion order (the file's order for nodes read) and emits a node that is not
yet placed just before its first reader: an untouched graph keeps its node
order exactly, and a node a pass appended lands right before the node that
needs it (or at the end if nothing reads it). See :func:`emission_order`.

Leaves of a rewritten graph: onnxruntime does not run a model in file order.
Its default schedule is a depth-first walk from the *leaves* (nodes nobody
reads: the loss, each SGD update), starting from the leaf that comes *last* in
the file. On a training step whose updates are listed first-block-last, that
walk runs the whole backward pass for the first block's update before any other
update, so every block's weight-gradient inputs stay alive to the end and a
per-segment recomputation saves nothing. So when the graph holds nodes a pass
added, the writer emits the leaves last, the one whose inputs are ready
earliest in the node order at the very end, so that ORT's walk follows the
node order (:func:`ort_leaf_order`). A graph no pass added to keeps its order.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph

INPUT = "graphpass.Input"
INITIALIZER = "graphpass.Initializer"
SOURCE_OPS = frozenset({INPUT, INITIALIZER})
# node.meta key set on every node read from a file (a pass's new nodes lack it).
READ_INDEX = "onnx_read_index"


def emission_order(graph: Graph) -> list[str]:
    """Insertion order, each node preceded by whichever of its producers (data or
    control) are not placed yet, depth first. Raises ``ValueError`` on a cycle."""
    done: set[str] = set()
    order: list[str] = []
    for root in graph:
        if root in done:
            continue
        stack = [(root, iter(graph.producers(root)))]
        active = {root}
        while stack:
            name, producers = stack[-1]
            for producer in producers:
                if producer in done:
                    continue
                if producer in active:
                    raise ValueError(f"the graph has a cycle through {producer!r}")
                active.add(producer)
                stack.append((producer, iter(graph.producers(producer))))
                break
            else:
                stack.pop()
                active.discard(name)
                done.add(name)
                order.append(name)
    return order


def file_order(graph: Graph) -> list[str]:
    """The order the writer emits nodes in (source nodes included, where they fall):
    :func:`emission_order`, and for a graph a pass added nodes to, leaves last
    (:func:`ort_leaf_order`)."""
    order = emission_order(graph)
    if any(READ_INDEX not in n.meta for n in graph.nodes() if n.op not in SOURCE_OPS):
        order = ort_leaf_order(graph, order)
    return order


def ort_leaf_order(graph: Graph, order: list[str]) -> list[str]:
    """``order`` with its leaves moved to the end, latest-ready first.

    A leaf is ready once the shared values its private cone reads exist (its
    private cone: the leaf and the ancestors only it uses, such as an update's
    ``Mul(lr, grad)`` and the weight-gradient MatMul), measured by their depth
    (:func:`_depths`), not their place in the file: a scalar shared by every
    update that the file computes after the backward pass would otherwise make
    every leaf ready there. onnxruntime walks from the last leaf of the file
    first, so the leaf ready earliest goes last.
    """
    position = {name: i for i, name in enumerate(order)}
    leaves = [n for n in order if not graph.users(n) and graph.node(n).op not in SOURCE_OPS]
    depth = _depths(graph, order)
    readiness = {leaf: _ready_depth(graph, leaf, depth) for leaf in leaves}
    moved = set(leaves)
    tail = sorted(leaves, key=lambda n: (readiness[n], position[n]), reverse=True)
    return [n for n in order if n not in moved] + tail


def _depths(graph: Graph, order: list[str]) -> dict[str, int]:
    """Each node's depth in ``order`` (topological): the most ops on a path to it
    from the inputs and initializers. A value computed from sources by a few ops
    (Adam's bias-corrected rate from the step counter) is shallow wherever the
    file lists it; a weight gradient is as deep as the backward pass has come."""
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = 0 if graph.node(name).op in SOURCE_OPS else \
            1 + max((depth[p] for p in graph.producers(name)), default=0)
    return depth


def _ready_depth(graph: Graph, leaf: str, depth: dict[str, int]) -> int:
    """The greatest depth of a value ``leaf``'s private cone reads from outside it."""
    private = {leaf}
    users_seen: dict[str, int] = {}
    stack = [leaf]
    ready = -1
    while stack:
        for producer in graph.producers(stack.pop()):
            if graph.node(producer).op in SOURCE_OPS:
                continue
            users_seen[producer] = users_seen.get(producer, 0) + 1
            if users_seen[producer] == len(graph.users(producer)):
                private.add(producer)
                stack.append(producer)
    for name in private:
        for producer in graph.producers(name):
            if producer not in private and graph.node(producer).op not in SOURCE_OPS:
                ready = max(ready, depth[producer])
    return ready
