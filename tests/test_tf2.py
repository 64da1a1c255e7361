"""TF2 training steps: Keras 3 train functions saved as SavedModel signatures
(tools/fixtures/keras3_models.py). The step function's body is read as the IR, analysed
(plain-op optimizer updates), rewritten, written back into the library, and the
result is loaded with ``tf.saved_model.load`` and trained against the original."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tf_helpers import listing

import graphpass
from graphpass.cli import main
from graphpass.inspect.describe import describe
from tools.fixtures import keras3_models

#: Forward name scopes of one block in each model's step function.
BLOCKS = {"mlp": "mlp_1/block[1-7]_", "convnet": "convnet_1/block[1-2]_",
          "transformer": "transformer_1/block[1-4]_"}
#: Trainable variables of each model (each gets one gradient update).
TRAINABLE = {"mlp": 8, "convnet": 8, "transformer": 64}
#: Models whose build and runs belong to the slow tier (the MLP keeps the fast one).
SLOW_MODELS = [pytest.param("convnet", marks=pytest.mark.slow),
               pytest.param("transformer", marks=pytest.mark.slow)]


class SavedModels:
    """Each Keras SavedModel built once per module, and its reference training run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict = {}

    def get(self, model: str, optimizer: str, **options) -> Path:
        key = "_".join([model, optimizer, *(f"{k}{v}" for k, v in sorted(options.items()))])
        directory = self.root / key
        if not directory.exists():
            keras3_models.export(directory, model, optimizer, **options)
        return directory

    def reference(self, directory: Path, model: str):
        if directory not in self.runs:
            self.runs[directory] = keras3_models.train_steps(directory, model)
        return self.runs[directory]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import tensorflow as tf

    was_eager = tf.executing_eagerly()
    yield SavedModels(tmp_path_factory.mktemp("keras3"))
    if not was_eager:  # the TF1 tests after this module expect graph mode
        tf.compat.v1.disable_eager_execution()


def _rewrite(source: Path, target: Path, *args: str) -> None:
    assert main(["rewrite", str(source), "-o", str(target), "--quiet", *args]) == 0


def _assert_trains_like(directory: Path, model: str, reference, rtol: float = 0.0) -> None:
    losses, variables = keras3_models.train_steps(directory, model)
    ref_losses, ref_variables = reference
    assert sorted(variables) == sorted(ref_variables) and variables
    if rtol == 0.0:
        assert np.array(losses).tobytes() == np.array(ref_losses).tobytes(), (losses, ref_losses)
        for name, value in ref_variables.items():
            assert variables[name].tobytes() == value.tobytes(), f"variable {name} differs"
    else:
        np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
        for name, value in ref_variables.items():
            np.testing.assert_allclose(variables[name], value, rtol=rtol, atol=1e-7,
                                       err_msg=name)


# -- reading and writing function bodies ------------------------------------------


def test_round_trip_keeps_the_saved_model(saved, tmp_path):
    """Read the step function and write it back with no pass: the SavedModel proto is
    equal to the original (object graph, signatures, every function), and variables/
    and assets/ are copied."""
    from tensorflow.core.protobuf import saved_model_pb2

    source = saved.get("mlp", "sgd")
    graph = graphpass.load(source)
    assert graph.format_state.function.name.startswith("__inference_train_")
    graphpass.save(graph, tmp_path / "out")
    protos = []
    for directory in (source, tmp_path / "out"):
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString((directory / "saved_model.pb").read_bytes())
        protos.append(proto)
    assert protos[0] == protos[1]
    copied = set(listing(tmp_path / "out"))
    assert {p for p in listing(source) if p.startswith("variables")} <= copied


@pytest.mark.parametrize("model", ["mlp", *SLOW_MODELS])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_inspect_finds_the_step_without_flags(saved, model, optimizer):
    graph = graphpass.load(saved.get(model, optimizer))
    regions = describe(graph)["regions"]
    assert regions is not None
    assert regions["losses"] == ["Mean"]
    assert regions["apply_ops"] == TRAINABLE[model]
    assert regions["global_step_variable"].endswith("/iteration")


def _outer_name(graph, argument: str) -> str:
    return graph.format_state.function.variables[argument]


