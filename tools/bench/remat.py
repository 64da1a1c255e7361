"""Peak memory and step time of one training step, rematerialized or not.

The 8-block MLP of the issue (x [2048, 1024] float32, block i
``h = tanh(relu(h @ W_i)) * 2``, loss ``mean(h*h)``, SGD), blocks 1..7 marked.
Variants, each run in its own process (the allocator's peak is per process):

* original           -- the exported training graph, untouched
* graphpass control  -- ``graphpass rewrite --recompute 'block[1-7]/'``
* graphpass data     -- the same with ``--dependency data``
* graphpass auto     -- ``--recompute auto --memory-budget-bytes B``, B = 0.6x the
                        original's estimated peak: the planner picks the blocks
* grappler manual    -- the original with ``_recompute_hint`` on the same nodes and
                        Grappler's memory optimizer in MANUAL mode
* tf.recompute_grad  -- the model rebuilt with source-level ``tf.recompute_grad``
                        around blocks 1..7

Peak = ``get_memory_info('CPU:0')['peak']`` over one step after a warm-up step and
``reset_memory_stats``, minus the ``current`` before the step;
``inter_op_parallelism_threads=1`` for a stable schedule. ``--xla`` compiles every
variant's step with XLA, clustered the same way (graphpass's ``--target xla``
lowering marks the step as ``jit_scope`` would); XLA's buffer-assignment total is
then read from XLA's own dump. Ratios are against the original, measured in the same run.

    python -m tools.bench.remat [--batch 2048 --width 1024 --blocks 8] [--xla]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

MARK = "block[1-7]/"
#: The auto variant's budget, as a fraction of the original step's estimated peak.
AUTO_BUDGET = 0.6


def build_variants(args, work: Path) -> dict[str, dict]:
    """Write one GraphDef per variant; return variant -> run spec."""
    import graphpass
    from tools.fixtures import tf_models

    model = tf_models.block_mlp(batch=args.batch, width=args.width, blocks=args.blocks,
                                optimizer="sgd")
    original = work / "original.pb"
    original.write_bytes(model.graph_def.SerializeToString(deterministic=True))
    spec = {"loss": model.loss, "train_op": model.train_op, "init": model.init,
            "batch": args.batch, "width": args.width}
    target = {"target": "xla"} if args.xla else {}
    variants = {"original": dict(spec, graph=str(_lowered(original, target)), nodes_added=0)}
    for dependency in ("control", "data"):
        graph = graphpass.load(original)
        results = graphpass.run_passes(
            graph, {"recompute": [MARK], "dependency": dependency, **target})
        path = work / f"graphpass_{dependency}.pb"
        graphpass.save(graph, path)
        variants[f"graphpass {dependency}"] = dict(
            spec, graph=str(path), nodes_added=results[0].report["nodes_added"])
    estimate = results[0].report["estimated_peak_bytes_before"]
    variants["graphpass auto"] = _auto_variant(original, work, int(AUTO_BUDGET * estimate),
                                               target, spec)
    hinted = _lowered(_hinted(original, work), target)
    variants["grappler manual"] = dict(spec, graph=str(hinted), nodes_added=0,
                                       grappler_manual=True)
    source = tf_models.block_mlp(batch=args.batch, width=args.width, blocks=args.blocks,
                                 optimizer="sgd", recompute_grad_blocks=range(1, 8))
    path = work / "recompute_grad.pb"
    path.write_bytes(source.graph_def.SerializeToString(deterministic=True))
    variants["tf.recompute_grad"] = dict(spec, graph=str(_lowered(path, target)),
                                         loss=source.loss, train_op=source.train_op,
                                         init=source.init, nodes_added=0)
    return variants


def _auto_variant(original: Path, work: Path, budget: int, target: dict, spec: dict) -> dict:
    """The planner's choice for ``budget`` bytes (printed: which blocks it took)."""
    import graphpass

    graph = graphpass.load(original)
    results = graphpass.run_passes(
        graph, {"recompute": ["auto"], "memory_budget_bytes": budget, **target})
    print(results[0].report["summary"][0])
    path = work / "graphpass_auto.pb"
    graphpass.save(graph, path)
    return dict(spec, graph=str(path), nodes_added=results[0].report["nodes_added"])


def _lowered(path: Path, target: dict) -> Path:
    """With ``--xla``, every variant's step is clustered the same way: graphpass's
    lowering (``_XlaCompile``/``_XlaScope`` on the step, as jit_scope sets them)."""
    if not target:
        return path
    import graphpass

    graph = graphpass.load(path)
    graphpass.run_passes(graph, target)
    lowered = path.with_name(path.stem + "_xla.pb")
    graphpass.save(graph, lowered)
    return lowered


