"""Measured peak memory of one TF training step, each graph in its own process.

What is measured: the bytes the step's kernels hold at once, from the
allocation records TF keeps per node when a step runs with
``RunOptions.FULL_TRACE`` (``RunMetadata.step_stats``: every allocation and
deallocation with its time, through each kernel's tracking allocator). Those
records exist whatever the CPU: TF 2.21 turns oneDNN off on CPUs without
avx512_vnni, and then ``get_memory_info('CPU:0')`` has no statistics at all;
with oneDNN on, the allocator's own figure (``peak`` after
``reset_memory_stats``, minus ``current`` before the step) is reported beside
it as ``allocator_peak_bytes`` (it also counts the fed arrays, which the
step's kernels do not allocate).

Each measurement runs in a fresh process (the allocator's statistics are per
process) with ``inter_op_parallelism_threads=1`` (a stable schedule),
Grappler's defaults, after a warm-up step. Inputs are seeded random values of
each placeholder's shape; a ``None`` batch dimension takes ``batch_size``.

Step time ratios of two graphs come from one process that alternates their
steps (:func:`paired_step_time`): separate processes run minutes apart on a
shared machine, and their medians moved by +-20% from run to run here.

    python tools/measure.py GRAPH --fetch loss:0 --fetch train [--init init]
    python tools/measure.py GRAPH --fetch loss:0 --fetch train --against REWRITTEN
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Measurement:
    """One step's figures. ``peak_bytes``: from the allocation records;
    ``allocator_peak_bytes``: the CPU allocator's statistics (None without them);
    ``order``: the nodes in the order the executor started them."""

    peak_bytes: int
    allocator_peak_bytes: int | None
    step_s: float
    losses: list[float]
    order: list[str] = field(default_factory=list)


def measure(graph_path: str | Path, fetches: list[str], init: str | None = "init",
            batch_size: int | None = None, steps: int = 3, onednn: bool | None = None,
            grappler: bool | str = True, trace_path: str | Path | None = None,
            timeout_s: float = 900) -> Measurement:
    """Measure one step of ``graph_path`` (GraphDef or MetaGraphDef) in a new process.

    ``onednn`` sets ``TF_ENABLE_ONEDNN_OPTS`` for that process (None: inherit);
    ``grappler=False`` turns Grappler's optimizers off (``disable_meta_optimizer``);
    ``trace_path`` keeps the traced step's ``RunMetadata`` (step stats and the graph
    the executor ran, after Grappler) for a closer look.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
    spec = {"graph": str(graph_path), "fetches": list(fetches), "init": init,
            "batch_size": batch_size, "steps": steps, "grappler": grappler,
            "trace_path": str(trace_path) if trace_path else None}
    return Measurement(**_run_worker(["--worker", json.dumps(spec)], str(graph_path),
                                     timeout_s, env))


@dataclass
class StepTimes:
    """The rewritten graph's step time over the original's, from steps alternated in
    one process: medians over rounds of the per-round ratio, of wall-clock time and
    of the process's CPU time (all threads; what the recompute costs whatever else
    the machine runs), and the original's median wall-clock step."""

    wall_ratio: float
    cpu_ratio: float
    original_step_s: float
    rounds: int


def paired_step_time(original: str | Path, rewritten: str | Path, fetches: list[str],
                     init: str | None = "init", rounds: int = 15,
                     grappler: bool | str = True, timeout_s: float = 900) -> StepTimes:
    """Time ``rewritten`` against ``original`` in one new process.

    Each round runs the steps in the order original, rewritten, rewritten, original
    (ABBA: a drift in the machine's speed within a round cancels), and its ratio is
    the rewritten pair's time over the original pair's; the median over rounds
    discards the rounds another process interrupted. ``grappler`` applies to the
    rewritten graph's session (see :func:`measure`); the original runs with
    Grappler's defaults.
    """
    spec = {"graphs": [str(original), str(rewritten)], "fetches": list(fetches),
            "init": init, "rounds": rounds, "grappler": grappler}
    return StepTimes(**_run_worker(["--paired-worker", json.dumps(spec)],
                                   f"{rewritten} against {original}", timeout_s))


