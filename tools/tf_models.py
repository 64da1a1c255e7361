"""Training graphs built with real TF 1.x-style graph code, for tests, examples
and benchmarks. Each builder returns a :class:`Model`: the exported
MetaGraphDef (collections and saver_def included) plus the names needed to
run it, and deterministic feeds.

``run_steps`` imports any GraphDef/MetaGraphDef into a fresh Session and runs
training steps, returning the losses and every variable's final value: the
yardstick for "the rewritten graph trains identically".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _tf():
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    return tf


@dataclass
class Model:
    meta_graph: object
    loss: str
    train_op: str
    init: str = "init"
    feeds: dict = field(default_factory=dict)

    @property
    def graph_def(self):
        return self.meta_graph.graph_def


def _export(tf, graph, loss, train_op, feeds) -> Model:
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver()
        meta = tf.compat.v1.train.export_meta_graph(graph=graph,
                                                    saver_def=saver.as_saver_def())
    return Model(meta_graph=meta, loss=loss.name, train_op=train_op.name, init=init.name,
                 feeds=feeds)


def block_mlp(batch=16, width=32, blocks=8, optimizer="adam", use_resource=True,
              seed=0, debug_print=False, recompute_grad_blocks=()) -> Model:
    """The benchmark MLP: block i is ``h = tanh(relu(h @ W_i)) * 2``; loss ``mean(h*h)``.

    ``debug_print`` puts a ``tf.print`` (no XLA kernel) into the step.
    ``recompute_grad_blocks`` wraps those blocks in source-level ``tf.recompute_grad``
    (the anchor graphpass is compared with); their weights enter as inputs so the
    recomputed function is pure.
    """
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    rng = np.random.RandomState(seed)

    def block(h, w):
        return tf.tanh(tf.nn.relu(tf.matmul(h, w))) * 2

    with graph.as_default():
        tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [batch, width], name="x")
        h = x
        for i in range(1, blocks + 1):
            with tf1.variable_scope(f"block{i}"):
                w = tf1.get_variable("W", [width, width], use_resource=use_resource,
                                     initializer=tf1.random_normal_initializer(
                                         stddev=1.0 / np.sqrt(width), seed=seed + i))
                if i in recompute_grad_blocks:
                    h = tf.recompute_grad(block)(h, w.read_value())
                else:
                    h = block(h, w)
        printed = [tf.print("h:", tf.reduce_max(h), name="debug_print")] if debug_print else []
        with tf.control_dependencies(printed):
            loss = tf.reduce_mean(h * h, name="loss")
        step = tf1.train.get_or_create_global_step()
        train = _optimizer(tf1, optimizer).minimize(loss, global_step=step, name="train")
    feeds = {"x:0": rng.standard_normal([batch, width]).astype(np.float32)}
    return _export(tf, graph, loss, train, feeds)


def prenorm_ffn(batch=16, width=32, hidden=64, layers=4, seed=0, clip_norm=1.0) -> Model:
    """A pre-norm FFN stack: layer ``i`` is ``h + W2 gelu(W1 LN(h) + b1) + b2``, with the
    layer norm written with ``tf.nn.moments`` and ``rsqrt`` and the exact (erf) GELU;
    loss ``mean(h*h)``; each gradient clipped with ``clip_by_norm``; Adam.

    The ops Grappler rewrites most on CPU (fusable MatMul + BiasAdd, moments'
    SquaredDifference, rsqrt, erf): a remat copy of a layer must come out of
    Grappler the same as the layer itself, bit for bit.
    """
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    rng = np.random.RandomState(seed)

    def dense(h, name, n_in, n_out, i):
        w = tf1.get_variable(f"{name}_W", [n_in, n_out], initializer=tf1.random_normal_initializer(
            stddev=1.0 / np.sqrt(n_in), seed=seed + 10 * i + len(name)))
        b = tf1.get_variable(f"{name}_b", [n_out], initializer=tf1.zeros_initializer())
        return tf.nn.bias_add(tf.matmul(h, w), b)

    with graph.as_default():
        tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [batch, width], name="x")
        h = x
        for i in range(1, layers + 1):
            with tf1.variable_scope(f"layer{i}"):
                gamma = tf1.get_variable("gamma", [width], initializer=tf1.ones_initializer())
                beta = tf1.get_variable("beta", [width], initializer=tf1.zeros_initializer())
                mean, variance = tf.nn.moments(h, axes=[1], keepdims=True)
                normed = (h - mean) * tf.math.rsqrt(variance + 1e-5) * gamma + beta
                up = dense(normed, "up", width, hidden, i)
                gelu = 0.5 * up * (1.0 + tf.math.erf(up / np.sqrt(2.0).astype(np.float32)))
                h = h + dense(gelu, "down", hidden, width, i)
        loss = tf.reduce_mean(h * h, name="loss")
        step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.AdamOptimizer(0.01)
        grads = optimizer.compute_gradients(loss)
        clipped = [(tf.clip_by_norm(g, clip_norm), v) for g, v in grads]
        train = optimizer.apply_gradients(clipped, global_step=step, name="train")
    feeds = {"x:0": rng.standard_normal([batch, width]).astype(np.float32)}
    return _export(tf, graph, loss, train, feeds)


def _optimizer(tf1, name):
    if name == "adam":
        return tf1.train.AdamOptimizer(0.01)
    if name == "momentum":
        return tf1.train.MomentumOptimizer(0.05, 0.9)
    return tf1.train.GradientDescentOptimizer(0.1)


def conv_bn_dropout(batch=8, seed=0) -> Model:
    """Conv net with fused batch norm (moving-average updates), dropout, Momentum,
    ref variables."""
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    rng = np.random.RandomState(seed)
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [batch, 16, 16, 3], name="images")
        labels = tf1.placeholder(tf.int32, [batch], name="labels")
        h = images
        for i, channels in enumerate((8, 16), start=1):
            with tf1.variable_scope(f"conv{i}"):
                k = tf1.get_variable("kernel", [3, 3, h.shape[-1], channels], use_resource=False,
                                     initializer=tf1.glorot_uniform_initializer(seed=seed + i))
                h = tf.nn.conv2d(h, k, strides=1, padding="SAME")
                h = _fused_batch_norm(tf1, h, channels)
                h = tf.nn.relu(h)
                h = tf1.nn.dropout(h, rate=0.25, seed=seed + 10 + i)
        with tf1.variable_scope("head"):
            flat = tf.reshape(h, [batch, -1])
            w = tf1.get_variable("W", [flat.shape[-1], 10], use_resource=False,
                                 initializer=tf1.glorot_uniform_initializer(seed=seed + 7))
            logits = tf.matmul(flat, w)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
            name="loss")
        step = tf1.train.get_or_create_global_step()
        updates = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(updates):
            train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(
                loss, global_step=step, name="train")
    feeds = {
        "images:0": rng.standard_normal([batch, 16, 16, 3]).astype(np.float32),
        "labels:0": rng.randint(0, 10, [batch]).astype(np.int32),
    }
    return _export(tf, graph, loss, train, feeds)


def _fused_batch_norm(tf1, h, channels):
    """Training-mode fused batch norm with moving-average update ops (ref vars)."""
    tf = tf1
    scale = tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer(),
                             use_resource=False)
    offset = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer(),
                              use_resource=False)
    mean_ma = tf1.get_variable("moving_mean", [channels], trainable=False,
                               initializer=tf1.zeros_initializer(), use_resource=False)
    var_ma = tf1.get_variable("moving_variance", [channels], trainable=False,
                              initializer=tf1.ones_initializer(), use_resource=False)
    y, mean, var = tf1.nn.fused_batch_norm(h, scale, offset, is_training=True)
    decay = 0.9
    tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                          tf1.assign_sub(mean_ma, (mean_ma - mean) * (1 - decay)))
    tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                          tf1.assign_sub(var_ma, (var_ma - var) * (1 - decay)))
    del tf
    return y


def control_flow(batch=8, seed=0) -> Model:
    """v1 control flow: a ``tf.cond`` and a ``tf.while_loop`` in the trained path."""
    tf = _tf()
    tf1 = tf.compat.v1
    tf1.disable_control_flow_v2()
    graph = tf.Graph()
    rng = np.random.RandomState(seed)
    with graph.as_default():
        tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [batch, 4], name="x")
        flag = tf1.placeholder(tf.bool, [], name="flag")
        w = tf1.get_variable("W", [4, 4], initializer=tf1.random_normal_initializer(seed=seed))
        h = tf.matmul(x, w)
        h = tf1.cond(flag, lambda: tf.tanh(h), lambda: tf.nn.relu(h))
        _, h = tf1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.sin(v) * 1.5),
                              [tf.constant(0), h])
        loss = tf.reduce_mean(h * h, name="loss")
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step,
                                                                 name="train")
    tf1.enable_control_flow_v2()
    feeds = {"x:0": rng.standard_normal([batch, 4]).astype(np.float32), "flag:0": True}
    return _export(tf, graph, loss, train, feeds)


def function_library(batch=8, seed=0) -> Model:
    """A ``tf.function`` called from the graph: the model lives in the FunctionDefLibrary."""
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    rng = np.random.RandomState(seed)
    with graph.as_default():
        tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [batch, 4], name="x")
        w = tf1.get_variable("W", [4, 4], initializer=tf1.random_normal_initializer(seed=seed))

        @tf.function
        def layer(a, b):
            return tf.tanh(tf.matmul(a, b)) * 2.0

        loss = tf.reduce_mean(tf.square(layer(x, w.read_value())), name="loss")
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step,
                                                                 name="train")
    feeds = {"x:0": rng.standard_normal([batch, 4]).astype(np.float32)}
    return _export(tf, graph, loss, train, feeds)


def clipped_custom_scope(batch=16, width=16, seed=0, train_ops=1) -> Model:
    """Gradients under ``training/grads`` (not ``gradients/``), clipped by global norm
    before ``apply_gradients``; optionally a second, independent train op."""
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    rng = np.random.RandomState(seed)
    with graph.as_default():
        tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [batch, width], name="x")
        step = tf1.train.get_or_create_global_step()
        trains, losses = [], []
        for t in range(train_ops):
            with tf1.variable_scope(f"tower{t}"):
                h = x
                variables = []
                for i in range(1, 4):
                    with tf1.variable_scope(f"block{i}"):
                        w = tf1.get_variable("W", [width, width], initializer=
                                             tf1.random_normal_initializer(stddev=0.3,
                                                                           seed=seed + i + 10 * t))
                        variables.append(w)
                        h = tf.tanh(tf.matmul(h, w)) * 2
                loss = tf.reduce_mean(h * h, name="loss")
                grads = tf1.gradients(loss, variables, name="training/grads")
                clipped, _ = tf.clip_by_global_norm(grads, 1.0)
                opt = tf1.train.MomentumOptimizer(0.1, 0.9, name=f"Momentum{t}")
                trains.append(opt.apply_gradients(zip(clipped, variables),
                                                  global_step=step if t == 0 else None,
                                                  name="train"))
                losses.append(loss)
    feeds = {"x:0": rng.standard_normal([batch, width]).astype(np.float32)}
    return _export(tf, graph, losses[0], trains[0], feeds)


def run_steps(graph_def, model: Model, steps=3, config=None, feeds=None, fetch_extra=()):
    """Import ``graph_def`` into a fresh Session, initialise, train ``steps`` steps.

    Returns ``(losses, variables)``: the loss of every step and the final value of
    every variable (by node name), so two graphs can be compared exactly.
    """
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
        reads = _variable_reads(tf, graph)
    feeds = feeds if feeds is not None else model.feeds
    with tf1.Session(graph=graph, config=config) as session:
        session.run(model.init)
        losses = []
        for _ in range(steps):
            loss, _ = session.run([model.loss, model.train_op], feeds)
            losses.append(loss)
        values = session.run(reads)
        extra = session.run(list(fetch_extra)) if fetch_extra else []
    return np.array(losses), values, extra


def _variable_reads(tf, graph) -> dict:
    from graphpass.inspect.equivalence import variable_value

    return {op.name: variable_value(tf, op) for op in graph.get_operations()
            if op.type in ("VariableV2", "Variable", "VarHandleOp")}
