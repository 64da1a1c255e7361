"""ONNX models built with ``onnx.helper`` (no network), for tests, examples and
benchmarks.

* Inference nets of real architecture classes with random weights:
  :func:`resnet18` (conv/BN/relu, residual adds, global pool, Gemm),
  :func:`densenet` (concat-heavy dense blocks) and :func:`inception`
  (parallel branches joined by Concat).
* Training steps in standard ONNX ops: forward, hand-written backward and an
  optimizer update in one graph; the loss, the updated parameters and the
  optimizer state are graph outputs (``tools/onnx_optimizers.py``). :func:`block_mlp`
  is the benchmark MLP of ``tools/tf_models.py``
  (block i: ``h = tanh(relu(h @ W_i)) * 2``; loss ``mean(h*h)``) with forward
  nodes under ``block{i}/`` so ``--recompute 'block[1-7]/'`` marks per block;
  :func:`conv_net` is a small conv net with softmax cross-entropy.

Every training builder checks its ONNX gradients before returning them
(:func:`check_gradients`): onnxruntime's gradients against central
differences of an independent float64 numpy forward, along random
directions, and the updates against a float64 numpy optimizer step. A mismatch
raises, so a wrong hand-written backward can never be saved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tools.onnx_optimizers import PREVIEW_DOMAIN, SGD, Optimizer, apply_optimizer, reference_step

OPSET = 17
IR_VERSION = 8
FLOAT = TensorProto.FLOAT


@dataclass
class Built:
    """A generated model, the feeds to run it, and what training builders know."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    loss: str | None = None
    #: parameter tensor name -> its gradient tensor name (training steps).
    gradients: dict[str, str] = field(default_factory=dict)
    #: parameter tensor name -> its updated value's graph output name.
    updates: dict[str, str] = field(default_factory=dict)
    #: optimizer state input name -> its next value's graph output name.
    state: dict[str, str] = field(default_factory=dict)
    optimizer: Optimizer | None = None

    @property
    def carried(self) -> dict[str, str]:
        """Every input or initializer a step replaces -> the output replacing it."""
        return {**self.updates, **self.state}


class _Builder:
    """Appends nodes and initializers; each node's single output is named like the node."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.params: dict[str, np.ndarray] = {}

    def const(self, name: str, value, dtype=np.float32) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def param(self, name: str, shape: tuple[int, ...], scale: float, offset: float = 0.0) -> str:
        value = (offset + self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.params[name] = value
        return self.const(name, value)

    def value(self, name: str) -> np.ndarray:
        """An initializer's value."""
        return next(numpy_helper.to_array(t) for t in self.initializers if t.name == name)

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def model(self, name: str, inputs: list, outputs: list, initializers=None,
              opset: int = OPSET, domains: dict[str, int] | None = None) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs,
                                  initializer=self.initializers if initializers is None
                                  else initializers)
        imports = [helper.make_opsetid("", opset)] + [
            helper.make_opsetid(domain, version) for domain, version in (domains or {}).items()]
        model = helper.make_model(graph, opset_imports=imports,
                                  ir_version=IR_VERSION, producer_name="graphpass.tools")
        onnx.checker.check_model(model)
        return model


# -- inference nets ----------------------------------------------------------


def _conv_bn(b: _Builder, x: str, name: str, c_in: int, c_out: int, kernel: int = 3,
             stride: int = 1, relu: bool = True) -> str:
    w = b.param(f"{name}/W", (c_out, c_in, kernel, kernel), np.sqrt(2.0 / (c_in * kernel ** 2)))
    pad = kernel // 2
    y = b.op("Conv", [x, w], f"{name}/conv", kernel_shape=[kernel, kernel],
             strides=[stride, stride], pads=[pad] * 4)
    y = _bn(b, y, f"{name}/bn", c_out)
    return b.op("Relu", [y], f"{name}/relu") if relu else y