def _run_worker(args: list[str], what: str, timeout_s: float,
                env: dict | None = None) -> dict:
    """This file run as a worker in a new process; its last stdout line, as JSON."""
    env = env or dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                         capture_output=True, text=True, env=env, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"measuring {what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_from_step_stats(step_stats) -> tuple[int, list[str]]:
    """Peak live bytes of the step's allocation records, and the node start order.

    Records of all nodes are merged by time (a stable sort keeps a node's own
    records in order); deallocations are negative records.
    """
    records, starts = [], []
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            starts.append((node.all_start_micros, len(starts), node.node_name))
            for memory in node.memory:
                records.extend((r.alloc_micros, r.alloc_bytes)
                               for r in memory.allocation_records)
    live = peak = 0
    for _, size in sorted(records, key=lambda r: r[0]):
        live += size
        peak = max(peak, live)
    order = [name for _, _, name in sorted(starts) if not name.startswith("_SOURCE")]
    return peak, order


def _session_config(tf1, grappler: bool | str):
    """``grappler``: True (defaults), False (off) or "manual" (its memory optimizer
    recomputes the ``_recompute_hint`` nodes: the anchor remat is compared with)."""
    config = tf1.ConfigProto(inter_op_parallelism_threads=1)
    if not grappler:
        config.graph_options.rewrite_options.disable_meta_optimizer = True
    if grappler == "manual":
        from tensorflow.core.protobuf import rewriter_config_pb2

        config.graph_options.rewrite_options.memory_optimization = \
            rewriter_config_pb2.RewriterConfig.MANUAL
    return config


def _load_graph(tf, path: Path):
    """A ``tf.Graph`` from a GraphDef or MetaGraphDef file."""
    from tensorflow.core.protobuf import meta_graph_pb2

    tf1 = tf.compat.v1
    data = path.read_bytes()
    meta = meta_graph_pb2.MetaGraphDef()
    try:
        meta.ParseFromString(data)
        graph_def = meta.graph_def if meta.graph_def.node else None
    except Exception:  # noqa: BLE001 - not a MetaGraphDef: a GraphDef
        graph_def = None
    if graph_def is None:
        graph_def = tf1.GraphDef()
        graph_def.ParseFromString(data)
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    return graph


def _feeds(graph, fetches: list[str], batch_size: int | None) -> dict:
    """Seeded random values for the placeholders the fetches need (``None`` batch:
    ``batch_size``); Keras leaves its own unused input placeholders in the graph."""
    import numpy as np

    from graphpass.inspect.verify.compare import random_value

    rng = np.random.RandomState(0)
    feeds = {}
    for op in _ancestors(graph, fetches):
        if op.type != "Placeholder":
            continue
        shape = op.outputs[0].shape.as_list()
        if shape and shape[0] is None:
            shape[0] = batch_size
        if None in shape:
            raise RuntimeError(f"placeholder {op.name} has shape {shape}: give batch_size")
        feeds[op.outputs[0]] = random_value(rng, op.outputs[0].dtype.name, tuple(shape))
    return feeds


def _ancestors(graph, fetches: list[str]) -> list:
    """The ops ``fetches`` depend on (data and control), in graph order."""
    seen, stack = set(), [graph.as_graph_element(f) for f in fetches]
    stack = [getattr(f, "op", f) for f in stack]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op in seen]


