"""Types of onnxruntime's own ops (``com.microsoft``) that ONNX shape inference
leaves unknown, asked of onnxruntime where it can tell.

onnxruntime ships a symbolic shape inference for its contrib ops
(``onnxruntime.tools.symbolic_shape_infer``: ``Gelu``, ``FusedMatMul``,
``BiasGelu``, the ``LayerNormalization`` variants, ``Attention``, ...), and it is
used first. It knows none of the training ops ``generate_artifacts`` writes
(``*Grad``, ``BatchNormInternal``, ``Scale``, ``InPlaceAccumulatorV2``,
``ConcatTraining``, ``LSTMTraining``, ``GRUTraining``) and stops at the first op it
cannot type, so it is taught them here from ORT's own schemas and conventions
(:data:`TRAINING_OP_TYPES`, :data:`TRAINING_OP_RULES`, and a gradient ``v_grad``
has ``v``'s type: ORT's gradient builder names and shapes it so); neither
onnxruntime's Python API nor ``onnx`` exposes those ops' inference. Where a
training op extends a standard one, the standard op's rule of onnxruntime's own
inference types it (:data:`ORT_RULES`: ``ConcatTraining`` is ``Concat``, values
included, so a shape it concatenates stays known downstream). Where onnxruntime is not
importable, or its inference fails or stops anyway, what it typed so far is
kept and the conventions alone type the rest (:func:`contrib_types` says which
happened). Reads a ``ModelProto``; never touches the IR.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from graphpass.dialects.onnx_ops import tensor_type
from graphpass.formats.ort_artifacts import GRADIENT_SUFFIX, MS_DOMAIN

#: onnxruntime training ops outside ONNX's schemas -> {output port: the input port
#: whose type it has} (ORT's own schemas: ``Scale`` keeps its input's type;
#: ``BatchNormInternal``'s saved and running statistics are per channel, like its
#: scale; ``LayerNormalizationGrad``'s ``dX`` is ``dY``'s, ``dscale`` and ``dbias``
#: the scale's).
TRAINING_OP_TYPES = {"Scale": {0: 0}, "BatchNormInternal": {0: 0, 1: 1, 2: 1, 3: 1, 4: 1},
                     "LayerNormalizationGrad": {0: 0, 1: 2, 2: 2}}
#: ... -> {output port: (dtype name, shape)}: the accumulator's "updated" flag.
TRAINING_OP_FIXED = {"InPlaceAccumulatorV2": {0: ("bool", (1,))}}
#: onnxruntime training ops whose extra outputs carry per-time-step state, by
#: ORT's schemas (``LSTMTraining``: ``all_cell_states`` and the gates ``iofc``;
#: ``GRUTraining``: the gates ``zrh``) -> (gates, the ports shaped
#: ``[seq, directions, batch, hidden]``, the ports shaped ``[directions, batch,
#: hidden]``, the gates' port: ``[seq, directions, batch, gates * hidden]``).
RECURRENT_OPS = {"LSTMTraining": (4, (0, 3), (1, 2), 4), "GRUTraining": (3, (0,), (1,), 2)}
#: Training ops that are a standard op plus outputs of their own -> the rule of
#: onnxruntime's symbolic inference that types their first output.
ORT_RULES = {"ConcatTraining": "_infer_Concat"}
#: ORT's gradient builder names the gradient of ``v`` ``v_grad``, and the partial
#: gradients it sums into it ``v_grad_1``, ``v_grad_2``, ...
_GRADIENT = re.compile(rf"(.+){GRADIENT_SUFFIX}(_[0-9]+)?")

#: What :func:`contrib_types` used.
SYMBOLIC = "onnxruntime's symbolic shape inference (training ops: ORT's conventions)"
CONVENTIONS = "ORT's training-op conventions alone"


def convention_source(node, port: int) -> str | None:
    """The value whose type output ``port`` of ``node`` has by ORT's conventions."""
    same_as = TRAINING_OP_TYPES.get(node.op_type, {}) if node.domain == MS_DOMAIN else {}
    if port in same_as and same_as[port] < len(node.input):
        return node.input[same_as[port]]
    gradient = _GRADIENT.fullmatch(node.output[port])
    return gradient.group(1) if gradient else None


