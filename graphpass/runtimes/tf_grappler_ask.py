"""Asking Grappler (``tf_optimizer.OptimizeGraph``) about a graph, in child
processes, one per oneDNN setting: TF reads ``TF_ENABLE_ONEDNN_OPTS`` once, as it
starts, and Grappler's C++ may abort on a graph TF's importer would refuse, which
then ends a child, not this process.

A question is sent before its answer is read (:func:`send_each`), so a child
works while this process does: a rewrite sends what it will ask of the original
up front (``TFExecutorModel.ask_ahead``), and each child answers in the order it
was asked. The last answers are kept by question, since the estimate and the
exactness check ask for the same graphs (the original, the rewrite as written)
under one setting.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys

#: The most elements a tensor attr may have for Grappler to be asked: TF's constant
#: folding makes none larger than 10 MiB, and reading a larger one (a splat of an
#: absurd shape) in Python to check it would allocate all of it.
MAX_CHECKED_ELEMENTS = 2**28
#: Where a session places a node without a device, on a machine without a GPU.
LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
#: Grappler's last answers, by question (:func:`question_key`).
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
    fusions where the setting is on. The settings' children work at once; every
    answer is read before a refusal is raised (a fresh ``GraphDef`` each time)."""
    from tensorflow.core.framework import graph_pb2

    keys = send_each(graph_def, fetch_nodes, settings)
    answers = [_ANSWERS[key] if key in _ANSWERS else _children.answer(key) for key in keys]
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    for key, answer in zip(keys, answers):
        _ANSWERS.pop(key, None)
        _ANSWERS[key] = answer
    while len(_ANSWERS) > ANSWERS_KEPT:  # the oldest go, these answers are in hand
        _ANSWERS.pop(next(iter(_ANSWERS)))
    return [graph_pb2.GraphDef.FromString(answer) for answer in answers]


def send_each(graph_def, fetch_nodes: list[str], settings: tuple[bool, ...]) -> list[tuple]:
    """Send the question of :func:`optimize_each` to each setting's child where it is
    neither answered nor sent already, without waiting; its keys. Raises
    ValueError where a tensor of the graph is one Grappler's C++ would abort on."""
    digest = hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()
    keys = [(digest, tuple(fetch_nodes), onednn) for onednn in settings]
    meta = None
    for key in keys:
        if key in _ANSWERS or _children.asked(key):
            continue
        meta = meta or _placed_meta(graph_def, fetch_nodes).SerializeToString()
        _children.send(key, meta)
    return keys


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
    """One child per oneDNN setting (a key's last element), started on the first
    question and ended with this process (its stdin closes). Each answers its
    questions in the order they were sent. A child that died is started again,
    and asked again what it had not answered; a question that ended two
    children is refused."""

    def __init__(self) -> None:
        self.running: dict[bool, subprocess.Popen] = {}
        #: Per setting, the questions sent and not yet answered, oldest first.
        self.waiting: dict[bool, list[tuple[tuple, bytes]]] = {}
        #: Answers read for a question not yet asked for (the refusals as errors).
        self.read: dict[tuple, bytes | Exception] = {}
        self.ended: set[tuple] = set()

    def asked(self, key: tuple) -> bool:
        return key in self.read or any(k == key for k, _ in self.waiting.get(key[-1], ()))

    def send(self, key: tuple, question: bytes) -> None:
        onednn = key[-1]
        self.waiting.setdefault(onednn, []).append((key, question))
        try:
            _send(self._child(onednn).stdin, question)
        except OSError:
            self._restart(onednn)

    def answer(self, key: tuple) -> bytes | Exception:
        """The answer to ``key`` (sent before), reading its child's answers in order;
        a refusal as a RuntimeError with Grappler's first line."""
        onednn = key[-1]
        while key not in self.read:
            self._read_next(onednn)
        return self.read.pop(key)

    def _read_next(self, onednn: bool) -> None:
        key, _ = self.waiting[onednn][0]
        try:
            result = _read_answer(self.running[onednn])
        except (OSError, EOFError, KeyError):
            self._restart(onednn)
            return
        except RuntimeError as refused:
            result = refused
        self.waiting[onednn].pop(0)
        self.read[key] = result

    def _restart(self, onednn: bool) -> None:
        """A new child for ``onednn``, asked what the old one had not answered; the
        question it was answering is refused if it ended a child before."""
        self.running.pop(onednn, None)
        waiting = self.waiting.pop(onednn, [])
        if waiting and waiting[0][0] in self.ended:
            self.read[waiting.pop(0)[0]] = RuntimeError("Grappler's child process ended")
        elif waiting:
            self.ended.add(waiting[0][0])
        for key, question in waiting:
            self.send(key, question)

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


def _child() -> None:
    """Answer MetaGraphDefs on stdin with Grappler's GraphDefs on stdout (status
    ``0``, or ``1`` and the error's first line) until stdin closes. A thread reads
    the questions as they come: the parent may send the next while this child
    writes an answer, and neither may wait on the other's pipe."""
    import queue
    import threading

    from tensorflow.core.protobuf import meta_graph_pb2

    questions: queue.Queue[bytes | None] = queue.Queue()

    def read_questions() -> None:
        while True:
            try:
                questions.put(_receive(sys.stdin.buffer))
            except EOFError:
                questions.put(None)
                return

    threading.Thread(target=read_questions, daemon=True).start()
    while (question := questions.get()) is not None:
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
