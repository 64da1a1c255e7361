"""Benchmark: graphpass on large training graphs, against Grappler's memory optimizer.

    python -m tools.bench.scale [--layers 70,210,485] [--onnx-blocks 3125]
        [--variants inspect,remat,estimates,auto,roundtrip,grappler] [--rounds N]

Graphs (generated once into ``--work``, reused by later runs):

* TF1 pre-norm FFN stacks: layer i under ``encoder/layer_i/`` is
  ``h + W2 relu(W1 LN(h) + b1) + b2`` (LN with its own gamma, beta), loss
  ``mean(h*h)``, gradients clipped by global norm, Adam; exported as a
  MetaGraphDef with its Saver. 70, 210 and 485 layers give about 21.6k, 65k
  and 150k nodes.
* ONNX: the block MLP of ``tools/fixtures/onnx_models.py`` (forward, hand-written
  backward, SGD) with 3125 blocks, about 50k nodes.

Variants, each in its own process (a fresh interpreter per measurement):

* ``inspect``   -- ``graphpass inspect``
* ``remat``     -- ``graphpass rewrite --recompute 'encoder/layer_[0-9]+/' --quiet``
                   (ONNX: ``'block[0-9]+/'``): no summary shown, so no memory estimate
* ``estimates`` -- the same with ``--report FILE``: the two estimates (before and
                   after) that the summary and the report show
* ``auto``      -- ``graphpass rewrite --recompute auto``
* ``roundtrip`` -- ``graphpass rewrite`` with no pass (read + write)
* ``grappler``  -- the anchor: the same graph with ``_recompute_hint`` on every
                   forward node the pattern matches, through
                   ``tf_optimizer.OptimizeGraph`` with only the memory optimizer
                   on, in MANUAL mode (TF graphs only)

Each worker first imports the runtime of the graph's format (TensorFlow, or
onnx and onnxruntime), timed apart as ``import s``; ``seconds`` is then the
command alone (graphpass's own modules included). ``s/1k ratio`` is the time per
node relative to the smallest graph of the same format (1.00 = linear);
``peak RSS`` is the worker process's high-water mark, TF import included.
A variant that runs past ``--timeout`` is reported as such. With ``--rounds N``
each variant of a graph runs N times, the variants in turn (every other round in
reverse), and the table gives the median, the spread (``min-max``) and, against
Grappler, the median of the per-round ratios: on a shared machine a single run
moves by tens of percent, and a ratio of neighbouring runs less.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TF_MARK = "encoder/layer_[0-9]+/"
ONNX_MARK = "block[0-9]+/"
VARIANTS = ("inspect", "remat", "estimates", "auto", "roundtrip", "grappler")


# -- graphs -------------------------------------------------------------------


def ffn_stack(layers: int, width: int = 64, batch: int = 8, seed: int = 0):
    """A pre-norm FFN stack's training step (Adam, global-norm clipping) as a MetaGraphDef."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        h = tf1.placeholder(tf.float32, [batch, width], name="x")
        for i in range(layers):
            with tf1.variable_scope(f"encoder/layer_{i}"):
                h = h + _ffn(tf, tf1, _layer_norm(tf, tf1, h, width), width)
        loss = tf.reduce_mean(h * h, name="loss")
        step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.AdamOptimizer(1e-3)
        grads, variables = zip(*optimizer.compute_gradients(loss))
        clipped, _ = tf.clip_by_global_norm(grads, 1.0)
        optimizer.apply_gradients(zip(clipped, variables), global_step=step, name="train")
        tf1.global_variables_initializer()
        saver = tf1.train.Saver()
        return tf1.train.export_meta_graph(graph=graph, saver_def=saver.as_saver_def())


def _layer_norm(tf, tf1, h, width: int):
    gamma = tf1.get_variable("ln/gamma", [width], initializer=tf1.ones_initializer())
    beta = tf1.get_variable("ln/beta", [width], initializer=tf1.zeros_initializer())
    mean, variance = tf.nn.moments(h, [1], keepdims=True)
    return (h - mean) * tf.math.rsqrt(variance + 1e-6) * gamma + beta


def _ffn(tf, tf1, h, width: int):
    zeros = tf1.zeros_initializer()
    w1 = tf1.get_variable("ffn/w1", [width, 4 * width])
    b1 = tf1.get_variable("ffn/b1", [4 * width], initializer=zeros)
    w2 = tf1.get_variable("ffn/w2", [4 * width, width])
    b2 = tf1.get_variable("ffn/b2", [width], initializer=zeros)
    return tf.matmul(tf.nn.relu(tf.matmul(h, w1) + b1), w2) + b2


