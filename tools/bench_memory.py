"""Estimated vs measured peak memory of one training step, before and after remat.

For each model: the original training graph and the graph rewritten with
``--recompute REGEX`` (control mode, hand-written block marks), each
estimated by ``graphpass.analysis.memory`` (the simulation of TF's executor
the planner plans with) and measured in its own process by
``tools/measure.py`` (peak of the step's allocation records; the CPU
allocator's own peak beside it where oneDNN keeps statistics). Like is compared
with like: the records leave out the fed arrays, so "est/meas" is the estimate
less its fed values over the records' peak; the allocator counts them, so
"est/alloc" is the whole estimate over the allocator's peak.

Models (benchmark sizes; ``--small`` runs the test sizes, which keep the step's
activations larger than the weights' gradients: TF's executor delays some
optimizer updates to the end of the step in an order the estimate cannot know,
so on a toy CNN, where gradients outweigh activations, the measured peak
depends on that order rather than on what remat changes):

* mlp          -- the 8-block MLP of bench_remat (x [2048, 1024], SGD), ``block[1-7]/``
* mobilenet_v2 -- tf_keras MobileNetV2, 96x96, batch 32, Momentum, per-block marks
* resnet50     -- tf_keras ResNet50, 64x64, batch 32, Momentum, per-block marks
* transformer  -- 4-layer post-norm encoder, 128 tokens, width 128, batch 32, Adam
* ffn          -- 4-layer pre-norm FFN stack, 128 tokens, width 256, batch 32, Adam

    python tools/bench_memory.py [--models mlp,resnet50] [--small] [--onednn 0|1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: model -> (builder kwargs at benchmark size, at test size, --recompute regex).
MODELS = {
    "mlp": ({"batch": 2048, "width": 1024}, {"batch": 256, "width": 256}, r"block[1-7]/"),
    "mobilenet_v2": ({"size": 96, "batch": 32}, {"size": 64, "batch": 8, "alpha": 0.35},
                     r"mobilenetv2_[\d.]+_\d+/block_\d+_"),
    "resnet50": ({"size": 64, "batch": 32}, {"size": 64, "batch": 8},
                 r"resnet50/conv\d_block\d+_"),
    "transformer": ({"size": 128, "batch": 32, "layers": 4, "width": 128},
                    {"size": 32, "batch": 8, "layers": 2, "width": 64},
                    r"encoder/(mha|mlp)\d+"),
    "ffn": ({"size": 128, "batch": 32, "layers": 4, "width": 256},
            {"size": 32, "batch": 8, "layers": 2, "width": 64}, r"encoder/(ln|mlp)\d+"),
}
FETCHES = ["loss:0", "train"]


def build(name: str, small: bool):
    """The model's training graph (a ``tools.tf_models.Model``)."""
    from tools import keras_models, tf_models

    kwargs = MODELS[name][1 if small else 0]
    if name == "mlp":
        return tf_models.block_mlp(blocks=8, optimizer="sgd", **kwargs)
    return keras_models.BUILDERS[name](**kwargs)


def write_variants(name: str, small: bool, work: Path) -> dict[str, Path]:
    """The original and its regex-rewritten graph, as files."""
    import graphpass

    model = build(name, small)
    original = work / f"{name}.meta"
    original.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    graph = graphpass.load(original)
    graphpass.run_passes(graph, {"recompute": [MODELS[name][2]], "dependency": "control"})
    rewritten = work / f"{name}_remat.meta"
    graphpass.save(graph, rewritten)
    return {"original": original, "remat": rewritten}


def estimate(path: Path):
    """The estimator's profile of one step (peak, fed bytes, the node it peaks at)."""
    import graphpass
    from graphpass.analysis.memory import memory_profile

    return memory_profile(graphpass.load(path), FETCHES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--small", action="store_true", help="test sizes (fast)")
    parser.add_argument("--onednn", choices=("0", "1"),
                        help="TF_ENABLE_ONEDNN_OPTS for the measuring processes")
    args = parser.parse_args(argv)
    from tools.measure import measure

    onednn = None if args.onednn is None else args.onednn == "1"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for variant, path in write_variants(name, args.small, Path(tmp)).items():
                profile = estimate(path)
                measured = measure(path, FETCHES, onednn=onednn, steps=1)
                rows.append((name, variant, profile, measured))
                print_row(*rows[-1], header=len(rows) == 1)
    worst = max(abs((r[2].peak_bytes - r[2].fed_bytes) / r[3].peak_bytes - 1)
                for r in rows if r[3].peak_bytes)
    print(f"largest |estimate/measured - 1|: {worst:.1%}")
    return 0


def print_row(name, variant, profile, measured, header=False) -> None:
    if header:
        print(f"{'model':13s} {'variant':8s} {'estimated':>10s} {'fed':>8s} {'measured':>10s} "
              f"{'est/meas':>8s} {'allocator':>10s} {'est/alloc':>9s}  estimated peak at")
    allocator, peak = measured.allocator_peak_bytes, measured.peak_bytes
    estimated = profile.peak_bytes
    shown = f"{allocator / 2**20:8.1f}Mi {estimated / allocator:8.2f}x" \
        if allocator is not None else f"{'n/a':>10s} {'':9s}"
    print(f"{name:13s} {variant:8s} {estimated / 2**20:8.1f}Mi "
          f"{profile.fed_bytes / 2**20:6.1f}Mi {peak / 2**20:8.1f}Mi "
          f"{(estimated - profile.fed_bytes) / peak:7.2f}x {shown}  {profile.peak_node}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
