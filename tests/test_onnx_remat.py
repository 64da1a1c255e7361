"""Rematerialization of ONNX training steps (data mode), checked with onnxruntime:
checker, opset and metadata kept, same training over several steps with all ORT
optimizations, copies that ORT's optimizer keeps, per-segment triggers, hint
marks in ``metadata_props``, and ORT's executed order giving the memory saving."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphpass
from graphpass.cli import main
from graphpass.formats.onnx_io import graph_from_model
from graphpass.formats.onnx_order import READ_INDEX, SOURCE_OPS, file_order
from graphpass.passes.remat.defer import DEFER_SCOPE
from graphpass.passes.remat.marks import SCOPE
from graphpass.runtimes import ort_step
from graphpass.runtimes.ort import ort_schedule
from tools.fixtures import onnx_models

MARKS = {"block_mlp": "block[1-7]/", "conv_net": "conv[12]/"}
BUILDERS = {"block_mlp": lambda: onnx_models.block_mlp(batch=16, width=32),
            "conv_net": onnx_models.conv_net}


@pytest.fixture(scope="module")
def built():
    return {name: build() for name, build in BUILDERS.items()}


def _with_metadata(model: onnx.ModelProto) -> onnx.ModelProto:
    tagged = onnx.ModelProto()
    tagged.CopyFrom(model)
    tagged.doc_string = "a training step"
    tagged.model_version = 7
    tagged.metadata_props.add(key="owner", value="graphpass tests")
    return tagged


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def _rewrite(model: onnx.ModelProto, tmp_path: Path, *options: str) -> tuple[Path, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source, target = tmp_path / "step.onnx", tmp_path / "out.onnx"
    report = tmp_path / "report.json"
    onnx.save(model, source)
    status, _, err = _cli("rewrite", str(source), "-o", str(target), "--report", str(report),
                          *options)
    assert status == 0, err
    return target, json.loads(report.read_text())["passes"][0]


def _ort_session(model_path: Path, optimized: Path | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_rewrite_passes_checker_keeps_model_fields_and_trains_identically(name, built, tmp_path):
    model = _with_metadata(built[name].model)
    target, result = _rewrite(model, tmp_path, "--recompute", MARKS[name])
    assert result["changed"]
    rewritten = onnx.load(target)
    onnx.checker.check_model(rewritten, full_check=True)
    assert list(rewritten.opset_import) == list(model.opset_import)
    assert rewritten.ir_version == model.ir_version
    assert rewritten.producer_name == model.producer_name
    assert (rewritten.doc_string, rewritten.model_version) == ("a training step", 7)
    assert list(rewritten.metadata_props) == list(model.metadata_props)
    assert any(n.name.startswith(SCOPE) for n in rewritten.graph.node)
    # onnx_models.run uses ORT's default optimization level: all of them.
    assert ort.SessionOptions().graph_optimization_level == \
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    losses, params = onnx_models.train_steps(model, built[name], steps=3)
    new_losses, new_params = onnx_models.train_steps(rewritten, built[name], steps=3)
    np.testing.assert_allclose(new_losses, losses, rtol=1e-6)
    assert set(new_params) == set(params)
    for param, value in params.items():
        np.testing.assert_allclose(new_params[param], value, rtol=1e-6, atol=1e-7,
                                   err_msg=param)


def test_copies_survive_onnxruntime_optimizer(built, tmp_path):
    target, result = _rewrite(built["block_mlp"].model, tmp_path, "--recompute",
                              MARKS["block_mlp"])
    assert result["report"]["nodes_added"] == 21  # MatMul, Relu, Tanh of blocks 1..7
    optimized = tmp_path / "optimized.onnx"
    _ort_session(target, optimized)
    nodes = onnx.load(optimized).graph.node
    # ORT may fuse a copy (MatMul + scale -> FusedMatMul, renamed ".../MatMulScaleFusion/"),
    # but CSE must not merge a copy into its original: both compute, side by side.
    for i in range(1, 8):
        for op in ("MatMul", "Relu", "Tanh"):
            copies = [n for n in nodes if n.name.startswith(f"{SCOPE}block{i}/{op}")]
            originals = [n for n in nodes if n.name.startswith(f"block{i}/{op}")]
            assert len(copies) == 1 and len(originals) == 1, (i, op, copies, originals)
            assert copies[0].output[0] != originals[0].output[0]
    copies = [n for n in nodes if n.name.startswith(SCOPE) and "/dep/" not in n.name
              and not n.name.startswith(DEFER_SCOPE)]
    assert len(copies) == 21


def test_each_segment_is_triggered_by_its_own_incoming_gradient(built, tmp_path):
    _, result = _rewrite(built["block_mlp"].model, tmp_path, "--recompute", MARKS["block_mlp"])
    segments = result["report"]["segments"]
    # Greater(z, 0) and Mul(t, t) read the activations alone; the gradient joins one
    # op further down. The trigger is that gradient, never the constant next to z.
    assert [s["triggers"] for s in segments] == \
        [[f"gradients/block{i}/mul_grad"] for i in range(1, 8)]


def test_onnxruntime_runs_each_recomputation_when_the_backward_reaches_it(built, tmp_path):
    target, _ = _rewrite(built["block_mlp"].model, tmp_path, "--recompute", MARKS["block_mlp"])
    order = _executed_order(target, built["block_mlp"].feeds, tmp_path, optimize=True)

    def first(prefix: str) -> int:
        return next(i for i, n in enumerate(order) if n.startswith(prefix))

    for i in range(1, 8):
        # after the block above's backward, before its own
        assert first(f"gradients/block{i + 1}/Relu_grad") < first(f"{SCOPE}block{i}/MatMul") \
            < first(f"gradients/block{i}/Tanh_grad"), i
    # the updates, deferred to the end of the step, once the last gradient exists
    assert first("gradients/block1/W_grad") < first("sgd/"), order


def _executed_order(model_path: Path, feeds: dict, tmp_path: Path, optimize: bool) -> list[str]:
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    return [e["name"][:-len("_kernel_time")] for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_ort_schedule_is_the_order_onnxruntime_executes(name, built, tmp_path):
    target, result = _rewrite(built[name].model, tmp_path, "--recompute", MARKS[name])
    # the MLP's updates are deferred: the gate's order is ORT's too
    assert result["report"]["deferred_updates"] == (name == "block_mlp")
    for path in (tmp_path / "step.onnx", target):
        graph = graphpass.load(path)
        expected = [n for n in ort_schedule(graph) if graph.node(n).op not in SOURCE_OPS]
        assert _executed_order(path, built[name].feeds, tmp_path, optimize=False) == expected


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_figures_shown_follow_the_order_onnxruntime_gives(name, built, tmp_path):
    """onnxruntime's graph optimizer fuses nodes (a Transpose into the MatMul reading
    it, a bias into its Gemm), which moves others in the order it runs them: the
    figures the user reads follow the order onnxruntime gives
    (``ort_step.optimized_order``), which is the order its profiler reports it
    executing, before and after the rewrite (the reorder nodes its layout pass
    adds are named per session)."""
    target, result = _rewrite(built[name].model, tmp_path, "--recompute", MARKS[name])
    shown = result["report"]["runtime_estimate"]
    assert shown["model"] == f"onnxruntime {ort.__version__}'s order"
    assert shown["peak_bytes_after"] < shown["peak_bytes_before"]

    def unnumbered(order: list[str]) -> list[str]:
        return [re.sub(r"^(Reorder(Input|Output))(_token_\d+)?$", r"\1", name)
                for name in order]

    for path in (tmp_path / "step.onnx", target):
        given = ort_step.optimized_order(path.read_bytes())
        assert unnumbered(given) == \
            unnumbered(_executed_order(path, built[name].feeds, tmp_path, optimize=True))


def test_the_original_is_estimated_in_the_order_onnxruntime_gives(tmp_path):
    """A momentum MLP step whose original onnxruntime runs in another order than the
    planner's model of it (the order onnxruntime gives is the one its measured peak
    follows): the original's figure, which a plan is judged against, is the one in
    onnxruntime's own order, and the summary gives the planner's model of it beside."""
    from tools.fixtures.onnx_optimizers import Optimizer

    mlp = onnx_models.block_mlp(batch=512, width=256, optimizer=Optimizer("momentum", lr=0.01),
                                params_as_inputs=True, check=False)
    _, result = _rewrite(mlp.model, tmp_path, "--recompute", MARKS["block_mlp"])
    report = result["report"]
    runtime = report["runtime_estimate"]["peak_bytes_before"]
    assert report["estimated_peak_bytes_before"] == runtime
    summary = "\n".join(report["summary"])
    planned = re.search(r"the original in onnxruntime \S+'s order; graphpass's model of "
                        r"onnxruntime's order, which plans are weighed in, puts it at "
                        r"([\d.]+) MiB", summary)
    assert planned and float(planned.group(1)) * 2**20 > 1.05 * runtime
    assert "size a job by" not in summary


def test_writer_puts_leaves_last_only_in_rewritten_graphs(built, tmp_path):
    model = built["block_mlp"].model
    target, _ = _rewrite(model, tmp_path, "--recompute", MARKS["block_mlp"])
    names = [n.name for n in onnx.load(target).graph.node]
    # ORT's DFS starts from the last leaf: the forward's leaf (the loss), then the
    # update of the block whose gradient is ready first.
    assert names[-9:] == [*(f"sgd/block{i}/update" for i in range(1, 9)), "loss"]
    untouched = graphpass.load(tmp_path / "step.onnx")
    assert all(READ_INDEX in n.meta for n in untouched.nodes() if not n.op.startswith("graphpass"))
    graphpass.save(untouched, tmp_path / "round_trip.onnx")
    assert (tmp_path / "round_trip.onnx").read_bytes() == (tmp_path / "step.onnx").read_bytes()


def test_leaf_order_does_not_depend_on_where_the_file_computes_shared_scalars(tmp_path):
    """Adam's bias-corrected rate (from the step counter) is read by every update:
    listed after the backward pass, as the generator writes it, or before the
    forward pass, the rewritten file ends with the same leaves, the update whose
    gradient is ready first last (ORT's walk starts there)."""
    from tools.fixtures.onnx_optimizers import Optimizer

    built = onnx_models.block_mlp(batch=4, width=8, blocks=4, optimizer=Optimizer("adam")).model
    nodes = list(built.graph.node)
    scalars = {t.name for t in built.graph.initializer if not t.dims} | {"adam/step"}
    prelude = []
    for node in nodes:
        if all(value in scalars for value in node.input):
            prelude.append(node)
            scalars.update(node.output)
    # each block's update math listed first block first, after everything else
    updates = [n for i in range(1, 5) for n in nodes if n.name.startswith(f"adam/block{i}/")]
    rest = [n for n in nodes if n not in updates and n not in prelude]
    late, early = onnx.ModelProto(), onnx.ModelProto()
    for model, order in ((late, rest + prelude + updates), (early, prelude + rest + updates)):
        model.CopyFrom(built)
        del model.graph.node[:]
        model.graph.node.extend(order)
        onnx.checker.check_model(model)
    tails = []
    for model in (late, early):
        graph = graph_from_model(model)
        graphpass.run_passes(graph, {"recompute": ["block[1-3]/"]})
        order = [n for n in file_order(graph) if graph.node(n).op not in SOURCE_OPS]
        tails.append([n for n in order if not graph.users(n)])
    assert tails[0] == tails[1]
    assert tails[0][-2:] == ["adam/block4/update", "loss"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_estimate_is_the_peak_onnxruntime_measures(kind, tmp_path):
    """The estimate counts what ORT allocates: graph outputs (updated parameters and
    optimizer state) live from their producer to the end of the step, a weight
    gradient's ``Transpose`` fused into its MatMul is never allocated, a freed
    buffer stays allocated until ORT's planner hands it to the next value of its
    shape, ``Where`` holds two temporaries. So it is at least the liveness of ORT's
    optimized graph over its executed order, and within 5% of the rewritten
    step's measured peak RSS (arena off, one mmap per tensor; tensors of 512 KiB)."""
    from tools.fixtures.onnx_optimizers import Optimizer
    from tools.fixtures.ort_measure import executed_order_peak, run_worker

    mlp = onnx_models.block_mlp(batch=512, width=256, optimizer=Optimizer(kind, lr=0.01),
                                params_as_inputs=True, check=False)
    target, result = _rewrite(mlp.model, tmp_path, "--recompute", MARKS["block_mlp"])
    optimized = target.with_suffix(".optimized.onnx")
    _ort_session(target, optimized)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **{k.replace("/", "|"): v for k, v in mlp.feeds.items()})
    spec = {"model": str(target), "feeds": str(feeds), "threads": 1, "mem_pattern": False,
            "fetches": [mlp.loss, *mlp.carried.values()]}
    executed = executed_order_peak(spec, str(optimized), mlp.feeds)
    measured = run_worker("rewritten", spec, 1)["peak"]
    estimate = result["report"]["estimated_peak_bytes_after"]
    assert executed <= estimate, (estimate, executed)
    assert abs(estimate / measured - 1) <= 0.05, (estimate, measured)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nesterov", "adam"])
def test_deferred_updates_train_identically_and_lower_the_measured_peak(kind, tmp_path,
                                                                       monkeypatch):
    """The step returns every update, and ORT holds a graph output from its producer
    to the end of the step: an update run as soon as its gradient exists holds
    the new parameter and its state through the rest of the backward pass. Gated
    on every gradient, the updates run at the end and the backward pass holds one
    gradient per parameter instead. The rewrite keeps the gate only where the
    estimate is lower; so it must be lower in ORT's measured peak too (RSS, arena
    off, each variant in its own process), each estimate within 5% of its
    measurement, and the training the same over 3 steps."""
    from graphpass.passes.remat import defer
    from tools.fixtures.onnx_optimizers import Optimizer
    from tools.fixtures.ort_measure import run_worker

    mlp = onnx_models.block_mlp(batch=512, width=256, optimizer=Optimizer(kind, lr=0.01),
                                params_as_inputs=True, check=False)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **{k.replace("/", "|"): v for k, v in mlp.feeds.items()})
    lowest = ("--recompute", "auto", "--max-extra-time", "none")  # the plan, time aside
    rewrites = {"deferred": _rewrite(mlp.model, tmp_path / "deferred", *lowest)}
    monkeypatch.setattr(defer, "MIN_GAIN_FRACTION", 1.0)  # no gain is enough: never deferred
    rewrites["plain"] = _rewrite(mlp.model, tmp_path / "plain", *lowest)
    assert [r["report"]["deferred_updates"] for r in
            (rewrites["deferred"][1], rewrites["plain"][1])] == [True, False]
    estimate, measured = {}, {}
    for name, (target, result) in rewrites.items():
        spec = {"model": str(target), "feeds": str(feeds), "threads": 1, "mem_pattern": False,
                "fetches": [mlp.loss, *mlp.carried.values()]}
        estimate[name] = result["report"]["estimated_peak_bytes_after"]
        measured[name] = run_worker(name, spec, 1)["peak"]
        assert abs(estimate[name] / measured[name] - 1) <= 0.05, (name, estimate, measured)
    assert estimate["deferred"] < estimate["plain"] and measured["deferred"] < measured["plain"]
    losses, values = onnx_models.train_steps(mlp.model, mlp, steps=3)
    new_losses, new_values = onnx_models.train_steps(onnx.load(rewrites["deferred"][0]), mlp,
                                                     steps=3)
    np.testing.assert_allclose(new_losses, losses, rtol=1e-6)
    for name, value in values.items():
        np.testing.assert_allclose(new_values[name], value, rtol=1e-6, err_msg=name)


