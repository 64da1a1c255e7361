"""Function libraries and cyclic structure (issue 27): a library that TF's C++
would crash on, references that do not resolve, bodies that read what they lack,
and call chains or loops deep enough to exhaust Python's stack are each one line,
exit 2, before TensorFlow sees the library; walks over libraries are iterative."""

from __future__ import annotations

from pathlib import Path

import pytest
from tf_helpers import listing

from graphpass.cli import main

DATA = Path(__file__).resolve().parent / "data"
LAYER = "__inference_layer_833"


def _meta(name: str):
    from tensorflow.core.protobuf import meta_graph_pb2

    meta = meta_graph_pb2.MetaGraphDef()
    meta.ParseFromString((DATA / name).read_bytes())
    return meta


def _function(meta, name: str):
    return next(f for f in meta.graph_def.library.function if f.signature.name == name)


def _call(fdef, name: str, callee: str, op: str = "PartitionedCall"):
    node = fdef.node_def.add(name=name, op=op)
    node.input.extend(a.name for a in fdef.signature.input_arg)
    node.attr["f"].func.name = callee
    node.attr["Tin"].list.type.extend(a.type for a in fdef.signature.input_arg)
    node.attr["Tout"].list.type.extend(a.type for a in fdef.signature.output_arg)
    return node


def _self_call(meta):
    _call(_function(meta, LAYER), "again", LAYER)


def _self_as_op(meta):
    _function(meta, LAYER).node_def.add(name="again", op=LAYER).input.extend(["a", "b"])


def _mutual(meta):
    library = meta.graph_def.library
    for name, callee in (("ping", "pong"), ("pong", "ping")):
        fdef = library.function.add()
        fdef.signature.CopyFrom(_function(meta, LAYER).signature)
        fdef.signature.name = name
        _call(fdef, "call", callee)
    _call(_function(meta, LAYER), "enter", "ping")


def _top_call(callee):
    def damage(meta):
        next(n for n in meta.graph_def.node if n.name == "PartitionedCall") \
            .attr["f"].func.name = callee
    return damage


def _body_input(text):
    def damage(meta):
        _function(meta, LAYER).node_def[1].input[0] = text
    return damage


def _gradient_of_nothing(meta):
    meta.graph_def.library.gradient.add(function_name=LAYER, gradient_func="ghost")


@pytest.mark.parametrize("damage,mentions", [
    (_self_call, f"function '{LAYER}' calls itself ('{LAYER}' -> '{LAYER}')"),
    (_self_as_op, f"function '{LAYER}' calls itself"),
    (_mutual, "calls itself ("),
    (_top_call("ghost"), "attr 'f' names function 'ghost', which is not in the library"),
    (_top_call(""), "attr 'f' names function '', which is not in the library"),
    (_body_input("Nope:product:0"), "has no argument or node 'Nope'"),
    (_body_input("MatMul:product:1e3"), "output index is not a non-negative integer"),
    (_body_input("MatMul:product:99999999999"), "output index is not a non-negative integer"),
    (_gradient_of_nothing, "names function 'ghost', which is not in the library"),
], ids=["self-call", "self-as-op", "mutual", "dangling", "empty-name", "body-input",
        "body-port", "body-port-huge", "gradient"])
def test_malformed_libraries_are_refused_before_tf(tmp_path, capsys, damage, mentions):
    """The recursive ones crashed TF's shape import (SIGSEGV) with
    ``--recompute '.*' --target xla``; the rest raised KeyError or ValueError."""
    meta = _meta("function_library.meta")
    damage(meta)
    path = tmp_path / "model.meta"
    path.write_bytes(meta.SerializeToString())
    before = listing(tmp_path)
    for argv in (["inspect", str(path)],
                 ["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--recompute", ".*",
                  "--target", "xla"],
                 ["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--drop-stale", "2"]):
        assert main(argv) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"graphpass: error: {path}: "), lines
        assert mentions in lines[0] and "re-export" in lines[0]
        assert listing(tmp_path) == before


def _chain(depth: int, writes_at_bottom: bool = True):
    """A library of ``depth`` functions each calling the next; the last writes."""
    from tensorflow.core.framework import function_pb2, graph_pb2

    graph_def = graph_pb2.GraphDef()
    for i in range(depth):
        fdef = function_pb2.FunctionDef()
        fdef.signature.name = f"f{i}"
        fdef.signature.input_arg.add(name="v", type=20)
        if i + 1 < depth:
            _call(fdef, "call", f"f{i + 1}", "StatefulPartitionedCall")
        elif writes_at_bottom:
            write = fdef.node_def.add(name="w", op="AssignAddVariableOp")
            write.input.extend(["v", "v"])
            write.attr["dtype"].type = 1
        graph_def.library.function.append(fdef)
    top = graph_def.node.add(name="var", op="VarHandleOp")
    call = graph_def.node.add(name="call", op="StatefulPartitionedCall")
    call.input.append(top.name)
    call.attr["f"].func.name = "f0"
    return graph_def


def test_deep_call_chains_are_walked_without_recursion():
    """500 nested calls raised RecursionError in the library walks."""
    from graphpass.formats import tf_function
    from graphpass.formats.tf_library_check import check_library

    depth = 3000
    graph_def = _chain(depth)
    check_library(graph_def, "chain")
    assert tf_function.graph_def_steps(graph_def) == [f"f{depth - 1}"]
    assert tf_function.argument_sources(graph_def, f"f{depth - 1}") == {"v": "var"}


def test_writing_functions_spread_through_deep_chains():
    from types import SimpleNamespace

    from graphpass.dialects.tf_updates import _writing_functions
    from graphpass.ir.graph import Graph

    graph = Graph("tf", SimpleNamespace(library=_chain(3000).library))
    assert len(_writing_functions(graph)) == 3000
    graph = Graph("tf", SimpleNamespace(library=_chain(50, writes_at_bottom=False).library))
    assert _writing_functions(graph) == {}


@pytest.mark.parametrize("first_input", [False, True])
def test_identity_loop_in_a_while_is_one_line(tmp_path, capsys, first_input):
    """A self-loop on ``while/Identity``: RecursionError in the dialect's fetch
    check; inspect describes it, rewrite names the cycle."""
    meta = _meta("control_flow.meta")
    node = next(n for n in meta.graph_def.node if n.name == "while/Identity")
    if first_input:
        node.input[0] = node.name
    else:
        node.input.append(node.name)
    path = tmp_path / "model.meta"
    path.write_bytes(meta.SerializeToString())
    assert main(["inspect", str(path)]) == 0
    capsys.readouterr()
    assert main(["rewrite", str(path), "-o", str(tmp_path / "o.meta"), "--drop-stale",
                 "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "graphpass: error: in the input graph: the graph has a cycle through "
        "'while/Identity'; the file is malformed: re-export it or fix that node"]
