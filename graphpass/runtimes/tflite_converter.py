"""TensorFlow Lite (LiteRT) as a target: its converter, its model file and its
interpreter's arena, asked rather than modelled wherever they can tell.

* ``convert``: the on-device training recipe (``from_saved_model`` with the
  signatures an app calls, resource variables on, builtin and Select TF ops). A
  step the converter refuses is a one-line ``GraphpassError`` naming the ops it
  could not legalise.
* ``signature_ops`` / ``arena_inputs``: a signature's subgraph as the converter
  wrote it (op names in execution order; tensors, sizes, which are constants).
* ``measured_arena_bytes``: the span of the interpreter's arena for a signature,
  read from the addresses of its planned tensors after it ran.

Imports TensorFlow lazily (a runtime, as ``tf_xla`` does).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from graphpass.errors import GraphpassError

#: The signatures TFLite's on-device training guide converts, in its order; the
#: ones a SavedModel has are converted.
SIGNATURES = ("train", "infer", "save", "restore", "set_weights")
#: Select TF ops (the Flex delegate) are custom ops named ``Flex`` + the TF op.
FLEX_PREFIX = "Flex"
_UNSUPPORTED = re.compile(r"(tf\.[A-Za-z0-9_]+)")


def saved_signatures(directory: str | os.PathLike) -> list[str]:
    """The recipe's signatures the SavedModel at ``directory`` has."""
    from tensorflow.python.saved_model import loader_impl

    try:
        meta = loader_impl.parse_saved_model(str(directory)).meta_graphs[0]
    except Exception as exc:  # TF's IOError or a protobuf DecodeError
        raise GraphpassError(f"TFLite's converter cannot read {directory}: "
                             f"{_first_line(exc)}") from None
    return [s for s in SIGNATURES if s in meta.signature_def]


def convert(directory: str | os.PathLike, signatures: list[str] | None = None) -> bytes:
    """The ``.tflite`` model of the SavedModel at ``directory`` (module docstring)."""
    import tensorflow as tf

    keys = signatures or saved_signatures(directory)
    if "train" not in keys:
        raise GraphpassError(f"{directory}: --target litert converts a SavedModel's 'train' "
                             "signature (TFLite's on-device training recipe); it has none")
    try:
        # Loading reads the function library, which TF may refuse where graphpass's
        # reader did not (an op TF does not register): the converter never starts.
        converter = tf.lite.TFLiteConverter.from_saved_model(str(directory),
                                                             signature_keys=keys)
    except Exception as exc:  # TF's own errors, one class per status code
        raise GraphpassError(f"TFLite's converter cannot load the SavedModel: "
                             f"{_first_line(exc).split('. ')[0]}") from None
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                           tf.lite.OpsSet.SELECT_TF_OPS]
    converter.experimental_enable_resource_variables = True
    try:
        return converter.convert()
    except Exception as exc:  # the converter raises its own ConverterError
        raise GraphpassError(_refusal(exc)) from None


def _refusal(exc: Exception) -> str:
    """One line: the TF ops the converter could not legalise, or its first line."""
    text = str(exc)
    ops = sorted(set(_UNSUPPORTED.findall(text)))
    if ops:
        return (f"TFLite's converter cannot convert {len(ops)} op(s) of the step, neither "
                f"builtin nor Select TF ops: {', '.join(ops[:10])}; move them out of the step "
                "or use --target tf")
    return f"TFLite's converter refused the step: {_first_line(exc)}"


def _first_line(exc: Exception) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()),
                type(exc).__name__).strip()


@dataclass(frozen=True)
class Subgraph:
    """A signature's subgraph: ``ops`` (op names, execution order) with each op's
    ``(inputs, outputs)`` tensor indices, the subgraph's inputs and outputs, each
    tensor's static bytes (None: dynamic) and which tensors are constants.
    ``tensor_names``: each tensor's name, which the converter forms from the TF
    nodes it came from (``;`` between the nodes it fused, a digit appended where
    a name repeats): what ties a converted op to the graph."""

    ops: list[str]
    io: list[tuple[list[int], list[int]]]
    inputs: list[int]
    outputs: list[int]
    sizes: dict[int, int | None]
    constants: frozenset[int]
    tensor_names: tuple[str, ...]

    def flex_ops(self) -> list[str]:
        """The Select TF ops, by TF op name, in first-use order."""
        return list(dict.fromkeys(op[len(FLEX_PREFIX):] for op in self.ops
                                  if op.startswith(FLEX_PREFIX)))