def test_verify_matches_nan_against_nan(tmp_path):
    """``verify`` feeds random optimizer state, so Adam's ``sqrt(v)`` of a negative
    ``v`` is NaN in both steps: NaN against NaN (and equal infinities) match, a NaN
    against a number does not."""
    from graphpass.inspect.verify.compare import compare_values
    from tools.fixtures.onnx_optimizers import Optimizer

    nan, inf = float("nan"), float("inf")
    assert compare_values([nan, inf, 1.0], [nan, inf, 1.0], 0.0, 0.0)[2]
    assert not compare_values([nan, 1.0], [1.0, 1.0], 1e-6, 1e-6)[2]
    assert not compare_values([inf], [-inf], 1e-6, 1e-6)[2]
    mlp = onnx_models.block_mlp(batch=16, width=32, optimizer=Optimizer("adam", lr=0.01))
    target, _ = _rewrite(mlp.model, tmp_path, "--recompute", "auto")
    status, out, err = _cli("verify", str(tmp_path / "step.onnx"), str(target))
    assert status == 0, out + err
    assert "MISMATCH" not in out


def test_deferring_is_decided_when_the_figures_are_not_shown(tmp_path):
    """``--quiet`` without ``--report`` skips the estimates nobody sees, but deferring
    the updates is part of the rewrite: the quiet output is the same file."""
    from tools.fixtures.onnx_optimizers import Optimizer

    mlp = onnx_models.block_mlp(batch=256, width=64, optimizer=Optimizer("nesterov", lr=0.1),
                                check=False)
    shown, _ = _rewrite(mlp.model, tmp_path / "shown", "--recompute", "block[1-7]/")
    quiet = tmp_path / "quiet.onnx"
    status, _, err = _cli("rewrite", str(tmp_path / "shown" / "step.onnx"), "-o", str(quiet),
                          "--recompute", "block[1-7]/", "--quiet")
    assert status == 0, err
    assert any(n.name.startswith(DEFER_SCOPE) for n in onnx.load(quiet).graph.node)
    assert quiet.read_bytes() == shown.read_bytes()


