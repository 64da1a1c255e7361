"""The models of the fidelity matrix (tests/test_fidelity.py, tools/bench/fidelity.py):
small, seeded, built from layers nobody here tuned for graphpass, exported as
a user would (Keras 3: a ``tf.Module`` with a ``train`` signature; TF1: a
MetaGraph). Built in a child process (``fidelity_child.py export``).

* ``gelu_mlp``: Keras 3 ``Dense(64, gelu)`` x3 + ``Dense(1)``, Adam;
* ``mobilenet``: Keras 3 ``MobileNetV2(alpha=0.35)`` at 32x32 (BatchNormalization,
  ReLU6, depthwise convs, residual adds), Adam; ``mobilenet_v1``: Keras 3
  ``MobileNet(alpha=0.25)`` (depthwise separable convolutions, no residuals, dropout);
* ``tf_keras_transformer``, ``tf_keras_lstm``: tf_keras models in TF1 graph mode
  (``tools.fixtures.keras_models``, ``loop_models``), exported as MetaGraphs;
* ``encoder``: two blocks of Keras 3 ``MultiHeadAttention`` + ``LayerNormalization``
  + ``Dense(gelu)`` feed-forward, Adam;
* ``prenorm_ffn``: the TF1 pre-norm FFN of ``tools.fixtures.tf_models``;
* ``BACKBONES``: keras-hub's backbones from config (no weights), dropout on, Adam,
  one per family that computes otherwise: ``bert`` (post-norm encoder, exact
  GELU), ``albert`` (factorised embedding, one layer shared), ``gpt2`` (pre-norm
  decoder, approximate GELU, tied embedding), ``llama`` (rotary embeddings,
  grouped-query attention, RMSNorm, gated SiLU), ``gemma`` (approximate GELU
  gating, multi-query attention) and ``vit`` (patches by a strided convolution,
  a class token); a classification head (encoders) or the language-model loss
  (decoders); exported as a user exports a keras-hub training step
  (``_export_backbone``).

It only builds; the runs and comparisons live in the child and the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

BACKBONES = ("bert", "albert", "gpt2", "llama", "gemma", "vit")
MODELS = ("gelu_mlp", "mobilenet", "mobilenet_v1", "encoder", "convnet", "prenorm_ffn",
          "tf_keras_transformer", "tf_keras_lstm", *BACKBONES)
#: The inputs the child feeds are ints in [0, 4): vocabularies, segments and
#: classes hold at least that many.
BACKBONE = {"batch": 4, "sequence": 16, "vocabulary": 64, "layers": 2, "heads": 2,
            "hidden": 32, "intermediate": 64}


def model_path(directory: Path, name: str) -> Path:
    """Where ``export`` puts ``name``'s model under ``directory``."""
    return directory / "model.meta" if name in TF1 else directory


def export(name: str, directory: Path) -> Path:
    if name in TF1:
        return write_tf1(TF1[name](), directory)
    if name in BACKBONES:
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
            self.seeds = _seed_states(model)  # dropout's SeedGenerator (as _export_backbone)

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
    return _application(keras, tf, keras.applications.MobileNetV2, alpha=0.35)


def _mobilenet_v1(keras, tf):
    return _application(keras, tf, keras.applications.MobileNet, alpha=0.25)


def _application(keras, tf, application, **options):
    """A Keras 3 application with ``weights=None`` classifying 4 classes of 32x32
    images, batch 4."""
    batch, side = 4, 32
    model = application(weights=None, input_shape=(side, side, 3), classes=4, **options)
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


_KERAS = {"gelu_mlp": _gelu_mlp, "mobilenet": _mobilenet, "mobilenet_v1": _mobilenet_v1,
          "encoder": _encoder, "convnet": _convnet}


def _prenorm_ffn():
    from tools.fixtures.tf_models import prenorm_ffn

    return prenorm_ffn(layers=4)


def _tf_keras_transformer():
    from tools.fixtures.keras_models import transformer

    return transformer(size=16, batch=4)


def _tf_keras_lstm():
    from tools.fixtures.loop_models import lstm

    return lstm(seq=8, batch=4, units=16)


#: The TF1 models (MetaGraphs): our pre-norm FFN, and tf_keras models in graph mode.
TF1 = {"prenorm_ffn": _prenorm_ffn, "tf_keras_transformer": _tf_keras_transformer,
       "tf_keras_lstm": _tf_keras_lstm}


def write_tf1(model, directory: Path) -> Path:
    """A TF1 fixture (``tools.fixtures.tf_models.Model``) as the child runs it: the
    MetaGraph, its names (``.json``) and feeds (``.npz``)."""
    import numpy as np

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
    backbone, head, specs, loss_of = _BACKBONES[name](keras, keras_hub, tf)
    loss_of({key: tf.zeros(spec.shape, spec.dtype) for key, spec in specs.items()})
    variables = backbone.trainable_variables + (head.trainable_variables if head else [])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(variables)
    signature = [tf.TensorSpec(spec.shape, spec.dtype, name=key) for key, spec in specs.items()]

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head, self.optimizer = backbone, head, optimizer
            self.seeds = _seed_states(backbone)

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


def _seed_states(model) -> list:
    """The ``SeedGenerator`` state variables of a Keras 3 model's dropout layers."""
    return [v for v in model.non_trainable_variables if "seed" in v.path]


