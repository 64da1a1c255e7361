"""TensorFlow reader and writer: GraphDef, MetaGraphDef and SavedModel.

Only the ``GraphDef.node`` list becomes IR; everything else (versions, the
function library, the rest of a MetaGraphDef, the other MetaGraphs of a
SavedModel) is carried in ``Graph.format_state`` (``TFState``) as the parsed protos and re-emitted
untouched. NodeDef fields the IR does not model (debug info, full type) ride
along on the node (``tf_node_def``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from graphpass.dialects.tf_ops import attrs_problem
from graphpass.errors import GraphpassError
from graphpass.formats import tf_function
from graphpass.formats.files import (
    GRAPHDEF,
    METAGRAPH,
    SAVEDMODEL,
    atomic_output,
    check_output_path,
)
from graphpass.formats.nesting import check_nesting
from graphpass.formats.saved_model_files import copy_extras, plan_extras
from graphpass.formats.tf_importer import imported_shapes, record_shapes
from graphpass.formats.tf_library_check import check_library
from graphpass.formats.tf_node_def import keep_extras, write_extras
from graphpass.formats.tf_state import TFState
from graphpass.ir.graph import Graph, gc_paused, parse_tensor_name
from graphpass.ir.verify import MAX_PORT, port_problem

_KIND_NAMES = {GRAPHDEF: "GraphDef", METAGRAPH: "MetaGraphDef", SAVEDMODEL: "SavedModel"}


def read_tf(path: Path, kind: str, is_text: bool, *, tag: str | None = None,
            signature: str | None = None, shapes: bool = False,
            holds_step: Callable[[Graph], bool] | None = None) -> Graph:
    """Parse a TF model file (or SavedModel directory) into a Graph.

    When the training step is a function (a TF2 ``train`` signature, or a GraphDef
    whose top level only calls it), the graph is that function's body; see
    :mod:`graphpass.formats.tf_function`. ``signature`` names the signature to follow;
    ``shapes``: see ``graph_from_graph_def``. Which of a GraphDef's called
    functions holds the step is a question of training structure, which the
    reader does not answer: the caller's ``holds_step(body)`` does (without it,
    the top level is read).
    """
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    proto_type = {
        GRAPHDEF: graph_pb2.GraphDef,
        METAGRAPH: meta_graph_pb2.MetaGraphDef,
        SAVEDMODEL: saved_model_pb2.SavedModel,
    }[kind]
    source = path
    if kind == SAVEDMODEL and path.is_dir():
        path = path / ("saved_model.pbtxt" if is_text else "saved_model.pb")
    message = _parse(path, proto_type(), is_text, _KIND_NAMES[kind])
    state = TFState(container=kind, text=is_text)
    if kind == GRAPHDEF:
        graph_def = message
    elif kind == METAGRAPH:
        graph_def = message.graph_def
    else:
        index = _choose_meta_graph(path, message, tag)
        state.savedmodel, state.metagraph_index = message, index
        state.source_dir = source.parent if source.is_file() else source
        graph_def = message.meta_graphs[index].graph_def
    check_library(graph_def, str(source))
    if kind != GRAPHDEF:
        state.signatures = tf_function.signatures(_meta_graph(message, state))
    step = _step_function(source, kind, message, state, signature, holds_step)
    if kind == METAGRAPH:
        state.metagraph = _without_graph_def(message)
    if step is not None:
        return _read_step_function(graph_def, step, state)
    return graph_from_graph_def(graph_def, state, shapes=shapes)


def read_saved_model_proto(path: Path, tag: str | None = None):
    """The MetaGraphDef of a SavedModel that ``--tag`` (default train, then serve) picks."""
    from tensorflow.core.protobuf import saved_model_pb2

    from graphpass.formats.container import detect

    kind, is_text = detect(path)
    if kind != SAVEDMODEL:
        raise GraphpassError(f"{path}: not a SavedModel")
    if path.is_dir():
        path = path / ("saved_model.pbtxt" if is_text else "saved_model.pb")
    message = _parse(path, saved_model_pb2.SavedModel(), is_text, "SavedModel")
    return message.meta_graphs[_choose_meta_graph(path, message, tag)]


def _meta_graph(message, state: TFState):
    return message.meta_graphs[state.metagraph_index] if state.metagraph_index is not None \
        else message


def _step_function(source: Path, kind: str, message, state: TFState, signature: str | None,
                   holds_step: Callable[[Graph], bool] | None) -> str | None:
    """The library function holding the training step, or None for a top-level step."""
    if kind == GRAPHDEF:
        if signature is not None:
            raise GraphpassError(f"{source}: --signature needs a SavedModel or MetaGraphDef; "
                                 "a GraphDef has no signatures")
        return _graph_def_step(message, state, holds_step)
    return tf_function.choose_signature(_meta_graph(message, state), signature, str(source))


def _graph_def_step(graph_def, state: TFState,
                    holds_step: Callable[[Graph], bool] | None) -> str | None:
    """The one top-level call of a GraphDef whose function body ``holds_step`` says
    holds the training step (a TF2 graph's others are checkpoint save and restore)."""
    if holds_step is None:
        return None
    steps = []
    for name in tf_function.graph_def_steps(graph_def):
        try:
            if holds_step(_read_step_function(graph_def, name, state)):
                steps.append(name)
        except GraphpassError:
            continue
    return steps[0] if len(steps) == 1 else None


def _read_step_function(graph_def, name: str, state: TFState) -> Graph:
    functions = tf_function.library_functions(graph_def)
    state = dataclasses.replace(
        state, outer_graph_def=graph_def, library=graph_def.library,
        versions=graph_def.versions if graph_def.HasField("versions") else None,
        graph_version=graph_def.version)
    with gc_paused():
        graph = tf_function.graph_from_function(functions[name], functions, state)
    graph.format_state.function.variables = tf_function.argument_sources(graph_def, name)
    return graph


def graph_from_graph_def(graph_def, state: TFState | None = None, *,
                         shapes: bool = False) -> Graph:
    """Build the IR from a parsed ``GraphDef``; carries versions and library.

    With ``shapes``, TF's shape inference runs on ``graph_def`` before the IR is
    built and is recorded on the nodes once they exist: TF's imported graph is
    gone by then, where inferring the built IR holds both at once (a higher
    peak). A GraphDef with a port TF would crash on is
    left to the IR's checks, which refuse it."""
    with gc_paused():
        attrs = _checked_attrs(graph_def.node)
    inferred = None
    if shapes and not _ports_too_large(graph_def.node):
        # Nothing of ours is held through TF's import of the whole graph: the attr
        # dicts are made again after it, off the peak.
        attrs = None
        inferred = imported_shapes(graph_def.SerializeToString())
    with gc_paused():
        node_attrs = attrs if attrs is not None else (dict(n.attr) for n in graph_def.node)
        graph = _graph_from_graph_def(graph_def, state, node_attrs)
    if inferred is not None:
        record_shapes(graph, inferred)
    return graph


def _graph_from_graph_def(graph_def, state: TFState | None, attrs: Iterable[dict]) -> Graph:
    """The IR of ``graph_def``, whose nodes' attrs ``_checked_attrs`` gave; each node
    whose inputs the writer would write as the file does keeps its NodeDef as
    its record (``Graph.keep_record``: the file's node list and its index there),
    which the writer re-emits while the node is as read."""
    graph = Graph("tf", state or TFState())
    for field in ("versions", "library"):  # absent stays absent on the way out
        value = getattr(graph_def, field) if graph_def.HasField(field) else None
        setattr(graph.format_state, field, value)
    graph.format_state.graph_version = graph_def.version
    nodes = graph_def.node
    for node_def, node_attrs in zip(nodes, attrs):
        node = graph.add_node(node_def.name, node_def.op, attrs=node_attrs,
                              device=node_def.device)
        keep_extras(node, node_def)
    for index, node_def in enumerate(nodes):
        if _connect(graph, node_def):
            # The record names the NodeDef by its place in the file's list: a Python
            # object per NodeDef would be held as long as the graph.
            graph.keep_record(node_def.name, (nodes, index))
    problem = port_problem(graph)  # before anything hands the graph to TF (port >= 2^31 crashes it)
    if problem:
        raise GraphpassError(f"{problem}; the GraphDef is malformed: re-export it")
    graph.take_edited()  # checked: its nodes are whole by construction, their ports read
    graph.keep_source(graph_def)
    return graph


def _checked_attrs(nodes) -> list[dict]:
    """Each node's attrs, having refused, before TF or the IR sees them, nodes
    without a name or op, a name twice or starting with ``^``, and attrs TF's
    importer cannot take (a bad dtype, a function placeholder outside a function
    body). One sweep, whose attr dicts the IR takes, so they are made once."""
    names: set[str] = set()
    checked = []
    for node_def in nodes:
        name, op = node_def.name, node_def.op
        if not name or not op:
            raise GraphpassError(
                f"a node without a name or op ({name or '<unnamed>'}); "
                "the GraphDef is malformed"
            )
        if name in names:
            raise GraphpassError(f"node name {name!r} appears twice; names must be unique")
        if name.startswith("^"):  # an input naming it would read as a control input
            raise GraphpassError(f"node name {name!r} starts with '^', which marks a control "
                                 "input; the GraphDef is malformed: re-export it")
        names.add(name)
        attrs = dict(node_def.attr)
        problem = attrs_problem(op, attrs)
        if problem:
            key, what = problem
            raise GraphpassError(f"node {name!r}: attr {key!r} {what}; the "
                                 "GraphDef is malformed: re-export it")
        checked.append(attrs)
    return checked


def _ports_too_large(nodes) -> bool:
    """Whether an input reads a port TF stores wrapped (``MAX_PORT``): its importer
    crashes on those."""
    return any(parse_tensor_name(t).port > MAX_PORT for n in nodes for t in n.input
               if not t.startswith("^"))


def _connect(graph: Graph, node_def) -> bool:
    """A NodeDef's inputs: data inputs, then ``^``-prefixed control inputs; whether
    the writer would list them alike (then the NodeDef may be its record)."""
    texts = list(node_def.input)
    data = [t for t in texts if not t.startswith("^")]
    tensors = [parse_tensor_name(t) for t in data]
    controls = [t[1:] for t in texts if t.startswith("^")]
    graph.connect(node_def.name, tensors, controls)
    return _written_alike(texts, data, tensors, controls)


def _written_alike(texts: list[str], data: list[str], tensors: list, controls: list[str]
                   ) -> bool:
    """Whether ``Graph.input_texts`` gives ``texts`` back: data inputs first, each
    named as the IR names it (``x``, not ``x:0``; only a name with a colon can
    differ), no control input twice."""
    return texts[:len(data)] == data \
        and (not controls or len(set(controls)) == len(controls)) \
        and (":" not in "".join(data) or [str(t) for t in tensors] == data)


def graph_def_from_graph(graph: Graph, into=None):
    """Lower the IR back to a ``GraphDef`` (node order = graph order): a new one, or
    written into the empty GraphDef ``into`` (a container's own field, which
    saves copying a large GraphDef into it)."""
    with gc_paused():
        return _graph_def_from_graph(graph, into)


def _graph_def_from_graph(graph: Graph, graph_def=None):
    if graph_def is None:
        from tensorflow.core.framework import graph_pb2

        graph_def = graph_pb2.GraphDef()
    if graph.format_state.versions is not None:
        graph_def.versions.CopyFrom(graph.format_state.versions)
    if graph.format_state.library is not None:
        graph_def.library.CopyFrom(graph.format_state.library)
    if graph.format_state.graph_version:
        graph_def.version = graph.format_state.graph_version
    for node in graph.nodes():
        record = graph.record(node.name)
        if record is not None:  # as read: the NodeDef the reader named
            nodes, index = record
            graph_def.node.add().CopyFrom(nodes[index])
            continue
        node_def = graph_def.node.add(name=node.name, op=node.op, device=node.device)
        node_def.input.extend(graph.input_texts(node.name))
        for key, value in node.attrs.items():
            node_def.attr[key].CopyFrom(value)
        write_extras(node_def, node)
    return graph_def


def write_tf(graph: Graph, path: Path, *, output_format: str | None = None) -> None:
    """Write ``graph`` in the container it was read from; pb or pbtxt."""
    if output_format not in (None, "pb", "pbtxt"):
        raise GraphpassError(
            f"--output-format must be pb or pbtxt for TF graphs, not {output_format}")
    container = graph.format_state.container
    text = graph.format_state.text if output_format is None else output_format == "pbtxt"
    if container == GRAPHDEF:
        message = _lowered(graph)
    elif container == METAGRAPH:
        message = _copy(graph.format_state.metagraph)
        message.ClearField("graph_def")
        _lowered(graph, into=message.graph_def)
    else:
        _write_saved_model(graph, path, text)
        return
    with atomic_output(path) as tmp:
        tmp.write_bytes(serialize(message, text))


def _lowered(graph: Graph, into=None):
    """The GraphDef to write: the IR lowered, or the outer graph around a function
    step (``into``: the container's GraphDef field to fill)."""
    if graph.format_state.function is None:
        return graph_def_from_graph(graph, into)
    graph_def = tf_function.outer_graph_def(graph)
    if into is None:
        return graph_def
    into.CopyFrom(graph_def)
    return into


def _copy(message):
    other = type(message)()
    other.CopyFrom(message)
    return other


def serialize(message, text: bool) -> bytes:
    """Deterministic bytes: map fields sorted, so equal graphs give equal files."""
    if text:
        from google.protobuf import text_format

        return text_format.MessageToString(message).encode()
    return message.SerializeToString(deterministic=True)


def _parse(path: Path, message, is_text: bool, what: str):
    from google.protobuf import message as pb_message
    from google.protobuf import text_format

    try:
        data = path.read_bytes()
        if is_text:
            check_nesting(data, str(path))
            text_format.Parse(data.decode("utf-8"), message)
        else:
            message.ParseFromString(data)
    except (pb_message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise GraphpassError(
            f"{path}: not a valid {what} (corrupt or truncated: {str(exc).splitlines()[0]}); "
            "re-export it or check the copy"
        ) from None
    except OSError as exc:
        raise GraphpassError(f"{path}: cannot read ({exc.strerror})") from None
    return message


def _without_graph_def(meta_graph):
    """The rest of the MetaGraphDef, to carry untouched. The GraphDef is cleared
    from it, not copied out: a reference taken before (``meta_graph.graph_def``)
    stays valid on its own (protobuf detaches a cleared submessage), and a copy
    would hold the graph twice."""
    meta_graph.ClearField("graph_def")
    return meta_graph


def _choose_meta_graph(path: Path, saved_model, tag: str | None) -> int:
    tag_sets = [list(m.meta_info_def.tags) for m in saved_model.meta_graphs]
    if not tag_sets:
        raise GraphpassError(f"{path}: the SavedModel holds no MetaGraph")
    wanted = [tag] if tag else ["train", "serve"]
    for want in wanted:
        for index, tags in enumerate(tag_sets):
            if want in tags:
                return index
    if tag is None and len(tag_sets) == 1:
        return 0
    raise GraphpassError(
        f"{path}: no MetaGraph tagged {' or '.join(map(repr, wanted))}; "
        f"it has {tag_sets}; choose one with --tag"
    )


def _write_saved_model(graph: Graph, path: Path, text: bool) -> None:
    """Write a SavedModel directory: saved_model.pb plus a copy of variables/ and assets/."""
    saved_model = _copy(graph.format_state.savedmodel)
    meta_graph = saved_model.meta_graphs[graph.format_state.metagraph_index]
    meta_graph.ClearField("graph_def")
    _lowered(graph, into=meta_graph.graph_def)
    if path.name in ("saved_model.pb", "saved_model.pbtxt"):
        path = path.parent
    source = Path(graph.format_state.source_dir)
    if path.resolve() == source.resolve():
        raise GraphpassError(f"{path}: writing a SavedModel over its own directory is not "
                             "supported; choose another output directory")
    # The output directory is replaced as a whole: never one that holds something else.
    if path.is_dir() and any(path.iterdir()) and not any(
            (path / name).is_file() for name in ("saved_model.pb", "saved_model.pbtxt")):
        raise GraphpassError(f"{path}: the directory exists and is not a SavedModel, so it "
                             "would be replaced; choose a new or empty output directory")
    check_output_path(path, directory=True)
    extras = plan_extras(source)
    with atomic_output(path, directory=True) as tmp:
        name = "saved_model.pbtxt" if text else "saved_model.pb"
        (tmp / name).write_bytes(serialize(saved_model, text))
        # fingerprint.pb is left behind on purpose: it hashes the old saved_model.pb.
        copy_extras(extras, tmp)