@pytest.mark.parametrize("kind", ["sgd", "momentum"])
def test_deferred_updates_keep_what_onnxruntime_fuses_into_the_weight_gradient(kind,
                                                                               tmp_path):
    """ORT folds SGD's ``lr * g`` into the weight gradient's MatMul and momentum's
    ``mu * v + g`` with it into one Gemm; a gate between them left them unfused,
    which rounds differently (5.5e-5 relative on an SGD parameter after 3 steps).
    The gate goes past them, and the step trains as the original does."""
    from tools.fixtures.onnx_optimizers import Optimizer

    mlp = onnx_models.block_mlp(batch=512, width=256, optimizer=Optimizer(kind, lr=0.01),
                                params_as_inputs=True, check=False)
    target, result = _rewrite(mlp.model, tmp_path, "--recompute", "auto")
    assert result["report"]["deferred_updates"]
    gated = {n.input[0] for n in onnx.load(target).graph.node
             if n.name.startswith(f"{DEFER_SCOPE}/gate")}
    assert gated == {f"{kind}/block{i}/{'step' if kind == 'sgd' else 'velocity_next'}"
                     for i in range(1, 9)}
    losses, values = onnx_models.train_steps(mlp.model, mlp, steps=3)
    new_losses, new_values = onnx_models.train_steps(onnx.load(target), mlp, steps=3)
    np.testing.assert_allclose(new_losses, losses, rtol=1e-6)
    for name, value in values.items():
        np.testing.assert_allclose(new_values[name], value, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("kind", ["momentum", "rmsprop"])
def test_auto_keeps_what_is_not_live_at_the_relu_gradient(kind, tmp_path):
    """ORT's ``Where`` (the ReLU gradient) holds two temporaries of its output's
    size. The planner charges them to the unit whose gradient runs it, so of the
    equally narrow cuts after each block's ``tanh`` and after its ``2 * tanh`` it
    keeps the block's output, as the hand marks do: keeping ``tanh`` and
    recomputing ``2 * tanh`` for the next block's weight gradient leaves both live
    at that block's ``Where``, which the chain model did not see (its plan was
    estimated 8 MiB over the marks' at full size)."""
    from graphpass.analysis.cost import Sizes
    from graphpass.analysis.forward import computed_forward, forward_chain
    from tools.fixtures.onnx_optimizers import Optimizer

    mlp = onnx_models.block_mlp(batch=512, width=256, optimizer=Optimizer(kind, lr=0.01),
                                params_as_inputs=True, check=False)
    graph = graph_from_model(mlp.model)
    regions = graphpass.analyze(graph)
    chain = forward_chain(graph, computed_forward(graph, set(regions.nodes("forward"))),
                          set(regions.nodes("backward")), Sizes(graph))
    where = 2 * 512 * 256 * 4  # two temporaries of the [512, 256] float32 gradient
    charged = {chain.nodes(i, i)[0]: u.scratch_bytes
               for i, u in enumerate(chain.units) if u.scratch_bytes}
    # a ReLU gradient reads the block's MatMul output (``positive``) first
    assert charged == {f"block{b}/MatMul": where for b in range(1, 9)}, charged
    _, marked = _rewrite(mlp.model, tmp_path, "--recompute", MARKS["block_mlp"])
    # the lowest peak, whatever its time: what this checks is what it keeps
    _, auto = _rewrite(mlp.model, tmp_path, "--recompute", "auto", "--max-extra-time", "none")
    segments = [s["label"] for s in auto["report"]["auto"]["segments"]]
    assert segments and all(re.fullmatch(r"block\d/MatMul\.\.mul", s) for s in segments)
    assert auto["report"]["estimated_peak_bytes_after"] <= \
        marked["report"]["estimated_peak_bytes_after"]


def test_peak_over_ort_executed_order_is_at_most_070x(tmp_path):
    from tools.fixtures.ort_measure import executed_order_peak

    mlp = onnx_models.block_mlp(batch=64, width=64, params_as_inputs=True)
    source = tmp_path / "step.onnx"
    onnx.save(mlp.model, source)
    target, result = _rewrite(mlp.model, tmp_path, "--recompute", MARKS["block_mlp"])
    # graphpass's own estimate walks the order ORT runs the written model in
    report = result["report"]
    assert report["estimated_peak_bytes_after"] <= 0.70 * report["estimated_peak_bytes_before"]
    fetches = [mlp.loss, *mlp.updates.values()]
    peaks = {}
    for path in (source, target):
        optimized = path.with_suffix(".optimized.onnx")
        _ort_session(path, optimized)
        peaks[path.name] = executed_order_peak(
            {"model": str(path), "fetches": fetches, "threads": 1}, str(optimized), mlp.feeds)
    assert peaks["out.onnx"] <= 0.70 * peaks["step.onnx"], peaks


def test_hint_marks_in_metadata_props(built, tmp_path):
    mlp = built["block_mlp"]
    graph = graph_from_model(mlp.model)
    dialect = graph.dialect
    for name in list(graph):
        found = re.match(r"block([1-7])/", name)
        if found:
            dialect.set_attr(graph, name, "_recompute_hint", int(found.group(1)))
    assert dialect.get_attr(graph, "block3/Relu", "_recompute_hint") == "3"
    assert dialect.get_attr(graph, "block8/Relu", "_recompute_hint") is None
    hinted = tmp_path / "hinted.onnx"
    graphpass.save(graph, hinted)
    model = onnx.load(hinted)
    onnx.checker.check_model(model, full_check=True)
    node = next(n for n in model.graph.node if n.name == "block3/Relu")
    assert {e.key: e.value for e in node.metadata_props} == {"_recompute_hint": "3"}
    assert not any(a.name.startswith("_") for n in model.graph.node for a in n.attribute)
    target, result = _rewrite(model, tmp_path, "--recompute-hints")
    segments = result["report"]["segments"]
    assert [s["segment"] for s in segments] == [f"hint {i}" for i in range(1, 8)]
    assert all(s["copied"] == 3 for s in segments)
    losses, _ = onnx_models.train_steps(mlp.model, mlp, steps=3)
    new_losses, _ = onnx_models.train_steps(onnx.load(target), mlp, steps=3)
    np.testing.assert_allclose(new_losses, losses, rtol=1e-6)


def test_control_dependency_on_onnx_exits_2_with_one_line(built, tmp_path):
    source = tmp_path / "step.onnx"
    onnx.save(built["block_mlp"].model, source)
    status, out, err = _cli("rewrite", str(source), "-o", str(tmp_path / "out.onnx"),
                            "--recompute", MARKS["block_mlp"], "--dependency", "control")
    assert status == 2
    assert err.count("\n") == 1 and "--dependency control" in err and "data" in err, err
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("name, recompute", [("conv_net", MARKS["conv_net"]),
                                             ("block_mlp", "auto")])
def test_second_rewrite_is_a_no_op(name, recompute, built, tmp_path):
    target, first = _rewrite(built[name].model, tmp_path, "--recompute", recompute)
    # the MLP's updates were deferred: a second run gates them no more
    assert first["report"]["deferred_updates"] == (name == "block_mlp")
    again = tmp_path / "again.onnx"
    report = tmp_path / "again.json"
    status, _, err = _cli("rewrite", str(target), "-o", str(again), "--report", str(report),
                          "--recompute", recompute)
    assert status == 0, err
    result = json.loads(report.read_text())["passes"][0]
    assert not result["changed"]
    assert again.read_bytes() == target.read_bytes()


def _gap_step(t3_returned: bool) -> graphpass.Graph:
    """``t1 = x*x`` dies early; ``big = wide * rowsum(t1)`` ([N, 2N]) comes next; then
    ``t3 = x + rowsum(big)``, of ``t1``'s exact shape, ORT's planner puts in ``t1``'s
    buffer (unless ``t3`` is a graph output), which stays allocated in between."""
    from onnx import TensorProto, helper

    n = 64
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("Mul", ["x", "x"], ["t1"], name="t1"),
             helper.make_node("ReduceSum", ["t1", "axes"], ["t2"], name="t2"),
             helper.make_node("Mul", ["wide", "t2"], ["big"], name="big"),
             helper.make_node("ReduceSum", ["big", "axes"], ["s"], name="s"),
             helper.make_node("Add", ["x", "s"], ["t3"], name="t3"),
             helper.make_node("ReduceSum", ["t3"], ["loss"], name="loss", keepdims=0)]
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    if t3_returned:
        outputs.append(helper.make_tensor_value_info("t3", TensorProto.FLOAT, [n, n]))
    model = helper.make_model(helper.make_graph(
        nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n]),
                       helper.make_tensor_value_info("wide", TensorProto.FLOAT, [n, 2 * n])],
        outputs, [axes]), opset_imports=[helper.make_opsetid("", 13)])
    return graph_from_model(model)


