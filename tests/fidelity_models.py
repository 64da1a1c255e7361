"""The models of the fidelity matrix (tests/test_fidelity.py, tools/bench/fidelity.py):
small, seeded, built from layers nobody here tuned for graphpass, exported as
a user would (Keras 3: a ``tf.Module`` with a ``train`` signature; TF1: a
MetaGraph). Built in a child process (``fidelity_child.py export``).

* ``gelu_mlp``: Keras 3 ``Dense(64, gelu)`` x3 + ``Dense(1)``, Adam;
* ``mobilenet``: Keras 3 ``MobileNetV2(alpha=0.35)`` at 32x32 (BatchNormalization,
  ReLU6, depthwise convs, residual adds), Adam;
* ``encoder``: two blocks of Keras 3 ``MultiHeadAttention`` + ``LayerNormalization``
  + ``Dense(gelu)`` feed-forward, Adam;
* ``prenorm_ffn``: the TF1 pre-norm FFN of ``tools.fixtures.tf_models``;
* ``bert``, ``gpt2``: keras-hub's ``BertBackbone`` and ``GPT2Backbone`` from config
  (no weights), dropout on, a classification head on the pooled output (BERT) and
  the language-model loss through the tied embedding (GPT-2), Adam; exported as a
  user exports a keras-hub training step (``_export_backbone``).

It only builds; the runs and comparisons live in the child and the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

MODELS = ("gelu_mlp", "mobilenet", "encoder", "convnet", "prenorm_ffn", "bert", "gpt2")
#: The inputs the child feeds are ints in [0, 4): vocabularies, segments and
#: classes hold at least that many.
BACKBONE = {"batch": 4, "sequence": 16, "vocabulary": 64, "layers": 2, "heads": 2,
            "hidden": 32, "intermediate": 64}


def model_path(directory: Path, name: str) -> Path:
    """Where ``export`` puts ``name``'s model under ``directory``."""
    return directory / "model.meta" if name == "prenorm_ffn" else directory


def export(name: str, directory: Path) -> Path:
    if name == "prenorm_ffn":
        return _export_tf1(directory)
    if name in ("bert", "gpt2"):
        return _export_backbone(name, directory)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model, x_spec, y_spec, loss_fn = _KERAS[name](keras, tf)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer = model, optimizer

        @tf.function(input_signature=[x_spec, y_spec])
        def train(self, x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, self.model(x, training=True))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            return {"loss": loss}

    step = Step()
    tf.saved_model.save(step, str(directory), signatures={"train": step.train})
    return directory


def _gelu_mlp(keras, tf):
    width, batch = 64, 32
    model = keras.Sequential([keras.Input((width,))]
                             + [keras.layers.Dense(width, activation="gelu") for _ in range(3)]
                             + [keras.layers.Dense(1)])
    return (model, tf.TensorSpec((batch, width), tf.float32, name="x"),
            tf.TensorSpec((batch, 1), tf.float32, name="y"),
            lambda y, p: tf.reduce_mean(tf.square(p - y)))


def _mobilenet(keras, tf):
    batch, side = 4, 32
    model = keras.applications.MobileNetV2(weights=None, input_shape=(side, side, 3),
                                           classes=4, alpha=0.35)
    return (model, tf.TensorSpec((batch, side, side, 3), tf.float32, name="x"),
            tf.TensorSpec((batch,), tf.int32, name="y"),
            lambda y, p: tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, p)))