@pytest.mark.parametrize("optimizer,options", [
    ("adamw", {}), ("rmsprop", {}), ("adagrad", {}), ("adam", {"clipnorm": 1.0}),
    ("sgd", {"global_clipnorm": 1.0}), ("adam", {"schedule": True}),
])
@pytest.mark.slow
def test_keras_optimizers_are_found_by_what_they_read(saved, optimizer, options):
    """Every trainable variable's update is found, with its gradient among the backward
    values, and ``iterations`` is the step counter, for each optimizer and option."""
    if options.pop("schedule", False):
        import tensorflow as tf

        options["learning_rate"] = tf.keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9)
    graph = graphpass.load(saved.get("mlp", optimizer, **options))
    regions = graphpass.analyze(graph)
    (step,) = regions.steps
    assert len(step.applies) == TRAINABLE["mlp"]
    assert all(regions.label(t.node) == "backward" for t in step.gradients)
    assert _outer_name(graph, regions.global_step).endswith("/iteration")


# -- rewriting ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["mlp", *SLOW_MODELS])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_regex_remat_trains_bit_for_bit(saved, tmp_path, model, optimizer):
    source = saved.get(model, optimizer)
    _rewrite(source, tmp_path / "out", "--recompute", BLOCKS[model])
    _assert_trains_like(tmp_path / "out", model, saved.reference(source, model))


@pytest.mark.parametrize("model", ["mlp", *SLOW_MODELS[1:]])
def test_data_mode_remat_trains_alike(saved, tmp_path, model):
    source = saved.get(model, "adam")
    _rewrite(source, tmp_path / "out", "--recompute", BLOCKS[model], "--dependency", "data")
    _assert_trains_like(tmp_path / "out", model, saved.reference(source, model), rtol=1e-6)


@pytest.mark.parametrize("model", ["mlp", *SLOW_MODELS[1:]])
def test_auto_remat_trains_bit_for_bit(saved, tmp_path, model):
    source = saved.get(model, "sgd")
    report = tmp_path / "report.json"
    _rewrite(source, tmp_path / "out", "--recompute", "auto", "--report", str(report))
    assert json.loads(report.read_text())["passes"][0]["changed"]
    _assert_trains_like(tmp_path / "out", model, saved.reference(source, model))


def test_auto_remat_pins_the_updates_in_the_step_function(saved, tmp_path):
    """The session inlines the step function and runs it on TF's executor: the
    updates' inputs are pinned ahead of the backward pass, and each weight's
    gradient waits for the backward op still reading the weight (an update of a
    weight still read copies it). SGD's ``momentum * velocity`` of each weight
    waits for that weight's gradient instead of being held from the step's start."""
    source = saved.get("mlp", "sgd")
    report = tmp_path / "report.json"
    _rewrite(source, tmp_path / "out", "--recompute", "auto", "--report", str(report))
    remat = json.loads(report.read_text())["passes"][0]["report"]
    assert remat["pinned_update_reads"] > 0
    graph = graphpass.load(tmp_path / "out")
    assert any(n.startswith("graphpass/pinned_updates/") for n in graph)
    for block in range(2, 9):
        scope = f"gradient_tape/mlp_1/block{block}_dense_1/MatMul"
        assert f"{scope}/MatMul" in graph.control_inputs(f"{scope}/MatMul_1"), scope
    waiting = [n for n in graph if graph.node(n).op == "Mul" and not n.startswith("gradient")
               and any(c.startswith("gradient_tape/") for c in graph.control_inputs(n))]
    assert len(waiting) == remat["state_values_waiting"] >= 8  # a kernel per block
    for name in waiting:  # reads the velocity, not the gradient
        assert not any(t.node.startswith("gradient_tape/") for t in graph.inputs(name))
    _assert_trains_like(tmp_path / "out", "mlp", saved.reference(source, "mlp"))