def tf_graph(work: Path, layers: int) -> Path:
    path = work / f"ffn_{layers}.meta"
    if not path.exists():
        _atomic_write(path, ffn_stack(layers).SerializeToString(deterministic=True))
    return path


def onnx_graph(work: Path, blocks: int) -> Path:
    path = work / f"onnx_mlp_{blocks}.onnx"
    if not path.exists():
        from tools.fixtures import onnx_models

        built = onnx_models.block_mlp(batch=8, width=32, blocks=blocks, check=False)
        _atomic_write(path, built.model.SerializeToString(deterministic=True))
    return path


def hinted_graph(source: Path) -> Path:
    """``source`` with ``_recompute_hint`` on the forward nodes ``TF_MARK`` matches
    (the marks Grappler's MANUAL mode recomputes)."""
    path = source.with_name(source.stem + "_hinted.meta")
    if not path.exists():
        import graphpass

        graph = graphpass.load(source)
        forward = set(graphpass.analyze(graph).nodes("forward"))
        for name in list(graph):
            if re.match(TF_MARK, name) and name in forward:
                graph.dialect.set_attr(graph, name, "_recompute_hint", 0)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            graphpass.save(graph, Path(tmp, path.name))
            os.replace(Path(tmp, path.name), path)
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def node_count(path: Path) -> int:
    if path.suffix == ".onnx":
        import onnx

        return len(onnx.load(str(path), load_external_data=False).graph.node)
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.ParseFromString(path.read_bytes())
    return len(meta.graph_def.node)


# -- workers (one process per measurement) ------------------------------------


def worker(variant: str, source: str, output: str, profile: str | None) -> dict:
    """Import the format's runtime (timed apart), then time one command."""
    is_onnx = source.endswith(".onnx")
    start = time.perf_counter()
    if is_onnx:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    else:
        import tensorflow  # noqa: F401
    import_s = time.perf_counter() - start
    command = _command(variant, source, output, is_onnx)
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.runcall(command)
        seconds = time.perf_counter() - start
        profiler.dump_stats(profile)
    else:
        start = time.perf_counter()
        command()
        seconds = time.perf_counter() - start
    return {"import_s": import_s, "seconds": seconds, "peak_rss": _peak_rss()}


def _peak_rss() -> int:
    """This process's resident high-water mark (``VmHWM``; ``ru_maxrss`` would
    carry the parent's over fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _command(variant: str, source: str, output: str, is_onnx: bool):
    if variant == "grappler":
        return lambda: _grappler(source)
    from graphpass.cli import main

    mark = ONNX_MARK if is_onnx else TF_MARK
    argv = {
        "inspect": ["inspect", source],
        "remat": ["rewrite", source, "-o", output, "--recompute", mark, "--quiet"],
        "estimates": ["rewrite", source, "-o", output, "--recompute", mark, "--quiet",
                      "--report", output + ".json"],
        "auto": ["rewrite", source, "-o", output, "--recompute", "auto", "--quiet"],
        "roundtrip": ["rewrite", source, "-o", output, "--quiet"],
    }[variant]

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            status = main(argv)
        if status != 0:
            raise SystemExit(f"graphpass {' '.join(argv)}: exit {status}")

    return run


def _grappler(source: str) -> None:
    """Grappler's memory optimizer alone, MANUAL mode (``_recompute_hint`` marks)."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef()
    meta.ParseFromString(Path(source).read_bytes())
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append("memory")
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.MANUAL
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    optimized = tf_optimizer.OptimizeGraph(config, meta)
    recomputed = sum(1 for n in optimized.node if "Recomputed/" in n.name)
    if not recomputed:
        raise SystemExit("Grappler recomputed nothing: the anchor would be meaningless")


def run_worker(variant: str, source: Path, work: Path, timeout: float,
               profile: str | None = None) -> dict:
    output = work / f"out_{variant}_{source.name}"
    argv = [sys.executable, "-m", "tools.bench.scale", "--worker", variant,
            str(source.resolve()), str(output.resolve())]
    if profile:
        argv += ["--profile", str(Path(profile).resolve())]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the table ----------------------------------------------------------------


