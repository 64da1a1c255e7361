"""TF2 training steps built with Keras 3 (``tf.keras``), exported as SavedModels the
way TensorFlow Lite's on-device training guide does: a ``tf.Module`` holding the
model and its optimizer, a ``@tf.function`` ``train(x, y)`` step (GradientTape,
``optimizer.apply_gradients``) returning ``{"loss": loss}``, saved with
``tf.saved_model.save(module, dir, signatures={"train": module.train})``.

Models (small defaults for tests; ``--size bench`` for benchmarks):

* ``mlp``: 8 blocks ``h = tanh(relu(Dense(h))) * 2``, loss ``mean(h * h)`` (the same
  block as ``tools/tf_models.block_mlp``);
* ``convnet``: Conv2D + BatchNormalization + ReLU, twice, Dropout, Dense, softmax
  cross-entropy;
* ``transformer``: an encoder of blocks (MultiHeadAttention, LayerNormalization,
  feed-forward), mean squared error against a target sequence.

Optimizers: ``sgd`` (momentum 0.9), ``adam``, plus ``adamw``, ``rmsprop``,
``adagrad`` for the region analysis. ``jit_compile=True`` marks the train function
for XLA. Everything is seeded: the same arguments give the same variables and the
same inputs (``inputs``).

    python tools/keras3_models.py export mlp sgd /tmp/mlp_sgd [--jit] [--size bench]
    python tools/keras3_models.py measure /tmp/mlp_sgd mlp
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODELS = ("mlp", "convnet", "transformer")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")


@dataclass(frozen=True)
class Size:
    """Shapes of one model family's inputs and layers."""

    batch: int
    width: int
    blocks: int
    image: int = 8
    sequence: int = 8
    heads: int = 2


SIZES = {
    # Activations of at least 256 KiB where memory is measured: oneDNN's CPU
    # allocator leaves smaller buffers out of its statistics.
    "test": {"mlp": Size(batch=1024, width=128, blocks=8),
             "convnet": Size(batch=4, width=8, blocks=2, image=8),
             "transformer": Size(batch=8, width=32, blocks=4, sequence=128, heads=4)},
    "bench": {"mlp": Size(batch=2048, width=1024, blocks=8),
              "convnet": Size(batch=32, width=32, blocks=2, image=32),
              "transformer": Size(batch=32, width=128, blocks=4, sequence=256, heads=4)},
}


