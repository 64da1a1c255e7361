"""onnxruntime's runtime model, as the memory estimate needs it: which outputs
share their input's buffer (aliasing kernels, the MatMul fusions that fold a
Transpose or a scale away), which ops write in place, which fuse into their
producer, and the scratch tensors a kernel holds while it runs.

Pure functions of the graph and what inference recorded on it: they never edit
the graph, never run inference (the analyses ask for shapes first) and never
import onnxruntime (the model is written down here, not measured).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from graphpass.dialects.onnx_attrs import get_attr
from graphpass.dialects.onnx_ops import ALIAS_OPS, DEFAULT_DOMAINS, INPLACE_OPS
from graphpass.dialects.onnx_shapes import broadcast, constant_value, tensor_dtype, tensor_shape
from graphpass.formats.ort_artifacts import MS_DOMAIN
from graphpass.ir.graph import Tensor

if TYPE_CHECKING:
    from graphpass.ir.graph import Graph


def output_alias(graph: Graph, name: str, port: int) -> int | None:
    """onnxruntime's aliasing kernels (``ALIAS_OPS``), and a ``Transpose`` of the
    last two axes read only by ``MatMul``s: ORT's ``MatmulTransposeFusion``
    folds it into them (``FusedMatMul`` with ``transA``/``transB``), so its
    output is never allocated and the MatMuls read its input instead (the
    ``input^T @ grad`` of every weight gradient)."""
    node = graph.node(name)
    if port != 0 or node.domain not in DEFAULT_DOMAINS:
        return None
    if node.op in ALIAS_OPS or (node.op == "Transpose" and _fused_transpose(graph, name)):
        return 0
    if node.op in ("Mul", "Div"):
        return _fused_scale(graph, name)
    return None


def _fused_scale(graph: Graph, name: str) -> int | None:
    """The scaled input's slot when ORT's ``MatMulScaleFusion`` folds this
    product with a scalar constant into a MatMul (``FusedMatMul`` with ``alpha``):
    its only reader is a MatMul (it scales an operand), or its scaled input is
    a MatMul's output read only here (it scales the result). Either way no
    buffer of its own: the MatMul reads or writes the scaled input's."""
    inputs = graph.input_slots(name)
    if len(inputs) != 2 or set(graph.node(name).outputs) & output_names(graph):
        return None
    slots = [s for s in (0, 1) if not _scalar_constant(graph, inputs[s])]
    if len(slots) != 1 or (graph.node(name).op == "Div" and slots != [0]):
        return None
    slot, scaled = slots[0], inputs[slots[0]]
    users = graph.data_users(name)
    if len(users) == 1 and graph.node(users[0]).op == "MatMul" and \
            list(graph.inputs(users[0])).count(Tensor(name, 0)) == 1:
        return slot
    producer = graph.node(scaled.node)
    if producer.op == "MatMul" and graph.data_users(scaled.node) == [name]:
        return slot
    return None


def fuses_into_producer(graph: Graph, name: str, slot: int) -> bool:
    """ORT's ``MatMulScaleFusion`` (a scalar-constant ``Mul``/``Div`` of a MatMul's
    output read only there: ``lr * g`` of an SGD step) and ``MatMulAddFusion`` (an
    ``Add`` to a 2-D MatMul's output read only there, the other operand of
    shape ``[N]``, ``[1, N]``, ``[M, 1]`` or ``[M, N]``, as one Gemm:
    ``mu * v + g`` of a momentum step)."""
    node = graph.node(name)
    inputs = graph.input_slots(name)
    producer = inputs.get(slot)
    if node.domain not in DEFAULT_DOMAINS or producer is None or \
            graph.node(producer.node).op != "MatMul" or \
            graph.node(producer.node).domain not in DEFAULT_DOMAINS or \
            graph.consumers(producer) != [(name, slot)] or \
            set(graph.node(producer.node).outputs) & output_names(graph):
        return False
    if node.op in ("Mul", "Div"):
        return _fused_scale(graph, name) == slot
    return node.op == "Add" and len(inputs) == 2 and _gemm_bias(graph, producer.node,
                                                                inputs[1 - slot])


def _gemm_bias(graph: Graph, matmul: str, bias: Tensor) -> bool:
    """``MatMulAddFusion``'s conditions on the MatMul (2-D float operands) and the
    other ``Add`` operand (a bias Gemm broadcasts one way)."""
    a, b = (tensor_shape(graph, t) for t in graph.inputs(matmul))
    shape = tensor_shape(graph, bias)
    if a is None or b is None or shape is None or len(a) != 2 or len(b) != 2 or \
            tensor_dtype(graph, bias) not in ("float32", "float16", "bfloat16"):
        return False
    m, n = a[0], b[1]
    return shape in ((n,), (1, n), (m, 1), (m, n)) and None not in (m, n)


def _scalar_constant(graph: Graph, tensor: Tensor) -> bool:
    shape = tensor_shape(graph, tensor)
    return shape is not None and None not in shape and math.prod(shape) == 1 and \
        constant_value(graph, tensor) is not None


#: onnxruntime training kernels that hold temporaries of their input 0's shape while
#: they run -> how many (measured on ORT 1.19's CPU kernels: the peak of the op alone
#: less its outputs; ``LayerNormalizationGrad`` keeps its ``A``, ``B``, ``C`` terms
#: and ``X - mean`` at full size).
INPUT_SIZED_SCRATCH = {"LayerNormalizationGrad": 4}


