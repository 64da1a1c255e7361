"""A small reverse-mode autodiff over standard ONNX ops: it writes the gradient
graph of a forward graph into the same graph, in standard ops.

This is the second, independent way the tools produce ONNX training steps (the
first is the hand-written backward of ``onnx_models.block_mlp`` and
``conv_net``): ``onnx_models.transformer`` and ``onnx_models.shipped_layers``
(the first layers of a model that ships with the ``onnx`` package) get their
backward here, and every builder checks the result against central finite
differences (``onnx_models.check_gradients``).

Gradients flow backwards over the forward nodes in reverse order, summed where
a value has several readers; only values between the parameters and the loss
get one. Broadcasting ops sum their gradient back to the operand's shape. Static
shapes (ONNX shape inference of the forward) decide the broadcast axes, the
``ConvTranspose`` output padding and the mean counts; the forward graph must have
static shapes. Supported ops are the keys of ``_RULES``; anything else on the
path from a parameter to the loss raises ``NotImplementedError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

#: Opset from which ReduceSum (13) and ReduceMean (18) take ``axes`` as an input.
_AXES_AS_INPUT = {"ReduceSum": 13, "ReduceMean": 18}


class _Backward:
    """Emits the gradient nodes of one forward graph through builder ``b``
    (``b.op(op_type, inputs, name, **attrs)`` appends a one-output node named
    like its output; ``b.const(name, value, dtype)`` an initializer)."""

    def __init__(self, b, shapes: dict[str, tuple], opset: int) -> None:
        self.b = b
        self.shapes = shapes
        self.opset = opset
        self.grads: dict[str, list[str]] = {}
        self.constants: dict[tuple, str] = {}

    # -- helpers ------------------------------------------------------------

    def const(self, value, dtype=np.float32) -> str:
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.constants:
            self.constants[key] = self.b.const(f"gradients/const{len(self.constants)}", array,
                                               dtype)
        return self.constants[key]

    def reduce(self, op: str, x: str, axes: list[int], name: str, keepdims: int) -> str:
        if self.opset >= _AXES_AS_INPUT[op]:
            return self.b.op(op, [x, self.const(axes, np.int64)], name, keepdims=keepdims)
        return self.b.op(op, [x], name, axes=axes, keepdims=keepdims)

    def unbroadcast(self, grad: str, grad_shape: tuple, shape: tuple, name: str) -> str:
        """Sum ``grad`` over the axes numpy broadcasting added or stretched."""
        lead = len(grad_shape) - len(shape)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(shape)
                                    if d == 1 and grad_shape[lead + i] != 1]
        if not axes:
            return grad
        summed = self.reduce("ReduceSum", grad, axes, f"{name}/sum", keepdims=1)
        return self.b.op("Reshape", [summed, self.const(shape, np.int64)], f"{name}/unbroadcast")

    def add(self, value: str, grad: str) -> None:
        self.grads.setdefault(value, []).append(grad)

    def total(self, value: str, name: str) -> str:
        parts = self.grads[value]
        return parts[0] if len(parts) == 1 else self.b.op("Sum", parts, f"{name}/accumulate")

    # -- the pass -----------------------------------------------------------

    def run(self, nodes: list[onnx.NodeProto], loss: str, params: list[str]) -> dict[str, str]:
        needed = _between(nodes, set(params), loss)
        self.grads[loss] = [self.const(1.0)]
        for node in reversed(nodes):
            if node.output[0] not in needed or node.output[0] not in self.grads:
                continue
            rule = _RULES.get(node.op_type)
            if rule is None:
                raise NotImplementedError(f"no gradient for {node.op_type} ({node.name})")
            grad = self.total(node.output[0], f"gradients/{node.name}")
            for value, contribution in rule(self, node, grad, f"gradients/{node.name}"):
                if value in needed or value in params:
                    self.add(value, contribution)
        return {p: self.total(p, f"gradients/{p}") for p in params if p in self.grads}


def _between(nodes: list[onnx.NodeProto], params: set[str], loss: str) -> set[str]:
    """Values computed from a parameter that the loss is computed from."""
    downstream = set(params)
    for node in nodes:
        if downstream & set(node.input):
            downstream.update(node.output)
    upstream = {loss}
    for node in reversed(nodes):
        if upstream & set(node.output):
            upstream.update(node.input)
    return downstream & upstream


def add_gradients(b, inputs: list, loss: str, params: list[str],
                  opset: int) -> dict[str, str]:
    """Append the gradient of scalar ``loss`` with respect to each of ``params`` to
    builder ``b`` (its nodes so far are the forward); return param -> gradient."""
    forward = helper.make_graph(list(b.nodes), "forward", inputs,
                                [helper.make_tensor_value_info(loss, onnx.TensorProto.FLOAT, [])],
                                initializer=b.initializers)
    model = helper.make_model(forward, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {t.name: tuple(t.dims) for t in b.initializers}
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = info.type.tensor_type.shape.dim
        shapes[info.name] = tuple(d.dim_value for d in dims)
    return _Backward(b, shapes, opset).run(list(b.nodes), loss, params)


# -- rules: (backward, node, output gradient, name) -> [(input, its gradient)] --------


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _elementwise(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """Add, Sub, Mul, Div with broadcasting."""
    a, c = node.input
    out = bw.shapes[node.output[0]]
    op = node.op_type
    if op in ("Add", "Sub"):
        da, dc = grad, grad if op == "Add" else bw.b.op("Neg", [grad], f"{name}/neg")
    elif op == "Mul":
        da = bw.b.op("Mul", [grad, c], f"{name}/da")
        dc = bw.b.op("Mul", [grad, a], f"{name}/db")
    else:  # Div: d/da = 1/c, d/dc = -y/c
        da = bw.b.op("Div", [grad, c], f"{name}/da")
        dc = bw.b.op("Neg", [bw.b.op("Mul", [da, node.output[0]], f"{name}/da_y")],
                     f"{name}/db")
    return [(a, bw.unbroadcast(da, out, bw.shapes[a], f"{name}/a")),
            (c, bw.unbroadcast(dc, out, bw.shapes[c], f"{name}/b"))]


def _matmul(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    a, c = node.input
    out = bw.shapes[node.output[0]]

    def swap(value: str, tag: str) -> str:
        rank = len(bw.shapes[value])
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        return bw.b.op("Transpose", [value], f"{name}/{tag}_T", perm=perm)

    da = bw.b.op("MatMul", [grad, swap(c, "b")], f"{name}/da")
    dc = bw.b.op("MatMul", [swap(a, "a"), grad], f"{name}/db")
    return [(a, bw.unbroadcast(da, out[:-2] + bw.shapes[a][-2:], bw.shapes[a], f"{name}/a")),
            (c, bw.unbroadcast(dc, out[:-2] + bw.shapes[c][-2:], bw.shapes[c], f"{name}/b"))]


def _relu(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    positive = bw.b.op("Greater", [node.input[0], bw.const(0.0)], f"{name}/positive")
    return [(node.input[0], bw.b.op("Where", [positive, grad, bw.const(0.0)], f"{name}/dx"))]


def _tanh(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    y = node.output[0]
    slope = bw.b.op("Sub", [bw.const(1.0), bw.b.op("Mul", [y, y], f"{name}/y2")], f"{name}/slope")
    return [(node.input[0], bw.b.op("Mul", [grad, slope], f"{name}/dx"))]


def _softmax(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """``y * (dy - sum(dy * y))`` over the softmax axis."""
    y = node.output[0]
    axis = _attrs(node).get("axis", -1)
    dot = bw.reduce("ReduceSum", bw.b.op("Mul", [grad, y], f"{name}/dy_y"), [axis],
                    f"{name}/dot", keepdims=1)
    return [(node.input[0], bw.b.op("Mul", [y, bw.b.op("Sub", [grad, dot], f"{name}/centered")],
                                    f"{name}/dx"))]


def _gelu(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """Exact GELU: ``Phi(x) + x phi(x)``."""
    if _attrs(node).get("approximate", "none") != "none":
        raise NotImplementedError("tanh-approximated Gelu")
    x = node.input[0]
    cdf = bw.b.op("Mul", [bw.const(0.5), bw.b.op("Add", [
        bw.const(1.0), bw.b.op("Erf", [bw.b.op("Mul", [x, bw.const(1 / math.sqrt(2))],
                                                f"{name}/scaled")], f"{name}/erf")],
        f"{name}/one_plus_erf")], f"{name}/cdf")
    square = bw.b.op("Mul", [x, x], f"{name}/x2")
    pdf = bw.b.op("Mul", [bw.const(1 / math.sqrt(2 * math.pi)), bw.b.op(
        "Exp", [bw.b.op("Mul", [square, bw.const(-0.5)], f"{name}/exponent")], f"{name}/exp")],
        f"{name}/pdf")
    slope = bw.b.op("Add", [cdf, bw.b.op("Mul", [x, pdf], f"{name}/x_pdf")], f"{name}/slope")
    return [(x, bw.b.op("Mul", [grad, slope], f"{name}/dx"))]


def _layer_norm(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """Normalization over the last axis: the statistics are recomputed here."""
    x, scale, *bias = node.input
    attrs = _attrs(node)
    if attrs.get("axis", -1) not in (-1, len(bw.shapes[x]) - 1):
        raise NotImplementedError("LayerNormalization over more than the last axis")
    op = bw.b.op

    def mean(value: str, tag: str) -> str:
        return bw.reduce("ReduceMean", value, [-1], f"{name}/{tag}", keepdims=1)

    centered = op("Sub", [x, mean(x, "mean")], f"{name}/centered")
    variance = mean(op("Mul", [centered, centered], f"{name}/sq"), "variance")
    inv_std = op("Reciprocal", [op("Sqrt", [op("Add", [variance, bw.const(
        attrs.get("epsilon", 1e-5))], f"{name}/var_eps")], f"{name}/std")], f"{name}/inv_std")
    normed = op("Mul", [centered, inv_std], f"{name}/normed")
    out = bw.shapes[node.output[0]]
    dnormed = op("Mul", [grad, scale], f"{name}/dnormed")
    correction = op("Add", [mean(dnormed, "mean_dn"), op("Mul", [normed, mean(
        op("Mul", [dnormed, normed], f"{name}/dn_n"), "mean_dn_n")], f"{name}/proj")],
        f"{name}/correction")
    dx = op("Mul", [inv_std, op("Sub", [dnormed, correction], f"{name}/dn_c")], f"{name}/dx")
    found = [(x, dx), (scale, bw.unbroadcast(op("Mul", [grad, normed], f"{name}/dscale_full"),
                                             out, bw.shapes[scale], f"{name}/scale"))]
    if bias:
        found.append((bias[0], bw.unbroadcast(grad, out, bw.shapes[bias[0]], f"{name}/bias")))
    return found


def _transpose(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    perm = _attrs(node).get("perm") or list(reversed(range(len(bw.shapes[node.input[0]]))))
    inverse = [perm.index(i) for i in range(len(perm))]
    return [(node.input[0], bw.b.op("Transpose", [grad], f"{name}/dx", perm=inverse))]


def _reshape(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """Reshape, Flatten, Identity, inference Dropout: the gradient in the input's shape."""
    x = node.input[0]
    shape = bw.const(bw.shapes[x], np.int64)
    return [(x, bw.b.op("Reshape", [grad, shape], f"{name}/dx"))]


