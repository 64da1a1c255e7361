"""TensorFlow Lite as a :class:`~graphpass.runtimes.base.RuntimeModel`: the
converter's op order, TF's aliasing and folding as the converter applies them,
and a static arena (``ARENA``: ``analysis/arena`` packs it as TFLite's
``ArenaPlanner`` does). The converter drops control edges, so a rewrite orders
work by data dependencies; no process holds updates, as the interpreter runs
the converted order as it is. The converter itself is the oracle of what a
rewrite becomes on the device (``tflite_converter``): a step it refuses, or a
rewrite it merges back, is never written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph
from graphpass.runtimes.base import ARENA, Execution
from graphpass.runtimes.tf_executor import TFKernelFacts


class TFLiteModel(TFKernelFacts):
    name = "litert"
    title = "TFLite's arena"
    dependency = "data"
    heap = ARENA
    fuser = "TFLite's converter"

    def refuses_dependency(self, dependency: str) -> str | None:
        """Control mode: the converter drops control edges, and its CSE then merges
        each copy back into its original, so the rewrite would convert to the
        original's model."""
        if dependency != "control":
            return None
        return ("TFLite's converter drops control edges and merges every copy back into "
                "its original; use --dependency data (the default there)")

    def executions(self, graph: Graph, nodes: set[str], known: frozenset[str],
                   fetched: frozenset[str]) -> list[Execution]:
        return [Execution(converted_order(graph, nodes))]

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        return ()  # the arena gives every output a tensor of its own

    def check_input(self, graph: Graph) -> None:
        """TFLite converts signatures: the step must be a SavedModel's function."""
        if not graph.dialect.step.in_function_body(graph):
            raise GraphpassError("--target litert needs a TF2 SavedModel whose training step "
                                 "is a signature (TFLite's converter reads signatures); this "
                                 f"{graph.format} graph has none")

    def check_written(self, graph: Graph, source: Path, reports: list[dict]) -> dict:
        """Convert the rewritten graph (staged in a temporary directory) and, where remat
        added copies, the original: the converter drops control edges and merges
        identical ops, so a rewrite is kept only if the converted ``train`` subgraph
        still holds more ops than the original's. The report's ``litert`` entry."""
        from graphpass.formats.dispatch import save
        from graphpass.runtimes import tflite_converter as converter

        with tempfile.TemporaryDirectory(prefix="graphpass-litert-") as staging:
            staged = Path(staging) / "model"
            save(graph, staged)
            rewritten = converter.subgraph(converter.convert(staged))
        added = sum(p["report"].get("nodes_added", 0) for p in reports if p["name"] == "remat")
        entry = {"train_ops": len(rewritten.ops), "select_tf_ops": rewritten.flex_ops()}
        if added:
            original = converter.subgraph(converter.convert(source))
            entry["train_ops_before"] = len(original.ops)
            if len(rewritten.ops) <= len(original.ops):
                raise GraphpassError(
                    f"TFLite's converter merges the {added} recomputed ops back into their "
                    f"originals ({len(rewritten.ops)} ops in the converted train step, "
                    f"{len(original.ops)} before): the rewrite would save nothing on the "
                    "device")
        flex = entry["select_tf_ops"]
        before = f" (original {entry['train_ops_before']})" if "train_ops_before" in entry \
            else ""
        entry["summary"] = [
            f"TFLite: train step converts to {entry['train_ops']} ops{before}; "
            + (f"{len(flex)} Select TF op types need the Flex delegate: {', '.join(flex[:6])}"
               + (" ..." if len(flex) > 6 else "") if flex else "all builtin")]
        return entry


def converted_order(graph: Graph, needed: set[str]) -> list[str]:
    """The converter's op order: TF's graph importer lays a function's nodes out in
    reverse post-order of a depth-first search from the nodes that read nothing,
    each node's users taken in name order (``GetReversePostOrder`` with a name
    comparator), and the passes after it keep that order. So work that only the
    updates read (a weight's gradient ``x^T dy``, a norm's scale gradient) sinks
    past the whole backward pass, to the updates, and keeps its operands alive
    that long, where a schedule running each op as soon as it can frees them."""
    users = {n: sorted(u for u in set(graph.users(n)) if u in needed) for n in needed}
    roots = sorted(n for n in needed if not any(p in needed for p in graph.producers(n)))
    finished: list[str] = []
    visited: set[str] = set()
    stack = [(name, False) for name in roots]
    while stack:
        name, leaving = stack.pop()
        if leaving:
            finished.append(name)
        elif name not in visited:
            visited.add(name)
            stack.append((name, True))
            stack.extend((user, False) for user in users[name] if user not in visited)
    return finished[::-1]
