"""TF2 training steps live in functions: find the one that holds the step, import
its body as the IR, and write it back into the library it came from.

A ``tf.function`` train step saved as a SavedModel signature is a chain of calls:
the MetaGraph's top level feeds placeholders to a ``StatefulPartitionedCall`` of
the signature wrapper, which calls the traced step function. The step function's
FunctionDef is the graph to rewrite. In the IR:

* each argument is a ``Placeholder`` named like the argument (FunctionDefs refer
  to arguments by their bare name, and nodes and arguments share one namespace);
* each result is a ``_Retval`` node (TF's own in-graph form of a function result),
  named ``graphpass/ret/<output name>``, with ``index`` the result's position;
* the control outputs are kept as names in ``graph.format_state.function``.

FunctionDef inputs name outputs as ``node:output_arg:index``; the IR uses flat
output ports, so both directions go through the producing op's OpDef (or, for a
call of a library function, that function's signature). Everything else of the
FunctionDef (signature, attrs such as ``_XlaMustCompile``, arg/result attrs,
resource ids) is carried as read; everything else of the container (object graph,
other functions, signatures) is not touched.
"""

from __future__ import annotations

from graphpass.dialects.tf_ops import (
    RESULT_OP,
    called_functions,
    op_def,
    output_arg_sizes,
    shape_tuple,
    writes_variables,
)
from graphpass.errors import GraphpassError
from graphpass.formats.tf_node_def import keep_extras, write_extras
from graphpass.formats.tf_state import TFFunction, TFState
from graphpass.ir.graph import Graph, Tensor

CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
RESULT_SCOPE = "graphpass/ret/"
DEFAULT_SIGNATURE = "train"


def _called(node_def, functions: dict) -> str | None:
    """The library function ``node_def`` calls, if any (a call op or the function
    used as an op)."""
    if node_def.op in CALL_OPS:
        return node_def.attr["f"].func.name
    return node_def.op if node_def.op in functions else None


def _holds_writes(name: str, functions: dict) -> bool:
    """Whether function ``name`` or a function it calls writes a variable (an
    iterative walk: call chains may be deep, and a malformed library cyclic)."""
    seen, stack = {name}, [name]
    while stack:
        fdef = functions.get(stack.pop())
        for node_def in fdef.node_def if fdef is not None else ():
            if writes_variables(node_def.op):
                return True
            for callee in called_functions(node_def.op, node_def.attr, functions):
                if callee not in seen:
                    seen.add(callee)
                    stack.append(callee)
    return False


def step_function(functions: dict, start: str) -> str:
    """Follow calls from function ``start`` to the function whose own body writes
    variables: a function that only forwards to one writing callee is a wrapper."""
    name = start
    for _ in range(len(functions)):
        fdef = functions.get(name)
        if fdef is None:
            return name
        if any(writes_variables(n.op) for n in fdef.node_def):
            return name
        callees = sorted({c for n in fdef.node_def
                          for c in called_functions(n.op, n.attr, functions)
                          if _holds_writes(c, functions)})
        # Only a plain call forwards the step; an If's branches are part of it.
        calls = [n for n in fdef.node_def if _called(n, functions) in callees]
        if len(callees) != 1 or len(calls) != 1:
            return name
        name = callees[0]
    return name


def library_functions(graph_def) -> dict:
    return {f.signature.name: f for f in graph_def.library.function}


def signature_entry(meta_graph, key: str, functions: dict) -> str | None:
    """The function a signature's outputs come from (the wrapper), or None when
    they are plain top-level tensors (a TF1 signature)."""
    signature = meta_graph.signature_def[key]
    nodes = {n.name: n for n in meta_graph.graph_def.node}
    callees = set()
    for info in list(signature.outputs.values()):
        node_def = nodes.get(info.name.split(":")[0])
        callee = _called(node_def, functions) if node_def is not None else None
        if callee is None:
            return None
        callees.add(callee)
    return callees.pop() if len(callees) == 1 else None


