"""The automatic remat planner against the hand-written marks and Grappler, measured.

Per model (``tools.fixtures.memory_models.MODELS``: the 8-block MLP, tf_keras
MobileNetV2 96x96 and ResNet50 64x64 at batch 32, a transformer encoder stack, a pre-norm FFN
stack) and variant, each graph measured in its own process
(``tools/fixtures/measure.py``: one inter-op thread, Grappler's defaults, after a
warm-up step):

* original         -- the exported training graph
* regex            -- ``--recompute REGEX``, the hand-written block marks
* grappler manual  -- the original with ``_recompute_hint`` on the same forward
                      nodes and Grappler's memory optimizer in MANUAL mode
* auto             -- ``--recompute auto`` (policy min-peak)
* auto B           -- ``--recompute auto --memory-budget-bytes B`` for B = 0.8x,
                      0.6x, 0.5x of the original's *measured* peak
* auto = regex     -- the same with B = the regex variant's measured peak (can
                      the planner match the hand-written marks?)
* cheap            -- ``--recompute auto --recompute-policy cheap``

Columns: estimated peak (graphpass's simulation), the step's allocation records' peak
plus the fed values (what the estimate simulates: the kernels' own allocations),
measured peak (the CPU allocator's where oneDNN keeps statistics, else the records plus
the fed values) and its ratio to the original's, the step time the rewrite predicts
(``est t``: the report's ``estimated_extra_step_time``) beside the measured step time
ratios (wall clock and CPU time, from steps alternated with the original's in one
process: ``measure.paired_step_time``), planning seconds, the solver's gap, and for
budgets what the planner planned to (the budget less the runtime model's allocator
headroom), whether it said the budget is met and whether the measured peak is within it
(+5%). A budget no plan reaches is reported as the planner's exit-2 message.

    python -m tools.bench.planner [--models mlp,mobilenet_v2,resnet50,transformer] [--small]
                                  [--variants auto,cheap,...] [--rounds N]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from tools.fixtures.memory_models import FETCHES, MODELS, build

BUDGETS = (0.8, 0.6, 0.5)
#: Measured peak may exceed a budget the planner said it met by this much.
TOLERANCE = 1.05


def rewrite(original: Path, out: Path, settings: dict) -> dict:
    """Rewrite ``original`` with ``settings`` into ``out``; the remat report, with the
    planning seconds, or ``{"error": message}`` when the planner refuses."""
    import graphpass
    from graphpass.errors import GraphpassError

    graph = graphpass.load(original)
    start = time.perf_counter()
    try:
        report = graphpass.run_passes(graph, settings)[0].report
    except GraphpassError as exc:
        return {"error": str(exc)}
    report["seconds"] = time.perf_counter() - start
    graphpass.save(graph, out)
    return report


def hinted(original: Path, out: Path, regex: str) -> None:
    """The original with ``_recompute_hint`` on the forward nodes the regex marks."""
    import graphpass

    graph = graphpass.load(original)
    forward = set(graphpass.analyze(graph).nodes("forward"))
    for name in list(graph):
        if re.match(regex, name) and name in forward:
            graph.dialect.set_attr(graph, name, "_recompute_hint", 0)
    graphpass.save(graph, out)


def peak(measurement) -> int:
    """The allocator's peak where oneDNN keeps statistics, else the records' peak
    plus the fed values."""
    return measurement.allocator_peak_bytes or records(measurement)


def records(measurement) -> int:
    """The allocation records' peak plus the fed values (the records leave them out)."""
    return measurement.peak_bytes + MODEL_BYTES["fed"]


#: Of the model being measured (set per model): the bytes of its fed values, and
#: the floor (:func:`floor_bytes`).
MODEL_BYTES = {"fed": 0, "floor": 0}


VARIANTS = ("regex", "auto", "budgets", "auto=regex", "cheap", "manual")


def bench_model(name: str, small: bool, work: Path, rounds: int,
                wanted: frozenset[str] = frozenset(VARIANTS)) -> None:
    """The original and the ``wanted`` variants of one model, each measured in its own
    process (a subset reruns only what a change touched; ratios stay to this run's
    original) and timed against the original over ``rounds`` paired rounds."""
    from tools.fixtures.measure import measure, paired_step_time

    def measured(path: Path, **options):
        times = paired_step_time(original, path, FETCHES, rounds=rounds,
                                 grappler=options.get("grappler", True))
        return measure(path, FETCHES, steps=1, **options), times

    model = build(name, small)
    regex = MODELS[name][2]
    original = work / f"{name}.meta"
    original.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    MODEL_BYTES["fed"] = fed_bytes(original)
    MODEL_BYTES["floor"] = floor_bytes(original)
    print(f"{name:13s} floor {MODEL_BYTES['floor'] / 2**20:.1f} MiB", flush=True)
    base = measure(original, FETCHES, steps=1)
    print_row(name, "original", {}, (base, None), base)
    variants = []
    if wanted & {"regex", "auto=regex"}:
        out = work / f"{name}_regex.meta"
        report = rewrite(original, out, {"recompute": [regex], "dependency": "control"})
        hand, times = measured(out)
        print_row(name, "regex", report, (hand, times), base)
    if "auto" in wanted:
        variants.append(("auto", {"recompute": ["auto"]}))
    if "budgets" in wanted:
        variants += [(f"auto {b}x", {"recompute": ["auto"],
                                     "memory_budget_bytes": int(b * peak(base))})
                     for b in BUDGETS]
    if "auto=regex" in wanted:
        variants.append(("auto = regex", {"recompute": ["auto"],
                                          "memory_budget_bytes": peak(hand)}))
    if "cheap" in wanted:
        variants.append(("cheap", {"recompute": ["auto"], "recompute_policy": "cheap"}))
    for label, settings in variants:
        out = work / f"{name}_{label.replace(' ', '_').replace('=', 'eq')}.meta"
        report = rewrite(original, out, settings)
        if "error" in report:
            print(f"{name:13s} {label:16s} planner: {report['error']}", flush=True)
            continue
        print_row(name, label, report, measured(out), base,
                  settings.get("memory_budget_bytes"))
    if "manual" not in wanted:
        return
    manual = work / f"{name}_manual.meta"
    hinted(original, manual, regex)
    print_row(name, "grappler manual", {}, measured(manual, grappler="manual"), base)


