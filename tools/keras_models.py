"""Keras-built training graphs (tf_keras, TF1 graph mode) exported as MetaGraphDefs.

These are the graphs a new user brings: every layer flat under the model's
scope, resource variables, batch-norm moving averages as Keras updates. Each
builder makes a fresh ``tf.Graph``, builds the model with fixed seeds, adds the
loss and a ``tf.compat.v1.train`` optimizer (the updates run under
``control_dependencies`` of the train op) and exports it with the init op and a
saver, so ``graphpass verify`` and ``tools/tf_models.run_steps`` can run it.

* ``mobilenet_v2`` / ``resnet50``: ``tf_keras.applications`` with ``weights=None``
  and a small classifier head; sparse softmax cross-entropy; Momentum.
* ``transformer``: an encoder stack (MultiHeadAttention, LayerNormalization,
  Dense GELU MLP, post-norm residuals) over a token embedding; Adam.
* ``ffn``: a pre-norm FFN stack (``x + MLP(LayerNorm(x))``) over a token embedding; Adam.

The placeholders' batch dimension is static unless ``dynamic_batch`` (then
``None``, for ``--batch-size``).

    python tools/keras_models.py NAME OUT.meta [--size N] [--batch B] [--dynamic-batch]

``--size`` is the image side for the CNNs, the sequence length for the others.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.tf_models import Model, _export, _tf  # noqa: E402

#: Classes of every classifier head (small: the head is not what is measured).
CLASSES = 10
#: Vocabulary of the token models.
VOCAB = 64


def mobilenet_v2(size: int = 32, batch: int = 4, seed: int = 0,
                 dynamic_batch: bool = False) -> Model:
    """tf_keras MobileNetV2 (alpha 1.0) on ``size`` x ``size`` RGB images, Momentum."""
    return _image_classifier("MobileNetV2", size, batch, seed, dynamic_batch)


def resnet50(size: int = 32, batch: int = 4, seed: int = 0,
             dynamic_batch: bool = False) -> Model:
    """tf_keras ResNet50 on ``size`` x ``size`` RGB images, Momentum."""
    return _image_classifier("ResNet50", size, batch, seed, dynamic_batch)


def transformer(size: int = 32, batch: int = 4, seed: int = 0, dynamic_batch: bool = False,
                layers: int = 2, width: int = 64, heads: int = 4) -> Model:
    """Post-norm encoder stack over ``size`` tokens: ``x = LN(x + MHA(x))``,
    ``x = LN(x + MLP(x))`` with a 4x GELU MLP; mean-pooled classifier; Adam."""
    def block(keras, x, i):
        attention = keras.layers.MultiHeadAttention(heads, width // heads, name=f"mha{i}")
        x = keras.layers.LayerNormalization(name=f"ln{i}_a")(x + attention(x, x))
        return keras.layers.LayerNormalization(name=f"ln{i}_b")(x + _mlp(keras, x, width, i))

    return _token_classifier(block, size, batch, seed, dynamic_batch, layers, width)


def ffn(size: int = 32, batch: int = 4, seed: int = 0, dynamic_batch: bool = False,
        layers: int = 4, width: int = 64) -> Model:
    """Pre-norm FFN stack over ``size`` tokens: ``x = x + MLP(LN(x))``; Adam."""
    def block(keras, x, i):
        return x + _mlp(keras, keras.layers.LayerNormalization(name=f"ln{i}")(x), width, i)

    return _token_classifier(block, size, batch, seed, dynamic_batch, layers, width)


BUILDERS = {"mobilenet_v2": mobilenet_v2, "resnet50": resnet50,
            "transformer": transformer, "ffn": ffn}


def _mlp(keras, x, width: int, i: int):
    hidden = keras.layers.Dense(4 * width, activation="gelu", name=f"mlp{i}_in")(x)
    return keras.layers.Dense(width, name=f"mlp{i}_out")(hidden)


def _image_classifier(application: str, size: int, batch: int, seed: int,
                      dynamic_batch: bool) -> Model:
    tf, keras = _keras()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [None if dynamic_batch else batch, size, size, 3],
                                 name="images")
        labels = tf1.placeholder(tf.int32, [None if dynamic_batch else batch], name="labels")
        model = getattr(keras.applications, application)(
            input_shape=(size, size, 3), weights=None, classes=CLASSES,
            classifier_activation=None)
        logits = model(images, training=True)
        train, loss = _train(tf, model, images, labels, logits,
                             tf1.train.MomentumOptimizer(0.01, 0.9))
    rng = np.random.RandomState(seed)
    feeds = {"images:0": rng.standard_normal([batch, size, size, 3]).astype(np.float32),
             "labels:0": rng.randint(0, CLASSES, [batch]).astype(np.int32)}
    return _export(tf, graph, loss, train, feeds)


def _token_classifier(block, size: int, batch: int, seed: int, dynamic_batch: bool,
                      layers: int, width: int) -> Model:
    tf, keras = _keras()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        tokens = tf1.placeholder(tf.int32, [None if dynamic_batch else batch, size],
                                 name="tokens")
        labels = tf1.placeholder(tf.int32, [None if dynamic_batch else batch], name="labels")
        inputs = keras.Input(shape=(size,), dtype="int32", name="model_tokens")
        x = keras.layers.Embedding(VOCAB, width, name="embed")(inputs)
        for i in range(1, layers + 1):
            x = block(keras, x, i)
        x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
        model = keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x),
                            name="encoder")
        logits = model(tokens, training=True)
        train, loss = _train(tf, model, tokens, labels, logits, tf1.train.AdamOptimizer(1e-3))
    rng = np.random.RandomState(seed)
    feeds = {"tokens:0": rng.randint(0, VOCAB, [batch, size]).astype(np.int32),
             "labels:0": rng.randint(0, CLASSES, [batch]).astype(np.int32)}
    return _export(tf, graph, loss, train, feeds)


def _train(tf, model, inputs, labels, logits, optimizer):
    """Mean sparse softmax cross-entropy; the model's updates (batch-norm moving
    averages) run before the optimizer step, as ``control_dependencies(update_ops)``.
    Only the updates of the call on ``inputs``: building a functional model calls
    its layers once more on the model's own ``Input`` placeholder."""
    tf1 = tf.compat.v1
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
        name="loss")
    step = tf1.train.get_or_create_global_step()
    with tf.control_dependencies(model.get_updates_for(inputs)):
        train = optimizer.minimize(loss, global_step=step, var_list=model.trainable_variables,
                                   name="train")
    return train, loss


def _keras():
    """TF in graph mode and tf_keras with a fresh name space (layer names repeat
    exactly from build to build, so exports are byte-identical)."""
    tf = _tf()
    import tf_keras

    tf_keras.backend.clear_session()
    return tf, tf_keras


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(BUILDERS))
    parser.add_argument("out", type=Path, help="where to write the MetaGraphDef (.meta)")
    parser.add_argument("--size", type=int, default=32,
                        help="image side (CNNs) or sequence length (token models)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dynamic-batch", action="store_true",
                        help="placeholders with an unknown (None) batch dimension")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = BUILDERS[args.name](size=args.size, batch=args.batch, seed=args.seed,
                                dynamic_batch=args.dynamic_batch)
    args.out.write_bytes(model.meta_graph.SerializeToString(deterministic=True))
    print(f"{args.out}: loss {model.loss}, train op {model.train_op}, init {model.init}, "
          f"feeds {', '.join(sorted(model.feeds))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