def _encoder(keras, tf):
    batch, sequence, width, heads = 4, 16, 32, 2
    inputs = keras.Input((sequence, width))
    h = inputs
    for _ in range(2):
        attended = keras.layers.MultiHeadAttention(heads, width // heads)(h, h)
        h = keras.layers.LayerNormalization(epsilon=1e-6)(h + attended)
        ff = keras.layers.Dense(2 * width, activation="gelu")(h)
        ff = keras.layers.Dense(width)(ff)
        h = keras.layers.LayerNormalization(epsilon=1e-6)(h + ff)
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    return (model, tf.TensorSpec((batch, sequence, width), tf.float32, name="x"),
            tf.TensorSpec((batch, 1), tf.float32, name="y"),
            lambda y, p: tf.reduce_mean(tf.square(p - y)))


def _convnet(keras, tf):
    """Residual blocks of biased convolutions (as ResNet50's), batch norm and ReLU:
    oneDNN fuses each convolution's filter gradient with its bias gradient."""
    batch, side, width = 4, 16, 16
    inputs = keras.Input((side, side, 3))
    h = keras.layers.Conv2D(width, 3, padding="same", name="stem")(inputs)
    for i in range(1, 5):
        y = keras.layers.Conv2D(width, 3, padding="same", name=f"block{i}_conv")(h)
        y = keras.layers.BatchNormalization(name=f"block{i}_bn")(y)
        h = keras.layers.ReLU(name=f"block{i}_relu")(h + y)
    pooled = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(4)(pooled))
    return (model, tf.TensorSpec((batch, side, side, 3), tf.float32, name="x"),
            tf.TensorSpec((batch,), tf.int32, name="y"),
            lambda y, p: tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, p, from_logits=True)))


_KERAS = {"gelu_mlp": _gelu_mlp, "mobilenet": _mobilenet, "encoder": _encoder,
          "convnet": _convnet}


def _export_tf1(directory: Path) -> Path:
    import numpy as np

    from tools.fixtures.tf_models import prenorm_ffn

    model = prenorm_ffn(layers=4)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.meta"
    path.write_bytes(model.meta_graph.SerializeToString())
    path.with_suffix(".json").write_text(json.dumps(
        {"loss": model.loss, "train_op": model.train_op, "init": model.init}))
    np.savez(path.with_suffix(".npz"), **model.feeds)
    return path


def _export_backbone(name: str, directory: Path) -> Path:
    """A keras-hub backbone's training step as a ``train`` signature. Its dropout
    layers draw from ``SeedGenerator`` state variables, which
    ``tf.saved_model.save`` must find tracked by the module (it refuses the step
    otherwise): the module holds them (``self.seeds``)."""
    import keras
    import keras_hub
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    size = BACKBONE
    batch, sequence = size["batch"], size["sequence"]
    common = {"vocabulary_size": size["vocabulary"], "num_layers": size["layers"],
              "num_heads": size["heads"], "hidden_dim": size["hidden"],
              "intermediate_dim": size["intermediate"], "max_sequence_length": sequence}
    ints = tf.TensorSpec((batch, sequence), tf.int32)
    if name == "bert":
        backbone = keras_hub.models.BertBackbone(num_segments=4, **common)
        head = keras.layers.Dense(4)
        specs = {"token_ids": ints, "segment_ids": ints, "padding_mask": ints,
                 "y": tf.TensorSpec((batch,), tf.int32)}

        def loss_of(inputs):
            features = {k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")}
            logits = head(backbone(features, training=True)["pooled_output"])
            return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                inputs["y"], logits, from_logits=True))
    else:
        backbone = keras_hub.models.GPT2Backbone(**common)
        head = None
        specs = {"token_ids": ints, "padding_mask": ints}

        def loss_of(inputs):
            features = {k: inputs[k] for k in ("token_ids", "padding_mask")}
            hidden = backbone(features, training=True)
            logits = backbone.token_embedding(hidden, reverse=True)
            return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                inputs["token_ids"][:, 1:], logits[:, :-1], from_logits=True))

    loss_of({key: tf.zeros(spec.shape, spec.dtype) for key, spec in specs.items()})
    variables = backbone.trainable_variables + (head.trainable_variables if head else [])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(variables)
    signature = [tf.TensorSpec(spec.shape, spec.dtype, name=key) for key, spec in specs.items()]

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head, self.optimizer = backbone, head, optimizer
            self.seeds = [v for v in backbone.non_trainable_variables if "seed" in v.path]

        @tf.function(input_signature=signature)
        def train(self, *inputs):
            with tf.GradientTape() as tape:
                loss = loss_of(dict(zip(specs, inputs)))
            grads = tape.gradient(loss, variables)
            self.optimizer.apply_gradients(zip(grads, variables))
            return {"loss": loss}

    step = Step()
    tf.saved_model.save(step, str(directory), signatures={"train": step.train})
    return directory