def _text_sizes() -> dict:
    size = BACKBONE
    return {"vocabulary_size": size["vocabulary"], "num_layers": size["layers"],
            "hidden_dim": size["hidden"], "intermediate_dim": size["intermediate"]}


def _token_specs(tf, names: tuple[str, ...]) -> dict:
    ints = tf.TensorSpec((BACKBONE["batch"], BACKBONE["sequence"]), tf.int32)
    return dict.fromkeys(names, ints)


def _classifier(keras, tf, backbone, head, features, pooled):
    """The loss of a classification head on what ``pooled`` takes of the
    backbone's output on ``features`` (names of inputs, or one input's name),
    labels ``y``."""
    def loss_of(inputs):
        given = inputs[features] if isinstance(features, str) else {
            k: inputs[k] for k in features}
        logits = head(pooled(backbone(given, training=True)))
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            inputs["y"], logits, from_logits=True))
    return loss_of


def _language_model(keras, tf, backbone, logits_of):
    """The next-token loss of a decoder, logits from its output by ``logits_of``."""
    def loss_of(inputs):
        hidden = backbone({k: inputs[k] for k in ("token_ids", "padding_mask")}, training=True)
        logits = logits_of(hidden)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            inputs["token_ids"][:, 1:], logits[:, :-1], from_logits=True))
    return loss_of


def _labels(tf) -> dict:
    return {"y": tf.TensorSpec((BACKBONE["batch"],), tf.int32)}


def _bert(keras, keras_hub, tf):
    features = ("token_ids", "segment_ids", "padding_mask")
    backbone = keras_hub.models.BertBackbone(
        num_segments=4, num_heads=BACKBONE["heads"],
        max_sequence_length=BACKBONE["sequence"], **_text_sizes())
    head = keras.layers.Dense(4)
    return (backbone, head, {**_token_specs(tf, features), **_labels(tf)},
            _classifier(keras, tf, backbone, head, features, lambda o: o["pooled_output"]))


def _albert(keras, keras_hub, tf):
    """A factorised embedding (narrower than the hidden width, projected up) and
    one transformer layer shared by every repetition."""
    features = ("token_ids", "segment_ids", "padding_mask")
    backbone = keras_hub.models.AlbertBackbone(
        num_segments=4, num_heads=BACKBONE["heads"], embedding_dim=BACKBONE["hidden"] // 2,
        num_groups=1, num_inner_repetitions=1, dropout=0.1,
        max_sequence_length=BACKBONE["sequence"], **_text_sizes())
    head = keras.layers.Dense(4)
    return (backbone, head, {**_token_specs(tf, features), **_labels(tf)},
            _classifier(keras, tf, backbone, head, features, lambda o: o["pooled_output"]))


def _gpt2(keras, keras_hub, tf):
    backbone = keras_hub.models.GPT2Backbone(
        num_heads=BACKBONE["heads"], max_sequence_length=BACKBONE["sequence"],
        **_text_sizes())
    return (backbone, None, _token_specs(tf, ("token_ids", "padding_mask")),
            _language_model(keras, tf, backbone,
                            lambda h: backbone.token_embedding(h, reverse=True)))


def _llama(keras, keras_hub, tf):
    """Rotary position embeddings, grouped-query attention (4 query heads
    sharing 2 key/value heads), RMSNorm, a gated SiLU feed-forward and an
    untied output embedding (``LlamaCausalLM``'s head)."""
    backbone = keras_hub.models.LlamaBackbone(
        num_query_heads=4, num_key_value_heads=2, dropout=0.1, tie_word_embeddings=False,
        **_text_sizes())
    return (backbone, None, _token_specs(tf, ("token_ids", "padding_mask")),
            _language_model(keras, tf, backbone,
                            lambda h: backbone.token_embedding(h, reverse=True)))


def _gemma(keras, keras_hub, tf):
    """Approximate GELU gating (``pow(x, 3)``, which Grappler shares with its
    gradient's ``pow(x, 2)``), RMSNorm with ``1 + scale``, multi-query attention,
    the embedding scaled by the width's square root and tied to the output."""
    backbone = keras_hub.models.GemmaBackbone(
        num_query_heads=2, num_key_value_heads=1, head_dim=16, dropout=0.1,
        **_text_sizes())
    return (backbone, None, _token_specs(tf, ("token_ids", "padding_mask")),
            _language_model(keras, tf, backbone,
                            lambda h: backbone.token_embedding(h, reverse=True)))


def _vit(keras, keras_hub, tf):
    """Patches embedded by a strided convolution, a class token, pre-norm blocks."""
    side, batch = 16, BACKBONE["batch"]
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(side, side, 3), patch_size=4, num_layers=BACKBONE["layers"],
        num_heads=BACKBONE["heads"], hidden_dim=BACKBONE["hidden"],
        mlp_dim=BACKBONE["intermediate"], dropout_rate=0.1)
    head = keras.layers.Dense(4)
    images = {"images": tf.TensorSpec((batch, side, side, 3), tf.float32)}
    return (backbone, head, {**images, **_labels(tf)},
            _classifier(keras, tf, backbone, head, "images", lambda o: o[:, 0]))


_BACKBONES = {"bert": _bert, "albert": _albert, "gpt2": _gpt2, "llama": _llama,
              "gemma": _gemma, "vit": _vit}