def signatures(meta_graph) -> list[dict]:
    """Each signature of a MetaGraph: its key, the function holding its step (if
    it follows a call into the library) and whether that function writes variables."""
    functions = library_functions(meta_graph.graph_def)
    found = []
    for key in sorted(meta_graph.signature_def):
        entry = signature_entry(meta_graph, key, functions)
        step = step_function(functions, entry) if entry else None
        found.append({"signature": key, "function": step,
                      "updates_variables": bool(step and _holds_writes(step, functions))})
    return found


def choose_signature(meta_graph, requested: str | None, where: str) -> str | None:
    """The function to import for ``--signature`` (default ``train`` when it holds a
    training step, else the one signature that does); None keeps the top level."""
    listed = signatures(meta_graph)
    by_key = {s["signature"]: s for s in listed}
    names = ", ".join(by_key) or "none"
    if requested is not None:
        chosen = by_key.get(requested)
        if chosen is None:
            raise GraphpassError(f"{where}: no signature {requested!r}; it has: {names}")
        if not chosen["updates_variables"]:
            raise GraphpassError(
                f"{where}: signature {requested!r} holds no training step (no variable "
                f"updates); signatures with updates: "
                f"{', '.join(s['signature'] for s in listed if s['updates_variables'])}")
        return chosen["function"]
    training = [s for s in listed if s["updates_variables"]]
    default = by_key.get(DEFAULT_SIGNATURE)
    if default is not None and default["updates_variables"]:
        return default["function"]
    if len(training) == 1:
        return training[0]["function"]
    if len(training) > 1:
        raise GraphpassError(
            f"{where}: several signatures update variables "
            f"({', '.join(s['signature'] for s in training)}); choose one with --signature")
    return None


def graph_def_steps(graph_def) -> list[str]:
    """For a GraphDef without apply ops at its top level: the step functions behind
    its top-level calls that (transitively) write variables. A TF2 graph also calls
    its checkpoint restore function, which writes too; the caller tells them apart."""
    if any(n.op.startswith(("ResourceApply", "ResourceSparseApply", "Apply", "SparseApply"))
           for n in graph_def.node):
        return []
    functions = library_functions(graph_def)
    entries = {c for n in graph_def.node
               if (c := _called(n, functions)) and _holds_writes(c, functions)}
    return sorted({step_function(functions, e) for e in entries})


def _reaches(name: str, step: str, functions: dict) -> bool:
    """Whether function ``name`` is ``step`` or calls it, directly or not."""
    seen, stack = {name}, [name]
    while stack:
        current = stack.pop()
        if current == step:
            return True
        fdef = functions.get(current)
        for node_def in fdef.node_def if fdef is not None else ():
            callee = _called(node_def, functions)
            if callee and callee not in seen:
                seen.add(callee)
                stack.append(callee)
    return False


def argument_sources(graph_def, step: str) -> dict[str, str]:
    """``{argument of step: top-level node}``: which variable (``VarHandleOp``) or
    placeholder each argument of the step function is, following the calls that
    lead to it from the top level (depth first, with an explicit stack)."""
    functions = library_functions(graph_def)
    stack = [(iter(graph_def.node), None)]
    while stack:
        node_def = next(stack[-1][0], None)
        if node_def is None:
            stack.pop()
            continue
        names = stack[-1][1]
        callee = _called(node_def, functions)
        if callee is None or callee not in functions \
                or not _reaches(callee, step, functions):
            continue
        inputs = [i.split(":")[0] for i in node_def.input if not i.startswith("^")]
        outer = inputs if names is None else [names.get(i) for i in inputs]
        args = [a.name for a in functions[callee].signature.input_arg]
        mapping = {a: o for a, o in zip(args, outer) if o}
        if callee == step:
            return mapping
        stack.append((iter(functions[callee].node_def), mapping))
    return {}


# -- FunctionDef -> IR ----------------------------------------------------------