def fed_bytes(path: Path) -> int:
    """Bytes of the values the step is fed (the estimate's ``fed_bytes``)."""
    import graphpass
    from graphpass.analysis.memory import memory_profile

    return memory_profile(graphpass.load(path), FETCHES).fed_bytes


def floor_bytes(path: Path) -> int:
    """The least any plan could peak at, from the graph's tensor sizes alone: the fed
    values, and the working set (inputs and outputs) of the step's largest op,
    every other value recomputed from the nearest kept input when it is read and
    every weight gradient applied as it appears. Recomputing cannot go below it,
    so a plan's share of the achievable saving is (original - plan) /
    (original - floor). Variables, their reads and constants are not the step's
    allocations; fed values are counted once."""
    import graphpass
    from graphpass.analysis.buffers import tensor_bytes
    from graphpass.analysis.manager import AnalysisManager
    from graphpass.analysis.regions import OTHER
    from graphpass.ir.graph import Tensor

    graph = graphpass.load(path)
    regions = AnalysisManager().regions(graph)
    dialect = graph.dialect
    dialect.ensure_shapes(graph, None)

    def allocated(name: str) -> bool:
        return not (dialect.is_variable(graph, name) or dialect.is_variable_value(graph, name)
                    or dialect.is_constant(graph, name) or dialect.is_source(graph, name))

    largest = 0
    for name, label in regions.labels.items():
        if label == OTHER or not allocated(name):
            continue
        tensors = {t for t in graph.inputs(name) if allocated(t.node)} | \
            {Tensor(name, port) for port in graph.used_ports(name)}
        largest = max(largest, sum(tensor_bytes(graph, t) or 0 for t in tensors))
    return MODEL_BYTES["fed"] + largest


def captured(measured: int, base: int) -> str:
    """The share of the achievable saving (down to the floor) a plan measured."""
    floor = MODEL_BYTES["floor"]
    return f"{(base - measured) / (base - floor):6.2f}" if base > floor else f"{'':6s}"


def print_row(name, label, report, result, base, budget=None) -> None:
    """One table row; ``result`` is the variant's (Measurement, StepTimes or None)."""
    measured, times = result
    auto = report.get("auto", {})
    estimate = report.get("estimated_peak_bytes_after", 0)
    gap = auto.get("gap")
    cells = [f"{name:13s}", f"{label:16s}",
             f"{estimate / 2**20:8.1f}" if estimate else f"{'':8s}",
             f"{records(measured) / 2**20:8.1f}", f"{peak(measured) / 2**20:8.1f}",
             f"{peak(measured) / peak(base):6.2f}x", captured(peak(measured), peak(base)),
             _predicted_time(report),
             f"{times.wall_ratio:6.2f}x {times.cpu_ratio:6.2f}x" if times
             else f"{base.step_s * 1e3:5.0f}ms {'':7s}",
             f"{report['seconds']:6.1f}" if "seconds" in report else f"{'':6s}",
             f"{gap:6.1%}" if gap is not None else f"{'':6s}"]
    if budget is not None:
        within = peak(measured) <= budget * TOLERANCE
        planned = auto.get("planned_budget_bytes") or budget
        cells.append(f"budget {budget / 2**20:.1f} MiB (planned to {planned / 2**20:.1f}): "
                     f"planner says "
                     f"{'met' if auto.get('budget_met') else 'not met'}, measured "
                     f"{'within' if within else 'OVER'} (+5%)")
    print(" ".join(cells), flush=True)


def _predicted_time(report: dict) -> str:
    """The rewrite's predicted step time against the original's (``est t``)."""
    extra = report.get("estimated_extra_step_time")
    return f"{1 + extra:5.2f}x" if extra is not None else f"{'':6s}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,mobilenet_v2,resnet50,transformer")
    parser.add_argument("--small", action="store_true", help="test sizes (fast)")
    parser.add_argument("--rounds", type=int, default=8,
                        help="ABBA rounds timing each variant against the original")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    wanted = frozenset(args.variants.split(","))
    if not wanted <= set(VARIANTS):
        parser.error(f"unknown variants {sorted(wanted - set(VARIANTS))}; "
                     f"choose from {', '.join(VARIANTS)}")
    print(f"{'model':13s} {'variant':16s} {'est MiB':>8s} {'rec MiB':>8s} {'meas MiB':>8s} "
          f"{'peak':>7s} {'share':>6s} {'est t':>6s} "
          f"{'time':>7s} {'cpu':>7s} {'plan s':>6s} {'gap':>6s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            bench_model(name, args.small, Path(tmp), args.rounds, wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
