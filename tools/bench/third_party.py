"""Estimate against measurement on third-party models, built from config, as a new
user brings them: what graphpass printed against what the step really held.

Models (``--size test``: small and quick; ``--size bench``: the sizes of issue 25):

* ``inception_v3``: tf_keras ``InceptionV3(weights=None)``, TF1 MetaGraph, Adam
  (``tools.fixtures.third_party``);
* ``lstm``: tf_keras ``Embedding + LSTM`` (a control flow v2 ``While``), Adam
  (``tools.fixtures.loop_models``; bench: seq 64, batch 32, 256 units);
* ``resnet50``, ``mobilenet_v2``: Keras 3 applications, SGD momentum, TF2 ``train``
  signature (``third_party``);
* ``encoder``: a Keras 3 ``MultiHeadAttention`` encoder, the same kind of step.

Variants, each rewritten by the CLI and measured in a process of its own:
``original``; ``auto`` (``--recompute auto``); ``cheap`` (``--recompute-policy
cheap``); ``budget`` (``--memory-budget 0.6x --profile``: 0.6x of the measured
original, judged on the profile). Every process runs with oneDNN on
(``TF_ENABLE_ONEDNN_OPTS=1``, issue 25's setting; ``--onednn 0``: off, where TF's
own convolution-gradient kernels allocate im2col buffers) and one inter-op
thread; it warms the step up, then
reads the CPU allocator's peak over one step (``peak`` minus ``current`` before;
the figure of issue 25) and, over one traced step, the peak of the kernels'
allocation records. The allocator's peak varies from process to process, so each
variant is measured ``--repeats`` times and the table shows the median and the
spread; ratios are of medians measured in this run.

Columns: graphpass's estimate and the ratio it printed (after over before); the
allocator's peak (median ±spread) and the records' peak (plus the fed arrays of
a MetaGraph's placeholders; median ±spread); graphpass's estimate of the graph TF
runs replayed in the order TF started the nodes of the records' traced step
(``memory_profile``'s replay; median), and its ratio to the records' peak of the
same process (median): the buffers' model on each process's own schedule, where
the estimate models one schedule for every process; the allocator's high-water
mark in the records' own traced step (at node ends, above its bytes in use when
the step began, median;
``tools.fixtures.allocator_slack``: it counts whole chunks where the records
count what kernels asked for); *measured*: the larger of the two (oneDNN's
allocator leaves buffers under 256 KiB out of its statistics, so at small sizes
the records are the larger: the figure ``--profile`` judges by) as a ratio to
the original's; the estimate over the measured figure; the estimate of the graph
Grappler returns (``runtime_estimate``: the figure the rewrite prints beside the
planner's) and its ratio to the measured figure; for the budget its
verdict (met/refused, the figure it was judged on) and measured over budget. A
variant the rewrite wrote unchanged is marked so: its measured ratio is the
spread of the original's own processes.

    python -m tools.bench.third_party [--size test|bench] [--models lstm,encoder]
                                      [--variants auto,cheap,budget] [--repeats 3]
                                      [--onednn 1|0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("inception_v3", "lstm", "resnet50", "mobilenet_v2", "encoder")
VARIANTS = {
    "auto": ["--recompute", "auto"],
    "cheap": ["--recompute", "auto", "--recompute-policy", "cheap"],
    "budget": ["--recompute", "auto", "--memory-budget", "0.6x", "--profile"],
}
#: ``loop_models.lstm`` arguments per size (issue 25: seq 64, batch 32, LSTM(256)).
LSTM_SIZES = {"test": {"seq": 16, "batch": 8, "units": 64},
              "bench": {"seq": 64, "batch": 32, "units": 256}}
ENV = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="3")


def build(name: str, work: Path, size: str) -> tuple[Path, list[str]]:
    """The model's graph file (MetaGraphDef or SavedModel) and its fetches."""
    if name == "lstm":
        from tools.fixtures import loop_models

        model = loop_models.lstm(**LSTM_SIZES[size])
        path = work / f"lstm_{size}.meta"
        path.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
        return path, [model.loss, model.train_op]
    from tools.fixtures import third_party

    return third_party.build(name, work, size)