def fused_unlike_its_copy(graph: Graph, name: str) -> bool:
    """Where ORT's ``SkipLayerNormFusion`` would fold a residual ``Add`` into the
    ``LayerNormalization`` reading it alone, in a copy or in the original a copy
    leaves behind. The fused CPU kernel leaves the mean and inverse deviation
    uncomputed, and ``LayerNormalizationGrad`` reads both: the step stops
    ("Missing Input"). Two sides of one fact:

    * the normalisation, where its ``Add`` is read by others too: unfused as the
      original, but a copy of the pair has an ``Add`` only the copied
      normalisation reads;
    * the ``Add``, where the normalisation's gradient is its only other reader
      (a post-norm residual): the rewrite moves that read to the copy, and the
      original ``Add``, now read by the normalisation alone, is fused.
    """
    node = graph.node(name)
    if node.domain not in DEFAULT_DOMAINS:
        return False
    if node.op == "LayerNormalization":
        source = graph.input_slots(name).get(0)
        producer = graph.node(source.node) if source is not None else None
        return producer is not None and _reads_stats(graph, name) and \
            producer.op == "Add" and producer.domain in DEFAULT_DOMAINS and \
            len(graph.consumers(source)) > 1
    return node.op == "Add" and _only_norm_and_its_gradient(graph, name)


def _reads_stats(graph: Graph, norm: str) -> bool:
    """A ``LayerNormalization`` whose mean or inverse deviation is read."""
    node = graph.node(norm)
    return node.op == "LayerNormalization" and node.domain in DEFAULT_DOMAINS and \
        bool({1, 2} & set(graph.used_ports(norm)))


def _only_norm_and_its_gradient(graph: Graph, add: str) -> bool:
    """``add``'s value is input 0 of a normalisation with its statistics read, and
    every other reader reads those statistics too (the normalisation's gradient),
    so moving the gradient's reads to a copy leaves the normalisation its only
    reader."""
    consumers = graph.consumers(Tensor(add, 0))
    norms = [r for r, slot in consumers if slot == 0 and _reads_stats(graph, r)]
    if len(norms) != 1:
        return False
    statistics = {reader for port in (1, 2)
                  for reader, _ in graph.consumers(Tensor(norms[0], port))}
    return {r for r, _ in consumers} - {norms[0]} <= statistics


def scratch_shapes(graph: Graph, name: str) -> list[tuple[Tensor, tuple]]:
    """onnxruntime's CPU ``Where`` broadcasts twice before it writes its output:
    ``condition ? X : 0`` and ``condition ? 0 : Y``, each a tensor of its own of
    the condition and that operand broadcast together (a ReLU gradient
    ``Where(x > 0, g, 0)`` holds two more tensors of ``g``'s size meanwhile).
    And the training kernels of ``INPUT_SIZED_SCRATCH``."""
    node = graph.node(name)
    inputs = graph.input_slots(name)
    copies = INPUT_SIZED_SCRATCH.get(node.op, 0) if node.domain == MS_DOMAIN else 0
    if copies and 0 in inputs:
        shape = tensor_shape(graph, inputs[0])
        return [] if shape is None else [(Tensor(name, 0), shape)] * copies
    if node.op != "Where" or node.domain not in DEFAULT_DOMAINS or len(inputs) != 3:
        return []
    condition = tensor_shape(graph, inputs[0])
    scratch = []
    for slot in (1, 2):
        operand = tensor_shape(graph, inputs[slot])
        if condition is None or operand is None:
            return []
        scratch.append((Tensor(name, 0), broadcast(condition, operand)))
    return scratch


def forwardable_inputs(graph: Graph, name: str) -> tuple[int, ...]:
    """Input 0 of onnxruntime's in-place kernels (``INPLACE_OPS``): its allocation
    planner gives their output the input's buffer when this read is its last. And
    the MatMul's slot of an ``Add`` that ``MatMulAddFusion`` folds into it (a bias
    add: one Gemm, ``FusedGemm`` with a following activation, writes the sum where
    the product would have gone, so the product never has a buffer of its own)."""
    node = graph.node(name)
    if node.domain not in DEFAULT_DOMAINS:
        return ()
    if node.op in INPLACE_OPS:
        return (0,)
    if node.op == "Add":
        return tuple(s for s in (0, 1) if fuses_into_producer(graph, name, s))
    return ()


def _fused_transpose(graph: Graph, name: str) -> bool:
    perm = get_attr(graph, name, "perm")
    users = graph.data_users(name)
    return perm is not None and len(perm) >= 2 and \
        list(perm) == [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2] and \
        bool(users) and all(graph.node(u).op == "MatMul" for u in users) and \
        not set(graph.node(name).outputs) & output_names(graph)


def output_names(graph: Graph) -> frozenset[str]:
    """The graph's output value names, gathered once per outputs list (the memory
    estimate asks per node)."""
    outputs = graph.format_state.outputs
    cached = _OUTPUT_NAMES.get(graph)
    if cached is None or cached[0] is not outputs or cached[1] != len(outputs):
        cached = _OUTPUT_NAMES[graph] = (outputs, len(outputs),
                                         frozenset(v.name for v in outputs))
    return cached[2]


#: Per graph: (its outputs list, its length, their names), for ``output_names``.
_OUTPUT_NAMES: WeakKeyDictionary = WeakKeyDictionary()
