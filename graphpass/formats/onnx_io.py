"""ONNX reader and writer: a ``ModelProto`` to the IR and back.

Only ``graph.node`` becomes IR nodes, plus one *source node* per value the
graph does not compute, so that every edge has a producer:

* ``graphpass.Input``: a graph input without an initializer (a fed value);
* ``graphpass.Initializer``: an initializer, dense or sparse (also when IR < 4
  lists it among the graph inputs too, as a default value).

A source node's key is its tensor name (``_1``, ``_2``... appended if an
ONNX node already has that name) and ``outputs`` is ``[tensor name]``. The
writer never emits source nodes; it emits the initializers they stand for.

Everything else is carried in ``Graph.format_state`` (``ONNXState``) untouched and
re-emitted:

* ``model``: the ModelProto without the nodes, initializers, graph
  inputs / outputs and value_info (so: ir_version, opset imports, producer,
  domain, model_version, doc strings, metadata_props, functions,
  training_info, quantization annotations, fields newer than this code);
* ``inputs``, ``outputs``, ``value_info``: the
  ``ValueInfoProto`` lists, in file order;
* ``initializers`` / ``sparse_initializers``: tensor name ->
  the parsed ``TensorProto`` / ``SparseTensorProto``, never re-encoded. Only
  those with a live source node are written back, in this order;
* ``source_dir``: where relative external-data locations point.

Node names: ONNX allows empty and duplicate node names, the IR needs unique
keys. Named nodes keep their name (first occurrence wins); the others get the
first output's tensor name (else the op type), made unique with ``_1``,
``_2``... The original name is kept in ``node.meta["onnx_name"]`` and written
back, so an untouched round trip gives the same bytes.

External data: tensors stored outside the model keep their location info
(they are *not* loaded into memory). The writer copies each referenced data
file whole beside the output, under a name the output owns and the content
decides (``onnx_data``), so the written model reads the same bytes at the same
offsets: an untouched round trip differs only in the locations, and the model
and its data are replaced as one unit.

Subgraphs (``If``/``Loop``/``Scan`` bodies) may read outer values by name,
without an input slot. Each such capture becomes a control edge from the
producer: it keeps the producer alive and ordered before the reader. ONNX has
no syntax for control edges, so the writer uses them only for ordering.

Node order: the writer emits nodes in :func:`graphpass.formats.onnx_order.file_order`
(an untouched graph keeps its order exactly; a rewritten one is ordered for
onnxruntime's schedule); that module also holds the schedule itself and the
conventions above (source ops, the read index), shared with the dialect.
"""

from __future__ import annotations

from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.onnx_check import check_model
from graphpass.formats.onnx_data import locations, write_with_data
from graphpass.formats.onnx_order import INITIALIZER, INPUT, READ_INDEX, SOURCE_OPS, file_order
from graphpass.formats.onnx_state import ONNXState
from graphpass.formats.ort_artifacts import artifact_kind
from graphpass.ir.graph import Graph, Tensor, fresh_name

# NodeProto fields the IR models; any other field rides along in node.meta["onnx_extras"].
_MODELLED_NODE_FIELDS = ("input", "output", "name", "op_type", "domain", "attribute")
_STRING_NODE_FIELDS = ("name", "op_type", "domain")
# Graph fields kept outside the carried skeleton (in the IR or in ONNXState's own fields).
_SPLIT_GRAPH_FIELDS = ("node", "initializer", "sparse_initializer", "input", "output",
                       "value_info")


def read_onnx(path: Path) -> Graph:
    """Parse an ONNX model file into a Graph; external data stays on disk."""
    import onnx
    from google.protobuf import message as pb_message

    path = Path(path)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except pb_message.DecodeError as exc:
        raise GraphpassError(
            f"{path}: not a valid ONNX model (corrupt or truncated: {str(exc).splitlines()[0]}); "
            "re-export it or check the copy"
        ) from None
    except OSError as exc:
        raise GraphpassError(f"{path}: cannot read ({exc.strerror})") from None
    bad = _non_utf8_string(model, "model")
    if bad:
        raise GraphpassError(f"{path}: {bad[0]} is not valid UTF-8 ({bad[1]!r}); ONNX strings "
                             "must be UTF-8: re-export the model")
    check_model(model, str(path))
    return graph_from_model(model, source_dir=path.parent)


