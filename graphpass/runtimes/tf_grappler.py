"""The graph TF's executor runs, asked from TF instead of modelled (the TF runtime
model's oracle): Grappler's meta optimizer (``tf_optimizer.OptimizeGraph``) run on
the step with a session's default ``RewriterConfig``, its fetches in the
``train_op`` collection so that nothing they need is pruned, read back into the IR.

Grappler's remapper fuses differently with oneDNN on and off, and TF reads that
setting once per process: where this process's setting is not the target's
(``RuntimeConfig.onednn``), Grappler is asked in a child process started with
the target's, so the answer never depends on the build machine.

Its nodes carry the temporaries TF's kernels allocate under the target's
configuration (``tf_kernels``). This is the graph a ``Session`` hands its executor,
less what runs after Grappler (the graph optimization passes: oneDNN's
``MklLayoutRewritePass`` replaces nodes with its kernels', which only a run shows,
in ``RunMetadata``'s partition graphs; the order its new nodes take in the
executor is modelled, ``tf_kernels.renamed_by_onednn``). Where TF is not
installed, or refuses the graph, :func:`runtime_graph` says why, and callers keep
the hand model (``tf_order.GrapplerView``).

It reads the graph and never edits it; node names Grappler keeps are the IR's
(Grappler renames only what it creates or folds), so the result maps back by name.
"""

from __future__ import annotations

from graphpass.formats.tf_function import library_functions, outer_graph_def
from graphpass.formats.tf_io import graph_def_from_graph, graph_from_graph_def
from graphpass.installed import TENSORFLOW, installed
from graphpass.ir.graph import Graph
from graphpass.options import RuntimeConfig
from graphpass.runtimes.base import RuntimeGraph
from graphpass.runtimes.tf_grappler_ask import optimize, send_each
from graphpass.runtimes.tf_kernels import mark_temporaries

#: The call of the step in the graph :func:`called_positions` builds (a session's name).
CALL = "StatefulPartitionedCall"
#: The prefix of that graph's data inputs' names, which sorts them before every
#: variable's name.
DATA_FIRST = "0/"
#: What a figure was computed on (``RuntimeGraph.model``).
GRAPPLER = "the graph Grappler hands TF's executor"
HAND_MODEL = "graphpass's model of Grappler"


def runtime_graph(graph: Graph, fetches: list[str],
                  config: RuntimeConfig | None = None) -> RuntimeGraph:
    """The graph TF runs for ``fetches`` (``node`` or ``node:port``) under ``config``
    (default: ``RuntimeConfig()``), or ``graph`` itself under the hand model, with
    the reason, where TF cannot be asked. Its ``node_orders``: Grappler's output in
    its own order (oneDNN's layout pass reorders it) and, where the step is a
    function, as a graph calling it runs it (:func:`called_positions`): the caller
    decides that order and the file does not hold it, so the estimate runs the
    step in each and keeps the higher."""
    config = config or RuntimeConfig()
    if not installed(TENSORFLOW):
        return RuntimeGraph(graph, HAND_MODEL, "TensorFlow is not installed")
    try:
        optimized = optimize(graph_def_from_graph(graph), fetch_nodes(fetches), config.onednn)
    except Exception as exc:  # noqa: BLE001 - any refusal of TF's keeps the hand model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RuntimeGraph(graph, HAND_MODEL, f"Grappler refused the graph: {first}")
    result = graph_from_graph_def(optimized, shapes=True)
    _keep_shapes(graph, result)
    called = {n: p for n, p in called_positions(graph, config.onednn).items() if n in result}
    orders = (tuple(result), tuple(sorted(called, key=called.__getitem__)))
    orders = tuple(order for order in orders if order)
    marked = mark_temporaries(result, config)
    if not marked:
        return RuntimeGraph(result, GRAPPLER, node_orders=orders)
    return RuntimeGraph(result, f"{GRAPPLER}, with the im2col buffers of its {marked} "
                        f"convolution gradients (oneDNN off)", node_orders=orders)


def called_positions(graph: Graph, onednn: bool) -> dict[str, int]:
    """Each node of a step that is a function (a TF2 SavedModel signature's) to its
    position in the graph Grappler returns for a graph calling it, as a session
    or an eager call runs it: the call inlined, the variables as handles. Empty
    where the step is not a function or Grappler refuses the call.

    That order is not the function's own, and the graph that calls the step
    decides it (the names of its nodes alone move it), which no file holds. The
    caller here is a session's: its data inputs named to sort before the
    variables (as a session's constants, ``Const_1``, do), the variables' handles
    named as the SavedModel names them. The function's own order stands for the
    other callers."""
    function = graph.format_state.function
    if function is None:
        return {}
    try:
        optimized = optimize(_calling_graph_def(graph), [CALL], onednn)
    except Exception:  # noqa: BLE001 - any refusal of TF's leaves the function's own order
        return {}
    prefix = CALL + "/"
    positions: dict[str, int] = {}
    for position, node_def in enumerate(optimized.node):
        if node_def.name.startswith(prefix):
            positions.setdefault(node_def.name[len(prefix):], position)
    return positions