def convention_type(node, port: int, type_of: Callable[[str], tuple | None]) -> tuple | None:
    """``(dtype, shape)`` of output ``port`` of ``node`` by ORT's conventions, from
    ``type_of`` (a value's ``(dtype, shape)`` or None); None if they do not tell."""
    fixed = TRAINING_OP_FIXED.get(node.op_type, {}) if node.domain == MS_DOMAIN else {}
    if port in fixed:
        return fixed[port]
    rule = TRAINING_OP_RULES.get(node.op_type) if node.domain == MS_DOMAIN else None
    if rule is not None:
        return rule(node, port, type_of)
    source = convention_source(node, port)
    known = type_of(source) if source is not None else None
    return known if known is not None and known[1] is not None else None


def _recurrent_type(node, port: int, type_of: Callable[[str], tuple | None]) -> tuple | None:
    """An ``LSTMTraining`` or ``GRUTraining`` output (:data:`RECURRENT_OPS`), from
    ``X`` (``[seq, batch, input]``) and ``R`` (``[directions, gates * hidden, hidden]``)."""
    gates, sequences, finals, gates_port = RECURRENT_OPS[node.op_type]
    x, r = (type_of(node.input[i]) if len(node.input) > i and node.input[i] else None
            for i in (0, 2))
    if x is None or r is None or x[1] is None or r[1] is None or \
            len(x[1]) != 3 or len(r[1]) != 3:
        return None
    (seq, batch, _), (directions, _, hidden) = x[1], r[1]
    if port in sequences:
        return x[0], (seq, directions, batch, hidden)
    if port in finals:
        return x[0], (directions, batch, hidden)
    if port == gates_port:
        return x[0], (seq, directions, batch,
                      gates * hidden if isinstance(hidden, int) else None)
    return None


def _concat_type(node, port: int, type_of: Callable[[str], tuple | None]) -> tuple | None:
    """``ConcatTraining``: ``Concat``'s result, and ``per_input_length``, one int64
    per input (ORT's schema)."""
    if port == 1:
        return "int64", (len(node.input),)
    inputs = [type_of(v) for v in node.input]
    if port != 0 or any(t is None or not t[1] for t in inputs):
        return None
    shapes = [t[1] for t in inputs]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(shapes[0])
    parts = [s[axis] for s in shapes]
    total = None if any(d is None or isinstance(d, str) for d in parts) else sum(parts)
    return inputs[0][0], (*shapes[0][:axis], total, *shapes[0][axis + 1:])


#: Training ops whose outputs' types follow from their inputs' by ORT's schemas.
TRAINING_OP_RULES = {"LSTMTraining": _recurrent_type, "GRUTraining": _recurrent_type,
                     "ConcatTraining": _concat_type}


def contrib_types(model, types: dict) -> str:
    """Add to ``types`` (value -> ``(dtype name, shape)``, shapes with None for
    unknown dims) what onnxruntime's symbolic inference and ORT's conventions give;
    returns what typed them (:data:`SYMBOLIC`, or :data:`CONVENTIONS` and why)."""
    try:
        found, stopped = _symbolic(model)
    except ImportError as error:  # onnxruntime, or the sympy it needs
        found, stopped = {}, f"could not be imported ({_missing_module(error)})"
    except Exception as error:  # noqa: BLE001 - its own bugs must not stop a rewrite
        found, stopped = {}, f"it failed ({type(error).__name__})"
    for name, value in found.items():
        if better(types.get(name), value):
            types[name] = value
    convention_types(model.graph.node, types)
    return SYMBOLIC if stopped is None else \
        f"{CONVENTIONS} (onnxruntime's symbolic shape inference {stopped})"