def _keras():
    """TF and Keras, eager. ``tools/tf_models`` turns eager execution off for the
    whole process (TF1 graphs); a test process runs both, so turn it back on."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.python.framework import ops

    if not tf.executing_eagerly():
        # TF refuses to turn eager back on once graph mode created the global
        # default graph (tf_keras graph-mode models do); drop that graph first.
        tf.compat.v1.reset_default_graph()
        ops.enable_eager_execution()
    return tf, tf.keras


def optimizer(name: str, **options):
    """A Keras 3 optimizer by name; ``options`` go to its constructor (``clipnorm``,
    ``global_clipnorm``, ``learning_rate`` (a schedule too), ...)."""
    _, keras = _keras()
    options.setdefault("learning_rate", 0.01)
    if name == "sgd":
        return keras.optimizers.SGD(momentum=0.9, **options)
    classes = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW,
               "rmsprop": keras.optimizers.RMSprop, "adagrad": keras.optimizers.Adagrad}
    return classes[name](**options)


def _mlp(keras, size: Size, name: str = "mlp"):
    inputs = keras.Input((size.width,), batch_size=size.batch, name="x")
    h = inputs
    for i in range(1, size.blocks + 1):
        h = keras.layers.Dense(size.width, activation="relu", use_bias=False,
                               name=f"block{i}_dense")(h)
        h = keras.layers.Lambda(lambda t: keras.ops.tanh(t) * 2, name=f"block{i}_tanh")(h)
    return keras.Model(inputs, h, name=name)


def _convnet(keras, size: Size):
    inputs = keras.Input((size.image, size.image, 3), batch_size=size.batch, name="x")
    h = inputs
    for i in range(1, size.blocks + 1):
        h = keras.layers.Conv2D(size.width * i, 3, padding="same", use_bias=False,
                                name=f"block{i}_conv")(h)
        h = keras.layers.BatchNormalization(name=f"block{i}_bn")(h)
        h = keras.layers.ReLU(name=f"block{i}_relu")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    h = keras.layers.Dropout(0.25, seed=1, name="dropout")(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    return keras.Model(inputs, outputs, name="convnet")


def _transformer(keras, size: Size):
    inputs = keras.Input((size.sequence, size.width), batch_size=size.batch, name="x")
    h = inputs
    for i in range(1, size.blocks + 1):
        attention = keras.layers.MultiHeadAttention(
            size.heads, size.width // size.heads, name=f"block{i}_attention")(h, h)
        h = keras.layers.LayerNormalization(name=f"block{i}_norm1")(h + attention)
        ff = keras.layers.Dense(size.width * 4, activation="relu", name=f"block{i}_ff1")(h)
        ff = keras.layers.Dense(size.width, name=f"block{i}_ff2")(ff)
        h = keras.layers.LayerNormalization(name=f"block{i}_norm2")(h + ff)
    return keras.Model(inputs, h, name="transformer")


def _loss(tf, model_name: str, y, prediction):
    if model_name == "mlp":
        return tf.reduce_mean(prediction * prediction)
    if model_name == "convnet":
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, prediction))
    return tf.reduce_mean(tf.square(prediction - y))


def input_specs(model_name: str, size: Size) -> tuple:
    """``(x, y)`` shapes and dtypes of the train signature."""
    if model_name == "mlp":
        return ((size.batch, size.width), "float32"), ((size.batch, size.width), "float32")
    if model_name == "convnet":
        return ((size.batch, size.image, size.image, 3), "float32"), ((size.batch,), "int32")
    shape = (size.batch, size.sequence, size.width)
    return (shape, "float32"), (shape, "float32")


def inputs(model_name: str, size_name: str = "test", seed: int = 0) -> dict:
    """Deterministic ``{"x": ..., "y": ...}`` for the train signature."""
    rng = np.random.RandomState(seed)
    size = SIZES[size_name][model_name]
    (x_shape, _), (y_shape, y_dtype) = input_specs(model_name, size)
    x = rng.standard_normal(x_shape).astype(np.float32)
    if y_dtype == "int32":
        y = rng.randint(0, 10, y_shape).astype(np.int32)
    else:
        y = rng.standard_normal(y_shape).astype(np.float32)
    return {"x": x, "y": y}


def build_module(model_name: str, optimizer_name: str, *, size_name: str = "test",
                 jit_compile: bool = False, seed: int = 0, **optimizer_options):
    """The ``tf.Module`` with ``model``, ``optimizer`` and the ``train`` tf.function."""
    tf, keras = _keras()
    keras.utils.set_random_seed(seed)
    size = SIZES[size_name][model_name]
    model = {"mlp": _mlp, "convnet": _convnet, "transformer": _transformer}[model_name](
        keras, size)
    opt = optimizer(optimizer_name, **optimizer_options)
    opt.build(model.trainable_variables)
    (x_shape, x_dtype), (y_shape, y_dtype) = input_specs(model_name, size)

    class TrainModule(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.optimizer = opt
            # Keras 3 variables tf.Module tracking does not see (Dropout's seed
            # generator state): listed here so that the SavedModel saves them.
            self.state = [v for layer in model.layers
                          for generator in getattr(layer, "_seed_generators", [])
                          for v in [generator.state]]

        @tf.function(input_signature=[tf.TensorSpec(x_shape, x_dtype, name="x"),
                                      tf.TensorSpec(y_shape, y_dtype, name="y")],
                     jit_compile=jit_compile)
        def train(self, x, y):
            with tf.GradientTape() as tape:
                prediction = self.model(x, training=True)
                loss = _loss(tf, model_name, y, prediction)
            variables = self.model.trainable_variables
            gradients = tape.gradient(loss, variables)
            self.optimizer.apply_gradients(zip(gradients, variables))
            return {"loss": loss}

    module = TrainModule()
    variables = _step_variables(module)
    specs = [tf.TensorSpec(v.shape, v.dtype, name=_input_name(v)) for v in variables]

    @tf.function(input_signature=specs)
    def set_weights(*values):
        """Assign every variable of the step (model and optimizer): how a TFLite
        interpreter initialises them before training (the ``set_weights``
        signature of on-device training; builtin ops only, no Flex delegate)."""
        for v, value in zip(variables, values):
            v.assign(value)
        return {"done": tf.constant(True)}

    module.set_weights = set_weights
    return module


def export_two_steps(directory: str | os.PathLike, *, seed: int = 0) -> Path:
    """Two training steps in one ``train`` function: the ``mlp`` model trained with
    SGD on ``mean(h * h)`` and a second one, ``critic``, trained with Adam to map
    ``x`` to ``y``; each its own GradientTape and ``apply_gradients``. Inputs as
    ``inputs("mlp")``; returns ``{"loss", "critic_loss"}``."""
    tf, keras = _keras()
    keras.utils.set_random_seed(seed)
    size = SIZES["test"]["mlp"]
    models = [_mlp(keras, size), _mlp(keras, Size(size.batch, size.width, 2), "critic")]
    optimizers = [optimizer("sgd"), optimizer("adam")]
    for model, opt in zip(models, optimizers):
        opt.build(model.trainable_variables)
    (x_shape, _), (y_shape, _) = input_specs("mlp", size)

    class TwoSteps(tf.Module):
        def __init__(self):
            super().__init__()
            self.models, self.optimizers = models, optimizers

        @tf.function(input_signature=[tf.TensorSpec(x_shape, tf.float32, name="x"),
                                      tf.TensorSpec(y_shape, tf.float32, name="y")])
        def train(self, x, y):
            losses = []
            for model, opt in zip(self.models, self.optimizers):
                with tf.GradientTape() as tape:
                    prediction = model(x, training=True)
                    loss = _loss(tf, model.name, y, prediction)
                variables = model.trainable_variables
                opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
                losses.append(loss)
            return {"loss": losses[0], "critic_loss": losses[1]}

    module = TwoSteps()
    tf.saved_model.save(module, str(directory), signatures={"train": module.train})
    return Path(directory)


def _input_name(variable) -> str:
    return variable.path.replace("/", "_")


def initial_weights(directory: str | os.PathLike, signature: str = "train") -> dict:
    """``{set_weights input name: value}`` from a SavedModel's variables as saved."""
    tf, _ = _keras()
    loaded = tf.saved_model.load(str(directory))
    return {v.name.split(":")[0].replace("/", "_"): v.numpy()
            for v in loaded.signatures[signature].variables}


