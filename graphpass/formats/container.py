"""Which container a path holds (GraphDef, MetaGraphDef, SavedModel or ONNX),
told from its content, not its extension: binary protobufs apart by the field
numbers and wire types at their top level, text protos by their first field
name. It reads bytes and returns a kind; it must not parse a model into IR.
"""

from __future__ import annotations

import stat
from collections import Counter
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.files import GRAPHDEF, METAGRAPH, ONNX, SAVEDMODEL, existing

# Top-level (field number, wire type) pairs that only one container uses.
# Wire types: 0 varint, 2 length-delimited.
_ONLY_IN = {
    GRAPHDEF: {(3, 0)},
    METAGRAPH: {(3, 2), (5, 2), (6, 2), (7, 2)},
    SAVEDMODEL: {(1, 0)},
}
_TEXT_FIRST_FIELDS = {
    "node": GRAPHDEF,
    "versions": GRAPHDEF,
    "library": GRAPHDEF,
    "meta_info_def": METAGRAPH,
    "graph_def": METAGRAPH,
    "saver_def": METAGRAPH,
    "collection_def": METAGRAPH,
    "signature_def": METAGRAPH,
    "saved_model_schema_version": SAVEDMODEL,
    "meta_graphs": SAVEDMODEL,
}


def detect(path: Path) -> tuple[str, bool]:
    """``(kind, is_text)`` for the model at ``path``, from its content."""
    found = existing(path)
    if found is None:
        raise GraphpassError(f"{path}: no such file or directory")
    if stat.S_ISDIR(found.st_mode):
        return _detect_saved_model_dir(path)
    check_regular_file(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GraphpassError(f"{path}: cannot read ({exc.strerror})") from None
    if not data:
        raise GraphpassError(f"{path}: the file is empty; expected a GraphDef, MetaGraphDef, "
                             "SavedModel or ONNX model")
    text_kind = _detect_text(data)
    if text_kind:
        return text_kind, True
    if _is_plain_text(data):
        first = data[:40].decode("utf-8", "replace").strip().splitlines()[0]
        raise GraphpassError(
            f"{path}: unknown format: a text file that is not a TF text proto (it starts with "
            f"{first!r}); expected a GraphDef, MetaGraphDef, SavedModel or ONNX model")
    return _detect_binary(path, data), False


def check_regular_file(path: Path, what: str = "") -> None:
    """A user error unless ``path`` is a regular file (reading a FIFO would block
    forever, a device would never end)."""
    if existing(path) is None:
        raise GraphpassError(f"{what}{path}: no such file")
    if not path.is_file():
        raise GraphpassError(f"{what}{path}: not a regular file (a FIFO, socket or device); "
                             "pass a file")


def _is_plain_text(data: bytes) -> bool:
    """UTF-8 without control characters other than whitespace (a binary protobuf
    almost always has some: tags and lengths are small bytes)."""
    head = data[:4096]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\r\t" for c in text)


def _detect_saved_model_dir(path: Path) -> tuple[str, bool]:
    for name, is_text in (("saved_model.pb", False), ("saved_model.pbtxt", True)):
        if (path / name).is_file():
            return SAVEDMODEL, is_text
    raise GraphpassError(
        f"{path}: a directory without saved_model.pb; pass a SavedModel directory or a model file"
    )


def _detect_text(data: bytes) -> str | None:
    try:
        text = data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        field = line.split("{")[0].split(":")[0].strip()
        return _TEXT_FIRST_FIELDS.get(field)
    return None


def _detect_binary(path: Path, data: bytes) -> str:
    fields = _top_level_fields(path, data)
    if (1, 0) in fields and (7, 2) in fields:
        return ONNX
    for kind, only in _ONLY_IN.items():
        if set(fields) & only:
            return kind
    if set(fields) <= {(1, 2), (2, 2), (4, 2)}:
        # node / library / versions, or meta_info_def / graph_def / collection_def.
        # A GraphDef repeats field 1 (one per node); a MetaGraphDef has it once at most
        # and keeps its nodes inside field 2.
        single_info = fields[(1, 2)] <= 1
        if fields[(2, 2)] == 1 and single_info and _looks_like_graph_def_inside(data):
            return METAGRAPH
        return GRAPHDEF
    raise GraphpassError(
        f"{path}: not a TensorFlow GraphDef, MetaGraphDef, SavedModel or ONNX model "
        "(unrecognised protobuf content)"
    )


def _looks_like_graph_def_inside(data: bytes) -> bool:
    """True if field 2 of ``data`` parses as a GraphDef with named nodes."""
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    try:
        meta.ParseFromString(data)
    except Exception:
        return False
    nodes = meta.graph_def.node
    return len(nodes) > 0 and all(n.name and n.op for n in nodes)


def _top_level_fields(path: Path, data: bytes) -> Counter:
    """Count ``(field number, wire type)`` at the top level; errors on truncation."""
    fields: Counter = Counter()
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(path, data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _corrupt(path, "field number 0")
        if wire == 0:
            _, pos = _varint(path, data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(path, data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise _corrupt(path, f"unsupported wire type {wire}")
        if pos > end:
            raise _corrupt(path, "truncated")
        fields[(number, wire)] += 1
    return fields


def _varint(path: Path, data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise _corrupt(path, "truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _corrupt(path, "malformed varint")


def _corrupt(path: Path, why: str) -> GraphpassError:
    return GraphpassError(
        f"{path}: unknown format or a corrupt/truncated protobuf ({why}); expected a TF "
        "GraphDef, MetaGraphDef, SavedModel or ONNX model: re-export it or check the copy"
    )
