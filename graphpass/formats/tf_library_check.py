"""The checks a TF function library must pass before anything walks it or hands
it to TensorFlow: every function reference resolves, no function calls itself
(directly or through others: TF's C++ recurses without end on such a library and
crashes the process), every argument and result of a signature has a name and a
dtype, and every input inside a function body names an argument or a node of
that body with an integer port.

One pass over the library, iterative (a chain of 500 nested calls is fine), each
problem one ``GraphpassError`` naming the function and the node. It reads the
protos and changes nothing; what a function *means* (which holds the step, what
it writes) is ``tf_function``'s question.
"""

from __future__ import annotations

from graphpass.dialects.tf_ops import attrs_problem, is_dtype, op_def
from graphpass.errors import GraphpassError
from graphpass.ir.order import first_cycle

CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
_FIX = "the library is malformed: re-export the model"


def check_library(graph_def, where: str) -> None:
    """A user error unless ``graph_def``'s library is well formed (see the module)."""
    library = graph_def.library
    functions = {}
    for fdef in library.function:
        name = fdef.signature.name
        if not name:
            raise GraphpassError(f"{where}: a library function has no name; {_FIX}")
        if name in functions:
            raise GraphpassError(f"{where}: the library defines function {name!r} twice; {_FIX}")
        functions[name] = fdef
    for gradient in library.gradient:
        if gradient.gradient_func not in functions:
            raise GraphpassError(f"{where}: the gradient of {gradient.function_name!r} names "
                                 f"function {gradient.gradient_func!r}, which is not in the "
                                 f"library; {_FIX}")
    for node_def in graph_def.node:
        _callees(node_def, functions, where, "the graph")
    calls = {name: sorted({c for n in fdef.node_def
                           for c in _callees(n, functions, where, f"function {name!r}")})
             for name, fdef in functions.items()}
    cycle = first_cycle(calls)
    if cycle:
        path = " -> ".join(repr(c) for c in cycle)
        raise GraphpassError(f"{where}: function {cycle[0]!r} calls itself ({path}); "
                             "TensorFlow cannot run a recursive function: re-export the model")
    for fdef in functions.values():
        _check_body(fdef, where)


def _callees(node_def, functions: dict, where: str, owner: str) -> list[str]:
    """The library functions ``node_def`` refers to; a user error for a reference
    that names none (the empty name included)."""
    found = [node_def.op] if node_def.op in functions else []
    names = []
    if node_def.op in CALL_OPS:
        if node_def.attr["f"].WhichOneof("value") != "func":
            raise GraphpassError(f"{where}: {owner}: call {node_def.name!r} has no function "
                                 f"attr 'f'; {_FIX}")
    for key, value in node_def.attr.items():
        kind = value.WhichOneof("value")
        if kind == "func":
            names.append((key, value.func.name))
        elif kind == "list":
            names.extend((key, f.name) for f in value.list.func)
    for key, name in names:
        if name in functions:
            found.append(name)
        elif not name or op_def(name) is None:
            raise GraphpassError(f"{where}: {owner}: node {node_def.name!r} attr {key!r} "
                                 f"names function {name!r}, which is not in the library; "
                                 f"{_FIX}")
    return found


def _check_signature(fdef, where: str) -> None:
    """Every argument and result has a name of its own and a dtype: a TF dtype, or
    one of the signature's attrs (a body imports each argument as a node of it)."""
    name = fdef.signature.name
    declared = {a.name for a in fdef.signature.attr}
    for kind, args in (("argument", fdef.signature.input_arg),
                       ("result", fdef.signature.output_arg)):
        seen = set()
        for arg in args:
            if not arg.name or arg.name in seen:
                raise GraphpassError(f"{where}: function {name!r} has {kind} "
                                     f"{arg.name or '<unnamed>'!r} "
                                     f"{'twice' if arg.name else 'without a name'}; {_FIX}")
            seen.add(arg.name)
            typed_by = [a for a in (arg.type_attr, arg.number_attr, arg.type_list_attr) if a]
            if not is_dtype(arg.type) and not (typed_by and set(typed_by) <= declared):
                raise GraphpassError(f"{where}: function {name!r}: {kind} {arg.name!r} has "
                                     f"no dtype (DataType {arg.type}, and no attr of the "
                                     f"signature gives one); {_FIX}")


def _check_body(fdef, where: str) -> None:
    """Every input of a body node names an argument or a node of the body, with an
    integer port (``node:output_arg:index``)."""
    _check_signature(fdef, where)
    name = fdef.signature.name
    args = {a.name for a in fdef.signature.input_arg}
    nodes = {n.name for n in fdef.node_def}
    polymorphic = len(fdef.signature.attr) > 0  # its body may hold $T placeholders
    for node_def in fdef.node_def:
        problem = None if polymorphic else attrs_problem(node_def.op, dict(node_def.attr))
        if problem:
            raise GraphpassError(f"{where}: function {name!r}: node {node_def.name!r}: attr "
                                 f"{problem[0]!r} {problem[1]}; {_FIX}")
        for text in node_def.input:
            source, *rest = text.lstrip("^").split(":")
            if source not in nodes and source not in args:
                raise GraphpassError(
                    f"{where}: function {name!r}: node {node_def.name!r} reads {text!r}, "
                    f"but the function has no argument or node {source!r}; {_FIX}")
            if len(rest) > 2 or (len(rest) == 2 and not _is_index(rest[1])) \
                    or (len(rest) == 1 and source in args and not _is_index(rest[0])):
                raise GraphpassError(
                    f"{where}: function {name!r}: node {node_def.name!r} reads {text!r}, "
                    f"whose output index is not a non-negative integer; {_FIX}")
    for key, text in list(fdef.ret.items()) + list(fdef.control_ret.items()):
        source = text.split(":")[0]
        if source not in nodes and source not in args:
            raise GraphpassError(f"{where}: function {name!r} returns {key!r} from {text!r}, "
                                 f"which is not a node of the function; {_FIX}")


def _is_index(text: str) -> bool:
    return text.isdigit() and text.isascii() and int(text) < 2**31
