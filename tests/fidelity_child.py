"""The TensorFlow side of the fidelity tests, run in a child process so that each
run sees the oneDNN setting its parent chose (``TF_ENABLE_ONEDNN_OPTS`` is read
once, when TensorFlow starts) and nothing else the test process imported.

A model is a TF2 SavedModel directory (its ``train`` signature, inputs drawn
from the signature's specs with a fixed seed) or a TF1 ``.meta`` file with a
``<file>.json`` beside it naming the loss, the train op and the init op, and a
``<file>.npz`` holding the feeds.

    python tests/fidelity_child.py export MODEL DIR        (tests/fidelity_models.py)
    python tests/fidelity_child.py run OUT_DIR PATH [PATH...]
        3 steps of each model, one after the other: OUT_DIR/<i>/values.npz, the
        losses and variables, and OUT_DIR/<i>/kernels.json, the executed graph's
        kernels, for the i-th PATH

One process runs both, the kernels read from the first of the steps, and runs every
model given: the TF start and the model's load are most of a small model's run.
It builds and runs; it never compares (``kernel_parity`` and the tests do).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
STEPS = 3


def _is_tf1(path: Path) -> bool:
    return path.suffix == ".meta"


def _signature_inputs(tf, function) -> dict:
    """Seeded inputs for every argument of a signature (ints: small class ids)."""
    import numpy as np

    rng = np.random.RandomState(0)
    values = {}
    for name, spec in sorted(function.structured_input_signature[1].items()):
        shape = spec.shape.as_list()
        if spec.dtype.is_integer:
            values[name] = tf.constant(rng.randint(0, 4, shape), dtype=spec.dtype)
        else:
            values[name] = tf.constant(rng.standard_normal(shape), dtype=spec.dtype)
    return values


def _tf1_model(path: Path):
    import numpy as np

    names = json.loads(path.with_suffix(".json").read_text())
    with np.load(path.with_suffix(".npz")) as data:
        feeds = {key: data[key] for key in data.files}
    return names, feeds


def _tf1_graph(tf, path: Path):
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.ParseFromString(path.read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(meta.graph_def, name="")
    return graph


def run(out: Path, paths: list[Path]) -> None:
    """``STEPS`` steps of each model: the losses and every variable's final value in
    ``<i>/values.npz``, the kernels the first step executed in ``<i>/kernels.json``."""
    dumps: set[Path] = set()
    for i, path in enumerate(paths):
        _run_one(path, out / str(i), out / "dumps", dumps)


def _run_one(path: Path, out: Path, dump_dir: Path, dumped: set[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if _is_tf1(path):
        losses, values, partitions = _session_steps(path)
    else:
        losses, values, partitions = _eager_steps(path, dump_dir, dumped)
    import numpy as np

    np.savez(out / "values.npz", __losses__=np.array(losses), **values)
    (out / "kernels.json").write_text(json.dumps(_kernels(partitions), indent=0,
                                                 sort_keys=True))


def _kernels(partitions: list) -> dict:
    """The kernel of every node TF executed, ``{name: [op, fused_ops, data inputs,
    attributes' digest]}``, after Grappler, function inlining and oneDNN's
    rewrites; names as written in the graph (a function body's without its call
    prefixes).

    A TF1 graph's partition graphs are the ones its session returns. A
    SavedModel's are those the eager call of its signature runs, as TF's graph
    dumper writes them (a session that calls the signature optimizes the inlined
    body with the rest of its graph, which is not what an eager call runs)."""
    found = {}
    for partition in partitions:
        for node in partition.node:
            if node.name.startswith("Func/") or node.op in ("_Send", "_Recv", "_Arg",
                                                             "_Retval"):
                continue
            fused = [s.decode() for s in node.attr["fused_ops"].list.s] \
                if "fused_ops" in node.attr else []
            inputs = [_body_name(i) for i in node.input if not i.startswith("^")]
            found[_body_name(node.name)] = [node.op, fused, inputs, _attrs_digest(node)]
    return found


def _session_steps(path: Path) -> tuple[list, dict, list]:
    import tensorflow as tf

    from graphpass.inspect.verify.tf_runner import SESSION_VARIABLE_OPS, variable_value

    tf1 = tf.compat.v1
    options = tf1.RunOptions(output_partition_graphs=True)
    metadata = tf1.RunMetadata()
    names, feeds = _tf1_model(path)
    graph = _tf1_graph(tf, path)
    with graph.as_default():
        reads = {op.name: variable_value(tf, op) for op in graph.get_operations()
                 if op.type in SESSION_VARIABLE_OPS}
    fetches = [names["loss"], names["train_op"]]
    with tf1.Session(graph=graph) as session:
        session.run(names["init"])
        losses = [session.run(fetches, feeds, options=options, run_metadata=metadata)[0]]
        losses += [session.run(fetches, feeds)[0] for _ in range(STEPS - 1)]
        values = session.run(reads)
    return losses, values, list(metadata.partition_graphs)


def _eager_steps(path: Path, dumps: Path, dumped: set[Path]) -> tuple[list, dict, list]:
    """Eager steps with TF's debug graph dumper on (read when TF starts): the
    partition graphs are the dumps this model's steps wrote (``dumped``: those of
    the models before it, to which this adds its own)."""
    if not dumps.exists():
        assert "tensorflow" not in sys.modules, "the dumper must be set before TF starts"
        dumps.mkdir(parents=True)
        os.environ.update(TF_DUMP_GRAPH_PREFIX=str(dumps), TF_DUMP_GRAPH_NAME_FILTER="*",
                          TF_DUMP_GRAPH_GROUPS="main")
    import tensorflow as tf
    from google.protobuf import text_format

    loaded = tf.saved_model.load(str(path))  # holds the variables
    function = loaded.signatures["train"]
    inputs = _signature_inputs(tf, function)
    losses = [function(**inputs)["loss"].numpy() for _ in range(STEPS)]
    # Keras 3 names repeat (every Dense has a "kernel"): the position tells.
    values = {f"{i}:{v.name}": v.numpy() for i, v in enumerate(function.variables)}
    mine = sorted(set(dumps.glob("*_partition_*after_partition_passes.pbtxt")) - dumped)
    dumped.update(mine)
    partitions = [text_format.Parse(dump.read_text(), tf.compat.v1.GraphDef())
                  for dump in mine]
    assert partitions, f"TF wrote no partition graphs for {path} under {dumps}"
    return losses, values, partitions


def _attrs_digest(node) -> str:
    """What a node's attributes compute with (a constant's value, a conv's strides),
    not TF's bookkeeping (``_``-prefixed attributes)."""
    import hashlib

    digest = hashlib.sha256()
    for key in sorted(node.attr):
        if not key.startswith("_"):
            digest.update(key.encode() + node.attr[key].SerializeToString(deterministic=True))
    return digest.hexdigest()[:16]


#: A node of the stale gate's branch, which TF lowered and inlined into the step:
#: ``<If>/then/_<k>/<body node>``.
_INLINED_BRANCH = re.compile(r"graphpass/drop_stale/.+?/(?:then|else)/_\d+/(.+)")


def _body_name(name: str) -> str:
    """A node's name in its function body: inlining prefixes it with the call(s),
    and with the conditional's and branch's names for a node of a lowered branch."""
    while name.startswith("StatefulPartitionedCall/"):
        name = name[len("StatefulPartitionedCall/"):]
    inlined = _INLINED_BRANCH.fullmatch(name)
    return inlined.group(1) if inlined else name


def main(argv: list[str]) -> None:
    command, path, *rest = argv
    if command == "export":
        from tests.fidelity_models import export

        export(path, Path(rest[0]))
    elif command == "run":
        run(Path(path), [Path(p) for p in rest])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