def graph_from_function(fdef, functions: dict, state: TFState) -> Graph:
    """The IR of one FunctionDef body (arguments as placeholders, results as
    ``_Retval`` nodes); ``state`` is the container's, kept for writing back."""
    graph = Graph("tf", state)
    graph.format_state.function = TFFunction(
        name=fdef.signature.name, control_ret=dict(fdef.control_ret),
        args=frozenset(a.name for a in fdef.signature.input_arg),
        nodes=frozenset(n.name for n in fdef.node_def),
        xla_must_compile=_must_compile(fdef, functions))
    for index, arg in enumerate(fdef.signature.input_arg):
        node = graph.add_node(arg.name, "Placeholder",
                              attrs=_placeholder_attrs(fdef, index, arg))
        node.meta["shapes"] = [_arg_shape(fdef, index)]
    for node_def in fdef.node_def:
        if node_def.name in graph:
            raise GraphpassError(f"function {fdef.signature.name}: node name "
                                 f"{node_def.name!r} appears twice; the library is malformed")
        node = graph.add_node(node_def.name, node_def.op, attrs=dict(node_def.attr),
                              device=node_def.device)
        keep_extras(node, node_def)
        shapes = node_def.attr.get("_output_shapes")
        if shapes is not None:
            node.meta["shapes"] = [shape_tuple(p) for p in shapes.list.shape]
    outputs = _OutputNames(graph, functions)
    for node_def in fdef.node_def:
        inputs = node_def.input
        graph.connect(node_def.name,
                      [outputs.tensor(t) for t in inputs if not t.startswith("^")],
                      [t[1:] for t in inputs if t.startswith("^")])
    for index, arg in enumerate(fdef.signature.output_arg):
        graph.add_node(RESULT_SCOPE + arg.name, RESULT_OP, [outputs.tensor(fdef.ret[arg.name])],
                       attrs=_retval_attrs(arg.type, index))
    return graph


def _must_compile(fdef, functions: dict) -> bool:
    """``jit_compile=True``: the function, or a call of it, carries ``_XlaMustCompile``."""
    if fdef.attr["_XlaMustCompile"].b if "_XlaMustCompile" in fdef.attr else False:
        return True
    name = fdef.signature.name
    return any(_called(n, functions) == name and "_XlaMustCompile" in n.attr
               and n.attr["_XlaMustCompile"].b
               for f in functions.values() for n in f.node_def)


def _placeholder_attrs(fdef, index: int, arg) -> dict:
    from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2

    attrs = {"dtype": attr_value_pb2.AttrValue(type=arg.type)}
    shapes = fdef.arg_attr[index].attr.get("_output_shapes") if index in fdef.arg_attr else None
    shape = shapes.list.shape[0] if shapes is not None and shapes.list.shape else \
        tensor_shape_pb2.TensorShapeProto(unknown_rank=True)
    attrs["shape"] = attr_value_pb2.AttrValue(shape=shape)
    if arg.handle_data:  # a resource: what the variable holds
        attrs["_handle_dtypes"] = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[h.dtype for h in arg.handle_data]))
        attrs["_handle_shapes"] = attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            shape=[h.shape for h in arg.handle_data]))
    return attrs


def _arg_shape(fdef, index: int) -> tuple | None:
    shapes = fdef.arg_attr[index].attr.get("_output_shapes") if index in fdef.arg_attr else None
    if shapes is None or not shapes.list.shape:
        return None
    return shape_tuple(shapes.list.shape[0])


def _retval_attrs(dtype: int, index: int) -> dict:
    from tensorflow.core.framework import attr_value_pb2

    return {"T": attr_value_pb2.AttrValue(type=dtype), "index": attr_value_pb2.AttrValue(i=index)}