def _reduce_mean(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """ReduceMean and ReduceSum (axes as attribute or input), and GlobalAveragePool."""
    x = node.input[0]
    shape = bw.shapes[x]
    if node.op_type == "GlobalAveragePool":
        axes = list(range(2, len(shape)))
    elif len(node.input) > 1:
        axes = [int(a) for a in bw.b.value(node.input[1])]
    else:
        axes = _attrs(node).get("axes") or list(range(len(shape)))
    axes = [a % len(shape) for a in axes]
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    grad = bw.b.op("Reshape", [grad, bw.const(kept, np.int64)], f"{name}/kept")
    if node.op_type != "ReduceSum":
        count = int(np.prod([shape[a] for a in axes]))
        grad = bw.b.op("Mul", [grad, bw.const(1.0 / count)], f"{name}/scaled")
    return [(x, bw.b.op("Expand", [grad, bw.const(shape, np.int64)], f"{name}/dx"))]


def _conv(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """2-D convolution, one group, no dilation: ``ConvTranspose`` for the input,
    a strided correlation of input and output gradient for the weights."""
    x, w, *bias = node.input
    attrs = _attrs(node)
    if attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise NotImplementedError("grouped or dilated Conv")
    kernel = bw.shapes[w][2:]
    strides = attrs.get("strides", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    in_hw, out_hw = bw.shapes[x][2:], bw.shapes[node.output[0]][2:]
    extra = [in_hw[i] - ((out_hw[i] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + 2])
             for i in range(2)]
    found = [(x, bw.b.op("ConvTranspose", [grad, w], f"{name}/dx", strides=strides, pads=pads,
                         kernel_shape=list(kernel), output_padding=extra))]
    x_t = bw.b.op("Transpose", [x], f"{name}/x_T", perm=[1, 0, 2, 3])
    dy_t = bw.b.op("Transpose", [grad], f"{name}/dy_T", perm=[1, 0, 2, 3])
    corr = bw.b.op("Conv", [x_t, dy_t], f"{name}/correlate", dilations=strides, pads=pads)
    corr = bw.b.op("Slice", [corr, bw.const([0, 0], np.int64), bw.const(kernel, np.int64),
                             bw.const([2, 3], np.int64)], f"{name}/window")
    found.append((w, bw.b.op("Transpose", [corr], f"{name}/dw", perm=[1, 0, 2, 3])))
    if bias:
        found.append((bias[0], bw.reduce("ReduceSum", grad, [0, 2, 3], f"{name}/db", keepdims=0)))
    return found


def _max_pool(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    """Scatter-add the gradient to the argmax positions (the forward node is given
    its ``Indices`` output: flat positions in the input)."""
    x = node.input[0]
    if len(node.output) < 2:
        node.output.append(f"{node.output[0]}/indices")
    flat = bw.const([-1], np.int64)
    size = int(np.prod(bw.shapes[x]))
    zeros = bw.const(np.zeros(size, np.float32))
    indices = bw.b.op("Reshape", [node.output[1], flat], f"{name}/indices")
    values = bw.b.op("Reshape", [grad, flat], f"{name}/values")
    scattered = bw.b.op("ScatterElements", [zeros, indices, values], f"{name}/scatter",
                        reduction="add")
    return [(x, bw.b.op("Reshape", [scattered, bw.const(bw.shapes[x], np.int64)], f"{name}/dx"))]


def _concat(bw: _Backward, node, grad: str, name: str) -> list[tuple[str, str]]:
    axis = _attrs(node)["axis"]
    start, found = 0, []
    for i, value in enumerate(node.input):
        end = start + bw.shapes[value][axis]
        found.append((value, bw.b.op("Slice", [grad, bw.const([start], np.int64),
                                               bw.const([end], np.int64),
                                               bw.const([axis], np.int64)], f"{name}/d{i}")))
        start = end
    return found


_RULES: dict[str, Callable] = {
    "Add": _elementwise, "Sub": _elementwise, "Mul": _elementwise, "Div": _elementwise,
    "MatMul": _matmul, "Relu": _relu, "Tanh": _tanh, "Softmax": _softmax, "Gelu": _gelu,
    "LayerNormalization": _layer_norm, "Transpose": _transpose, "Reshape": _reshape,
    "Flatten": _reshape, "Identity": _reshape, "Dropout": _reshape,
    "ReduceMean": _reduce_mean, "ReduceSum": _reduce_mean, "GlobalAveragePool": _reduce_mean,
    "Conv": _conv, "MaxPool": _max_pool, "Concat": _concat,
}