def tflite_train(directory: str | os.PathLike, model_name: str, weights: dict, *,
                 steps: int = 3, size_name: str = "test") -> list[float]:
    """Convert the SavedModel's ``train`` and ``set_weights`` signatures with
    resource variables enabled (TFLite's on-device training recipe), initialise
    the variables through ``set_weights`` and train ``steps`` steps in the TFLite
    interpreter; returns the losses."""
    tf, _ = _keras()
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(directory), signature_keys=["train", "set_weights"])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                           tf.lite.OpsSet.SELECT_TF_OPS]
    converter.experimental_enable_resource_variables = True
    interpreter = tf.lite.Interpreter(model_content=converter.convert())
    interpreter.get_signature_runner("set_weights")(**weights)
    train = interpreter.get_signature_runner("train")
    feed = inputs(model_name, size_name)
    return [float(train(**feed)["loss"]) for _ in range(steps)]



def _step_variables(module) -> list:
    """The model's and the optimizer's variables (Keras 3 ``Variable``s), in a fixed order."""
    return list(module.model.variables) + list(module.optimizer.variables)


def export(directory: str | os.PathLike, model_name: str, optimizer_name: str, *,
           size_name: str = "test", jit_compile: bool = False, seed: int = 0,
           on_device: bool = False, **optimizer_options) -> Path:
    """Build and save the SavedModel with its ``train`` signature; returns the directory.
    ``on_device`` adds a ``set_weights`` signature (see :func:`tflite_train`)."""
    tf, _ = _keras()
    module = build_module(model_name, optimizer_name, size_name=size_name,
                          jit_compile=jit_compile, seed=seed, **optimizer_options)
    signatures = {"train": module.train}
    if on_device:
        signatures["set_weights"] = module.set_weights
    tf.saved_model.save(module, str(directory), signatures=signatures)
    return Path(directory)


def train_steps(directory: str | os.PathLike, model_name: str, *, steps: int = 3,
                size_name: str = "test", signature: str = "train") -> tuple[list, dict]:
    """Load a SavedModel with ``tf.saved_model.load`` and call its train signature
    ``steps`` times on ``inputs``: the losses, and every variable it uses, by name."""
    tf, _ = _keras()
    loaded = tf.saved_model.load(str(directory))
    function = loaded.signatures[signature]
    feed = {k: tf.constant(v) for k, v in inputs(model_name, size_name).items()}
    losses = [function(**feed)["loss"].numpy() for _ in range(steps)]
    return losses, {v.name: v.numpy() for v in function.variables}