class _OutputNames:
    """Translates between FunctionDef output names (``node:arg:index``) and flat
    ports, from the OpDef (or the called function's signature) of the producer."""

    def __init__(self, graph: Graph, functions: dict) -> None:
        self.graph = graph
        self.functions = functions

    def _arg_sizes(self, name: str) -> list[tuple[str, int]]:
        node = self.graph.node(name)
        if node.op in self.functions:
            return [(a.name, 1) for a in self.functions[node.op].signature.output_arg]
        sizes = output_arg_sizes(node)
        if sizes is None:
            raise GraphpassError(f"node {name!r}: op {node.op!r} is neither registered nor "
                                 "a library function; cannot read its outputs")
        return [(arg.name, count) for arg, count in sizes]

    def tensor(self, text: str) -> Tensor:
        parts = text.split(":")
        if len(parts) == 1:  # an argument
            return Tensor(parts[0], 0)
        if len(parts) == 2:  # an argument list element
            return Tensor(parts[0], int(parts[1]))
        node, arg_name, index = parts
        port = 0
        for name, count in self._arg_sizes(node):
            if name == arg_name:
                return Tensor(node, port + int(index))
            port += count
        raise GraphpassError(f"input {text!r}: {node!r} has no output {arg_name!r}")

    def text(self, tensor: Tensor) -> str:
        if self.graph.node(tensor.node).op == "Placeholder" and \
                tensor.node in self.graph.format_state.function.args:
            return tensor.node if tensor.port == 0 else f"{tensor.node}:{tensor.port}"
        start = 0
        for name, count in self._arg_sizes(tensor.node):
            if tensor.port < start + count:
                return f"{tensor.node}:{name}:{tensor.port - start}"
            start += count
        raise GraphpassError(f"{tensor}: no such output")


# -- IR -> FunctionDef ----------------------------------------------------------


def function_from_graph(graph: Graph, original):
    """The rewritten FunctionDef: ``original`` with its body, results and control
    outputs replaced from the IR. Stateful nodes a pass added that nothing reads
    become control outputs, so the function runtime does not prune them."""
    fdef = type(original)()
    fdef.CopyFrom(original)
    del fdef.node_def[:]
    fdef.ClearField("ret")
    args = graph.format_state.function.args
    outputs = _OutputNames(graph, library_functions_of(graph))
    results = {}
    for node in graph.nodes():
        if node.name in args:
            continue
        if node.op == RESULT_OP and node.name.startswith(RESULT_SCOPE):
            results[node.name[len(RESULT_SCOPE):]] = outputs.text(graph.inputs(node.name)[0])
            continue
        node_def = fdef.node_def.add(name=node.name, op=node.op, device=node.device)
        node_def.input.extend(outputs.text(t) for t in graph.inputs(node.name))
        node_def.input.extend("^" + c for c in graph.control_inputs(node.name))
        for key, value in node.attrs.items():
            node_def.attr[key].CopyFrom(value)
        write_extras(node_def, node)
    for arg in original.signature.output_arg:
        fdef.ret[arg.name] = results[arg.name]
    control_ret = {k: v for k, v in graph.format_state.function.control_ret.items() if v in graph}
    known = graph.format_state.function.nodes
    for node in graph.nodes():
        definition = op_def(node.op)
        if node.name not in known and node.name not in args and node.op != RESULT_OP \
                and (definition is None or definition.is_stateful) \
                and not graph.users(node.name) and node.name not in control_ret.values():
            control_ret[node.name] = node.name
    fdef.ClearField("control_ret")
    for key, value in control_ret.items():
        fdef.control_ret[key] = value
    del fdef.signature.control_output[:]
    fdef.signature.control_output.extend(sorted(control_ret))
    return fdef


def library_functions_of(graph: Graph) -> dict:
    library = graph.format_state.library
    return {f.signature.name: f for f in library.function} if library is not None else {}


def outer_graph_def(graph: Graph):
    """The container's GraphDef with the step function replaced by the IR's body
    (and any functions a pass added to the library, such as ``If`` branches)."""
    outer = type(graph.format_state.outer_graph_def)()
    outer.CopyFrom(graph.format_state.outer_graph_def)
    name = graph.format_state.function.name
    library = graph.format_state.library
    original = library_functions(outer)[name]
    rewritten = function_from_graph(graph, original)
    outer.library.CopyFrom(library)
    for index, fdef in enumerate(outer.library.function):
        if fdef.signature.name == name:
            outer.library.function[index].CopyFrom(rewritten)
    return outer
