"""Peak memory and step time of one ONNX training step under onnxruntime,
rematerialized by graphpass or not.

Models (``--model``), each a training step of ``tools.fixtures.onnx_models`` with the
parameters and the optimizer state as graph inputs, fed every step:

* ``mlp`` (default): the 8-block MLP of ``block_mlp`` (x [2048, 1024] float32,
  block i ``h = tanh(relu(h @ W_i)) * 2``, loss ``mean(h*h)``);
* ``transformer``: the pre-LN transformer block stack of ``transformer``
  (x [8, 256, 256]: LayerNormalization, single-head Softmax attention, a Gelu
  MLP of width 1024; loss ``mean(h*h)``; backward from ``tools.fixtures.onnx_autodiff``).

``--optimizer`` picks the update (``sgd``, ``momentum``, ``nesterov``, ``adam``,
``adamw``, ``adagrad``, ``rmsprop``, a comma list, or ``all`` of them; one table
each). Variants (``--variants`` picks among the last three), each run in its own
process:

* original         -- the generated training step, untouched
* original, leaves -- the same nodes with the leaves (loss, updates) in the order
                      graphpass's writer gives a rewritten graph (see
                      ``graphpass.formats.onnx_order``): how much of the saving is
                      onnxruntime's schedule alone
* graphpass data   -- ``graphpass rewrite --recompute 'block[1-7]/'`` (data mode,
                      the only one ONNX has; blocks 1..n-1 marked)
* graphpass auto   -- ``graphpass rewrite --recompute auto`` (the planner chooses)

onnxruntime runs on CPU with all graph optimizations (``ORT_ENABLE_ALL``), the
CPU memory arena off (``enable_cpu_mem_arena=False``: every tensor is its own
allocation, freed when ORT's plan says it is dead) and one intra-op thread.
"peak" runs with ORT's memory pattern off, "pattern" with it on (ORT's default:
after the first run it allocates one block per run laid out by its pattern
planner, a first-fit packing of the first run's allocations, so that figure is
the packing's size rather than the live bytes); ``--no-pattern`` skips it.

Peak = the rise of the process's resident set over one step after a warm-up step
(how it is read: ``tools/fixtures/ort_measure.py``).

The "plan MiB" column is a second, independent figure: the liveness peak of
the step's tensors (static sizes from ONNX shape inference) over the order in
which onnxruntime executed the optimized graph's nodes (from its profiler;
the optimized graph is the one ORT writes to ``optimized_model_filepath``).
"est MiB" is graphpass's own estimate of each step's peak
(``analysis.memory``, the remat report's ``estimated_peak_bytes_before/after``),
printed beside the measurements to show how well it predicts them.
Ratios are against the original, measured in the same run.

    python -m tools.bench.onnx_remat [--model mlp|transformer] [--optimizer KIND,...|all]
                                    [--variants leaves,data,auto] [--no-pattern]
                                    [--batch N --width N --blocks N --seq N] [--steps 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tools.fixtures.ort_measure import run_worker

#: --model -> default sizes (batch, width, blocks, seq).
MODELS = {"mlp": dict(batch=2048, width=1024, blocks=8, seq=None),
          "transformer": dict(batch=8, width=256, blocks=8, seq=256)}


def build_model(args, optimizer: str):
    from tools.fixtures import onnx_models
    from tools.fixtures.onnx_optimizers import Optimizer

    opt = Optimizer(optimizer, lr=0.01)
    if args.model == "transformer":
        return onnx_models.transformer(batch=args.batch, seq=args.seq, width=args.width,
                                       blocks=args.blocks, optimizer=opt,
                                       params_as_inputs=True, check=False)
    return onnx_models.block_mlp(batch=args.batch, width=args.width, blocks=args.blocks,
                                 optimizer=opt, params_as_inputs=True, check=False)


def build_variants(args, work: Path, optimizer: str) -> dict[str, dict]:
    """Write one ONNX model per variant and the feeds; return variant -> run spec."""
    import onnx

    import graphpass

    built = build_model(args, optimizer)
    feeds = work / "feeds.npz"
    np.savez(feeds, **{k.replace("/", "|"): v for k, v in built.feeds.items()})
    original = work / "original.onnx"
    onnx.save(built.model, original)
    spec = {"feeds": str(feeds), "fetches": [built.loss, *built.carried.values()],
            "threads": args.threads}
    variants = {"original": dict(spec, model=str(original), nodes_added=0, estimate=None)}
    if "leaves" in args.variants:
        leaves = work / "original_leaves.onnx"
        onnx.save(_leaves_reordered(built.model), leaves)
        variants["original, leaves"] = dict(spec, model=str(leaves), nodes_added=0,
                                            estimate=None)
    for name, marks in (("graphpass data", [mark(args)]), ("graphpass auto", ["auto"])):
        if name.split()[-1] not in args.variants:
            continue
        graph = graphpass.load(original)
        report = graphpass.run_passes(graph, {"recompute": marks})[0].report
        path = work / f"{name.replace(' ', '_')}.onnx"
        graphpass.save(graph, path)
        variants[name] = dict(spec, model=str(path), nodes_added=report["nodes_added"],
                              estimate=report["estimated_peak_bytes_after"])
        variants["original"]["estimate"] = report["estimated_peak_bytes_before"]
    return variants


def mark(args) -> str:
    """Blocks 1..n-1: the last block's activations are read right away anyway."""
    return f"block[1-{args.blocks - 1}]/"