def _hinted(original: Path, work: Path) -> Path:
    """The original with Grappler's ``_recompute_hint`` on every forward node of the marks."""
    import graphpass

    graph = graphpass.load(original)
    forward = set(graphpass.analyze(graph).nodes("forward"))
    for name in list(graph):
        if re.match(MARK, name) and name in forward:
            graph.dialect.set_attr(graph, name, "_recompute_hint", 0)
    path = work / "grappler_manual.pb"
    graphpass.save(graph, path)
    return path


def measure(spec: dict, steps: int, xla: bool) -> dict:
    """Run in a worker process: peak bytes of one step, median step seconds."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    graph_def = tf1.GraphDef()
    graph_def.ParseFromString(Path(spec["graph"]).read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    config = tf1.ConfigProto(inter_op_parallelism_threads=1)
    if spec.get("grappler_manual"):
        from tensorflow.core.protobuf import rewriter_config_pb2

        config.graph_options.rewrite_options.memory_optimization = \
            rewriter_config_pb2.RewriterConfig.MANUAL
    feeds = {"x:0": np.random.RandomState(0).standard_normal(
        [spec["batch"], spec["width"]]).astype(np.float32)}
    fetches = [spec["loss"], spec["train_op"]]
    with tf1.Session(graph=graph, config=config) as session:
        session.run(spec["init"])
        session.run(fetches, feeds)  # warm-up: compile, allocate persistent state
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        loss, _ = session.run(fetches, feeds)
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            session.run(fetches, feeds)
            times.append(time.perf_counter() - start)
    return {"peak": peak, "step_s": statistics.median(times), "loss": float(loss)}


def xla_total_bytes(dump_dir: Path) -> int | None:
    """Largest "Total bytes used" over XLA's buffer-assignment dumps (the training step)."""
    totals = []
    for path in dump_dir.glob("*buffer-assignment.txt"):
        for match in re.finditer(r"Total bytes used: (\d+)", path.read_text()):
            totals.append(int(match.group(1)))
    return max(totals) if totals else None


def dump_dir(work: Path, name: str) -> Path:
    """Where ``run_worker`` has XLA dump variant ``name``'s modules."""
    return work / f"xla_{name.replace(' ', '_').replace('.', '_')}"


def run_worker(name: str, spec: dict, steps: int, xla: bool, work: Path,
               dump_flags: str = "") -> dict:
    """Run one variant in its own process; ``dump_flags`` are added to XLA's dump flags."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    dump = dump_dir(work, name)
    if xla:
        env["XLA_FLAGS"] = f"--xla_dump_to={dump} {dump_flags}".strip()
    out = subprocess.run(
        [sys.executable, "-m", "tools.bench.remat", "--worker", json.dumps(spec), "--steps",
         str(steps)] + (["--xla"] if xla else []),
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if xla:
        result["xla_bytes"] = xla_total_bytes(dump)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--xla", action="store_true")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker), args.steps, args.xla)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        variants = build_variants(args, work)
        results = {name: run_worker(name, spec, args.steps, args.xla, work)
                   for name, spec in variants.items()}
    print_table(args, variants, results)


def print_table(args, variants: dict, results: dict) -> None:
    base = results["original"]
    mode = "XLA (step clustered)" if args.xla else "TF runtime, Grappler defaults"
    print(f"8-block MLP step, x [{args.batch}, {args.width}] float32, blocks 1..7 marked "
          f"(auto: budget {AUTO_BUDGET}x the estimated peak); {mode}")
    header = f"{'variant':20s} {'peak MiB':>9s} {'peak':>7s} {'step ms':>8s} {'time':>6s} " \
             f"{'nodes+':>6s} {'loss':>12s}"
    if args.xla:
        header += f" {'XLA MiB':>8s} {'XLA':>6s}"
    print(header)
    for name, r in results.items():
        line = (f"{name:20s} {r['peak'] / 2**20:9.1f} {r['peak'] / base['peak']:6.2f}x "
                f"{r['step_s'] * 1e3:8.1f} {r['step_s'] / base['step_s']:5.2f}x "
                f"{variants[name]['nodes_added']:6d} {r['loss']:12.6g}")
        if args.xla and r.get("xla_bytes") and base.get("xla_bytes"):
            line += f" {r['xla_bytes'] / 2**20:8.1f} {r['xla_bytes'] / base['xla_bytes']:5.2f}x"
        print(line)


if __name__ == "__main__":
    main()
