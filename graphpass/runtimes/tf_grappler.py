"""The graph TF's executor runs, asked from TF instead of modelled (the TF runtime
model's oracle): Grappler's meta optimizer (``tf_optimizer.OptimizeGraph``) run on
the step with a session's default ``RewriterConfig``, its fetches in the
``train_op`` collection so that nothing they need is pruned, read back into the IR.

Grappler's remapper fuses differently with oneDNN on and off, and TF reads that
setting once per process: where this process's setting is not the target's
(``RuntimeConfig.onednn``), Grappler is asked in a child process started with
the target's, so the answer never depends on the build machine.

Its nodes carry the temporaries TF's kernels allocate under the target's
configuration (``tf_kernels``). This is the graph a ``Session`` hands its executor,
less what runs after Grappler (the graph optimization passes: oneDNN's
``MklLayoutRewritePass`` replaces nodes with its kernels', which only a run shows,
in ``RunMetadata``'s partition graphs; the order its new nodes take in the
executor is modelled, ``tf_kernels.renamed_by_onednn``). Where TF is not
installed, or refuses the graph, :func:`runtime_graph` says why, and callers keep
the hand model (``tf_order.GrapplerView``).

It reads the graph and never edits it; node names Grappler keeps are the IR's
(Grappler renames only what it creates or folds), so the result maps back by name.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys

from graphpass.formats.tf_function import library_functions, outer_graph_def
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.installed import TENSORFLOW, installed
from graphpass.ir.graph import Graph
from graphpass.options import RuntimeConfig
from graphpass.runtimes.base import RuntimeGraph
from graphpass.runtimes.tf_kernels import mark_temporaries

#: The most elements a tensor attr may have for Grappler to be asked: TF's constant
#: folding makes none larger than 10 MiB, and reading a larger one (a splat of an
#: absurd shape) in Python to check it would allocate all of it.
MAX_CHECKED_ELEMENTS = 2**28
#: Where a session places a node without a device, on a machine without a GPU.
LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
#: The call of the step in the graph :func:`called_positions` builds (a session's name).
CALL = "StatefulPartitionedCall"
#: The prefix of that graph's data inputs' names, which sorts them before every
#: variable's name.
DATA_FIRST = "0/"
#: What a figure was computed on (``RuntimeGraph.model``).
GRAPPLER = "the graph Grappler hands TF's executor"
HAND_MODEL = "graphpass's model of Grappler"


def runtime_graph(graph: Graph, fetches: list[str],
                  config: RuntimeConfig | None = None) -> RuntimeGraph:
    """The graph TF runs for ``fetches`` (``node`` or ``node:port``) under ``config``
    (default: ``RuntimeConfig()``), or ``graph`` itself under the hand model, with
    the reason, where TF cannot be asked. Its ``node_orders``: Grappler's output in
    its own order (oneDNN's layout pass reorders it) and, where the step is a
    function, as a graph calling it runs it (:func:`called_positions`): the caller
    decides that order and the file does not hold it, so the estimate runs the
    step in each and keeps the higher."""
    config = config or RuntimeConfig()
    if not installed(TENSORFLOW):
        return RuntimeGraph(graph, HAND_MODEL, "TensorFlow is not installed")
    try:
        optimized = optimize(graph_def_from_graph(graph), fetch_nodes(fetches), config.onednn)
    except Exception as exc:  # noqa: BLE001 - any refusal of TF's keeps the hand model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RuntimeGraph(graph, HAND_MODEL, f"Grappler refused the graph: {first}")
    result = graph_from_graph_def(optimized, shapes=True)
    _keep_shapes(graph, result)
    called = {n: p for n, p in called_positions(graph, config.onednn).items() if n in result}
    orders = (tuple(result), tuple(sorted(called, key=called.__getitem__)))
    orders = tuple(order for order in orders if order)
    marked = mark_temporaries(result, config)
    if not marked:
        return RuntimeGraph(result, GRAPPLER, node_orders=orders)
    return RuntimeGraph(result, f"{GRAPPLER}, with the im2col buffers of its {marked} "
                        f"convolution gradients (oneDNN off)", node_orders=orders)


def called_positions(graph: Graph, onednn: bool) -> dict[str, int]:
    """Each node of a step that is a function (a TF2 SavedModel signature's) to its
    position in the graph Grappler returns for a graph calling it, as a session
    or an eager call runs it: the call inlined, the variables as handles. Empty
    where the step is not a function or Grappler refuses the call.

    That order is not the function's own, and the graph that calls the step
    decides it (the names of its nodes alone move it), which no file holds. The
    caller here is a session's: its data inputs named to sort before the
    variables (as a session's constants, ``Const_1``, do), the variables' handles
    named as the SavedModel names them. The function's own order stands for the
    other callers."""
    function = graph.format_state.function
    if function is None:
        return {}
    try:
        optimized = optimize(_calling_graph_def(graph), [CALL], onednn)
    except Exception:  # noqa: BLE001 - any refusal of TF's leaves the function's own order
        return {}
    prefix = CALL + "/"
    positions: dict[str, int] = {}
    for position, node_def in enumerate(optimized.node):
        if node_def.name.startswith(prefix):
            positions.setdefault(node_def.name[len(prefix):], position)
    return positions


def _calling_graph_def(graph: Graph):
    """A GraphDef that calls the step's function (:data:`CALL`) on a placeholder
    per data argument (named :data:`DATA_FIRST` + the argument) and a
    ``VarHandleOp`` per variable passed (named as the SavedModel names the
    variable, else as the argument), of the variable's dtype and shape."""
    from tensorflow.core.framework import graph_pb2

    outer = outer_graph_def(graph)
    signature = library_functions(outer)[graph.format_state.function.name].signature
    graph_def = graph_pb2.GraphDef()
    graph_def.library.CopyFrom(outer.library)
    graph_def.versions.CopyFrom(outer.versions)
    inputs = []
    for arg in signature.input_arg:
        attrs = graph.node(arg.name).attrs
        if "_handle_dtypes" in attrs:
            variable = graph.format_state.variable_of(arg.name) or arg.name
            if variable in inputs:  # one variable passed for several arguments
                inputs.append(variable)
                continue
            node_def = graph_def.node.add(name=variable, op="VarHandleOp")
            node_def.attr["dtype"].type = attrs["_handle_dtypes"].list.type[0]
            node_def.attr["shape"].shape.CopyFrom(attrs["_handle_shapes"].list.shape[0])
            node_def.attr["shared_name"].s = variable.encode()
        else:
            node_def = graph_def.node.add(name=DATA_FIRST + arg.name, op="Placeholder")
            node_def.attr["dtype"].type = arg.type
            node_def.attr["shape"].CopyFrom(attrs["shape"])
        inputs.append(node_def.name)
    call = graph_def.node.add(name=CALL, op=CALL, input=inputs)
    call.attr["f"].func.name = graph.format_state.function.name
    call.attr["Tin"].list.type.extend(a.type for a in signature.input_arg)
    call.attr["Tout"].list.type.extend(a.type for a in signature.output_arg)
    return graph_def


def _keep_shapes(graph: Graph, optimized: Graph) -> None:
    """The IR's shapes on the nodes Grappler kept: TF infers the optimized graph
    alone, without what the IR knows beyond the GraphDef (a function body's
    variable arguments' shapes, recorded from the SavedModel). A node Grappler
    fused keeps the name of the node it replaced and that node's outputs, which
    its readers read, so it takes the shapes of those outputs the IR knows fully
    (TF's shape functions of fused kernels know less: a ``_FusedConv2D``'s
    ``(batch, ?, ?, ?)``)."""
    graph.dialect.ensure_shapes(graph, None)
    for node in optimized.nodes():
        if node.name not in graph:
            continue
        shapes = graph.node(node.name).meta.get("shapes")
        if shapes is None:
            continue
        if graph.node(node.name).op == node.op:
            node.meta["shapes"] = shapes
            continue
        own = list(node.meta.get("shapes") or [])
        node.meta["shapes"] = [ir if ir is not None and None not in ir else mine
                               for ir, mine in zip(shapes, own)] + own[len(shapes):]


#: Grappler's last answers, by question: the estimate and the exactness check ask
#: for the same graphs (the original, the rewrite as written) under one setting.
_ANSWERS: dict[tuple, bytes] = {}
ANSWERS_KEPT = 4


def optimize(graph_def, fetch_nodes: list[str], onednn: bool):
    """Grappler's output under one oneDNN setting (:func:`optimize_each`)."""
    return optimize_each(graph_def, fetch_nodes, (onednn,))[0]


def optimize_each(graph_def, fetch_nodes: list[str], settings: tuple[bool, ...]) -> list:
    """Grappler's output for ``graph_def`` with ``fetch_nodes`` fetched, as a
    ``Session`` with a default ``ConfigProto`` runs it, under each oneDNN setting of
    ``settings``: on the graph placed first (a session places before it optimizes;
    the remapper fuses a convolution or matrix product with its ``BiasAdd`` only
    on a node placed on the CPU), with the same optimizers, and oneDNN's remapper
    fusions where the setting is on. Every question goes to a child process per
    setting (TF reads ``TF_ENABLE_ONEDNN_OPTS`` once, as it starts; Grappler's C++
    may abort on a graph TF's importer would refuse, which then ends a child, not
    this process), the settings' children at once; the last answers are kept
    (a fresh ``GraphDef`` each time)."""
    from tensorflow.core.framework import graph_pb2

    question = graph_def.SerializeToString(deterministic=True)
    digest = hashlib.sha256(question).hexdigest()
    keys = {onednn: (digest, tuple(fetch_nodes), onednn) for onednn in settings}
    answers = {onednn: _ANSWERS.get(key) for onednn, key in keys.items()}
    missing = [onednn for onednn, answer in answers.items() if answer is None]
    if missing:
        meta = _placed_meta(graph_def, fetch_nodes).SerializeToString()
        answers.update(zip(missing, _children.ask_each(missing, meta)))
        for onednn in missing:
            _ANSWERS[keys[onednn]] = answers[onednn]
        while len(_ANSWERS) > ANSWERS_KEPT:  # the oldest go, these answers are in hand
            _ANSWERS.pop(next(iter(_ANSWERS)))
    return [graph_pb2.GraphDef.FromString(answers[onednn]) for onednn in settings]


def _placed_meta(graph_def, fetch_nodes: list[str]):
    """The MetaGraphDef Grappler is asked about: every node placed on the CPU, the
    fetches as its train ops. Every tensor the graph holds is read in Python first:
    Grappler's C++ aborts on a tensor it cannot read (a CHECK in Tensor::FromProto)
    where TF's Python refuses it with an exception."""
    from tensorflow.core.protobuf import meta_graph_pb2

    _check_tensors(graph_def)
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    for node_def in meta.graph_def.node:
        node_def.device = node_def.device or LOCAL_CPU
    meta.collection_def["train_op"].node_list.value.extend(fetch_nodes)
    return meta


def _optimize_meta(meta):
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    return tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)


class _Children:
    """One child per oneDNN setting, started on the first question and ended with
    this process (its stdin closes). A child that died is started again once."""

    def __init__(self) -> None:
        self.running: dict[bool, subprocess.Popen] = {}

    def ask_each(self, settings: list[bool], question: bytes) -> list[bytes]:
        """``question`` asked of each setting's child at once (they run side by
        side); every answer is read before any refusal is raised, so no child is
        left with an answer unread."""
        sent = {}
        for onednn in settings:
            child = self._child(onednn)
            try:
                _send(child.stdin, question)
                sent[onednn] = child
            except OSError:
                self.running.pop(onednn, None)
        results = [self._answer(onednn, sent.get(onednn), question) for onednn in settings]
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def _answer(self, onednn: bool, child, question: bytes) -> bytes | Exception:
        if child is not None:
            try:
                return _read_answer(child)
            except (OSError, EOFError):
                self.running.pop(onednn, None)
            except RuntimeError as refused:
                return refused
        try:  # once more, alone, in a new child
            child = self._child(onednn)
            _send(child.stdin, question)
            return _read_answer(child)
        except (OSError, EOFError):
            self.running.pop(onednn, None)
            return RuntimeError("Grappler's child process ended")
        except RuntimeError as refused:
            return refused

    def _child(self, onednn: bool) -> subprocess.Popen:
        child = self.running.get(onednn)
        if child is None or child.poll() is not None:
            env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1" if onednn else "0",
                       TF_CPP_MIN_LOG_LEVEL="3")
            child = subprocess.Popen([sys.executable, "-m", __name__], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
            self.running[onednn] = child
        return child


_children = _Children()


def _read_answer(child) -> bytes:
    """The child's answer; RuntimeError with its first line where it refused."""
    status, answer = child.stdout.read(1), _receive(child.stdout)
    if status != b"0":
        raise RuntimeError(answer.decode(errors="replace"))
    return answer


def _send(stream, payload: bytes) -> None:
    stream.write(len(payload).to_bytes(8, "big") + payload)
    stream.flush()


def _receive(stream) -> bytes:
    size = stream.read(8)
    if len(size) < 8:
        raise EOFError
    payload = stream.read(int.from_bytes(size, "big"))
    if len(payload) < int.from_bytes(size, "big"):
        raise EOFError
    return payload


def _check_tensors(graph_def) -> None:
    """Raise ValueError naming the first tensor attr of ``graph_def`` (its nodes and
    its functions' nodes) whose dtype is not one of TF's or whose value does not
    fit its dtype and shape."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import tensor_util

    node_defs = [*graph_def.node, *(n for f in graph_def.library.function
                                    for n in f.node_def)]
    for node_def in node_defs:
        for key, value in sorted(node_def.attr.items()):
            for proto in [value.tensor] if value.HasField("tensor") else value.list.tensor:
                if proto.dtype not in types_pb2.DataType.values() or \
                        proto.dtype == types_pb2.DT_INVALID:
                    raise ValueError(f"node {node_def.name!r}: attr {key!r} has no dtype "
                                     f"TF knows ({proto.dtype})")
                dims = [d.size for d in proto.tensor_shape.dim]
                if any(d < 0 for d in dims) or math.prod(dims) > MAX_CHECKED_ELEMENTS:
                    raise ValueError(f"node {node_def.name!r}: attr {key!r} has shape "
                                     f"{dims}, which a constant cannot have here")
                try:
                    tensor_util.MakeNdarray(proto)
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"node {node_def.name!r}: attr {key!r} is not a "
                                     f"tensor TF can read ({exc})") from None


def fetch_nodes(fetches: list[str]) -> list[str]:
    """Node names of ``fetches`` (``loss:0`` -> ``loss``), in order, once each."""
    names = (f.lstrip("^").rsplit(":", 1)[0] if f.rsplit(":", 1)[-1].isdigit()
             else f.lstrip("^") for f in fetches)
    return list(dict.fromkeys(names))


def _child() -> None:
    """Answer MetaGraphDefs on stdin with Grappler's GraphDefs on stdout (status
    ``0``, or ``1`` and the error's first line) until stdin closes."""
    from tensorflow.core.protobuf import meta_graph_pb2

    while True:
        try:
            question = _receive(sys.stdin.buffer)
        except EOFError:
            return
        try:
            answer = _optimize_meta(meta_graph_pb2.MetaGraphDef.FromString(question))
            sys.stdout.buffer.write(b"0")
            _send(sys.stdout.buffer, answer.SerializeToString())
        except Exception as exc:  # noqa: BLE001 - the parent reports it in one line
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            sys.stdout.buffer.write(b"1")
            _send(sys.stdout.buffer, lines[0].encode())


if __name__ == "__main__":
    _child()
