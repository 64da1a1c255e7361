"""TF graph-level edits beyond ``GraphDef.node``: functions added to the
``FunctionDefLibrary`` (the branches of a functional ``If``) and MetaGraphDef
collections. The TF dialect's builders delegate here; protos stay out of passes.
Protos read from a file are copied before an edit, so a ``Graph.copy`` (which
shares ``meta``) never sees another graph's edits.
"""

from __future__ import annotations

import re

from graphpass.dialects.tf import (
    ResourceVariable,
    TFDialect,
    _attr,
    _DType,
    _dtype_enum,
    _Func,
    _locate_output,
    _Raw,
    _TypeList,
)
from graphpass.ir.graph import Graph, Tensor


def functional_if(dialect: TFDialect, graph: Graph, name: str, pred: Tensor,
                  branches: tuple[list[str], list[str]], results: tuple[float, float],
                  device: str = "") -> Tensor:
    """Move two sets of nodes into the then/else functions of one functional ``If``.

    Why a function: XLA compiles ``If`` (it rejects v1 Switch/Merge), and inside a
    branch function nodes run conditionally without dead tensors. Data inputs the
    moved nodes read from outside become the If's inputs (arguments of both
    branches); control inputs from outside become the If's control inputs. Each
    branch returns one float32 scalar (its entry of ``results``) after every node
    moved into it ran; its stateful nodes are also control outputs, so the function
    runtime never prunes them. Moved nodes must not be read outside their branch,
    and ref tensors cannot be inputs (raise ``ValueError``). Returns the If's output.
    """
    moved = [set(branch) for branch in branches]
    for members in moved:
        for node in members:
            outside = [u for u in graph.users(node) if u not in members]
            if outside:
                raise ValueError(f"{node!r} is read by {outside[0]!r} outside its branch")
    external: dict[Tensor, int] = {}
    controls: list[str] = []
    for branch, members in zip(branches, moved):
        for node in branch:
            for tensor in graph.inputs(node):
                if tensor.node not in members and tensor not in external:
                    if dialect.is_ref(graph, tensor):
                        raise ValueError(f"{node!r} reads the ref tensor {tensor}")
                    external[tensor] = len(external)
            controls += [c for c in graph.control_inputs(node)
                         if c not in members and c not in controls]
    inputs = list(external)
    types = [dialect._dt(graph, t) for t in inputs]
    library = _copy_library(graph)
    functions = []
    for branch, kind, result in zip(branches, ("then", "else"), results):
        fname = _unique_function_name(library, f"{name}_{kind}")
        library.function.append(
            _branch_function(dialect, graph, fname, branch, external, types, result))
        functions.append(fname)
    graph.meta["library"] = library
    if_node = dialect._op(graph, name, "If", [pred, *inputs], controls, device=device,
                          Tcond=dialect._dt(graph, pred), Tin=_TypeList(types),
                          Tout=_TypeList([_DType("float32")]),
                          then_branch=_Func(functions[0]), else_branch=_Func(functions[1]))
    doomed = set().union(*moved)
    # Readers before what they read, among the moved nodes only: the rest of the graph
    # may hold v1 while loops, whose back edges make it cyclic.
    inside = graph.topological_order(ignore_edge=lambda s, d: s not in doomed or d not in doomed)
    for node in reversed(inside):
        if node in doomed:
            graph.remove_node(node)
    return if_node


def _copy_library(graph: Graph):
    """An editable copy of the graph's FunctionDefLibrary (the read one stays untouched)."""
    from tensorflow.core.framework import function_pb2

    library = function_pb2.FunctionDefLibrary()
    if graph.meta.get("library") is not None:
        library.CopyFrom(graph.meta["library"])
    return library


def _unique_function_name(library, base: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", base)
    taken = {f.signature.name for f in library.function}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _branch_function(dialect: TFDialect, graph: Graph, fname: str, branch: list[str],
                     external: dict[Tensor, int], types: list[str], result: float):
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
        signature.input_arg.add(name=arg, type=_dtype_enum(dtype))
    signature.output_arg.add(name="result", type=_dtype_enum("float32"))
    members = set(branch)

    def reference(tensor: Tensor) -> str:
        if tensor.node not in members:
            return args[external[tensor]]
        arg, index = _locate_output(graph, tensor)
        return f"{tensor.node}:{arg.name}:{index}"

    for name in branch:
        node = graph.node(name)
        node_def = fdef.node_def.add(name=name, op=node.op, device=node.device)
        node_def.input.extend(reference(t) for t in graph.inputs(name))
        node_def.input.extend(f"^{c}" for c in graph.control_inputs(name) if c in members)
        for key, value in node.attrs.items():
            if key != "_class":  # colocation names nodes of the outer graph
                node_def.attr[key].CopyFrom(value)
        if dialect.is_stateful(graph, name):
            signature.control_output.append(name)
            fdef.control_ret[name] = name
    done = fdef.node_def.add(name="graphpass_result", op="Const")
    done.input.extend(f"^{n}" for n in branch if not set(graph.users(n)) & members)
    done.attr["dtype"].CopyFrom(_attr(_DType("float32")))
    done.attr["value"].CopyFrom(_attr(_Raw(tensor_util.make_tensor_proto(result, "float32"))))
    fdef.ret["result"] = "graphpass_result:output:0"
    return fdef


def register_global_variable(graph: Graph, variable: ResourceVariable) -> bool:
    """List a resource variable in a MetaGraphDef's global variables collection
    (non-trainable), as ``get_variable`` would; False when there is no MetaGraphDef.
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
    edit stays in this graph (``Graph.copy`` shares ``meta``); None for a GraphDef."""
    if graph.meta.get("metagraph") is not None:
        graph.meta["metagraph"] = _copy_proto(graph.meta["metagraph"])
        return graph.meta["metagraph"]
    if graph.meta.get("savedmodel") is not None:
        graph.meta["savedmodel"] = _copy_proto(graph.meta["savedmodel"])
        return graph.meta["savedmodel"].meta_graphs[graph.meta["metagraph_index"]]
    return None


def _tensor_name(tensor: Tensor) -> str:
    """``node:port`` always, as collections and VariableDefs spell tensors."""
    return f"{tensor.node}:{tensor.port}"


def _copy_proto(message):
    copied = type(message)()
    copied.CopyFrom(message)
    return copied