def _bn(b: _Builder, x: str, name: str, channels: int) -> str:
    scale = b.const(f"{name}/scale", 1 + 0.1 * b.rng.standard_normal(channels))
    bias = b.const(f"{name}/bias", 0.1 * b.rng.standard_normal(channels))
    mean = b.const(f"{name}/mean", 0.1 * b.rng.standard_normal(channels))
    var = b.const(f"{name}/var", 1 + 0.1 * b.rng.rand(channels))
    return b.op("BatchNormalization", [x, scale, bias, mean, var], name, epsilon=1e-5)


def _head(b: _Builder, x: str, channels: int, classes: int) -> str:
    pooled = b.op("GlobalAveragePool", [x], "head/pool")
    flat = b.op("Flatten", [pooled], "head/flatten", axis=1)
    w = b.param("head/W", (classes, channels), np.sqrt(1.0 / channels))
    bias = b.const("head/b", np.zeros(classes))
    return b.op("Gemm", [flat, w, bias], "logits", transB=1)


def _image_model(b: _Builder, name: str, batch: int, size: int, logits: str,
                 classes: int) -> Built:
    image = helper.make_tensor_value_info("image", FLOAT, [batch, 3, size, size])
    out = helper.make_tensor_value_info(logits, FLOAT, [batch, classes])
    feeds = {"image": b.rng.standard_normal((batch, 3, size, size)).astype(np.float32)}
    return Built(b.model(name, [image], [out]), feeds)


def resnet18(batch: int = 2, size: int = 32, width: int = 16, classes: int = 10,
             seed: int = 0) -> Built:
    """ResNet-18 layout (stem, 4 stages of 2 basic blocks, pool, Gemm) at a small width."""
    b = _Builder(seed)
    h = _conv_bn(b, "image", "stem", 3, width)
    channels = width
    for stage in range(4):
        out_channels = width * 2 ** stage
        for block in range(2):
            name = f"layer{stage + 1}.{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            y = _conv_bn(b, h, f"{name}/conv1", channels, out_channels, stride=stride)
            y = _conv_bn(b, y, f"{name}/conv2", out_channels, out_channels, relu=False)
            shortcut = h
            if stride != 1 or channels != out_channels:
                shortcut = _conv_bn(b, h, f"{name}/downsample", channels, out_channels,
                                    kernel=1, stride=stride, relu=False)
            h = b.op("Relu", [b.op("Add", [y, shortcut], f"{name}/add")], f"{name}/relu")
            channels = out_channels
    return _image_model(b, "resnet18", batch, size, _head(b, h, channels, classes), classes)


