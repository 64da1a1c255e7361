"""Peak memory of onnxruntime on-device training steps (``generate_artifacts``'s
``training_model.onnx``) before and after ``graphpass rewrite --recompute auto``.

Run in the training environment (``tools/make_ort_training_env.sh``):
``.venv-ort-training/bin/python -m tools.bench.ort_artifacts [--model NAME ...]``.
Each model's artifacts are generated (``tools/fixtures/ort_artifacts.py``) at
benchmark size in a temporary directory; each variant's step runs in a process of
its own under ``tools/fixtures/ort_measure.py`` (CPU arena off, memory pattern
off, all graph optimizations): the parameters from the checkpoint, zeroed
accumulation buffers and ``lazy_reset_grad`` are fed like the training API feeds
them (``mlp_gradients``: the MLP's step returning its gradients instead). The
tutorial's artifacts (``tools/fixtures/ort_tutorial.py``: torch models exported and
``generate_artifacts``'d as ORT's tutorial does) are stepped and estimated at a
larger batch than they were exported at (``TUTORIAL``).
Printed: measured peak RSS growth of one step, its ratio to the original,
graphpass's estimate (the planner's model of ORT's order) and the estimate in
the order onnxruntime gives (``runtime_estimate``), each with its ratio to the
measurement, and the median step time.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tools.fixtures.ort_measure import run_worker

#: name -> (artifact case, sizes).
MODELS = {
    "mlp": ("mlp_ce", dict(batch=2048, width=512, blocks=8, classes=16)),
    "transformer": ("transformer_ce", dict(batch=8, seq=256, width=256, layers=3)),
    "conv_bn": ("conv_bn_ce", dict(batch=32, size=32, channels=32, layers=6)),
    "mlp_gelu": ("mlp_gelu_bce", dict(batch=2048, width=512, blocks=8, classes=16)),
    "torch_mlp": ("torch_mlp_ce", dict(batch=2048, width=512, blocks=8, classes=16)),
    # The MLP's step returning its gradients (``ort_artifacts.gradients_as_outputs``).
    "mlp_gradients": ("mlp_ce", dict(batch=2048, width=512, blocks=8, classes=16)),
}
#: Models whose step returns gradients instead of accumulating them.
GRADIENT_STEPS = frozenset({"mlp_gradients"})
#: ORT's tutorial artifacts (``tools/fixtures/ort_tutorial.py``, torch models exported
#: at a batch of 4) -> the batch they are stepped and estimated at (``--batch-size``;
#: their batch dimension is dynamic): at 4 a step's tensors are smaller than the
#: resident-set noise.
TUTORIAL = {"tutorial_mlp": 32768, "tutorial_cnn_dropout": 4096, "tutorial_cnn_bn": 4096,
            "tutorial_lstm": 4096, "tutorial_gpt2": 512}


def _feeds(directory: Path, model, repeats: int = 1) -> dict[str, np.ndarray]:
    """The step's feeds as the training API gives them; the data ``repeats`` times
    over (the tutorial's logits are flattened batch first, so its targets repeat
    alike)."""
    from onnxruntime.training import api

    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    batch = np.load(directory / "inputs.npz")
    batch_values = iter([np.concatenate([batch[key]] * repeats)  # the data, then the target
                         for key in ("x", "target")])
    feeds = {}
    for value in model.graph.input:
        name = value.name
        if name in state.parameters:
            feeds[name] = state.parameters[name].data
        elif name.endswith("_grad.accumulation.buffer"):
            parameter = name[:-len("_grad.accumulation.buffer")]
            feeds[name] = np.zeros_like(state.parameters[parameter].data)
        elif name == "lazy_reset_grad":
            feeds[name] = np.array([True])
        else:
            feeds[name] = next(batch_values)
    return feeds


def measure(name: str, work: Path, threads: int, steps: int) -> list[dict]:
    import onnx

    import graphpass
    from tools.fixtures import ort_artifacts, ort_tutorial

    batch = TUTORIAL.get(name)
    if batch is None:
        case, sizes = MODELS[name]
        directory = ort_artifacts.generate(case, work, **sizes)
    else:
        directory = ort_tutorial.generate(name, work)
    original = directory / "training_model.onnx"
    model = onnx.load(original)
    if name in GRADIENT_STEPS:
        model = ort_artifacts.gradients_as_outputs(model)
        original = directory / "gradients.onnx"
        onnx.save(model, original)
    feeds = work / f"{name}_feeds.npz"
    repeats = batch // ort_tutorial.BATCH if batch else 1
    np.savez(feeds, **{k.replace("/", "|"): v
                       for k, v in _feeds(directory, model, repeats).items()})
    graph = graphpass.load(original)
    options = {"recompute": ["auto"], **({"batch_size": batch} if batch else {})}
    report = graphpass.run_passes(graph, options)[0].report
    rewritten = directory / "auto.onnx"
    graphpass.save(graph, rewritten)
    spec = {"feeds": str(feeds), "fetches": [o.name for o in model.graph.output],
            "threads": threads, "mem_pattern": False}
    ordered = report.get("runtime_estimate") or {}
    rows = []
    for variant, path, estimate, in_order in (
            ("original", original, report["estimated_peak_bytes_before"],
             ordered.get("peak_bytes_before")),
            ("auto", rewritten, report["estimated_peak_bytes_after"],
             ordered.get("peak_bytes_after"))):
        result = run_worker(f"{name} {variant}", dict(spec, model=str(path)), steps)
        rows.append(dict(model=name, variant=variant, estimate=estimate, in_order=in_order,
                         **result))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted({*MODELS, *TUTORIAL}))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'model':20s} {'variant':9s} {'peak MiB':>9s} {'ratio':>6s} {'est MiB':>8s} "
          f"{'est/meas':>8s} {'ORT order':>9s} {'/meas':>6s} {'step s':>7s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model or [*MODELS, *TUTORIAL]:
            rows = measure(name, Path(tmp), args.threads, args.steps)
            base = rows[0]["peak"]
            for row in rows:
                in_order = row["in_order"] or float("nan")
                print(f"{row['model']:20s} {row['variant']:9s} {row['peak'] / 2**20:9.1f} "
                      f"{row['peak'] / base:6.2f} {row['estimate'] / 2**20:8.1f} "
                      f"{row['estimate'] / row['peak']:8.2f} {in_order / 2**20:9.1f} "
                      f"{in_order / row['peak']:6.2f} {row['step_s']:7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
