"""The IR's edge bookkeeping, which the reader and writer rely on: both
directions of every edge agree after any edit (onnx-graphsurgeon's rule)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphpass.ir.graph import Graph, Tensor
from graphpass.ir.verify import InvariantError, MalformedGraphError, verify
from graphpass.options import RuntimeConfig
from graphpass.passes.base import Pass, Pipeline
from graphpass.passes.context import PassContext
from graphpass.runtimes import runtime_for

DATA = Path(__file__).resolve().parent / "data"


def _graph() -> Graph:
    graph = Graph("tf")
    graph.add_node("a", "Placeholder")
    graph.add_node("b", "Placeholder")
    graph.add_node("c", "AddV2", [Tensor("a"), Tensor("b")], ["b"])
    graph.add_node("d", "Mul", [Tensor("c"), Tensor("c")], ["a", "b"])
    return graph


def _both_directions_agree(graph: Graph) -> None:
    for name in graph:
        for slot, tensor in enumerate(graph.inputs(name)):
            assert (name, slot) in graph.consumers(tensor)
            assert tensor.port in graph.used_ports(tensor.node)
        for src in graph.control_inputs(name):
            assert name in graph.control_users(src)
        for user in graph.data_users(name):
            assert any(t.node == name for t in graph.inputs(user))


def test_inputs_in_slot_order_and_control_inputs_in_added_order():
    graph = _graph()
    assert graph.inputs("d") == [Tensor("c"), Tensor("c")]
    assert graph.control_inputs("d") == ["a", "b"]
    assert graph.consumers(Tensor("c")) == [("d", 0), ("d", 1)]
    assert graph.users("b") == ["c", "d"] and graph.producers("d") == ["c", "a", "b"]
    _both_directions_agree(graph)


def test_set_input_replaces_only_its_slot():
    graph = _graph()
    graph.set_input("d", 1, Tensor("a"))
    assert graph.inputs("d") == [Tensor("c"), Tensor("a")]
    assert graph.consumers(Tensor("c")) == [("d", 0)]
    graph.set_input("d", 0, Tensor("b"))
    assert graph.inputs("d") == [Tensor("b"), Tensor("a")]
    assert graph.data_users("c") == [] and graph.control_inputs("d") == ["a", "b"]
    _both_directions_agree(graph)


def test_clear_input_and_control_edges_beside_data_edges():
    graph = _graph()
    graph.clear_input("c", 0)
    assert graph.input_slots("c") == {1: Tensor("b")}
    assert graph.control_inputs("c") == ["b"]  # the control edge from b is untouched
    graph.clear_input("c", 1)
    assert graph.inputs("c") == [] and graph.control_inputs("c") == ["b"]
    graph.remove_control_input("c", "b")
    assert graph.users("b") == ["d"]
    _both_directions_agree(graph)


def test_ancestors_with_and_without_control_edges():
    graph = _graph()
    graph.add_node("e", "Identity", [Tensor("a")], ["d"])
    assert graph.ancestors(["e"]) == {"a", "b", "c", "d"}
    assert graph.ancestors(["e"], follow_control=False) == {"a"}
    assert graph.descendants(["b"], follow_control=False) == {"c", "d"}
    assert graph.descendants(["d"]) == {"e"}
    assert graph.descendants(["d"], follow_control=False) == set()


def test_unknown_node_is_a_key_error_not_an_empty_answer():
    graph = _graph()
    graph.add_node("x", "Placeholder")
    # "xd" is not a node, though "x" and "d" are: no character-wise lookup
    for method in (graph.inputs, graph.control_inputs, graph.data_users):
        with pytest.raises(KeyError, match="no node named 'xd'"):
            method("xd")


def test_connect_wires_a_new_node_and_refuses_one_with_inputs():
    graph = _graph()
    graph.add_node("e", "AddN")
    graph.connect("e", [Tensor("c"), Tensor("d")], ["a"])
    assert graph.inputs("e") == [Tensor("c"), Tensor("d")]
    assert graph.control_inputs("e") == ["a"]
    _both_directions_agree(graph)
    with pytest.raises(ValueError, match="already has inputs"):
        graph.connect("e", [Tensor("a")])


def test_topological_order_follows_every_structural_edit():
    graph = _graph()
    assert graph.topological_order() == ["a", "b", "c", "d"]
    version = graph.version
    graph.add_node("first", "Placeholder")
    graph.set_input("a", 0, Tensor("first"))  # a now runs after a later-added node
    assert graph.version > version
    assert graph.topological_order() == ["b", "first", "a", "c", "d"]
    order = graph.topological_order()
    order.clear()  # the caller's copy: the kept order is untouched
    assert graph.topological_order() == ["b", "first", "a", "c", "d"]
    graph.add_control_input("b", "d")  # a cycle
    with pytest.raises(ValueError, match="cycle"):
        graph.topological_order()


def test_node_views_follow_removal_and_copy():
    graph = _graph()
    graph.add_node("e", "Identity", [Tensor("d")])
    graph.remove_node("e")
    with pytest.raises(KeyError):
        graph.node("e")
    graph.add_node("e", "Neg", [Tensor("c")])
    assert graph.node("e").op == "Neg"
    assert [n.name for n in graph.nodes()] == ["a", "b", "c", "d", "e"]
    copy = graph.copy()
    copy.node("e").attrs["T"] = 1
    assert "T" not in graph.node("e").attrs
    assert [n.name for n in copy.nodes()] == list(copy)


# -- the checker between passes ---------------------------------------------------


class _Edit(Pass):
    """A pass that applies ``edit`` to the graph (a buggy pass, for the checker)."""

    name = "edit"

    def __init__(self, edit) -> None:
        super().__init__()
        self.edit = edit

    def run(self, graph: Graph, ctx) -> bool:
        self.edit(graph)
        return True


def test_edits_are_recorded_in_first_edit_order():
    graph = _graph()
    assert graph.take_edited() == ["a", "b", "c", "d"] and graph.take_edited() == []
    graph.set_input("d", 1, Tensor("a"))
    graph.add_node("e", "Identity", [Tensor("d")])
    graph.clear_input("c", 0)
    graph.add_control_input("c", "a")
    graph.remove_control_input("d", "b")
    assert graph.take_edited() == ["d", "e", "c"]
    assert graph.copy().take_edited() == [] and graph.take_edited() == []


def test_a_read_graph_is_vouched_for_by_its_reader():
    import graphpass

    graph = graphpass.load(DATA / "mlp_adam.meta")
    assert graph.take_edited() == []


@pytest.mark.parametrize("edit,problem", [
    (lambda g: g.clear_input("c", 0), "node 'c' has gaps in its input slots [1]"),
    (lambda g: g.set_input("d", 1, Tensor("a", 3)),
     "node 'd' reads a:3, but 'a' has only 1 output"),
    (lambda g: g.set_input("a", 0, Tensor("d")), "the graph has a cycle through"),
    (lambda g: g.add_control_input("b", "d"), "the graph has a cycle through"),
])
def test_the_checker_catches_what_a_pass_broke(edit, problem):
    graph = _graph()
    with pytest.raises(InvariantError, match=f"after pass 'edit': {re.escape(problem)}"):
        Pipeline([_Edit(edit)]).run(graph)


def _filter_and_bias_gradients() -> Graph:
    """A convolution's filter gradient and the bias gradient of the same incoming
    gradient ``dy``, which TF with oneDNN runs as one kernel
    (``RuntimeModel.merged_with``), and ``x``, an input of the filter gradient."""
    graph = Graph("tf")
    for name in ("x", "w_shape", "dy"):
        graph.add_node(name, "Placeholder")
    graph.add_node("x_again", "Identity", [Tensor("x")])
    graph.add_node("filter_grad", "Conv2DBackpropFilter",
                   [Tensor("x_again"), Tensor("w_shape"), Tensor("dy")])
    graph.add_node("bias_grad", "BiasAddGrad", [Tensor("dy")])
    return graph


def test_the_checker_catches_a_path_between_kernels_the_runtime_merges():
    """An edge from the bias gradient into what the filter gradient reads is no
    cycle in the graph, but one in the kernel oneDNN makes of the two: a pass
    that adds it broke the step (TF rejects it, or leaves it unrun); an input
    graph is left as exported."""
    graph = _filter_and_bias_gradients()
    assert runtime_for(graph).merged_with(graph, "filter_grad") == ["bias_grad"]
    Pipeline([_Edit(lambda g: g.add_control_input("bias_grad", "x"))]).run(graph)
    with pytest.raises(InvariantError, match="after pass 'edit': node 'filter_grad' depends "
                                             "on 'bias_grad', which the runtime runs with it"):
        Pipeline([_Edit(lambda g: g.add_control_input("x_again", "bias_grad"))]).run(graph)
    verify(graph)  # as input, the same graph: left to the exporter


def test_kernels_merged_only_with_onednn_are_checked_only_for_a_target_with_onednn():
    """The check is the target runtime's (``RuntimeModel.ir_checks``), under the
    configuration the options give: without oneDNN the two gradients are two
    kernels, and the same edge is no cycle anywhere."""
    graph = _filter_and_bias_gradients()
    off = PassContext(runtime_config=RuntimeConfig(onednn=False))
    assert off.runtime(graph).merged_with(graph, "filter_grad") == []
    assert Pipeline([_Edit(lambda g: g.add_control_input("x_again", "bias_grad"))]).run(
        graph, off)[0].changed


def test_an_input_built_with_a_bad_port_is_refused_before_any_pass():
    graph = _graph()
    graph.add_node("e", "Identity", [Tensor("d", 2)])
    with pytest.raises(MalformedGraphError, match="in the input graph: node 'e' reads d:2"):
        Pipeline([_Edit(lambda g: None)]).run(graph)


def test_unique_name_is_the_lowest_free_name_after_removals():
    graph = _graph()
    names = [graph.add_node(graph.unique_name("n"), "NoOp").name for _ in range(4)]
    assert names == ["n", "n_1", "n_2", "n_3"]
    assert graph.unique_name("n") == "n_4" == graph.unique_name("n")  # not taken yet
    graph.remove_node("n_2")
    assert graph.unique_name("n") == "n_2"
    graph.add_node("n_2", "NoOp")
    graph.remove_node("n")
    assert graph.unique_name("n") == "n"


def test_a_copy_writes_its_own_format_state_containers():
    graph = Graph("onnx")
    graph.format_state.initializers.update(w=1)
    graph.format_state.inputs.append("x")
    other = graph.copy()
    other.format_state.initializers["v"] = 2
    other.format_state.inputs.append("y")
    assert (graph.format_state.initializers, graph.format_state.inputs) == ({"w": 1}, ["x"])
    assert (other.format_state.initializers, other.format_state.inputs) == (
        {"w": 1, "v": 2}, ["x", "y"])


def test_a_copy_of_a_tf_step_writes_its_own_function_record():
    from graphpass.formats.tf_state import TFFunction

    graph = _graph()
    graph.format_state.function = TFFunction("f", {"c": "c"}, frozenset(), frozenset(), False)
    other = graph.copy()
    other.format_state.function.control_ret["d"] = "d"
    other.format_state.function.variables["x"] = "v"
    assert graph.format_state.function.control_ret == {"c": "c"}
    assert graph.format_state.function.variables == {}


# -- records: a node as its file held it -------------------------------------------


@pytest.mark.parametrize("edit", [
    lambda g: g.set_input("d", 1, Tensor("a")),
    lambda g: g.clear_input("d", 1),
    lambda g: g.add_control_input("d", "c"),
    lambda g: g.remove_control_input("d", "a"),
    lambda g: g.node("d").attrs.__setitem__("T", 2),
    lambda g: g.node("d").attrs.pop("T"),
    lambda g: g.node("d").attrs.update(U=3),
    lambda g: setattr(g.node("d"), "device", "/cpu:0"),
])
def test_every_edit_through_the_ir_forgets_a_nodes_record(edit):
    """A writer re-emits a node's record only while the node is as read, so an
    edit of its inputs, attrs or device, in whatever form, must forget it; the
    other nodes keep theirs, and so does a copy until it is edited itself."""
    graph = _graph()
    graph.node("d").attrs.update(T=1)
    graph.node("d").attrs.edited = False  # as a reader leaves a node it just made
    for name in graph:
        graph.keep_record(name, f"record of {name}")
    copy = graph.copy()
    edit(graph)
    assert graph.record("d") is None
    assert [graph.record(n) for n in "abc"] == [f"record of {n}" for n in "abc"]
    assert copy.record("d") == "record of d"
    edit(copy)
    assert copy.record("d") is None


def test_connect_keeps_a_record_and_a_new_node_has_none():
    graph = Graph("tf")
    graph.add_node("a", "Placeholder")
    graph.add_node("b", "Identity")
    graph.keep_record("b", "b as read")
    graph.connect("b", [Tensor("a")], ["a"])
    assert graph.record("b") == "b as read" and graph.record("a") is None


# -- acyclicity: proven in one sweep where the last order still holds -------------


def _chain(length: int) -> Graph:
    graph = Graph("tf")
    graph.add_node("n0", "Placeholder")
    for i in range(1, length):
        graph.add_node(f"n{i}", "Neg", [Tensor(f"n{i - 1}")])
    return graph


def test_topological_order_of_a_graph_in_dependency_order_is_its_order(monkeypatch):
    """A graph whose insertion order is topological (a file as exported) gets that
    order after one sweep, without Kahn's heap; one that is not gets Kahn's order,
    ties broken by insertion."""
    import heapq

    graph = _chain(6)
    pops = []
    pop = heapq.heappop
    monkeypatch.setattr(heapq, "heappop", lambda heap: pops.append(1) or pop(heap))
    assert graph.topological_order() == [f"n{i}" for i in range(6)] and pops == []
    graph.add_node("early", "Placeholder")
    graph.set_input("n1", 0, Tensor("early"))
    assert graph.topological_order() == ["n0", "early", "n1", "n2", "n3", "n4", "n5"]
    assert len(pops) == 7


def test_check_acyclic_places_new_nodes_before_their_readers_without_a_sort(monkeypatch):
    """After a pass adds nodes that earlier nodes read (recomputed copies), the last
    proven order with each new node placed before its first reader is checked in
    one sweep; the full sort runs only when that fails, and still finds cycles."""
    graph = _chain(8)
    graph.check_acyclic()
    sorts = []
    monkeypatch.setattr(Graph, "_sorted", lambda self, ignore: sorts.append(1) or [])
    graph.add_node("copy2", "Neg", [Tensor("n1")])
    graph.add_node("copy3", "Neg", [Tensor("copy2")], ["n5"])
    graph.set_input("n6", 0, Tensor("copy3"))
    graph.add_node("sink", "NoOp", [], ["n7", "copy3"])
    graph.check_acyclic()
    graph.check_acyclic()  # proven for this version: nothing to do
    assert sorts == []
    monkeypatch.undo()
    graph.set_input("copy2", 0, Tensor("n6"))  # n6 -> copy2 -> copy3 -> n6
    with pytest.raises(ValueError, match="the graph has a cycle through"):
        graph.check_acyclic()


def _networkx_agrees_both_ways(graph: Graph) -> None:
    """Through networkx's public API: every edge listed out of its source is listed
    into its destination with the same data, and the IR's reads are those edges."""
    g = graph.nx
    out = {(u, v, k): d for u in g for _, v, k, d in g.out_edges(u, keys=True, data=True)}
    into = {(u, v, k): d for v in g for u, _, k, d in g.in_edges(v, keys=True, data=True)}
    assert out == into
    for name in graph:
        reads = {(u, k, d["src_port"]) for (u, v, k), d in into.items() if v == name}
        assert reads == {(t.node, slot, t.port) for slot, t in graph.input_slots(name).items()} \
            | {(src, "^", -1) for src in graph.control_inputs(name)}
        assert set(graph.users(name)) == {v for (u, v, _) in out if u == name}
    _both_directions_agree(graph)


