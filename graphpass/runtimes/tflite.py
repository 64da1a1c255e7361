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

    def executions(self, graph: Graph, nodes: set[str], known: frozenset[str],
                   fetched: frozenset[str]) -> list[Execution]:
        return [Execution(converted_order(graph, nodes))]

    def forwardable_inputs(self, graph: Graph, name: str) -> tuple[int, ...]:
        return ()  # the arena gives every output a tensor of its own

    def check_input(self, graph: Graph) -> None:
        """TFLite converts signatures: the step must be a SavedModel's function."""
        if not graph.dialect.in_function_body(graph):
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
    """The converter's op order as far as it matters to the arena: each op as
    soon as its inputs are there, the most recently readied first (a depth-first
    list schedule; ties in the graph's order). The converter hoists what does not
    wait for the gradients (variable reads, a momentum times its slot, the masks
    of activation gradients) next to what it reads, which this reproduces; the
    graph's own order would keep activations alive until their gradient's turn."""
    order = [n for n in graph.topological_order() if n in needed]
    position = {n: i for i, n in enumerate(order)}
    waiting = {n: sum(1 for p in set(graph.producers(n)) if p in position) for n in order}
    ready = [n for n in reversed(order) if not waiting[n]]
    scheduled = []
    while ready:
        name = ready.pop()
        scheduled.append(name)
        users = [u for u in set(graph.users(name)) if u in position]
        for user in sorted(users, key=position.get, reverse=True):
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
    return scheduled