def rewrite(source: Path, target: Path, args: list[str]) -> dict:
    """The CLI's rewrite in its own process: its report's remat entry (with
    ``unchanged`` where the pass wrote the graph as it read it), or
    ``{"refused": <the exit-2 line>}``."""
    report = target.with_name(target.name + ".json")
    out = subprocess.run([sys.executable, "-m", "graphpass.cli", "rewrite", str(source), "-o",
                          str(target), "--quiet", "--report", str(report), *args],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=3600)
    if out.returncode == 2:
        return {"refused": out.stderr.strip().splitlines()[-1]}
    if out.returncode != 0:  # a crash is a row too: the table says what failed
        return {"failed": out.stderr.strip().splitlines()[-1]}
    remat = json.loads(report.read_text())["passes"][0]
    return {**remat["report"], "unchanged": not remat["changed"]}


def measured(path: Path, fetches: list[str], repeats: int, model: str, size: str) -> dict:
    """The allocator's and the records' peaks over ``repeats`` processes."""
    runs = []
    spec = {"path": str(path), "fetches": fetches, "model": model, "size": size}
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-m", "tools.bench.third_party", "--worker",
                              json.dumps(spec)],
                             cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise RuntimeError(f"measuring {path} failed:\n{out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    allocator = [r["allocator"] for r in runs]
    records = statistics.median(r["records"] for r in runs)
    session = [r["session_allocator"] for r in runs if r["session_allocator"] is not None]
    return {"allocator": statistics.median(allocator), "spread": max(allocator) - min(allocator),
            "records": records, "measured": max(statistics.median(allocator), records),
            "session_allocator": statistics.median(session) if session else None,
            "records_spread": max(r["records"] for r in runs) - min(r["records"] for r in runs),
            "replayed": statistics.median(r["replayed"] for r in runs),
            "replayed_fit": statistics.median(r["replayed"] / r["records"] for r in runs),
            "loss": runs[0]["loss"]}


def worker(spec: dict) -> dict:
    """In the measuring process: warm-up, the allocator's peak over one step, the
    records' peak over one traced step. A SavedModel's ``train`` signature is called
    eagerly for the allocator's figure (as a user calls it) and in a TF1 session for
    the records."""
    import tensorflow as tf

    from tools.fixtures import measure

    path = Path(spec["path"])
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if path.is_dir():
        return _signature_worker(tf, path, spec["model"], spec["size"])
    tf.compat.v1.disable_eager_execution()
    with tempfile.TemporaryDirectory() as work:
        trace = Path(work) / "trace.pb"
        result = measure.run_worker({"graph": str(path), "fetches": spec["fetches"],
                                     "init": "init", "batch_size": None, "steps": 1,
                                     "grappler": True, "trace_path": str(trace)})
        metadata = tf.compat.v1.RunMetadata.FromString(trace.read_bytes())
    graph = measure._load_graph(tf, path)
    fed = sum(v.nbytes for v in measure._feeds(graph, spec["fetches"], None).values())
    session = _session_allocator(metadata.step_stats)
    return {"allocator": result.allocator_peak_bytes or 0, "records": result.peak_bytes + fed,
            "session_allocator": None if session is None else session + fed,
            "replayed": _replayed(path, metadata.step_stats), "loss": result.losses[0]}


def _replayed(path: Path, step_stats) -> int:
    """graphpass's estimate of the graph TF runs, in the order TF started the nodes of
    the traced step (``memory_profile``'s replay): the buffers' model on this
    process's schedule, to set beside the records."""
    from graphpass.analysis.runtime_memory import runtime_memory_profile
    from graphpass.inspect.step_stats import executed_order
    from tools.fixtures.trace_order import load_step

    graph, fetches, view, runtime = load_step(path)
    return runtime_memory_profile(graph, fetches, view=view, replay=executed_order(step_stats),
                                  runtime=runtime).peak_bytes


def _session_allocator(step_stats) -> int | None:
    """The allocator's high-water mark over the traced step (at node ends), in
    bytes; None where it keeps no statistics (``tools.fixtures.allocator_slack``)."""
    from tools.fixtures.allocator_slack import slack

    return slack(step_stats).get("allocator_high_water")


def _signature_worker(tf, path: Path, name: str, size: str) -> dict:
    from tools.fixtures import third_party
    from tools.fixtures.measure import peak_from_step_stats

    values = third_party.inputs(name, size)
    allocator, loss = third_party.call_peak(tf, path, name, size)
    tf1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        traced = tf.saved_model.load(str(path)).signatures["train"]
        fetch = traced(**{k: tf.constant(v) for k, v in values.items()})["loss"]
        config = tf1.ConfigProto(inter_op_parallelism_threads=1)
        with tf1.Session(graph=graph, config=config) as session:
            session.run(tf1.global_variables_initializer())
            session.run(fetch)
            metadata = tf1.RunMetadata()
            session.run(fetch, run_metadata=metadata,
                        options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
    return {"allocator": allocator, "records": peak_from_step_stats(metadata.step_stats)[0],
            "session_allocator": _session_allocator(metadata.step_stats),
            "replayed": _replayed(path, metadata.step_stats), "loss": loss}


def bench(name: str, size: str, variants: list[str], repeats: int, work: Path) -> list[dict]:
    """Build, rewrite and measure every variant of one model: one row each."""
    source, fetches = build(name, work, size)
    base = measured(source, fetches, repeats, name, size)
    rows = [{"model": name, "variant": "original", **base}]
    for variant in variants:
        target = work / f"{name}_{size}_{variant}{source.suffix}"
        report = rewrite(source, target, VARIANTS[variant])
        row = {"model": name, "variant": variant, "report": report}
        if "refused" not in report and "failed" not in report:
            row.update(measured(target, fetches, repeats, name, size))
        rows.append(row)
    reports = [r["report"] for r in rows[1:]]
    runtime = next((r["runtime_estimate"] for r in reports if r.get("runtime_estimate")), {})
    rows[0]["report"] = {
        "estimated_peak_bytes_after": next(
            filter(None, (r.get("estimated_peak_bytes_before") for r in reports)), None),
        "runtime_estimate": {"peak_bytes_after": runtime.get("peak_bytes_before")}}
    return rows


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def line(row: dict, base: dict) -> str:
    """One printed row (module docstring's columns)."""
    report = row["report"]
    for outcome in ("refused", "failed"):
        if outcome in report:
            return f"| {row['model']} | {row['variant']} | {outcome}: {report[outcome]} |"
    estimate = report.get("estimated_peak_bytes_after")
    before = report.get("estimated_peak_bytes_before") or estimate
    printed = f"{estimate / before:.2f}x" if estimate and before else "-"
    fit = f"{estimate / row['measured']:.2f}" if estimate else "-"
    grappler = (report.get("runtime_estimate") or {}).get("peak_bytes_after")
    grappler_fit = f"{grappler / row['measured']:.2f}" if grappler else "-"
    verdict = "-"
    auto = report.get("auto") or {}
    if auto.get("budget_bytes"):
        verdict = (f"{'met' if auto['budget_met'] else 'NOT met'} ({auto['budget_judged_on']}), "
                   f"measured {row['measured'] / auto['budget_bytes']:.2f}x of it")
    # The same graph measured again: its ratio is the runtime's spread, not a plan's.
    variant = f"{row['variant']} (unchanged)" if report.get("unchanged") else row["variant"]
    return (f"| {row['model']} | {variant} | {_mib(estimate)} | {printed} | "
            f"{_mib(row['allocator'])} ±{_mib(row['spread'])} | {_mib(row['records'])} "
            f"±{_mib(row['records_spread'])} | {_mib(row['replayed'])} | "
            f"{row['replayed_fit']:.2f} | "
            f"{_mib(row['session_allocator'])} | {row['measured'] / base['measured']:.2f}x | "
            f"{fit} | {_mib(grappler)} | {grappler_fit} | {verdict} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("test", "bench"), default="test")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--onednn", type=int, choices=(0, 1), default=1)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    # every process this run starts (rewrites estimate, workers measure) inherits it
    ENV["TF_ENABLE_ONEDNN_OPTS"] = str(args.onednn)
    print(f"third-party models, size {args.size}, oneDNN {('off', 'on')[args.onednn]}, "
          f"CPU, {args.repeats} processes "
          "per variant (allocator peak: median ±spread)")
    print("| model | variant | estimate MiB | printed | allocator MiB | records MiB | "
          "estimate in TF's order MiB | its/records | "
          "allocator beside the records MiB | measured | estimate/measured | "
          "Grappler's graph MiB | its estimate/measured | budget |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="graphpass-third-party-") as work:
        for name in args.models.split(","):
            rows = bench(name, args.size, args.variants.split(","), args.repeats, Path(work))
            for row in rows:
                print(line(row, rows[0]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