def densenet(batch: int = 2, size: int = 32, growth: int = 8, layers: tuple = (4, 4, 4),
             classes: int = 10, seed: int = 0) -> Built:
    """DenseNet-BC layout: dense blocks (BN-relu-1x1-BN-relu-3x3, concat), transitions."""
    b = _Builder(seed)
    channels = 2 * growth
    h = _conv_bn(b, "image", "stem", 3, channels)
    for i, count in enumerate(layers, start=1):
        for j in range(count):
            name = f"dense{i}.{j}"
            y = b.op("Relu", [_bn(b, h, f"{name}/bn1", channels)], f"{name}/relu1")
            y = _conv_bn(b, y, f"{name}/conv1", channels, 4 * growth, kernel=1)
            w = b.param(f"{name}/conv2/W", (growth, 4 * growth, 3, 3),
                        np.sqrt(2.0 / (36 * growth)))
            y = b.op("Conv", [y, w], f"{name}/conv2", kernel_shape=[3, 3], pads=[1] * 4)
            h = b.op("Concat", [h, y], f"{name}/concat", axis=1)
            channels += growth
        if i < len(layers):
            name = f"transition{i}"
            y = b.op("Relu", [_bn(b, h, f"{name}/bn", channels)], f"{name}/relu")
            w = b.param(f"{name}/W", (channels // 2, channels, 1, 1), np.sqrt(2.0 / channels))
            y = b.op("Conv", [y, w], f"{name}/conv", kernel_shape=[1, 1])
            h = b.op("AveragePool", [y], f"{name}/pool", kernel_shape=[2, 2], strides=[2, 2])
            channels //= 2
    h = b.op("Relu", [_bn(b, h, "final/bn", channels)], "final/relu")
    return _image_model(b, "densenet", batch, size, _head(b, h, channels, classes), classes)


def inception(batch: int = 2, size: int = 32, modules: int = 3, classes: int = 10,
              seed: int = 0) -> Built:
    """GoogLeNet-style modules: 1x1, 1x1-3x3, 1x1-3x3-3x3 and pool-1x1 branches, concat."""
    b = _Builder(seed)
    channels = 32
    h = _conv_bn(b, "image", "stem", 3, channels)
    for i in range(1, modules + 1):
        name = f"mixed{i}"
        c = 8 * i
        branch1 = _conv_bn(b, h, f"{name}/b1x1", channels, c, kernel=1)
        branch2 = _conv_bn(b, _conv_bn(b, h, f"{name}/b3x3_reduce", channels, c, kernel=1),
                           f"{name}/b3x3", c, 2 * c)
        branch3 = _conv_bn(b, h, f"{name}/b5x5_reduce", channels, c // 2, kernel=1)
        branch3 = _conv_bn(b, branch3, f"{name}/b5x5_a", c // 2, c)
        branch3 = _conv_bn(b, branch3, f"{name}/b5x5_b", c, c)
        pooled = b.op("MaxPool", [h], f"{name}/pool", kernel_shape=[3, 3], pads=[1] * 4)
        branch4 = _conv_bn(b, pooled, f"{name}/pool_proj", channels, c, kernel=1)
        h = b.op("Concat", [branch1, branch2, branch3, branch4], f"{name}/concat", axis=1)
        channels = 5 * c
        if i < modules:
            h = b.op("MaxPool", [h], f"{name}/reduce", kernel_shape=[2, 2], strides=[2, 2])
    return _image_model(b, "inception", batch, size, _head(b, h, channels, classes), classes)


# -- training steps ----------------------------------------------------------


def _training_model(b: _Builder, name: str, data_inputs: list, loss: str,
                    gradients: dict[str, str], feeds: dict, params_as_inputs: bool,
                    optimizer: Optimizer, opset: int = OPSET) -> Built:
    """Add the optimizer's updates, make the model, and keep the parameters as
    inputs or initializers. Updated parameters and state are graph outputs,
    each replacing the input or initializer it updates (same shape)."""
    added = apply_optimizer(b, optimizer, gradients)
    outputs = [helper.make_tensor_value_info(loss, FLOAT, [])] + [
        helper.make_tensor_value_info(u, FLOAT, b.params[p].shape)
        for p, u in added.updates.items()]
    outputs += [helper.make_tensor_value_info(out, _elem_type(added.state_values[s]),
                                              added.state_values[s].shape)
                for s, out in added.state.items()]
    inputs = list(data_inputs) + [
        helper.make_tensor_value_info(s, _elem_type(v), v.shape)
        for s, v in added.state_values.items()]
    feeds = {**feeds, **added.state_values}
    initializers = b.initializers
    if params_as_inputs:
        inputs += [helper.make_tensor_value_info(p, FLOAT, v.shape) for p, v in b.params.items()]
        initializers = [t for t in b.initializers if t.name not in b.params]
        feeds = {**feeds, **b.params}
    domains = {PREVIEW_DOMAIN: 1} if optimizer.preview else {}
    model = b.model(name, inputs, outputs, initializers, opset=opset, domains=domains)
    return Built(model, feeds, loss=loss, gradients=dict(gradients), updates=added.updates,
                 state=added.state, optimizer=optimizer)


def _elem_type(value: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)


def block_mlp(batch: int = 16, width: int = 32, blocks: int = 8,
              optimizer: Optimizer = SGD, params_as_inputs: bool = False,
              seed: int = 0, check: bool = True) -> Built:
    """The benchmark MLP as one ONNX training step (forward, backward, optimizer).

    ``check=False`` skips :func:`check_gradients`, for sizes where float32 itself
    is the limit: at 2048 x 1024 the first blocks' float32 gradients miss the
    float64 central difference by more than its rtol along some random
    directions (where ``<grad, v>`` nearly cancels). The graph is the same code
    at every size, and checked at the default one.
    """
    b = _Builder(seed)
    two = b.const("two", 2.0)
    one = b.const("one", 1.0)
    zero = b.const("zero", 0.0)
    h, saved = "x", []
    for i in range(1, blocks + 1):
        w = b.param(f"block{i}/W", (width, width), 1.0 / np.sqrt(width))
        z = b.op("MatMul", [h, w], f"block{i}/MatMul")
        t = b.op("Tanh", [b.op("Relu", [z], f"block{i}/Relu")], f"block{i}/Tanh")
        saved.append((h, w, z, t))
        h = b.op("Mul", [t, two], f"block{i}/mul")
    square = b.op("Mul", [h, h], "square")
    loss = b.op("ReduceMean", [square], "loss", keepdims=0)
    # d loss / d h = 2 h / (batch * width)
    grad = b.op("Mul", [h, b.const("gradients/scale", 2.0 / (batch * width))],
                "gradients/square_grad")
    gradients = {}
    for i in range(blocks, 0, -1):
        h_in, w, z, t = saved[i - 1]
        g = f"gradients/block{i}"
        grad = b.op("Mul", [grad, two], f"{g}/mul_grad")
        t_squared = b.op("Mul", [t, t], f"{g}/tanh_sq")
        grad = b.op("Mul", [grad, b.op("Sub", [one, t_squared], f"{g}/tanh_deriv")],
                    f"{g}/Tanh_grad")
        positive = b.op("Greater", [z, zero], f"{g}/positive")
        grad = b.op("Where", [positive, grad, zero], f"{g}/Relu_grad")
        h_t = b.op("Transpose", [h_in], f"{g}/input_T", perm=[1, 0])
        gradients[w] = b.op("MatMul", [h_t, grad], f"{g}/W_grad")
        if i > 1:
            w_t = b.op("Transpose", [w], f"{g}/W_T", perm=[1, 0])
            grad = b.op("MatMul", [grad, w_t], f"{g}/input_grad")
    x = b.rng.standard_normal((batch, width)).astype(np.float32)
    data = [helper.make_tensor_value_info("x", FLOAT, [batch, width])]
    built = _training_model(b, "block_mlp", data, loss, gradients, {"x": x},
                            params_as_inputs, optimizer)

    def forward(params: dict[str, np.ndarray]) -> float:
        value = x.astype(np.float64)
        for i in range(1, blocks + 1):
            value = np.tanh(np.maximum(value @ params[f"block{i}/W"], 0)) * 2
        return float(np.mean(value * value))

    if check:
        check_gradients(built, forward, b.params)
    return built


def _conv_weight_grad(b: _Builder, x: str, dy: str, name: str) -> str:
    """d loss / d W of a stride-1, pad-1 3x3 Conv: correlate the input with dy over the
    batch (batch and channels swapped so Conv does the sum)."""
    x_t = b.op("Transpose", [x], f"{name}/input_T", perm=[1, 0, 2, 3])
    dy_t = b.op("Transpose", [dy], f"{name}/dy_T", perm=[1, 0, 2, 3])
    corr = b.op("Conv", [x_t, dy_t], f"{name}/correlate", pads=[1] * 4)
    return b.op("Transpose", [corr], f"{name}/W_grad", perm=[1, 0, 2, 3])


def conv_net(batch: int = 4, size: int = 8, classes: int = 10,
             optimizer: Optimizer = SGD, params_as_inputs: bool = False,
             seed: int = 0) -> Built:
    """Two 3x3 conv+relu layers, global pool, a linear head, softmax cross-entropy."""
    b = _Builder(seed)
    zero = b.const("zero", 0.0)
    w1 = b.param("conv1/W", (4, 3, 3, 3), np.sqrt(2.0 / 27))
    w2 = b.param("conv2/W", (8, 4, 3, 3), np.sqrt(2.0 / 36))
    w3 = b.param("head/W", (8, classes), np.sqrt(1.0 / 8))
    z1 = b.op("Conv", ["images", w1], "conv1/Conv", kernel_shape=[3, 3], pads=[1] * 4)
    r1 = b.op("Relu", [z1], "conv1/Relu")
    z2 = b.op("Conv", [r1, w2], "conv2/Conv", kernel_shape=[3, 3], pads=[1] * 4)
    r2 = b.op("Relu", [z2], "conv2/Relu")
    pooled = b.op("GlobalAveragePool", [r2], "head/pool")
    flat = b.op("Flatten", [pooled], "head/flatten", axis=1)
    logits = b.op("MatMul", [flat, w3], "head/logits")
    log_probs = b.op("LogSoftmax", [logits], "head/log_softmax", axis=1)
    picked = b.op("Mul", ["labels", log_probs], "xent/picked")
    total = b.op("ReduceSum", [picked], "xent/sum", keepdims=0)
    loss = b.op("Mul", [total, b.const("xent/neg_mean", -1.0 / batch)], "loss")
    # Backward: d loss / d logits = (softmax - labels) / batch
    g = "gradients"
    probs = b.op("Softmax", [logits], f"{g}/head/softmax", axis=1)
    dlogits = b.op("Mul", [b.op("Sub", [probs, "labels"], f"{g}/head/residual"),
                           b.const(f"{g}/head/scale", 1.0 / batch)], f"{g}/head/logits_grad")
    flat_t = b.op("Transpose", [flat], f"{g}/head/flat_T", perm=[1, 0])
    dw3 = b.op("MatMul", [flat_t, dlogits], f"{g}/head/W_grad")
    w3_t = b.op("Transpose", [w3], f"{g}/head/W_T", perm=[1, 0])
    dflat = b.op("MatMul", [dlogits, w3_t], f"{g}/head/flat_grad")
    dpooled = b.op("Reshape", [dflat, b.const(f"{g}/head/pool_shape", [batch, 8, 1, 1],
                                              np.int64)], f"{g}/head/pool_grad")
    spread = b.op("Expand", [dpooled, b.const(f"{g}/head/map_shape", [batch, 8, size, size],
                                              np.int64)], f"{g}/head/spread")
    dr2 = b.op("Mul", [spread, b.const(f"{g}/head/area", 1.0 / size ** 2)], f"{g}/conv2/Relu_out")
    dz2 = b.op("Where", [b.op("Greater", [z2, zero], f"{g}/conv2/positive"), dr2, zero],
               f"{g}/conv2/Relu_grad")
    dw2 = _conv_weight_grad(b, r1, dz2, f"{g}/conv2")
    dr1 = b.op("ConvTranspose", [dz2, w2], f"{g}/conv2/input_grad", kernel_shape=[3, 3],
               pads=[1] * 4)
    dz1 = b.op("Where", [b.op("Greater", [z1, zero], f"{g}/conv1/positive"), dr1, zero],
               f"{g}/conv1/Relu_grad")
    dw1 = _conv_weight_grad(b, "images", dz1, f"{g}/conv1")
    images = b.rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    labels = np.eye(classes, dtype=np.float32)[b.rng.randint(0, classes, batch)]
    data = [helper.make_tensor_value_info("images", FLOAT, [batch, 3, size, size]),
            helper.make_tensor_value_info("labels", FLOAT, [batch, classes])]
    built = _training_model(b, "conv_net", data, loss, {w1: dw1, w2: dw2, w3: dw3},
                            {"images": images, "labels": labels}, params_as_inputs, optimizer)

    def forward(params: dict[str, np.ndarray]) -> float:
        h = np.maximum(_conv3x3(images.astype(np.float64), params[w1]), 0)
        h = np.maximum(_conv3x3(h, params[w2]), 0)
        logits_ = h.mean(axis=(2, 3)) @ params[w3]
        shifted = logits_ - logits_.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(-(labels * log_p).sum() / batch)

    check_gradients(built, forward, b.params)
    return built


def _conv3x3(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Reference stride-1, pad-1 cross-correlation (ONNX Conv), NCHW / OIHW."""
    windows = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64))


# -- training steps with autodiff backward ------------------------------------------


def transformer(batch: int = 2, seq: int = 8, width: int = 16, blocks: int = 2,
                optimizer: Optimizer = SGD, params_as_inputs: bool = False,
                seed: int = 0, check: bool = True) -> Built:
    """A stack of pre-LN transformer blocks as one training step, opset 20.

    Block i (forward nodes under ``block{i}/``): ``LayerNormalization``,
    single-head attention (``MatMul`` query/key/value projections,
    ``Softmax(q k^T / sqrt(width))``, an output projection), a residual add, a
    second ``LayerNormalization``, an MLP ``MatMul -> Gelu -> MatMul`` of
    hidden width ``4 * width``, a residual add. Loss ``mean(h*h)``. The
    backward comes from :mod:`tools.onnx_autodiff`; ``check`` as in
    :func:`block_mlp`.
    """
    from tools import onnx_autodiff

    b = _Builder(seed)
    scale = b.const("attention/scale", 1.0 / np.sqrt(width))
    h = "x"
    for i in range(1, blocks + 1):
        h = _transformer_block(b, f"block{i}", h, width, scale)
    loss = b.op("ReduceMean", [b.op("Mul", [h, h], "square")], "loss", keepdims=0)
    x = b.rng.standard_normal((batch, seq, width)).astype(np.float32)
    data = [helper.make_tensor_value_info("x", FLOAT, [batch, seq, width])]
    forward = _forward_float64(b, data, loss, TRANSFORMER_OPSET)
    gradients = onnx_autodiff.add_gradients(b, data, loss, list(b.params), TRANSFORMER_OPSET)
    built = _training_model(b, "transformer", data, loss, gradients, {"x": x},
                            params_as_inputs, optimizer, opset=TRANSFORMER_OPSET)
    if check:
        check_gradients(built, lambda p: forward(p, built.feeds), b.params)
    return built


TRANSFORMER_OPSET = 20  # Gelu


def _transformer_block(b: _Builder, scope: str, h: str, width: int, scale: str) -> str:
    def norm(tag: str, value: str) -> str:
        gamma = b.param(f"{scope}/{tag}/scale", (width,), 0.1, offset=1.0)
        beta = b.param(f"{scope}/{tag}/bias", (width,), 0.1)
        return b.op("LayerNormalization", [value, gamma, beta], f"{scope}/{tag}", axis=-1,
                    epsilon=1e-5)

    def dense(tag: str, value: str, shape: tuple[int, int]) -> str:
        weight = b.param(f"{scope}/{tag}/W", shape, 1.0 / np.sqrt(shape[0]))
        return b.op("MatMul", [value, weight], f"{scope}/{tag}")

    normed = norm("ln1", h)
    q, k, v = (dense(name, normed, (width, width)) for name in ("query", "key", "value"))
    k_t = b.op("Transpose", [k], f"{scope}/key_T", perm=[0, 2, 1])
    scores = b.op("Mul", [b.op("MatMul", [q, k_t], f"{scope}/scores"), scale], f"{scope}/scaled")
    probs = b.op("Softmax", [scores], f"{scope}/softmax", axis=-1)
    attended = dense("out", b.op("MatMul", [probs, v], f"{scope}/attend"), (width, width))
    h = b.op("Add", [h, attended], f"{scope}/residual1")
    hidden = b.op("Gelu", [dense("fc1", norm("ln2", h), (width, 4 * width))], f"{scope}/gelu")
    return b.op("Add", [h, dense("fc2", hidden, (4 * width, width))], f"{scope}/residual2")


#: Models of ``onnx/backend/test/data/light`` whose first layers
#: :func:`shipped_layers` knows how to make trainable.
SHIPPED = ("light_squeezenet", "light_vgg19")


def shipped_layers(model: str = "light_squeezenet", layers: int = 10, batch: int = 2,
                   size: int = 32, optimizer: Optimizer = SGD,
                   params_as_inputs: bool = False, seed: int = 0, check: bool = True) -> Built:
    """The first ``layers`` ops of a model that ships with the ``onnx`` package
    (its backend test data), made a training step by :mod:`tools.onnx_autodiff`.

    The "light" models carry their architecture but generate their weights with
    ``ConstantOfShape`` (one fill value); here every weight and bias becomes a
    seeded random initializer of the declared shape, the input is
    ``[batch, 3, size, size]``, the loss ``mean(h*h)`` of the last layer's output,
    the ops are re-emitted at opset 17 (their semantics unchanged since 9), named
    under their layer's scope (``conv1/r0``, ``fire2/r5``).
    """
    from tools import onnx_autodiff

    source = onnx.load(str(Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
                           / f"{model}.onnx"))
    known = {t.name: numpy_helper.to_array(t) for t in source.graph.initializer}
    generated = {n.output[0]: tuple(int(d) for d in known[n.input[0]])
                 for n in source.graph.node if n.op_type == "ConstantOfShape"}
    b = _Builder(seed)
    image = source.graph.input[[i.name for i in source.graph.input].index(_data_input(source))]
    h = image.name
    scope = "input"
    for node in [n for n in source.graph.node if n.op_type != "ConstantOfShape"][:layers]:
        for value in node.input:
            if value not in b.params and (value in generated or value in known):
                shape = generated[value] if value in generated else known[value].shape
                b.param(value, shape, np.sqrt(2.0 / max(1, int(np.prod(shape[1:])))))
                scope = value.split("/")[0].removesuffix("_w_0").removesuffix("_b_0")
        # Named under the layer's scope (conv1/, fire2/), so --recompute auto has segments.
        b.nodes.append(helper.make_node(node.op_type, list(node.input), list(node.output),
                                        name=f"{scope}/{node.output[0]}", **_attrs_of(node)))
        h = node.output[0]
    loss = b.op("ReduceMean", [b.op("Mul", [h, h], "square")], "loss", keepdims=0)
    data = [helper.make_tensor_value_info(image.name, FLOAT, [batch, 3, size, size])]
    feeds = {image.name: b.rng.standard_normal((batch, 3, size, size)).astype(np.float32)}
    forward = _forward_float64(b, data, loss, OPSET)
    gradients = onnx_autodiff.add_gradients(b, data, loss, list(b.params), OPSET)
    built = _training_model(b, model, data, loss, gradients, feeds, params_as_inputs, optimizer)
    if check:
        check_gradients(built, lambda p: forward(p, built.feeds), b.params)
    return built


def _data_input(model: onnx.ModelProto) -> str:
    """The image input: the graph input of rank 4 that no initializer backs."""
    backed = {t.name for t in model.graph.initializer}
    return next(i.name for i in model.graph.input
                if i.name not in backed and len(i.type.tensor_type.shape.dim) == 4)


def _attrs_of(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _make_gelu64():
    """Exact ``Gelu`` for the reference evaluator in the input's precision: it
    expands Gelu into its function body, whose ``Erf`` rounds to float32
    (``otypes="f"``), which turns a float64 model's finite differences into noise."""
    from onnx.reference.op_run import OpRun

    class Gelu(OpRun):
        op_domain = ""

        def _run(self, x, approximate="none"):
            if approximate != "none":
                raise NotImplementedError("tanh-approximated Gelu")
            erf = np.vectorize(math.erf, otypes=[x.dtype])(x / math.sqrt(2))
            return (0.5 * x * (1 + erf),)

    return Gelu


def _forward_float64(b: _Builder, data_inputs: list, loss: str, opset: int
                     ) -> Callable[[dict, dict], float]:
    """The forward graph built so far as a float64 model run by
    ``onnx.reference.ReferenceEvaluator``: the loss as a function of the
    parameters, independent of the gradient graph (and of onnxruntime)."""
    from onnx.reference import ReferenceEvaluator


    def as_double(info):
        dims = [d.dim_value for d in info.type.tensor_type.shape.dim]
        return helper.make_tensor_value_info(info.name, TensorProto.DOUBLE, dims)

    def double_values(tensor):
        value = numpy_helper.to_array(tensor)
        return numpy_helper.from_array(value.astype(np.float64) if tensor.data_type == FLOAT
                                       else value, tensor.name)

    initializers = [double_values(t) for t in b.initializers if t.name not in b.params]
    params = [helper.make_tensor_value_info(p, TensorProto.DOUBLE, v.shape)
              for p, v in b.params.items()]
    output = helper.make_tensor_value_info(loss, TensorProto.DOUBLE, [])
    graph = helper.make_graph(list(b.nodes), "forward64",
                              [as_double(i) for i in data_inputs] + params, [output],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    evaluator = ReferenceEvaluator(model, new_ops=[_make_gelu64()])
    names = [i.name for i in data_inputs]

    def forward(param_values: dict, feeds: dict) -> float:
        inputs = {n: feeds[n].astype(np.float64) for n in names}
        inputs.update({p: np.asarray(v, np.float64) for p, v in param_values.items()})
        return float(evaluator.run([loss], inputs)[0])

    return forward


# -- checking ----------------------------------------------------------------


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
        outputs: list[str] | None = None) -> list[np.ndarray]:
    """Run ``model`` once on CPU with onnxruntime (one thread: reproducible), or with
    ``onnx.reference.ReferenceEvaluator`` when it uses the preview training ops,
    which onnxruntime does not implement."""
    if any(entry.domain == PREVIEW_DOMAIN for entry in model.opset_import):
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        names = set(evaluator.input_names)
        return evaluator.run(outputs, {k: v for k, v in feeds.items() if k in names})
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(outputs, {k: v for k, v in feeds.items() if k in names})


def train_steps(model: onnx.ModelProto, built: Built, steps: int = 3
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run ``steps`` training steps of ``model`` (the original or a rewritten one),
    feeding each step's updated parameters and optimizer state to the next.

    Returns the loss of every step and the final parameters and state, so two
    graphs can be compared exactly (the ONNX twin of ``tf_models.run_steps``).
    """
    current = onnx.ModelProto()
    current.CopyFrom(model)
    carried = built.carried
    feeds = dict(built.feeds)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.name in carried}
    values.update({k: feeds[k] for k in carried if k in feeds})
    losses = []
    for _ in range(steps):
        loss, *updated = run(current, {**feeds, **values}, [built.loss, *carried.values()])
        losses.append(loss)
        values = dict(zip(carried, updated))
        for tensor in current.graph.initializer:
            if tensor.name in values:
                tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    return np.array(losses), values


def check_gradients(built: Built, forward: Callable[[dict], float],
                    params: dict[str, np.ndarray], directions: int = 3,
                    seed: int = 1) -> None:
    """Raise ``AssertionError`` unless the graph's gradients and updates are right.

    The loss must match ``forward`` (float64 numpy); along random directions
    ``v`` each gradient's ``<grad, v>`` must match the central difference of
    ``forward``; and the updated parameters and state must match
    :func:`reference_step` applied to the graph's gradients.
    """
    probe = onnx.ModelProto()
    probe.CopyFrom(built.model)
    grad_names = list(built.gradients.values())
    probe.graph.output.extend(helper.make_tensor_value_info(g, FLOAT, None) for g in grad_names)
    wanted = [built.loss, *grad_names, *built.carried.values()]
    values = dict(zip(wanted, run(probe, built.feeds, wanted)))
    reference = {k: v.astype(np.float64) for k, v in params.items()}
    loss = forward(reference)
    if not np.isclose(values[built.loss], loss, rtol=1e-4, atol=1e-6):
        raise AssertionError(f"loss {values[built.loss]} != numpy reference {loss}")
    rng = np.random.RandomState(seed)
    eps = 1e-6
    for param, grad_name in built.gradients.items():
        grad = values[grad_name].astype(np.float64)
        for _ in range(directions):
            v = rng.standard_normal(grad.shape)
            up = forward({**reference, param: reference[param] + eps * v})
            down = forward({**reference, param: reference[param] - eps * v})
            numeric, analytic = (up - down) / (2 * eps), float((grad * v).sum())
            if not np.isclose(analytic, numeric, rtol=2e-3, atol=1e-6):
                raise AssertionError(
                    f"gradient of {param} ({grad_name}) is wrong: <grad, v> = {analytic}, "
                    f"central difference {numeric}")
    grads = {p: values[g] for p, g in built.gradients.items()}
    state = {s: built.feeds[s] for s in built.state}
    expected = reference_step(built.optimizer, params, grads, state)
    for name, output in built.carried.items():
        if not np.allclose(values[output], expected[name], rtol=1e-5, atol=1e-6):
            raise AssertionError(f"{built.optimizer.kind} update of {name} ({output}) does "
                                 "not match the numpy reference")