def test_a_function_step_is_estimated_as_tf2_calls_it(saved, tmp_path):
    """Weights that outweigh the activations: held to the end of the step, every
    weight gradient would be alive at once. A v1 session that imports the step
    runs it so in some processes; TF2 calls it with its variables as arguments,
    and runs each update as its gradient appears. The original's estimate (and
    the ratio printed) is of the call; the held figure is named beside it, and
    the rewrite pins it away for sessions too (``test_pin``: a TF1 graph, where
    the held figure is the estimate)."""
    source = saved.get("mlp", "sgd", size_name="weights")
    report = tmp_path / "report.json"
    _rewrite(source, tmp_path / "out", "--recompute", "auto", "--report", str(report))
    remat = json.loads(report.read_text())["passes"][0]["report"]
    held = remat["estimated_peak_bytes_updates_held"]
    low = remat["estimated_peak_bytes_updates_as_gradients_appear"]
    weight = 512 * 512 * 4
    assert held >= low + 2 * weight
    assert remat["estimated_peak_bytes_before"] == low
    assert remat["auto"]["estimated_peak_bytes_before"] == low
    assert not remat["estimated_peak_bytes_before_is_held"]
    assert remat["pinned_update_reads"] > 0
    summary = " ".join(remat["summary"])
    assert f"estimated peak {low / 2**20:.1f} MiB -> " in summary
    assert ("a v1 session that imports a graph calling it holds every gradient to the end of "
            f"the step in some processes: estimated {held / 2**20:.1f} MiB, which the "
            "rewrite pins away") in summary


@pytest.mark.slow
def test_auto_plan_is_solved_again_where_the_estimate_disagrees(saved, monkeypatch):
    """On the Keras 3 transformer, with its segments not recomputed in turn, the
    chain model's own plan leaves recomputed softmaxes waiting for starved weight
    gradients; the planner sees that in the estimate and solves again, keeping the
    lowest estimate (``remat/refine.py``). In turn (``order.order_segments``, as written),
    the first plan is already as low."""
    from graphpass.passes.remat import refine, rewrite

    def plan(rounds: int) -> dict:
        monkeypatch.setattr(refine, "ROUNDS", rounds)
        graph = graphpass.load(saved.get("transformer", "sgd"))
        return graphpass.run_passes(graph, {"recompute": ["auto"]})[0].report["auto"]

    rounds = refine.ROUNDS
    in_turn = plan(1)
    monkeypatch.setattr(rewrite, "order_segments", lambda graph, segments, gradients, runtime:
                        [0] * len(segments))
    first, refined = plan(1), plan(rounds)
    assert first["rounds"] == 1 and refined["rounds"] > 1
    # Keras 3.15's transformer: the second round's plan is as low as the first's.
    assert refined["estimated_peak_bytes"] <= first["estimated_peak_bytes"]
    assert in_turn["estimated_peak_bytes"] <= refined["estimated_peak_bytes"]
    assert in_turn["estimated_peak_bytes"] <= 0.6 * in_turn["estimated_peak_bytes_before"]


#: The most each rewrite's measured peak may be, as a fraction of the original's.
#: ``auto`` on the transformer gets 0.70x, not 0.60x: its plan measured 0.56x on one
#: 2-core machine and 0.625x on CI's (the allocator counts in 1 MiB steps, 16 MiB
#: before), because the estimate's schedule runs the weight gradients of a block
#: right away where TF's executor leaves them to the end of the step (README,
#: "Keras 3 train signatures"). The chain model's own plan measured 0.81x.
MEASURED_PEAK_BOUND = {("blocks", "mlp"): 0.60, ("blocks", "transformer"): 0.60,
                       ("auto", "mlp"): 0.60, ("auto", "transformer"): 0.70}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", *SLOW_MODELS[1:]])
@pytest.mark.parametrize("recompute", ["blocks", "auto"])
def test_measured_peak_of_one_call(saved, tmp_path, model, recompute):
    """The allocator's peak of one train call, each SavedModel in its own process:
    the block marks, and the planner's plan (checked against the estimate)."""
    source = saved.get(model, "sgd")
    _rewrite(source, tmp_path / "out", "--recompute",
             BLOCKS[model] if recompute == "blocks" else "auto")
    before = keras3_models.measure_in_subprocess(source, model)
    after = keras3_models.measure_in_subprocess(tmp_path / "out", model)
    assert before["loss"] == after["loss"]
    bound = MEASURED_PEAK_BOUND[recompute, model]
    assert after["peak"] <= bound * before["peak"], (before, after)