def measure(graphs: list[tuple[str, Path, int]], variants: list[str], work: Path,
            timeout: float, rounds: int = 1) -> list[dict]:
    """One row per graph and variant. With ``rounds`` > 1 the variants of a graph run
    in turn, round after round (every other round in reverse order, so none always
    runs first), and a row holds the median of its runs; ``x_grappler`` is the
    median of its per-round ratios to the Grappler run of the same round."""
    rows = []
    for fmt, path, nodes in graphs:
        wanted = [v for v in variants if v != "grappler" or fmt == "tf"]
        runs: dict[str, list[dict]] = {v: [] for v in wanted}
        for round_ in range(rounds):
            for variant in wanted if round_ % 2 == 0 else wanted[::-1]:
                source = hinted_graph(path) if variant == "grappler" else path
                runs[variant].append(run_worker(variant, source, work, timeout))
                print(_line({"format": fmt, "nodes": nodes, "variant": variant,
                             **runs[variant][-1]}), file=sys.stderr, flush=True)
        rows += [{"format": fmt, "nodes": nodes, "variant": v, **_summary(runs[v], runs)}
                 for v in wanted]
    _add_ratios(rows)
    return rows


def _summary(runs: list[dict], all_runs: dict[str, list[dict]]) -> dict:
    """The median run of a variant (a failed or timed-out run stands for the row),
    its spread, and its median ratio to Grappler's run of the same round."""
    failed = [r for r in runs if "seconds" not in r]
    if failed:
        return failed[0]
    seconds = sorted(r["seconds"] for r in runs)
    row = {"seconds": statistics.median(seconds), "spread": (seconds[0], seconds[-1]),
           "peak_rss": max(r["peak_rss"] for r in runs),
           "import_s": statistics.median(r["import_s"] for r in runs)}
    anchor = all_runs.get("grappler", [])
    if len(anchor) == len(runs) and all("seconds" in a for a in anchor):
        row["x_grappler"] = statistics.median(
            r["seconds"] / a["seconds"] for r, a in zip(runs, anchor))
    return row


def _add_ratios(rows: list[dict]) -> None:
    """Time per node relative to the smallest graph of the format, per variant."""
    smallest: dict[tuple[str, str], dict] = {}
    for row in sorted(rows, key=lambda r: r["nodes"]):
        if "seconds" in row:
            base = smallest.setdefault((row["format"], row["variant"]), row)
            row["ratio"] = (row["seconds"] / row["nodes"]) / (base["seconds"] / base["nodes"])


def _line(row: dict) -> str:
    what = f"{row['format']:4s} {row['nodes']:>8,d} {row['variant']:10s}"
    if "timeout" in row:
        return f"{what} timed out after {row['timeout']:.0f} s"
    if "error" in row:
        return f"{what} failed: {row['error']}"
    low, high = row.get("spread", (row["seconds"], row["seconds"]))
    return (f"{what} {row['seconds']:8.2f} {low:6.2f}-{high:<6.2f} "
            f"{row['seconds'] / row['nodes'] * 1e3:8.3f} "
            f"{row.get('ratio', 1.0):6.2f} {row['peak_rss'] / 2**20:9.0f} {row['import_s']:8.1f}")


def print_table(rows: list[dict]) -> None:
    print(f"{'fmt':4s} {'nodes':>8s} {'variant':10s} {'seconds':>8s} {'min-max':^13s} "
          f"{'s/1k':>8s} {'ratio':>6s} {'RSS MiB':>9s} {'import s':>8s}")
    for row in rows:
        print(_line(row))
    for row in rows:
        if row["variant"] != "grappler" and "x_grappler" in row:
            print(f"tf {row['nodes']:,d} {row['variant']}: {row['x_grappler']:.2f}x "
                  "Grappler's time (median of the rounds' ratios)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="70,210,485",
                        help="comma-separated FFN stack depths (TF graphs; '' for none)")
    parser.add_argument("--onnx-blocks", default="3125",
                        help="comma-separated ONNX MLP depths ('' for none)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir(), "graphpass_bench_scale")),
                        help="where the generated graphs are kept between runs")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per variant")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant of a graph this many times, in turn; "
                        "report medians")
    parser.add_argument("--profile", help="with one graph and one variant: cProfile stats here")
    parser.add_argument("--worker", nargs=3, metavar=("VARIANT", "SOURCE", "OUTPUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.profile)))
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    graphs = [("tf", tf_graph(work, int(n))) for n in filter(None, args.layers.split(","))]
    graphs += [("onnx", onnx_graph(work, int(n)))
               for n in filter(None, args.onnx_blocks.split(","))]
    graphs = [(fmt, path, node_count(path)) for fmt, path in graphs]
    variants = args.variants.split(",")
    if args.profile:
        (fmt, path, _), = graphs
        variant, = variants
        source = hinted_graph(path) if variant == "grappler" else path
        print(json.dumps(run_worker(variant, source, work, args.timeout, args.profile)))
        return 0
    print_table(measure(graphs, variants, work, args.timeout, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
