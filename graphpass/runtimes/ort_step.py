"""What the onnxruntime installed here does with a model: the order it runs the
nodes in (``optimized_order``: ``ORTModel``'s oracle), and one step, the check that
no rewrite is written which onnxruntime cannot run (``ORTModel.check_written``).

The rewrite is loaded as onnxruntime loads a training step (its default graph
optimizations: the fusions a rewrite can wake up) and run once on zeros, every
unknown dimension 1, from bytes in memory (nothing is written: the rewrite's data
loaded beside it). Values do not matter: a kernel that finds an input missing,
or a graph the session refuses, fails on any. Where the rewrite fails, the input
is tried the same way: if onnxruntime cannot run the input either (plain
onnxruntime has no kernels for onnxruntime-training's gradient ops), the rewrite
is not to blame and goes unstepped, with the reason; else it is refused.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

#: onnxruntime's input types -> numpy dtype names (``verify`` feeds them too).
ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
              "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(uint8)": "uint8",
              "tensor(int8)": "int8"}
#: The most this check feeds one input: a larger one is not stepped here.
MAX_FEED_BYTES = 2**30
#: "... while running LayerNormalizationGrad node. Name:'n' Status Message: ..."
_NODE_FAILED = re.compile(r"running (\S+) node\. Name:'([^']*)' Status Message: (.*)", re.S)
#: What ORT puts before its own words: the status code, the file it loaded, the C++
#: source location and signature of the check that failed.
_PREFIXES = re.compile(r"^(\[ONNXRuntimeError\] : \d+ : \w+ : |Load model from .*? failed:|"
                       r"/\S+:\d+ [^(]*\([^)]*\)( const)?( \[with [^\]]*\])? )")


class StepFailed(Exception):
    """onnxruntime could not load or run the model; the message is one line."""


def step_once(model: Path | bytes) -> None:
    """Load ``model`` (a file, or a serialized model) in an onnxruntime session and
    run it once on zeros; raise :class:`StepFailed` saying which node failed and
    why, or that an input is too large to feed here. Where a step fed all-ones
    dimensions fails, it is fed again with the dimensions an input shares with an
    output as that output has them (``_dims_outputs_give``)."""
    import onnxruntime as ort

    session = _session(ort, model, _options(ort))
    try:
        session.run(None, _zeros(session))
    except Exception as exc:
        bound = _dims_outputs_give(model, session)
        if not bound:
            raise StepFailed(node_failure(str(exc))) from None
        try:
            session.run(None, _zeros(session, bound))
        except Exception as again:
            raise StepFailed(node_failure(str(again))) from None


def _session(ort, model: Path | bytes, options):
    """``model`` loaded in an onnxruntime session on the CPU, or :class:`StepFailed`."""
    try:
        return ort.InferenceSession(model if isinstance(model, bytes) else str(model),
                                    options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's Fail, InvalidGraph, NotImplemented...
        raise StepFailed(f"it does not load: {_first_line(exc)}") from None


def _options(ort):
    options = ort.SessionOptions()
    # One thread: the check must not compete with the build; fatal only: a failing
    # node's error comes back as the exception, not as a log line on stderr.
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return options


def _zeros(session, bound: dict[str, int] | None = None) -> dict:
    """Zeros for every input of ``session``: each named dimension as ``bound`` has it,
    else 1."""
    import numpy as np

    bound = bound or {}
    feeds = {}
    for value in session.get_inputs():
        if value.type not in ORT_DTYPES:
            raise StepFailed(f"input {value.name!r} is a {value.type}, which this check "
                             "cannot feed")
        shape = [d if isinstance(d, int) else bound.get(d, 1) for d in value.shape or ()]
        dtype = np.dtype(ORT_DTYPES[value.type])
        if math.prod(shape) * dtype.itemsize > MAX_FEED_BYTES:
            raise StepFailed(f"input {value.name!r} of shape {shape} is over "
                             f"{MAX_FEED_BYTES >> 30} GiB, more than this check feeds")
        feeds[value.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _dims_outputs_give(model: Path | bytes, session) -> dict[str, int]:
    """The sizes of the named dimensions an input shares with a graph output, found by
    running the part of the model that computes those outputs (onnx's extractor).
    ORT's tutorial names a loss's labels by its logits' rows (``tokens``: a
    language model's batch times its sequence): fed one row each, the loss refuses
    them. Empty where no input shares a name or the part does not run."""
    import onnx
    import onnxruntime as ort
    from onnx.utils import Extractor

    named = {d for value in session.get_inputs() for d in value.shape or () if isinstance(d, str)}
    outputs = {value.name: value.shape for value in session.get_outputs()
               if any(isinstance(d, str) and d in named for d in value.shape or ())}
    if not outputs:
        return {}
    proto = onnx.load_model_from_string(model) if isinstance(model, bytes) else onnx.load(model)
    try:
        part = Extractor(proto).extract_model([i.name for i in proto.graph.input], list(outputs))
        computed = _session(ort, part.SerializeToString(), _options(ort))
        values = computed.run(list(outputs), _zeros(computed))
    except Exception:  # noqa: BLE001 - the part does not run: nothing to learn from it
        return {}
    bound: dict[str, int] = {}
    for shape, value in zip(outputs.values(), values):
        for dim, size in zip(shape, value.shape):
            if isinstance(dim, str):
                bound.setdefault(dim, size)
    return bound


def optimized_order(model: bytes) -> list[str]:
    """The nodes of ``model`` in the order onnxruntime runs them, asked from it: a
    session loads the model as a training step is loaded (every graph
    optimization) and saves the graph it optimized, whose nodes it writes in the
    order its executor runs them (both are its ``GraphViewer``'s topological
    order). A node onnxruntime fused has a name of its own there; nothing runs."""
    import onnx
    import onnxruntime as ort

    options = _options(ort)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory(prefix="graphpass-ort-") as directory:
        options.optimized_model_filepath = str(Path(directory) / "optimized.onnx")
        _session(ort, model, options)
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return [node.name for node in optimized.graph.node]


def version() -> str:
    import onnxruntime as ort

    return ort.__version__


def training_hint(failure: str) -> str:
    """Why an input with training ops does not load here: plain onnxruntime has no
    kernels for onnxruntime-training's gradient and accumulation ops."""
    from graphpass.installed import MissingRuntime, require_onnxruntime_training

    if "com.microsoft" not in failure:
        return ""
    try:
        require_onnxruntime_training()
    except MissingRuntime:
        return "; its training ops run in onnxruntime-training, not installed here"
    return ""


def node_failure(message: str) -> str:
    """onnxruntime's error of a failed run as one line: the node, its op and the
    kernel's own words."""
    found = _NODE_FAILED.search(message)
    if found is None:
        return f"it does not run: {_first_line(message)}"
    op, node, status = found.groups()
    return f"node {node!r} ({op}) fails: {_first_line(status)}"


def _first_line(error) -> str:
    """The first line of onnxruntime's message, in its own words."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    line = " ".join((lines[0] if lines else type(error).__name__).split())
    while (prefix := _PREFIXES.match(line)) is not None:
        line = line[prefix.end():].strip()
    return line