def measure_peak(directory: str | os.PathLike, model_name: str, *,
                 size_name: str = "test", signature: str = "train") -> dict:
    """Peak allocator bytes of one call of the train signature, after a warm-up call,
    with one inter-op thread (a stable schedule). Run it in a process of its own,
    with oneDNN on (``TF_ENABLE_ONEDNN_OPTS=1``): the allocator only keeps statistics
    then. Returns ``{"peak": bytes, "loss": float}``."""
    tf, _ = _keras()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    function = tf.saved_model.load(str(directory)).signatures[signature]
    feed = {k: tf.constant(v) for k, v in inputs(model_name, size_name).items()}
    function(**feed)
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    loss = function(**feed)["loss"].numpy()
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    return {"peak": peak, "loss": float(loss)}


def measure_records_peak(directory: str | os.PathLike, model_name: str, *,
                         size_name: str = "test", signature: str = "train") -> dict:
    """Peak live bytes of the kernels' allocation records over one call of the train
    signature (``tools/measure.py``'s figure): the signature called in a TF1 graph
    and run by a session with ``FULL_TRACE``, after a warm-up run, one inter-op
    thread. Unlike the allocator's statistics it counts buffers under 256 KiB and
    needs no oneDNN; with oneDNN off the records are the bytes the kernels asked for,
    the same on any CPU. Returns ``{"peak": bytes, "loss": float}``."""
    from tools.measure import peak_from_step_stats

    tf, _ = _keras()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        function = tf.saved_model.load(str(directory)).signatures[signature]
        feed = {k: tf.constant(v) for k, v in inputs(model_name, size_name).items()}
        loss = function(**feed)["loss"]
        config = tf1.ConfigProto(inter_op_parallelism_threads=1)
        with tf1.Session(graph=graph, config=config) as session:
            session.run(tf1.global_variables_initializer())
            session.run(loss)
            metadata = tf1.RunMetadata()
            value = session.run(loss, run_metadata=metadata, options=tf1.RunOptions(
                trace_level=tf1.RunOptions.FULL_TRACE))
    return {"peak": peak_from_step_stats(metadata.step_stats)[0], "loss": float(value)}


def measure_in_subprocess(directory: str | os.PathLike, model_name: str,
                          size_name: str = "test", xla_dump: Path | None = None,
                          records: bool = False) -> dict:
    """:func:`measure_peak` in a fresh process (the allocator's peak is per process),
    or with ``records`` :func:`measure_records_peak` there, oneDNN off.
    With ``xla_dump``, XLA dumps there what it compiles and ``xla_total`` is the
    largest "Total bytes used" of its buffer assignments (None: nothing compiled)."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0" if records else "1",
               TF_CPP_MIN_LOG_LEVEL="3")
    if xla_dump is not None:
        env["XLA_FLAGS"] = f"--xla_dump_to={xla_dump}"
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-m", "tools.keras3_models", "measure", str(directory), model_name,
         "--size", size_name, *(["--records"] if records else [])],
        env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if xla_dump is not None:
        result["xla_total"] = xla_total_bytes(Path(xla_dump))
    return result


def xla_total_bytes(dump_dir: Path) -> int | None:
    """Largest "Total bytes used" over XLA's buffer-assignment dumps (the train step)."""
    import re

    totals = [int(m.group(1)) for path in dump_dir.glob("*buffer-assignment.txt")
              for m in re.finditer(r"Total bytes used: (\d+)", path.read_text())]
    return max(totals) if totals else None


def main() -> None:
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("export", help="build and save a model")
    build.add_argument("model", choices=MODELS)
    build.add_argument("optimizer", choices=OPTIMIZERS)
    build.add_argument("directory")
    build.add_argument("--jit", action="store_true", help="jit_compile=True")
    build.add_argument("--size", choices=sorted(SIZES), default="test")
    measure = sub.add_parser("measure", help="peak bytes of one train call, as JSON")
    measure.add_argument("directory")
    measure.add_argument("model", choices=MODELS)
    measure.add_argument("--size", choices=sorted(SIZES), default="test")
    measure.add_argument("--records", action="store_true",
                         help="the kernels' allocation records, not the allocator's peak")
    args = parser.parse_args()
    if args.command == "measure":
        how = measure_records_peak if args.records else measure_peak
        print(json.dumps(how(args.directory, args.model, size_name=args.size)))
        return
    export(args.directory, args.model, args.optimizer, size_name=args.size,
           jit_compile=args.jit)
    print(args.directory)


if __name__ == "__main__":
    main()