def _calling_graph_def(graph: Graph):
    """A GraphDef that calls the step's function (:data:`CALL`) on a placeholder
    per data argument (named :data:`DATA_FIRST` + the argument) and a
    ``VarHandleOp`` per variable passed (named as the SavedModel names the
    variable, else as the argument), of the variable's dtype and shape."""
    from tensorflow.core.framework import graph_pb2

    outer = outer_graph_def(graph)
    signature = library_functions(outer)[graph.format_state.function.name].signature
    graph_def = graph_pb2.GraphDef()
    graph_def.library.CopyFrom(outer.library)
    graph_def.versions.CopyFrom(outer.versions)
    inputs = []
    for arg in signature.input_arg:
        attrs = graph.node(arg.name).attrs
        if "_handle_dtypes" in attrs:
            variable = graph.format_state.variable_of(arg.name) or arg.name
            if variable in inputs:  # one variable passed for several arguments
                inputs.append(variable)
                continue
            node_def = graph_def.node.add(name=variable, op="VarHandleOp")
            node_def.attr["dtype"].type = attrs["_handle_dtypes"].list.type[0]
            node_def.attr["shape"].shape.CopyFrom(attrs["_handle_shapes"].list.shape[0])
            node_def.attr["shared_name"].s = variable.encode()
        else:
            node_def = graph_def.node.add(name=DATA_FIRST + arg.name, op="Placeholder")
            node_def.attr["dtype"].type = arg.type
            node_def.attr["shape"].CopyFrom(attrs["shape"])
        inputs.append(node_def.name)
    call = graph_def.node.add(name=CALL, op=CALL, input=inputs)
    call.attr["f"].func.name = graph.format_state.function.name
    call.attr["Tin"].list.type.extend(a.type for a in signature.input_arg)
    call.attr["Tout"].list.type.extend(a.type for a in signature.output_arg)
    return graph_def


def _keep_shapes(graph: Graph, optimized: Graph) -> None:
    """The IR's shapes on the nodes Grappler kept: TF infers the optimized graph
    alone, without what the IR knows beyond the GraphDef (a function body's
    variable arguments' shapes, recorded from the SavedModel). A node Grappler
    fused keeps the name of the node it replaced and that node's outputs, which
    its readers read, so it takes the shapes of those outputs the IR knows fully
    (TF's shape functions of fused kernels know less: a ``_FusedConv2D``'s
    ``(batch, ?, ?, ?)``)."""
    graph.dialect.ensure_shapes(graph, None)
    for node in optimized.nodes():
        if node.name not in graph:
            continue
        shapes = graph.node(node.name).meta.get("shapes")
        if shapes is None:
            continue
        if graph.node(node.name).op == node.op:
            node.meta["shapes"] = shapes
            continue
        own = list(node.meta.get("shapes") or [])
        node.meta["shapes"] = [ir if ir is not None and None not in ir else mine
                               for ir, mine in zip(shapes, own)] + own[len(shapes):]


def fetch_nodes(fetches: list[str]) -> list[str]:
    """Node names of ``fetches`` (``loss:0`` -> ``loss``), in order, once each."""
    names = (f.lstrip("^").rsplit(":", 1)[0] if f.rsplit(":", 1)[-1].isdigit()
             else f.lstrip("^") for f in fetches)
    return list(dict.fromkeys(names))


def ask_ahead(graph: Graph, fetches: list[str], config: RuntimeConfig, oracle: bool,
              exactness: bool) -> None:
    """Send Grappler the questions a rewrite will ask of the original ``graph``, in
    the order it reads their answers (``tf_grappler_ask.send_each``): the step under
    the target's setting (the oracle, and the exactness check with the other
    setting beside it), then, for the oracle of a step that is a function, the
    graph calling it. The children work while this process analyses and plans,
    and a child that would have waited idle between two questions does not. Where
    a question cannot be sent, nothing is: it is asked, and refused, when needed."""
    settings = (config.onednn, not config.onednn) if exactness else \
        (config.onednn,) if oracle else ()
    if not settings or not installed(TENSORFLOW):
        return
    try:
        send_each(graph_def_from_graph(graph), fetch_nodes(fetches), settings)
        if oracle and graph.format_state.function is not None:
            send_each(_calling_graph_def(graph), [CALL], (config.onednn,))
    except Exception:  # noqa: BLE001 - asked again where needed, and reported there
        return