#: What onnxruntime's symbolic shape inference imports, in the order it does.
_INFERENCE_IMPORTS = ("onnxruntime", "sympy", "packaging")


def _missing_module(error: ImportError) -> str:
    """``no sympy; pip install 'graphpass[onnx]' installs it``: the module whose import
    failed. onnxruntime re-raises a missing sympy as an ImportError of its own,
    which names no module, so the candidates are looked up."""
    import importlib.util

    name = error.name
    if name is None:
        for candidate in _INFERENCE_IMPORTS:
            try:
                if importlib.util.find_spec(candidate) is None:
                    name = candidate
                    break
            except (ImportError, ValueError):
                name = candidate
                break
    if name is None:
        return str(error).splitlines()[0] if str(error) else "an import failed"
    return f"no {name}; pip install 'graphpass[onnx]' installs it"


def unknown_dims(shape: tuple | None) -> float:
    """How little of a shape is known: unknown dims, or infinity for an unknown rank."""
    return float("inf") if shape is None else sum(d is None for d in shape)


def better(old: tuple | None, new: tuple) -> bool:
    """Whether ``(dtype, shape)`` ``new`` knows more than ``old``."""
    return old is None or unknown_dims(new[1]) < unknown_dims(old[1]) or \
        (old[0] is None and new[0] is not None and new[1] == old[1])


def convention_types(nodes, types: dict) -> None:
    """Types by ORT's conventions, one pass in the model's (topological) node order."""
    for node in nodes:
        for port, value in enumerate(node.output):
            if not value or unknown_dims(types.get(value, (None, None))[1]) == 0:
                continue
            found = convention_type(node, port, types.get)
            if found is not None and better(types.get(value), found):
                types[value] = found


def _symbolic(model) -> tuple[dict, str | None]:
    """Every value onnxruntime's inference typed, and where it stopped (None if it
    typed them all). Driven step by step as its ``infer_shapes`` does, which on
    failure would write a file into the working directory."""
    from onnx import ValueInfoProto
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
    _teach(inference, model)
    inference._preprocess(model)
    # An omitted optional output (``LSTMGrad``'s): onnxruntime 1.19 looks its name
    # up like any other's and would stop there.
    inference.known_vi_[""] = ValueInfoProto()
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    found = {name: tensor_type(info.type) for name, info in inference.known_vi_.items() if name}
    if complete:
        return found, None
    typed = {name for name, (_, shape) in found.items() if shape is not None}
    stop = next((n for n in model.graph.node if any(v and v not in typed for v in n.output)),
                None)
    return found, "stopped at " + (f"{stop.domain}::{stop.op_type}" if stop else "?")


def _teach(inference, model) -> None:
    """Register ORT's conventions for the ops it has no rule for: by op type, as
    its dispatcher is keyed."""
    from onnx import helper

    from graphpass.dialects.onnx_ops import dtype_enum, dtype_name

    def type_of(name: str) -> tuple | None:
        info = inference.known_vi_.get(name)
        if info is None or not info.type.HasField("tensor_type"):
            return None
        tensor = info.type.tensor_type
        return dtype_name(tensor.elem_type), [
            d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in tensor.shape.dim]

    def infer(node, first: int = 0) -> None:
        for port, value in enumerate(node.output[first:], start=first):
            found = convention_type(node, port, type_of) if value else None
            if found is not None:
                inference.known_vi_[value] = helper.make_tensor_value_info(
                    value, dtype_enum(found[0]), list(found[1]))

    def extended(node) -> None:  # the standard op's rule, then the outputs it adds
        getattr(inference, ORT_RULES[node.op_type])(node)
        infer(node, 1)

    for node in model.graph.node:
        if node.domain == MS_DOMAIN and node.op_type not in inference.dispatcher_:
            inference.dispatcher_[node.op_type] = \
                extended if hasattr(inference, ORT_RULES.get(node.op_type, "?")) else infer