def run_worker(spec: dict) -> Measurement:
    """In the measuring process: warm up, read the allocator, trace one step, time."""
    sys.path.insert(0, str(ROOT))
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    graph = _load_graph(tf, Path(spec["graph"]))
    fetches = spec["fetches"]
    feeds = _feeds(graph, fetches, spec["batch_size"])
    losses = [i for i, name in enumerate(fetches) if ":" in name]
    with tf1.Session(graph=graph, config=_session_config(tf1, spec["grappler"])) as session:
        if spec["init"]:
            session.run(spec["init"])
        session.run(fetches, feeds)  # warm-up: kernels built, persistent state allocated
        allocator_peak = _allocator_peak(tf, session, fetches, feeds)
        metadata = tf1.RunMetadata()
        values = session.run(fetches, feeds, run_metadata=metadata, options=tf1.RunOptions(
            trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True))
        if spec["trace_path"]:
            Path(spec["trace_path"]).write_bytes(metadata.SerializeToString())
        peak, order = peak_from_step_stats(metadata.step_stats)
        times = []
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            session.run(fetches, feeds)
            times.append(time.perf_counter() - start)
    return Measurement(peak, allocator_peak, statistics.median(times),
                       [float(values[i]) for i in losses], order)


def run_paired_worker(spec: dict) -> StepTimes:
    """In the timing process: both graphs in sessions of their own, warmed up, then
    ``rounds`` ABBA rounds (see :func:`paired_step_time`)."""
    sys.path.insert(0, str(ROOT))
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    fetches = spec["fetches"]
    steps = []
    for path, grappler in zip(spec["graphs"], (True, spec["grappler"])):
        graph = _load_graph(tf, Path(path))
        session = tf1.Session(graph=graph, config=_session_config(tf1, grappler))
        if spec["init"]:
            session.run(spec["init"])
        feeds = _feeds(graph, fetches, None)
        session.run(fetches, feeds)  # warm-up
        steps.append(functools.partial(session.run, fetches, feeds))
    wall: list[list[float]] = [[], []]
    cpu: list[list[float]] = [[], []]
    for _ in range(spec["rounds"]):
        for which in (0, 1, 1, 0):
            start, start_cpu = time.perf_counter(), time.process_time()
            steps[which]()
            wall[which].append(time.perf_counter() - start)
            cpu[which].append(time.process_time() - start_cpu)
    return StepTimes(_median_pair_ratio(wall), _median_pair_ratio(cpu),
                     statistics.median(wall[0]), spec["rounds"])


def _median_pair_ratio(times: list[list[float]]) -> float:
    """Median over rounds of (rewritten pair) / (original pair); each graph ran twice
    per round, so its times come in consecutive pairs."""
    original, rewritten = times
    return statistics.median(
        (rewritten[i] + rewritten[i + 1]) / (original[i] + original[i + 1])
        for i in range(0, len(original), 2))


def _allocator_peak(tf, session, fetches, feeds) -> int | None:
    """The CPU allocator's peak over one step, or None when it keeps no statistics."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    except ValueError:  # oneDNN off: the plain CPU allocator has no statistics
        return None
    session.run(fetches, feeds)
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?")
    parser.add_argument("--fetch", action="append", default=[])
    parser.add_argument("--init", default="init")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--against", metavar="REWRITTEN",
                        help="time REWRITTEN against GRAPH, steps alternated in one process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--paired-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.paired_worker:
        worker = run_worker if args.worker else run_paired_worker
        print(json.dumps(asdict(worker(json.loads(args.worker or args.paired_worker)))))
        return 0
    if args.against:
        times = paired_step_time(args.graph, args.against, args.fetch, args.init)
        print(f"step time {times.wall_ratio:.3f}x wall, {times.cpu_ratio:.3f}x CPU "
              f"(original {times.original_step_s * 1e3:.1f} ms, {times.rounds} rounds)")
        return 0
    result = measure(args.graph, args.fetch, args.init, args.batch_size)
    print(f"peak {result.peak_bytes} B (allocator: {result.allocator_peak_bytes}), "
          f"step {result.step_s * 1e3:.1f} ms, losses {result.losses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
