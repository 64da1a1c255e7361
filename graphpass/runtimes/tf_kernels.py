"""Temporaries TF's own CPU kernels allocate while they run, on the graph TF runs
(``tf_grappler``), for the kernels TF picks under the target's configuration
(``RuntimeConfig``: oneDNN on or off, intra-op threads).

With oneDNN's kernels off (``TF_ENABLE_ONEDNN_OPTS=0``, and the default on CPUs
without the instructions oneDNN wants), ``Conv2DBackpropFilter`` and
``Conv2DBackpropInput`` are TF's "custom" kernels: each lowers its convolution
to one matrix product over an im2col buffer allocated from the step's
allocator. The buffer holds as many images as fit a fixed working set
(TF's constant for an L3 cache), not as many as the batch has, so it is as
large at batch 2 as at batch 64, up to that working set per kernel, and at small
batch sizes it can be the step's largest tensor. With oneDNN on the kernels are
oneDNN's, renamed after Grappler, whose scratch this module does not model.

The figures are TF's kernel sources' (``conv_grad_filter_ops.cc``,
``conv_grad_input_ops.h``); TF offers no API that says what a kernel allocates
before it runs, so they are written here once, and a test checks them against
the allocation records of a run.
"""

from __future__ import annotations

from functools import cache

from graphpass.ir.dtypes import np_dtype
from graphpass.ir.graph import Graph, Tensor
from graphpass.options import RuntimeConfig

#: The working set the custom kernels size their im2col buffer to, in bytes.
WORKING_SET_BYTES = 30 << 20
#: Below this many bytes of work per thread, the input-gradient kernel batches
#: images into one buffer instead of contracting one image at a time in parallel.
PER_THREAD_MIN_BYTES = 256 << 10
FILTER_GRAD = "Conv2DBackpropFilter"
INPUT_GRAD = "Conv2DBackpropInput"
#: The dtypes TF registers the custom kernels for.
KERNEL_DTYPES = ("float32", "float16", "bfloat16", "float64")
#: What ``Node.meta`` holds a kernel's temporaries under (``RuntimeModel.scratch_shapes``).
META_KEY = "kernel_temporaries"


#: Ops oneDNN's layout pass (``MklLayoutRewritePass``, run on the graph after
#: Grappler) replaces with a node of its own (``_MklNative<op>``, ``_Mkl<op>``)
#: whatever their inputs, for the dtypes in :data:`ONEDNN_DTYPES`: TF's rewrite
#: table, as far as a training step meets it (the ops it rewrites only where an
#: input is already oneDNN's are never rewritten in native format).
ONEDNN_RENAMED_OPS = frozenset({
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3D",
    "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
    "_FusedConv2D", "_FusedDepthwiseConv2dNative", "MatMul", "_FusedMatMul",
    "BatchMatMul", "BatchMatMulV2", "Einsum", "Softmax", "AvgPool", "AvgPoolGrad",
    "AvgPool3D", "AvgPool3DGrad", "MaxPool", "MaxPoolGrad", "MaxPool3D", "MaxPool3DGrad",
    "FusedBatchNorm", "FusedBatchNormGrad", "FusedBatchNormV2", "FusedBatchNormGradV2",
    "FusedBatchNormV3", "FusedBatchNormGradV3", "_FusedBatchNormEx",
})
#: The dtypes oneDNN registers those kernels for.
ONEDNN_DTYPES = frozenset({"float32", "bfloat16"})
#: Ops whose ``BiasAdd`` Grappler's remapper fuses into them (``_FusedConv2D``,
#: ``_FusedMatMul``, named as the ``BiasAdd``) on the CPU: the graph Grappler
#: returns has the fused node (``tf_grappler_ask.optimize`` places it as a session
#: does); the IR, which the planner estimates in that graph's order, keeps the
#: ``BiasAdd``, which the layout pass replaces with the fused node.
BIAS_FUSED_OPS = frozenset({"Conv2D", "MatMul", "DepthwiseConv2dNative"})


@cache
def host_onednn() -> bool:
    """Whether this process's TF runs oneDNN's kernels (``TF_ENABLE_ONEDNN_OPTS``,
    else TF's default for this CPU), as TF itself decides it: the oracle asks
    Grappler in this process only where this is the target's setting."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def renamed_by_onednn(graph: Graph, name: str, onednn: bool) -> bool:
    """Whether oneDNN's layout pass replaces node ``name`` of Grappler's graph with
    a new node where TF runs oneDNN's kernels (``onednn``). The new node is added
    to TF's graph after every node Grappler returned (the partition graphs a run
    reports end with them), and the executor's first ready nodes and each node's
    successors follow the order nodes were added: it reaches them after their
    peers."""
    op = graph.node(name).op
    if op == "BiasAdd":
        producer = graph.input_slots(name).get(0)
        fused = producer is not None and graph.node(producer.node).op in BIAS_FUSED_OPS
    else:
        fused = False
    return onednn and (fused or op in ONEDNN_RENAMED_OPS) and \
        graph.dialect.dtype(graph, Tensor(name, 0)) in ONEDNN_DTYPES


def mark_temporaries(graph: Graph, config: RuntimeConfig) -> int:
    """Record on each node of ``graph`` (a graph TF runs) the temporaries its kernel
    allocates under ``config``; the number of nodes marked."""
    if config.onednn:
        return 0
    threads = config.intra_op_threads
    marked = 0
    for node in graph.nodes():
        if node.op in (FILTER_GRAD, INPUT_GRAD) and \
                (shapes := col_buffer(graph, node.name, threads)) is not None:
            node.meta[META_KEY] = [(Tensor(node.name, 0), shapes)]
            marked += 1
    return marked


def col_buffer(graph: Graph, name: str, threads: int) -> tuple[int, ...] | None:
    """The shape of the im2col buffer TF's custom kernel for the convolution
    gradient ``name`` allocates with ``threads`` intra-op threads, or None where
    a shape it depends on is unknown (or the kernel is not the custom one)."""
    dialect = graph.dialect
    if dialect.get_attr(graph, name, "data_format", "NHWC") != "NHWC":
        return None
    op = graph.node(name).op
    inputs = graph.inputs(name)
    filter_shape = dialect.shape(graph, Tensor(name, 0) if op == FILTER_GRAD else inputs[1])
    out_backprop = dialect.shape(graph, inputs[2])
    if not _known(filter_shape, 4) or not _known(out_backprop[1:] if out_backprop else None, 3):
        return None
    rows, cols, in_depth, out_depth = filter_shape
    pixels = out_backprop[1] * out_backprop[2]
    patch = rows * cols * in_depth
    work = pixels * patch + pixels * out_depth + patch * out_depth
    dtype = dialect.dtype(graph, inputs[2])
    if dtype not in KERNEL_DTYPES or work == 0:
        return None
    itemsize = np_dtype(dtype).itemsize
    target = WORKING_SET_BYTES // itemsize
    images = (target + work - 1) // work
    if op == INPUT_GRAD and (out_backprop[0] == 1 or
                             work // threads >= PER_THREAD_MIN_BYTES // itemsize):
        images = 1  # one image at a time, the contraction itself parallel
    return (images, pixels, patch)


def _known(shape: tuple | None, rank: int) -> bool:
    return shape is not None and len(shape) == rank and \
        all(d is not None and d >= 0 for d in shape)