@pytest.mark.slow
def test_jit_compiled_step_gets_data_mode_and_less_xla_memory(saved, tmp_path):
    """``jit_compile=True``: remat defaults to data mode (XLA ignores control edges),
    XLA compiles the rewritten step, and its buffer assignment is smaller."""
    source = saved.get("mlp", "sgd", jit_compile=True)
    report = tmp_path / "report.json"
    _rewrite(source, tmp_path / "out", "--recompute", BLOCKS["mlp"], "--report", str(report))
    assert json.loads(report.read_text())["passes"][0]["report"]["dependency"] == "data"
    _assert_trains_like(tmp_path / "out", "mlp", saved.reference(source, "mlp"), rtol=1e-5)
    runs = {}
    for name, directory in (("original", source), ("rewritten", tmp_path / "out")):
        dump = tmp_path / f"xla_{name}"
        runs[name] = keras3_models.measure_in_subprocess(directory, "mlp", xla_dump=dump)
        assert any("inference_train_" in p.name for p in dump.iterdir()), "not compiled by XLA"
    assert runs["rewritten"]["xla_total"] < runs["original"]["xla_total"], runs


# -- verify and errors ---------------------------------------------------------------


def test_verify_calls_the_signature(saved, tmp_path, capsys):
    source = saved.get("mlp", "sgd")
    _rewrite(source, tmp_path / "out", "--recompute", BLOCKS["mlp"])
    assert main(["verify", str(source), str(tmp_path / "out"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["compared"]) == 18 and len(report["steps"]) == 3
    other = saved.get("mlp", "adam")  # same shapes, another optimizer: differs
    assert main(["verify", str(source), str(other), "--quiet"]) == 1


def test_saved_model_without_a_training_signature(saved, tmp_path, capsys):
    import tensorflow as tf

    module = tf.Module()
    module.v = tf.Variable(1.0)
    module.serve = tf.function(lambda x: x * module.v,
                               input_signature=[tf.TensorSpec([], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "serving"), signatures={"serve": module.serve})
    before = listing(tmp_path)
    assert main(["rewrite", str(tmp_path / "serving"), "-o", str(tmp_path / "out"),
                 "--recompute", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphpass: error:") and "serve" in err and len(err.splitlines()) == 1
    assert listing(tmp_path) == before
    assert main(["inspect", str(saved.get("mlp", "sgd")), "--signature", "nope"]) == 2
    assert "train" in capsys.readouterr().err


def test_inspect_lists_signatures(saved, capsys):
    assert main(["inspect", str(saved.get("mlp", "sgd")), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    by_key = {s["signature"]: s for s in info["signatures"]}
    assert by_key["train"]["updates_variables"]
    assert info["function"].startswith("__inference_train_")


def test_graph_def_whose_top_level_calls_the_step(saved, tmp_path):
    """A GraphDef with a library (the SavedModel's MetaGraph graph): the one top-level
    call that writes variables leads to the step; writing it back keeps the rest."""
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved.get("mlp", "sgd") / "saved_model.pb").read_bytes())
    source = tmp_path / "step.pb"
    source.write_bytes(proto.meta_graphs[0].graph_def.SerializeToString())
    graph = graphpass.load(source)
    assert graph.format_state.function.name.startswith("__inference_train_")
    assert len(graphpass.analyze(graph).steps[0].applies) == TRAINABLE["mlp"]
    _rewrite(source, tmp_path / "out.pb", "--recompute", BLOCKS["mlp"])
    written = graph_pb2.GraphDef()
    written.ParseFromString((tmp_path / "out.pb").read_bytes())
    original = proto.meta_graphs[0].graph_def
    assert list(written.node) == list(original.node)
    changed = [f.signature.name for f, g in zip(written.library.function,
                                                original.library.function) if f != g]
    assert changed == [graph.format_state.function.name]


@pytest.mark.parametrize("staleness,applied", [(0, True), (-1, False)])
def test_stale_gradients_in_the_step_function(saved, tmp_path, staleness, applied):
    """``iterations`` is the step counter and the apply (Keras's slot updates included)
    moves into a functional If, marked for TF's executor to lower and inline before
    Grappler (as ``tf.cond`` marks its own): staleness 0 in one process applies
    every step, bit for bit like the original; -1 drops every step, so nothing moves."""
    source = saved.get("mlp", "sgd")
    _rewrite(source, tmp_path / "out", "--drop-stale", str(staleness))
    graph = graphpass.load(tmp_path / "out")
    gates = [n for n in graph if graph.node(n).op == "If"]
    assert gates and all(graph.node(n).attrs["_lower_using_switch_merge"].b for n in gates)
    if applied:
        _assert_trains_like(tmp_path / "out", "mlp", saved.reference(source, "mlp"))
        return
    import tensorflow as tf

    loaded = tf.saved_model.load(str(source))
    initial = {v.name: v.numpy() for v in loaded.signatures["train"].variables}
    _, variables = keras3_models.train_steps(tmp_path / "out", "mlp")
    for name, value in initial.items():
        assert variables[name].tobytes() == value.tobytes(), name


def test_loss_scaling_and_sparse_updates_are_found(tmp_path):
    """LossScaleOptimizer applies inside an If (only finite gradients): the If is the
    update; an Embedding's gradient update is found like any other."""
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,), batch_size=8, dtype="int32")
    hidden = keras.layers.Flatten()(keras.layers.Embedding(50, 8)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    optimizer.build(model.trainable_variables)

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer = model, optimizer

        @tf.function(input_signature=[tf.TensorSpec([8, 4], tf.int32)])
        def train(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(self.model(x) ** 2)
                scaled = self.optimizer.scale_loss(loss)
            variables = self.model.trainable_variables
            gradients = tape.gradient(scaled, variables)
            self.optimizer.apply_gradients(zip(gradients, variables))
            return {"loss": loss}

    module = Module()
    tf.saved_model.save(module, str(tmp_path / "lso"), signatures={"train": module.train})
    graph = graphpass.load(tmp_path / "lso")
    (step,) = graphpass.analyze(graph).steps
    assert {graph.node(a).op for a in step.applies} == {"If"}
    assert {t.node for t in step.gradients} >= {
        n for n in graph if graph.node(n).op == "UnsortedSegmentSum"}


@pytest.mark.slow
def test_tflite_converts_the_rewritten_step_as_the_original(saved, tmp_path):
    """TFLite's on-device training recipe (``from_saved_model`` with the train and
    set_weights signatures, resource variables on): the rewritten SavedModel converts
    wherever the original does, and its train signature does in the interpreter what
    the original's does: the same losses, or (this pip's interpreter has no Flex
    delegate for the gradient ops) the same refusal."""
    source = saved.get("mlp", "sgd", on_device=True)
    _rewrite(source, tmp_path / "out", "--recompute", BLOCKS["mlp"])
    weights = keras3_models.initial_weights(source)
    outcomes = []
    for directory in (source, tmp_path / "out"):
        try:
            outcomes.append(keras3_models.tflite_train(directory, "mlp", weights))
        except RuntimeError as exc:  # raised by the interpreter, after conversion
            outcomes.append(str(exc).split("Node number")[0])
    assert outcomes[0] == outcomes[1]


def test_step_returning_loss_and_metric_is_one_train_op(tmp_path, capsys):
    """Every result of a train function waits for the whole step, so a step returning
    ``{"accuracy", "loss"}`` is one train op; remat and stale dropping together train
    it exactly like the original (verify through the signature)."""
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,), batch_size=32)
    hidden = keras.layers.Dense(64, activation="relu", name="block1")(inputs)
    hidden = keras.layers.Dense(64, activation="relu", name="block2")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden))
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer = model, optimizer

        @tf.function(input_signature=[tf.TensorSpec([32, 16], tf.float32),
                                      tf.TensorSpec([32], tf.int32)])
        def train(self, x, y):
            with tf.GradientTape() as tape:
                logits = self.model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            variables = self.model.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            hits = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y)
            return {"accuracy": tf.reduce_mean(tf.cast(hits, tf.float32)), "loss": loss}

    module = Module()
    tf.saved_model.save(module, str(tmp_path / "step"), signatures={"train": module.train})
    regions = graphpass.analyze(graphpass.load(tmp_path / "step"))
    assert len(regions.steps) == 1 and len(regions.steps[0].applies) == 6
    _rewrite(tmp_path / "step", tmp_path / "out", "--recompute", "[^/]*/block",
             "--drop-stale", "0")
    assert main(["verify", str(tmp_path / "step"), str(tmp_path / "out"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]


def test_function_with_two_training_steps_is_two_steps(tmp_path, capsys):
    """One train function trains two models (each its own tape, loss and optimizer):
    its updates split by the gradient computation they read into two steps, each
    with its own loss, found without flags, as two v1 train ops; each optimizer's
    ``iterations`` counts its own step, so there is no one global step. A regex
    remat of the first model's blocks trains both bit for bit like the original
    (every variable of both models and optimizers compared over 3 steps)."""
    source = keras3_models.export_two_steps(tmp_path / "two")
    assert main(["inspect", str(source), "--json"]) == 0
    regions = json.loads(capsys.readouterr().out)["regions"]
    assert regions["losses"] == ["Mean", "Mean_1"] and regions["apply_ops"] == 10
    assert regions["global_step"] is None
    graph = graphpass.load(source)
    analysed = graphpass.analyze(graph)
    # The first model (8 blocks, SGD: w += m) and the critic (2 blocks, Adam: w -= ...).
    owners = {str(step.loss): sorted({graph.node(a).op for a in step.applies}) * len(step.applies)
              for step in analysed.steps}
    assert owners == {"Mean": ["AssignAddVariableOp"] * 8,
                      "Mean_1": ["AssignSubVariableOp"] * 2}, owners
    assert all(analysed.label(t.node) == "backward"
               for step in analysed.steps for t in step.gradients)
    # Stale dropping gates a train op: two steps behind one are refused in one line.
    assert main(["rewrite", str(source), "-o", str(tmp_path / "stale"), "--drop-stale", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 training steps" in err and "--loss" in err, err
    assert not (tmp_path / "stale").exists()
    report = tmp_path / "report.json"
    _rewrite(source, tmp_path / "out", "--recompute", BLOCKS["mlp"], "--report", str(report))
    assert json.loads(report.read_text())["passes"][0]["changed"]
    _assert_trains_like(tmp_path / "out", "mlp", keras3_models.train_steps(source, "mlp"))


def test_update_without_a_gradient_is_named(tmp_path, capsys):
    """A step that also sets a variable the loss reads from the batch alone
    (``scale = max|x|``): no gradient computation reaches that write, so the analysis
    names it, in one line, with --train-op/--loss as the way out, and writes nothing;
    with them the write is left to the optimizer and the step is the SGD updates."""
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,), batch_size=4)
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(8)(hidden))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer = model, optimizer
            self.scale = tf.Variable(1.0, name="scale")

        @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32)])
        def train(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(self.model(x) ** 2) * self.scale
            variables = self.model.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            self.scale.assign(tf.reduce_max(tf.abs(x)))
            return {"loss": loss}

    module = Module()
    tf.saved_model.save(module, str(tmp_path / "step"), signatures={"train": module.train})
    before = listing(tmp_path)
    assert main(["rewrite", str(tmp_path / "step"), "-o", str(tmp_path / "out"),
                 "--recompute", "dense"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("graphpass: error: the update ")
    assert "'scale'" in err and "--train-op" in err and "--loss" in err, err
    assert listing(tmp_path) == before
    graph = graphpass.load(tmp_path / "step")
    (step,) = graphpass.analyze(graph, loss="mul", train_ops=["graphpass/ret/identity"]).steps
    # SGD with momentum: w += m for each of the 4 trainable variables, not the assign.
    assert [graph.node(a).op for a in step.applies] == ["AssignAddVariableOp"] * 4


def test_dtype_of_an_attr_left_at_its_default():
    """A SavedModel's function bodies leave out attrs at their OpDef default (a Keras
    3 ResNet50's ``MaxPool`` has no ``T``): the dtype comes from the default, so the
    estimate counts the output and the planner can order a read of it."""
    import tensorflow as tf

    from graphpass.formats.tf_io import graph_from_graph_def
    from graphpass.ir.graph import Tensor

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [1, 4, 4, 1], name="x")
        tf.nn.max_pool2d(x, 2, 2, "VALID", name="pool")
    graph_def = graph.as_graph_def()
    pool = next(n for n in graph_def.node if n.name == "pool")
    del pool.attr["T"]
    ir = graph_from_graph_def(graph_def)
    assert ir.dialect.dtype(ir, Tensor("pool", 0)) == "float32"
