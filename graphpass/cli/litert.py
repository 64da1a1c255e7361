"""``--target litert``: the rewritten SavedModel is converted before it is written.

TFLite's converter is the judge of what converts (builtin or Select TF ops) and
of what survives: it drops control edges and merges identical ops, so a rewrite
is only kept if the converted ``train`` subgraph still holds more ops than the
original's where remat added copies. A step it refuses, or a rewrite it would
undo, is a one-line error and nothing is written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph

TARGET = "litert"


def check_source(source: Path, target: str) -> None:
    """Before reading: TFLite converts SavedModels (directories) only."""
    if target == TARGET and not source.is_dir():
        raise GraphpassError(f"--target litert needs a TF2 SavedModel whose training step is "
                             f"a signature (TFLite's converter reads signatures); {source} is "
                             "not a SavedModel directory")


def check_input(graph: Graph, target: str) -> None:
    """TFLite converts signatures: the step must be a SavedModel's function."""
    if target == TARGET and not graph.dialect.in_function_body(graph):
        raise GraphpassError("--target litert needs a TF2 SavedModel whose training step is "
                             "a signature (TFLite's converter reads signatures); this "
                             f"{graph.format} graph has none")


def check_conversion(graph: Graph, source: Path, passes: list[dict]) -> dict:
    """Convert the rewritten graph (staged in a temporary directory) and, where remat
    added copies, the original; the ``litert`` entry of the report."""
    import graphpass
    from graphpass.dialects import tf_litert

    with tempfile.TemporaryDirectory(prefix="graphpass-litert-") as staging:
        staged = Path(staging) / "model"
        graphpass.save(graph, staged)
        rewritten = tf_litert.subgraph(tf_litert.convert(staged))
    added = sum(p["report"].get("nodes_added", 0) for p in passes if p["name"] == "remat")
    entry = {"train_ops": len(rewritten.ops), "select_tf_ops": rewritten.flex_ops()}
    if added:
        original = tf_litert.subgraph(tf_litert.convert(source))
        entry["train_ops_before"] = len(original.ops)
        if len(rewritten.ops) <= len(original.ops):
            raise GraphpassError(
                f"TFLite's converter merges the {added} recomputed ops back into their "
                f"originals ({len(rewritten.ops)} ops in the converted train step, "
                f"{len(original.ops)} before): the rewrite would save nothing on the device; "
                "use --dependency data")
    flex = entry["select_tf_ops"]
    before = f" (original {entry['train_ops_before']})" if "train_ops_before" in entry else ""
    entry["summary"] = [
        f"TFLite: train step converts to {entry['train_ops']} ops{before}; "
        + (f"{len(flex)} Select TF op types need the Flex delegate: {', '.join(flex[:6])}"
           + (" ..." if len(flex) > 6 else "") if flex else "all builtin")]
    return entry
