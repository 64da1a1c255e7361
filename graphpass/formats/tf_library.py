"""TF graph-level edits beyond ``GraphDef.node``: functions added to the
``FunctionDefLibrary`` (the branches of a functional ``If``) and MetaGraphDef
collections. The TF dialect's builders delegate here; protos stay out of passes,
and this module knows no dialect (only the op table, ``tf_ops``).
Protos read from a file are copied before an edit, so a ``Graph.copy`` (which
shares the format state's protos) never sees another graph's edits.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from graphpass.dialects.tf_ops import DType, Raw, attr_value, dtype_enum, locate_output
from graphpass.ir.graph import Graph, Tensor, fresh_name


def add_branch_functions(graph: Graph, name: str, branches: tuple[list[str], list[str]],
                         external: dict[Tensor, int], types: list[str],
                         results: tuple[float, float],
                         is_stateful: Callable[[str], bool]) -> list[str]:
    """Add the then/else functions of a functional ``If`` named ``name`` to a copy of
    the graph's library: each branch's nodes, reading the If's inputs (``external``,
    of dtypes ``types``) as arguments and returning its entry of ``results`` once
    they all ran; its stateful nodes are control outputs too. Returns the two
    function names; the nodes stay in the graph (the caller removes them)."""
    library = _copy_library(graph)
    functions = []
    for branch, kind, result in zip(branches, ("then", "else"), results):
        fname = _unique_function_name(library, f"{name}_{kind}")
        library.function.append(
            _branch_function(graph, fname, branch, external, types, result, is_stateful))
        functions.append(fname)
    graph.format_state.library = library
    return functions


def _copy_library(graph: Graph):
    """An editable copy of the graph's FunctionDefLibrary (the read one stays untouched)."""
    from tensorflow.core.framework import function_pb2

    library = function_pb2.FunctionDefLibrary()
    if graph.format_state.library is not None:
        library.CopyFrom(graph.format_state.library)
    return library


def _unique_function_name(library, base: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", base)
    taken = {f.signature.name for f in library.function}
    return fresh_name(base, taken.__contains__)


def _branch_function(graph: Graph, fname: str, branch: list[str], external: dict[Tensor, int],
                     types: list[str], result: float, is_stateful: Callable[[str], bool]):
    """One ``If`` branch as a FunctionDef: the branch's nodes, reading the If's inputs
    as arguments, returning ``result`` once they all ran."""
    from tensorflow.core.framework import function_pb2
    from tensorflow.python.framework import tensor_util

    fdef = function_pb2.FunctionDef()
    signature = fdef.signature
    signature.name = fname
    signature.is_stateful = True
    args = [f"graphpass_arg_{i}" for i in range(len(types))]
    for arg, dtype in zip(args, types):
        signature.input_arg.add(name=arg, type=dtype_enum(dtype))
    signature.output_arg.add(name="result", type=dtype_enum("float32"))
    members = set(branch)

    def reference(tensor: Tensor) -> str:
        if tensor.node not in members:
            return args[external[tensor]]
        arg, index = locate_output(graph, tensor)
        return f"{tensor.node}:{arg.name}:{index}"

    for name in branch:
        node = graph.node(name)
        node_def = fdef.node_def.add(name=name, op=node.op, device=node.device)
        node_def.input.extend(reference(t) for t in graph.inputs(name))
        node_def.input.extend(f"^{c}" for c in graph.control_inputs(name) if c in members)
        for key, value in node.attrs.items():
            if key != "_class":  # colocation names nodes of the outer graph
                node_def.attr[key].CopyFrom(value)
        if is_stateful(name):
            signature.control_output.append(name)
            fdef.control_ret[name] = name
    done = fdef.node_def.add(name="graphpass_result", op="Const")
    done.input.extend(f"^{n}" for n in branch if not set(graph.users(n)) & members)
    done.attr["dtype"].CopyFrom(attr_value(DType("float32")))
    done.attr["value"].CopyFrom(attr_value(Raw(tensor_util.make_tensor_proto(result, "float32"))))
    fdef.ret["result"] = "graphpass_result:output:0"
    return fdef


def register_global_variable(graph: Graph, variable) -> bool:
    """List a resource variable (a ``capabilities.ResourceVariable``) in a
    MetaGraphDef's global variables collection (non-trainable), as ``get_variable``
    would; False when there is no MetaGraphDef.
    An existing Saver (``saver_def``) is left alone: its checkpoints stay loadable."""
    from tensorflow.core.framework import variable_pb2

    meta_graph = _editable_meta_graph(graph)
    if meta_graph is None:
        return False
    definition = variable_pb2.VariableDef(
        variable_name=f"{variable.handle}:0", initializer_name=variable.initializer,
        snapshot_name=_tensor_name(variable.read),
        initial_value_name=_tensor_name(variable.initial_value),
        is_resource=True, trainable=False)
    values = meta_graph.collection_def["variables"].bytes_list.value
    values.append(definition.SerializeToString())
    return True


def add_to_collection(graph: Graph, key: str, tensor: Tensor) -> bool:
    """Add a tensor name to a MetaGraphDef node-list collection (``summaries``)."""
    meta_graph = _editable_meta_graph(graph)
    if meta_graph is None:
        return False
    meta_graph.collection_def[key].node_list.value.append(_tensor_name(tensor))
    return True


def _editable_meta_graph(graph: Graph):
    """The MetaGraphDef the graph was read from, copied before each edit so that the
    edit stays in this graph (``Graph.copy`` shares the protos); None for a GraphDef."""
    if graph.format_state.metagraph is not None:
        graph.format_state.metagraph = _copy_proto(graph.format_state.metagraph)
        return graph.format_state.metagraph
    if graph.format_state.savedmodel is not None:
        graph.format_state.savedmodel = _copy_proto(graph.format_state.savedmodel)
        return graph.format_state.savedmodel.meta_graphs[graph.format_state.metagraph_index]
    return None


def _tensor_name(tensor: Tensor) -> str:
    """``node:port`` always, as collections and VariableDefs spell tensors."""
    return f"{tensor.node}:{tensor.port}"


def _copy_proto(message):
    copied = type(message)()
    copied.CopyFrom(message)
    return copied