def _non_utf8_string(message, where: str) -> tuple[str, bytes] | None:
    """The first string field holding bytes that are not UTF-8 (protobuf hands such a
    proto2 ``string`` back as ``bytes``), as ``(field path, value)``."""
    from google.protobuf.descriptor import FieldDescriptor

    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        if field.type == FieldDescriptor.TYPE_STRING:
            for index, item in enumerate(values):
                if isinstance(item, bytes):
                    return f"{where}.{field.name}" + (f"[{index}]" if field.is_repeated
                                                      else ""), item
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not field.message_type.GetOptions()\
                .map_entry:
            for index, item in enumerate(values):
                bad = _non_utf8_string(item, f"{where}.{field.name}[{index}]"
                                       if field.is_repeated else f"{where}.{field.name}")
                if bad:
                    return bad
    return None


def graph_from_model(model, source_dir: Path | str = ".") -> Graph:
    """Build the IR from a parsed ``ModelProto``; ``source_dir`` anchors external data."""
    onnx_graph = model.graph
    skeleton = type(model)()
    skeleton.CopyFrom(model)
    for field in _SPLIT_GRAPH_FIELDS:
        skeleton.graph.ClearField(field)
    initializers = {t.name: t for t in onnx_graph.initializer}
    sparse = {t.values.name: t for t in onnx_graph.sparse_initializer}
    graph = Graph("onnx", ONNXState(
        model=skeleton, inputs=list(onnx_graph.input), outputs=list(onnx_graph.output),
        value_info=list(onnx_graph.value_info), initializers=initializers,
        sparse_initializers=sparse, source_dir=Path(source_dir),
        artifact=artifact_kind(model), source_locations=tuple(locations(model))))
    sources = _source_values(onnx_graph, initializers, sparse)
    keys = _node_keys(onnx_graph.node, sources)
    producers: dict[str, Tensor] = {}
    for value, op in sources.items():
        key = keys["sources"][value]
        graph.add_node(key, op, outputs=[value])
        producers[value] = Tensor(key, 0)
    for node_proto, key in zip(onnx_graph.node, keys["nodes"]):
        _add_node(graph, node_proto, key, producers)
    for node_proto, key in zip(onnx_graph.node, keys["nodes"]):
        _connect(graph, node_proto, key, producers)
    return graph


def _source_values(onnx_graph, initializers: dict, sparse: dict) -> dict[str, str]:
    """Tensor name -> source op, graph inputs first, then initializers, in file order."""
    sources = {}
    for value_info in onnx_graph.input:
        is_initializer = value_info.name in initializers or value_info.name in sparse
        sources[value_info.name] = INITIALIZER if is_initializer else INPUT
    for name in [*initializers, *sparse]:
        sources.setdefault(name, INITIALIZER)
    return sources


def _node_keys(node_protos, sources: dict[str, str]) -> dict:
    """Unique IR keys: named nodes first, then source values, then generated ones."""
    taken: set[str] = set()
    node_keys: list[str | None] = []
    for proto in node_protos:
        if proto.name and proto.name not in taken:
            taken.add(proto.name)
            node_keys.append(proto.name)
        else:
            node_keys.append(None)
    source_keys = {value: _claim(value, taken) for value in sources}
    for i, proto in enumerate(node_protos):
        if node_keys[i] is None:
            base = proto.name or next((o for o in proto.output if o), proto.op_type)
            node_keys[i] = _claim(base, taken)
    return {"nodes": node_keys, "sources": source_keys}


def _claim(base: str, taken: set[str]) -> str:
    """A fresh name for ``base``, added to ``taken``."""
    name = fresh_name(base, taken.__contains__)
    taken.add(name)
    return name


def _add_node(graph: Graph, proto, key: str, producers: dict[str, Tensor]) -> None:
    node = graph.add_node(key, proto.op_type, domain=proto.domain,
                          attrs={a.name: a for a in proto.attribute}, outputs=list(proto.output))
    node.meta[READ_INDEX] = len(graph)
    if key != proto.name:
        node.meta["onnx_name"] = proto.name
    extras = type(proto)()
    extras.CopyFrom(proto)
    for field in _MODELLED_NODE_FIELDS:
        extras.ClearField(field)
    if extras.ByteSize():
        node.meta["onnx_extras"] = extras
    # proto2 tells "" set from unset; keep which string fields were set empty.
    empty = tuple(f for f in _STRING_NODE_FIELDS if proto.HasField(f) and not getattr(proto, f))
    if empty:
        node.meta["onnx_empty_fields"] = empty
    if proto.input and not proto.input[-1]:
        node.meta["onnx_arity"] = len(proto.input)  # trailing empty slots
    for port, value in enumerate(proto.output):
        if not value:
            continue
        if value in producers:
            raise GraphpassError(
                f"tensor {value!r} is produced twice (by {producers[value].node!r} and {key!r}); "
                "ONNX values must have one producer; fix the exporter"
            )
        producers[value] = Tensor(key, port)