def subgraph(content: bytes, signature: str = "train") -> Subgraph:
    """The subgraph ``signature`` runs in the ``.tflite`` ``content``."""
    import numpy as np
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    index = next((s.subgraphIndex for s in model.signatureDefs or []
                  if s.signatureKey.decode() == signature), None)
    if index is None:
        raise GraphpassError(f"the converted model has no {signature!r} signature")
    graph = model.subgraphs[index]
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    types = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    ops, io = [], []
    for op in graph.operators or []:
        code = model.operatorCodes[op.opcodeIndex]
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        custom = code.customCode.decode() if code.customCode else None
        ops.append(custom or names.get(builtin, str(builtin)))
        io.append(([int(t) for t in _ints(op.inputs) if t >= 0],
                   [int(t) for t in _ints(op.outputs) if t >= 0]))
    sizes, constants = {}, set()
    for i, tensor in enumerate(graph.tensors or []):
        buffer = model.buffers[tensor.buffer] if tensor.buffer else None
        if buffer is not None and (buffer.data is not None and len(buffer.data) or buffer.size):
            constants.add(i)
        shape = [int(d) for d in _ints(tensor.shapeSignature if tensor.shapeSignature
                                       is not None else tensor.shape)]
        itemsize = _itemsize(np, types.get(tensor.type, ""))
        sizes[i] = None if itemsize is None or any(d < 0 for d in shape) else \
            int(np.prod(shape, dtype=np.int64)) * itemsize
    names = tuple(t.name.decode() for t in graph.tensors or [])
    return Subgraph(ops, io, [int(t) for t in _ints(graph.inputs)],
                    [int(t) for t in _ints(graph.outputs)], sizes, frozenset(constants), names)


def _ints(values) -> list[int]:
    return [] if values is None else list(values)


def _itemsize(np, type_name: str) -> int | None:
    """Bytes of a TFLite tensor type's element; None for strings, resources, variants."""
    if type_name in ("STRING", "RESOURCE", "VARIANT", ""):
        return None
    names = {"FLOAT32": "float32", "FLOAT16": "float16", "FLOAT64": "float64",
             "INT32": "int32", "INT64": "int64", "INT8": "int8", "UINT8": "uint8",
             "INT16": "int16", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "BOOL": "bool", "COMPLEX64": "complex64", "COMPLEX128": "complex128"}
    return np.dtype(names[type_name]).itemsize if type_name in names else None


def interpreter(content: bytes):
    """A ``tf.lite.Interpreter`` of ``content`` without the default delegates:
    XNNPACK would take ops, and their tensors, out of the arena being measured."""
    import tensorflow as tf
    from tensorflow.lite.python.interpreter import OpResolverType

    return tf.lite.Interpreter(
        model_content=content,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)


def measured_arena_bytes(runner, content: bytes, signature: str = "train") -> int:
    """The arena ``runner`` (an ``interpreter``) planned for ``signature``, once that
    signature has run: the span of the addresses of the subgraph's tensors, from
    its inputs (allocated first, at the arena's start) to the end of the highest
    tensor within the bytes all its static tensors could take. Constants (in the
    model's buffers) and dynamic tensors (allocated apart) fall outside."""
    import numpy as np

    wrapper = runner._interpreter
    index = wrapper.GetSubgraphIndexFromSignature(signature)
    planned = subgraph(content, signature)
    spans = []
    for tensor in range(wrapper.NumTensors(index)):
        if tensor in planned.constants:
            continue
        try:
            # Resource and string tensors have no plain buffer (and the wrapper's
            # view of one is unsafe to ask for); temporaries lie past the model's.
            if wrapper.TensorType(tensor, index) is np.object_:
                continue
            view = wrapper.tensor(runner, tensor, index)
        except ValueError:  # no type or no data: not allocated
            continue
        if view is not None and view.nbytes:
            spans.append((view.__array_interface__["data"][0], view.nbytes, tensor))
    starts = [a for a, _, t in spans if t in planned.inputs]
    if not starts:
        return 0
    base = min(starts)
    bound = base + sum(n for _, n, _ in spans)
    return max(a + n for a, n, _ in spans if base <= a < bound) - base