def _structure(graph: Graph) -> list:
    """What the IR's reads give, in their defined orders (producers have none: a
    copy lists them as networkx's ``copy`` does, in the users' order)."""
    return [(name, graph.inputs(name), graph.control_inputs(name),
             sorted(graph.producers(name)), graph.users(name)) for name in graph]


def test_both_directions_of_every_edge_agree_after_edits_and_copies():
    """Checked through networkx's public API (never its internal dicts), after each
    kind of edit, on a copy and on the original the copy was edited apart from."""
    graph = _graph()
    graph.add_node("e", "Identity", [Tensor("d")], ["c"])
    edits = [
        lambda g: g.set_input("c", 0, Tensor("b")),   # producer orders differ from user orders
        lambda g: g.add_control_input("c", "a"),
        lambda g: g.clear_input("d", 1),
        lambda g: g.remove_control_input("d", "a"),
        lambda g: g.replace_uses(Tensor("c"), Tensor("a")),
        lambda g: g.remove_node("e"),
    ]
    for edit in edits:
        edit(graph)
        _networkx_agrees_both_ways(graph)
        copy = graph.copy()
        assert _structure(copy) == _structure(graph)
        _networkx_agrees_both_ways(copy)
        before = _structure(graph)
        copy.set_input("d", 0, Tensor("b"))
        copy.add_control_input("d", "c")
        _networkx_agrees_both_ways(copy)
        assert _structure(graph) == before  # the copy's edges are its own


def test_input_nodes_are_the_data_and_control_inputs():
    graph = _graph()
    graph.set_input("d", 0, Tensor("b"))
    graph.add_control_input("d", "c")
    for name in graph:
        assert graph.input_nodes(name) == ([t.node for t in graph.inputs(name)],
                                           graph.control_inputs(name))
    assert graph.input_nodes("d") == (["b", "c"], ["a", "b", "c"])


def test_formats_are_registered_by_the_package_and_an_unknown_one_is_named():
    """The IR names no dialect: the package registers TF's and ONNX's with it."""
    from graphpass.dialects.onnx import ONNXDialect
    from graphpass.dialects.tf import TFDialect

    assert isinstance(Graph("tf").dialect, TFDialect)
    assert isinstance(Graph("onnx").dialect, ONNXDialect)
    with pytest.raises(ValueError, match=r"no format state registered for format 'caffe' "
                                         r"\(registered: onnx, tf;"):
        Graph("caffe")