def _connect(graph: Graph, proto, key: str, producers: dict[str, Tensor]) -> None:
    for slot, value in enumerate(proto.input):
        if value:
            graph.set_input(key, slot, _producer(producers, value, key))
    for value in sorted(_captured_values(proto)):
        if value in producers:  # else a name the subgraph defines in an enclosing body
            graph.add_control_input(key, producers[value].node)


def _producer(producers: dict[str, Tensor], value: str, reader: str) -> Tensor:
    try:
        return producers[value]
    except KeyError:
        raise GraphpassError(
            f"node {reader!r} reads {value!r}, which no node, graph input or initializer "
            "produces; the model is malformed (run onnx.checker on it)"
        ) from None


def _captured_values(proto) -> set[str]:
    """Outer-scope values that the subgraphs in ``proto``'s attributes read by name."""
    captured: set[str] = set()
    for attr in proto.attribute:
        for body in [attr.g] if attr.HasField("g") else list(attr.graphs):
            defined = {v.name for v in body.input} | {t.name for t in body.initializer} | \
                {t.values.name for t in body.sparse_initializer}
            for node in body.node:
                defined.update(node.output)
            for node in body.node:
                captured.update(v for v in node.input if v and v not in defined)
                captured.update(_captured_values(node) - defined)
    return captured


# -- writing ---------------------------------------------------------------


def model_from_graph(graph: Graph):
    """Lower the IR to a ``ModelProto`` (nodes in topological order)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(graph.format_state.model)
    out = model.graph
    live: set[str] = set()
    live_sources: set[str] = set()
    for name in file_order(graph):
        node = graph.node(name)
        live.update(v for v in node.outputs if v)
        if node.op in SOURCE_OPS:
            live_sources.update(node.outputs)
            continue
        out.node.append(_node_proto(graph, node))
    state = graph.format_state
    out.initializer.extend(t for n, t in state.initializers.items() if n in live_sources)
    out.sparse_initializer.extend(
        t for n, t in state.sparse_initializers.items() if n in live_sources)
    # An input that only named an initializer (IR < 4) goes with it; fed inputs stay.
    dropped = (state.initializers.keys() | state.sparse_initializers.keys()) - live_sources
    out.input.extend(v for v in state.inputs if v.name not in dropped)
    out.output.extend(state.outputs)
    out.value_info.extend(v for v in state.value_info if v.name in live)
    missing = [v.name for v in state.outputs if v.name not in live]
    if missing:
        raise GraphpassError(
            f"graph output(s) {', '.join(map(repr, missing))} are no longer produced by any node; "
            "a pass removed their producer without rewiring the output"
        )
    return model


def _node_proto(graph: Graph, node):
    import onnx

    proto = onnx.NodeProto()
    if "onnx_extras" in node.meta:
        proto.CopyFrom(node.meta["onnx_extras"])
    values = {"name": node.meta.get("onnx_name", node.name), "op_type": node.op,
              "domain": node.domain}
    for field, value in values.items():
        if value or field in node.meta.get("onnx_empty_fields", ()):
            setattr(proto, field, value)
    slots = graph.input_slots(node.name)
    arity = max(max(slots, default=-1) + 1, node.meta.get("onnx_arity", 0))
    proto.input.extend(_value_name(graph, slots[i], node.name) if i in slots else ""
                       for i in range(arity))
    proto.output.extend(node.outputs)
    proto.attribute.extend(node.attrs.values())
    return proto


def _value_name(graph: Graph, tensor: Tensor, reader: str) -> str:
    outputs = graph.node(tensor.node).outputs
    if tensor.port >= len(outputs) or not outputs[tensor.port]:
        raise GraphpassError(
            f"node {reader!r} reads output {tensor.port} of {tensor.node!r}, which has no tensor "
            f"name (outputs: {outputs}); build nodes with the ONNX dialect so outputs are named"
        )
    return outputs[tensor.port]


def write_onnx(graph: Graph, path: Path) -> None:
    """Write ``graph`` as an ONNX model; its external data files are copied beside
    it, and the model and its data replace the old ones as one unit (``onnx_data``)."""
    state = graph.format_state
    write_with_data(model_from_graph(graph), Path(path), Path(state.source_dir),
                    keep=state.source_locations)