@pytest.mark.parametrize("t3_returned", [False, True])
def test_estimate_holds_a_freed_buffer_until_ort_reuses_it(t3_returned):
    """ORT's allocation planner gives ``t3`` the freed buffer of ``t1`` (same shape),
    and frees that buffer only after ``t3``'s last reader: so while ``big`` is live,
    ``t1``'s bytes are still allocated. A graph output never takes a freed buffer,
    so then ``t1``'s buffer is freed where ``t1`` dies."""
    from graphpass.analysis.memory import memory_profile

    graph = _gap_step(t3_returned)
    profile = memory_profile(graph, graph.dialect.step.graph_outputs(graph))
    square, wide_rows, column = 64 * 64 * 4, 64 * 128 * 4, 64 * 4
    held = 0 if t3_returned else square
    assert dict(profile.timeline)["big"] == wide_rows + column + held
    assert profile.peak_bytes == wide_rows + column + held


def test_estimate_shares_buffers_as_ort_kernels_do():
    """``Relu`` writes into its input when it is that input's last reader (ORT's
    ``MayInplace``), and a product with a scalar constant whose only reader is a
    MatMul is folded into it (``MatMulScaleFusion``): ``m``, ``r`` and ``s`` are one
    buffer, so the step holds two [N, N] tensors at once, not four."""
    from onnx import TensorProto, helper

    from graphpass.analysis.memory import memory_profile

    n = 32
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="m"),
             helper.make_node("Relu", ["m"], ["r"], name="r"),
             helper.make_node("Mul", ["r", "two"], ["s"], name="s"),
             helper.make_node("MatMul", ["s", "w"], ["y"], name="y"),
             helper.make_node("ReduceSum", ["y"], ["loss"], name="loss", keepdims=0)]
    square = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        nodes, "fused", [square("x", TensorProto.FLOAT, [n, n]),
                         square("w", TensorProto.FLOAT, [n, n])],
        [square("loss", TensorProto.FLOAT, [])], [two]),
        opset_imports=[helper.make_opsetid("", 13)])
    graph = graph_from_model(model)
    profile = memory_profile(graph, graph.dialect.step.graph_outputs(graph))
    assert profile.peak_bytes == 2 * n * n * 4
    assert profile.peak_node == "y"
