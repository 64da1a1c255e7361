"""The TF dialect's builders: the small ops passes insert (with the attrs TF's
importer needs and, where inference already ran, their shapes), and the
variables, conditionals and collections the stale-gradient pass builds from.

A mixin of ``TFDialect`` (``tf.py``), whose op and dtype questions
(``dtype``, ``variable_dtype``, ``is_variable``, ...) it asks. It adds nodes and
edits graph-level protos through ``formats.tf_library``; it never decides what
to build.
"""

from __future__ import annotations

from collections.abc import Callable
from weakref import WeakKeyDictionary

from graphpass.dialects.capabilities import ResourceVariable
from graphpass.dialects.tf_ops import (
    DO_NOT_REWRITE_ATTR,
    RESTORE_OPS,
    DType,
    Func,
    Raw,
    TypeList,
    attr_value,
    output_arg,
)
from graphpass.dialects.tf_shapes import (
    broadcast_shape,
    derived_shapes,
    flat_shape,
    same_shape,
)
from graphpass.formats import tf_library
from graphpass.formats.tf_node_def import move_extras
from graphpass.ir.graph import Graph, Tensor


class TFBuilders:
    """Builders of the TF dialect (see the module docstring)."""

    # -- builders ----------------------------------------------------------

    def copy_node(self, graph: Graph, name: str, new_name: str) -> str:
        node = graph.node(name)
        copy = graph.add_node(new_name, node.op, attrs=node.attrs, device=node.device)
        for key in ("shapes", "batch_shapes"):  # same op, same inputs: same shapes
            if key in node.meta:
                copy.meta[key] = node.meta[key]
        return new_name

    def keep_readers(self, graph: Graph, name: str, tensor: Tensor, count: int,
                     holders: Callable[[], list[str]]) -> int:
        """``count`` ``Identity`` readers Grappler keeps as they are
        (``_grappler_do_not_remove``: not pruned, not rewritten), so its fanout
        counts see them; each runs as soon as ``tensor`` exists and holds
        nothing (its output is read by no one). A function body runs them as
        control outputs; a graph's holders (the train ops) wait for them."""
        for _ in range(count):
            reader = self.identity(graph, name, tensor)
            graph.node(reader.node).attrs[DO_NOT_REWRITE_ATTR] = attr_value(True)
            function = graph.format_state.function
            if function is not None:
                function.control_ret[reader.node] = reader.node
            else:
                for holder in holders():
                    graph.add_control_input(holder, reader.node)
        return count

    def ordered_read(self, graph: Graph, name: str, tensor: Tensor,
                     after: list[str]) -> Tensor:
        """An ``Identity`` with the control inputs, kept as it is by Grappler (its
        dependency optimizer would otherwise move them onto the copy)."""
        gated = self.identity(graph, name, tensor, after)
        graph.node(gated.node).attrs[DO_NOT_REWRITE_ATTR] = attr_value(True)
        return gated

    def _op(self, graph, name, op, inputs, control_inputs=(), device="", output_shapes=None,
            **attrs) -> Tensor:
        """Add one node; ``output_shapes`` (when known) is recorded as inference would."""
        name = graph.unique_name(name)
        node = graph.add_node(name, op, inputs, control_inputs,
                              attrs={k: attr_value(v) for k, v in attrs.items()}, device=device)
        if output_shapes is not None:
            node.meta["shapes"] = output_shapes
        return Tensor(name, 0)

    def _device(self, graph: Graph, tensor: Tensor) -> str:
        return graph.node(tensor.node).device

    def identity(self, graph, name, tensor, control_inputs=()) -> Tensor:
        return self._op(graph, name, "Identity", [tensor], control_inputs,
                        device=self._device(graph, tensor), T=self._dt(graph, tensor),
                        output_shapes=derived_shapes(graph, [tensor], same_shape))

    def constant(self, graph: Graph, name: str, value, dtype: str, device: str = "") -> Tensor:
        from tensorflow.python.framework import tensor_util

        proto = tensor_util.make_tensor_proto(value, dtype=dtype)
        shape = tuple(d.size for d in proto.tensor_shape.dim)
        return self._op(graph, name, "Const", [], device=device, dtype=DType(dtype),
                        value=Raw(proto), output_shapes=[shape])

    def scalar(self, graph, name, value, dtype) -> Tensor:
        return self.constant(graph, name, value, dtype)

    def first_element(self, graph, name, tensor) -> Tensor:
        device = self._device(graph, tensor)
        dtype = self._dt(graph, tensor)
        flat = self._op(graph, f"{name}/flat", "Reshape",
                        [tensor, self.constant(graph, f"{name}/minus_one", [-1], "int32", device)],
                        device=device, T=dtype, Tshape=DType("int32"),
                        output_shapes=derived_shapes(graph, [tensor], flat_shape))
        head = self._op(graph, f"{name}/head", "Slice",
                        [flat, self.constant(graph, f"{name}/begin", [0], "int32", device),
                         self.constant(graph, f"{name}/size", [1], "int32", device)],
                        device=device, T=dtype, Index=DType("int32"), output_shapes=[(1,)])
        scalar_shape = self.constant(graph, f"{name}/scalar_shape", [], "int32", device)
        return self._op(graph, name, "Reshape", [head, scalar_shape], device=device,
                        T=dtype, Tshape=DType("int32"), output_shapes=[()])

    def add_n(self, graph, name, tensors) -> Tensor:
        if len(tensors) == 1:
            return tensors[0]
        return self._op(graph, name, "AddN", tensors, device=self._device(graph, tensors[0]),
                        N=len(tensors), T=self._dt(graph, tensors[0]),
                        output_shapes=derived_shapes(graph, tensors[:1], same_shape))

    def cast(self, graph, name, tensor, dtype) -> Tensor:
        if self.dtype(graph, tensor) == dtype:
            return tensor
        return self._op(graph, name, "Cast", [tensor], device=self._device(graph, tensor),
                        SrcT=self._dt(graph, tensor), DstT=DType(dtype), Truncate=False,
                        output_shapes=derived_shapes(graph, [tensor], same_shape))

    def binary(self, graph, name, op, a, b) -> Tensor:
        tf_op = {"add": "AddV2", "sub": "Sub", "mul": "Mul", "div": "RealDiv",
                 "less_equal": "LessEqual"}[op]
        return self._op(graph, name, tf_op, [a, b], device=self._device(graph, a),
                        T=self._dt(graph, a),
                        output_shapes=derived_shapes(graph, [a, b], broadcast_shape))

    def stop_gradient(self, graph, name, tensor) -> Tensor:
        return self._op(graph, name, "StopGradient", [tensor],
                        device=self._device(graph, tensor), T=self._dt(graph, tensor),
                        output_shapes=derived_shapes(graph, [tensor], same_shape))

    def noop(self, graph: Graph, name: str, control_inputs: list[str], device: str = "") -> str:
        return self._op(graph, name, "NoOp", [], control_inputs, device=device,
                        output_shapes=[]).node

    # -- variables, control flow, summaries (the stale-gradient pass) ----------

    def has_outputs(self, graph: Graph, name: str) -> bool:
        """Whether ``name`` produces a value (an ``AssignAdd`` does, its resource
        twin ``AssignAddVariableOp`` does not)."""
        return bool(self.output_dtypes(graph, name))

    def is_ref(self, graph: Graph, tensor: Tensor) -> bool:
        """A ref tensor (a ``VariableV2`` output, an ``Assign`` result): it aliases a
        variable's buffer and cannot cross a function boundary."""
        arg = output_arg(graph, tensor)
        return arg is not None and arg.is_ref

    def frame_depths(self, graph: Graph) -> dict[str, int]:
        """How deep in v1 ``while_loop`` frames each node runs (0: the root frame).

        A node runs in its data inputs' frame, one deeper after an ``Enter``, one
        shallower after an ``Exit``; a node without data inputs runs in its control
        inputs' frame (a loop constant hangs on the loop's pivot). An edge between
        frames other than into an Enter is invalid, so passes adding control edges
        check both ends here. Kept per graph until its structure changes
        (``Graph.version``).
        """
        cached = _FRAME_DEPTHS.get(graph)
        if cached is not None and cached[0] == graph.version:
            return cached[1]
        if not any(node.op in ("Enter", "RefEnter") for node in graph.nodes()):
            return dict.fromkeys(graph, 0)  # no loop: every node in the root frame
        depths: dict[str, int] = {}
        order = graph.topological_order(ignore_edge=lambda s, d: self.is_back_edge(graph, s, d))
        for name in order:
            sources = [t.node for t in graph.inputs(name)] or graph.control_inputs(name)
            src = next((s for s in sources if s in depths), None)  # not a loop back-edge
            depth = 0
            if src is not None:
                op = graph.node(src).op
                depth = depths[src] + (op in ("Enter", "RefEnter")) - (op in ("Exit", "RefExit"))
            depths[name] = max(depth, 0)
        _FRAME_DEPTHS[graph] = (graph.version, depths)
        return depths

    def is_resource_variable(self, graph: Graph, name: str) -> bool:
        return graph.node(name).op == "VarHandleOp" or self.is_variable(graph, name) and \
            graph.node(name).op == "Placeholder"

    def read_variable(self, graph: Graph, name: str, variable: str,
                      control_inputs: list[str] = (), device: str | None = None) -> Tensor:
        """The variable's current value: ``ReadVariableOp`` of a resource, ``Identity``
        of a ref variable (which may alias the buffer: add 0 to keep a snapshot)."""
        node = graph.node(variable)
        dtype = DType(self.variable_dtype(graph, variable))
        device = node.device if device is None else device
        if self.is_resource_variable(graph, variable):
            return self._op(graph, name, "ReadVariableOp", [Tensor(variable, 0)], control_inputs,
                            device=device, dtype=dtype)
        return self._op(graph, name, "Identity", [Tensor(variable, 0)], control_inputs,
                        device=device, T=dtype)

    def resource_variable(self, graph: Graph, name: str, value: float, dtype: str,
                          device: str = "") -> ResourceVariable:
        """A scalar resource variable laid out as ``tf.compat.v1.get_variable`` does
        (``name``, ``name/Initializer/...``, ``name/Assign``, ``name/Read/ReadVariableOp``),
        so a ``VariableDef`` can describe it. Its initializer runs nowhere yet."""
        from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2

        handle = graph.unique_name(name)
        scalar = attr_value_pb2.AttrValue(shape=tensor_shape_pb2.TensorShapeProto())
        self._op(graph, handle, "VarHandleOp", [], device=device, dtype=DType(dtype),
                 shape=scalar, shared_name=handle, container="")
        initial = self.constant(graph, f"{handle}/Initializer/value", value, dtype, device)
        assign = self._op(graph, f"{handle}/Assign", "AssignVariableOp",
                          [Tensor(handle, 0), initial], device=device, dtype=DType(dtype)).node
        read = self.read_variable(graph, f"{handle}/Read/ReadVariableOp", handle)
        return ResourceVariable(handle, assign, read, initial)

    def assign_add_variable(self, graph: Graph, name: str, variable: str, value: Tensor,
                            control_inputs: list[str] = ()) -> str:
        """``variable += value`` for a resource variable; the op has no output."""
        return self._op(graph, name, "AssignAddVariableOp", [Tensor(variable, 0), value],
                        control_inputs, device=graph.node(variable).device,
                        dtype=self._dt(graph, value)).node

    def switch(self, graph: Graph, name: str, data: Tensor, pred: Tensor,
               device: str = "") -> tuple[Tensor, Tensor]:
        """v1 ``Switch``: ``(false output, true output)``; the untaken one is dead, and
        every node reading it (data or control) is dead too: it does not run."""
        switch = self._op(graph, name, "Switch", [data, pred], device=device,
                          T=self._dt(graph, data))
        return Tensor(switch.node, 0), Tensor(switch.node, 1)

    def merge(self, graph: Graph, name: str, tensors: list[Tensor], device: str = "") -> Tensor:
        """v1 ``Merge``: live as soon as one input is live (the end of a conditional)."""
        return self._op(graph, name, "Merge", tensors, device=device, N=len(tensors),
                        T=self._dt(graph, tensors[0]))

    def scalar_summary(self, graph: Graph, name: str, tag: str, value: Tensor) -> Tensor:
        tags = self.constant(graph, f"{name}/tags", tag, "string", self._device(graph, value))
        return self._op(graph, name, "ScalarSummary", [tags, value],
                        device=self._device(graph, value), T=self._dt(graph, value))

    def functional_if(self, graph: Graph, name: str, pred: Tensor,
                      branches: tuple[list[str], list[str]], results: tuple[float, float],
                      device: str = "", inlined: bool = False) -> Tensor:
        """Move two sets of nodes into the then/else functions of one functional ``If``.

        Why a function: XLA compiles ``If`` (it rejects v1 Switch/Merge), and inside a
        branch function nodes run conditionally without dead tensors. Data inputs the
        moved nodes read from outside become the If's inputs (arguments of both
        branches); control inputs from outside become the If's control inputs. Each
        branch returns one float32 scalar (its entry of ``results``) after every node
        moved into it ran; its stateful nodes are also control outputs, so the function
        runtime never prunes them. Moved nodes must not be read outside their branch,
        and ref tensors cannot be inputs (raise ``ValueError``). Returns the If's output.

        ``inlined``: TF's executor lowers the If to Switch/Merge and inlines its
        branches before Grappler (``_lower_using_switch_merge``, as ``tf.cond``
        marks its own), so they compile with the rest of the step as the nodes
        did before they moved; unmarked, each branch is optimized on its own.
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
                        if self.is_ref(graph, tensor):
                            raise ValueError(f"{node!r} reads the ref tensor {tensor}")
                        external[tensor] = len(external)
                controls += [c for c in graph.control_inputs(node)
                             if c not in members and c not in controls]
        inputs = list(external)
        types = [self._dt(graph, t) for t in inputs]
        functions = tf_library.add_branch_functions(
            graph, name, branches, external, types, results,
            lambda n: self.is_stateful(graph, n))
        if_node = self._op(graph, name, "If", [pred, *inputs], controls, device=device,
                           Tcond=self._dt(graph, pred), Tin=TypeList(types),
                           Tout=TypeList([DType("float32")]),
                           then_branch=Func(functions[0]), else_branch=Func(functions[1]),
                           **({"_lower_using_switch_merge": True} if inlined else {}))
        doomed = set().union(*moved)
        # Readers before what they read, among the moved nodes only: the rest of the
        # graph may hold v1 while loops, whose back edges make it cyclic.
        inside = graph.topological_order(
            ignore_edge=lambda s, d: s not in doomed or d not in doomed)
        for node in reversed(inside):
            if node in doomed:
                graph.remove_node(node)
        return if_node

    def colocate(self, graph: Graph, name: str, with_node: str) -> None:
        """Place ``name`` wherever ``with_node`` runs (a ``loc:@`` colocation class)."""
        self.set_attr(graph, name, "_class", [f"loc:@{with_node}"])

    def renamed_copy(self, graph: Graph, name: str, new_name: str) -> str:
        """``copy_node`` for a node moving to ``new_name``: the NodeDef fields the
        IR does not model (debug info) move with it."""
        self.copy_node(graph, name, new_name)
        move_extras(graph.node(name), graph.node(new_name))
        return new_name

    def initializer_groups(self, graph: Graph) -> list[str]:
        """Sink NoOps that group variable initializers (``global_variables_initializer``),
        possibly through per-device NoOps; a Saver's restore op does not count."""
        verdict: dict[str, bool] = {}

        def groups_initializers(name: str) -> bool:
            if name not in verdict:
                verdict[name] = False
                deps = graph.control_inputs(name)
                verdict[name] = bool(deps) and all(
                    self._is_initializer(graph, d) or (graph.node(d).op == "NoOp" and
                                                       groups_initializers(d)) for d in deps)
            return verdict[name]

        return [n.name for n in graph.nodes()
                if n.op == "NoOp" and not graph.users(n.name) and groups_initializers(n.name)]

    def _is_initializer(self, graph: Graph, name: str) -> bool:
        node = graph.node(name)
        inputs = graph.inputs(name)
        if node.op not in ("Assign", "AssignVariableOp") or len(inputs) < 2 or \
                not self.is_variable(graph, inputs[0].node):
            return False
        value = inputs[1].node
        while graph.node(value).op == "Identity" and graph.inputs(value):
            value = graph.inputs(value)[0].node
        return graph.node(value).op not in RESTORE_OPS

    # -- MetaGraphDef collections ---------------------------------------------

    def register_global_variable(self, graph: Graph, variable: ResourceVariable) -> bool:
        """List a pass-made variable in the MetaGraphDef's global variables collection
        (non-trainable); False for a bare GraphDef. Savers are left alone."""
        return tf_library.register_global_variable(graph, variable)

    def add_to_collection(self, graph: Graph, key: str, tensor: Tensor) -> bool:
        """Add a tensor to a MetaGraphDef node-list collection (``summaries``)."""
        return tf_library.add_to_collection(graph, key, tensor)

    def _dt(self, graph: Graph, tensor: Tensor) -> DType:
        dtype = self.dtype(graph, tensor)
        if dtype is None:
            raise ValueError(f"cannot tell the dtype of {tensor}")
        return DType(dtype)


#: Per graph: ``(Graph.version, frame depths)`` (``TFBuilders.frame_depths``).
_FRAME_DEPTHS: WeakKeyDictionary = WeakKeyDictionary()