def _leaves_reordered(model):
    """``model`` with its nodes in the order graphpass's writer emits a rewritten graph."""
    import onnx

    from graphpass.formats.onnx_io import graph_from_model
    from graphpass.formats.onnx_order import emission_order, ort_leaf_order

    graph = graph_from_model(model)
    protos = {(n.name, tuple(n.output)): n for n in model.graph.node}
    order = ort_leaf_order(graph, emission_order(graph))
    reordered = onnx.ModelProto()
    reordered.CopyFrom(model)
    del reordered.graph.node[:]
    reordered.graph.node.extend(
        protos[(name, tuple(graph.node(name).outputs))] for name in order
        if (name, tuple(graph.node(name).outputs)) in protos)
    onnx.checker.check_model(reordered)
    return reordered


def main() -> None:
    from tools.fixtures.onnx_optimizers import OPTIMIZERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--optimizer", default="sgd",
                        help=f"one of {', '.join(OPTIMIZERS)}, a comma list, or all")
    parser.add_argument("--variants", default="leaves,data,auto",
                        help="besides the original, a comma list of: leaves, data, auto")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--blocks", type=int)
    parser.add_argument("--seq", type=int, help="sequence length (transformer)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--no-pattern", action="store_true",
                        help="skip the runs with ORT's memory pattern on")
    args = parser.parse_args()
    for key, default in MODELS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    optimizers = OPTIMIZERS if args.optimizer == "all" else args.optimizer.split(",")
    unknown = set(optimizers) - set(OPTIMIZERS)
    if unknown:
        parser.error(f"unknown optimizer(s) {', '.join(sorted(unknown))}")
    args.variants = args.variants.split(",")
    for optimizer in optimizers:
        with tempfile.TemporaryDirectory() as tmp:
            variants = build_variants(args, Path(tmp), optimizer)
            results = {}
            for name, spec in variants.items():
                results[name] = run_worker(name, dict(spec, mem_pattern=False), args.steps)
                if not args.no_pattern:
                    with_pattern = run_worker(name, dict(spec, mem_pattern=True), args.steps)
                    results[name]["pattern_peak"] = with_pattern["peak"]
        print_table(args, optimizer, variants, results)


def print_table(args, optimizer: str, variants: dict, results: dict) -> None:
    base = results["original"]
    shape = f"x [{args.batch}, {args.width}]" if args.model == "mlp" else \
        f"x [{args.batch}, {args.seq}, {args.width}]"
    print(f"{args.blocks}-block {args.model} step, {shape} float32, {optimizer}; marks "
          f"{mark(args)!r}; onnxruntime CPU, ORT_ENABLE_ALL, arena off, {args.threads} thread(s)")
    pattern = "pattern_peak" in base
    print(f"{'variant':16s} {'peak MiB':>9s} {'peak':>7s} "
          + (f"{'pattern MiB':>11s} {'pattern':>7s} " if pattern else "")
          + f"{'plan MiB':>9s} {'plan':>7s} {'est MiB':>8s} {'est':>6s} {'step ms':>8s} "
          f"{'time':>6s} {'nodes+':>6s} {'loss':>12s}")
    for name, r in results.items():
        print(f"{name:16s} {r['peak'] / 2**20:9.1f} {r['peak'] / base['peak']:6.2f}x "
              + (f"{r['pattern_peak'] / 2**20:11.1f} "
                 f"{r['pattern_peak'] / base['pattern_peak']:6.2f}x " if pattern else "")
              + f"{r['plan_peak'] / 2**20:9.1f} {r['plan_peak'] / base['plan_peak']:6.2f}x "
              + _estimate_columns(variants[name]["estimate"], variants["original"]["estimate"])
              + f"{r['step_s'] * 1e3:8.1f} {r['step_s'] / base['step_s']:5.2f}x "
              f"{variants[name]['nodes_added']:6d} {r['loss']:12.6g}")
    print()


def _estimate_columns(estimate: int | None, original: int | None) -> str:
    """graphpass's estimated peak (``estimated_peak_bytes_*`` of the remat report)
    and its ratio, beside the measured ones; blank for the reordered original."""
    if estimate is None or original is None:
        return f"{'':>8s} {'':>6s} "
    return f"{estimate / 2**20:8.1f} {estimate / original:5.2f}x "


if __name__ == "__main__":
    main()
