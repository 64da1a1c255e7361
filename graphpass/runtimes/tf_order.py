"""TF's executor order and kernel tables (``tf_executor`` assembles them into the
runtime model): which kernels alias or forward their inputs' buffers, the graph
Grappler hands the executor (``GrapplerView``) and the order the executor runs
it in with one inter-op thread (``executor_order``).

It reads the graph and never edits it; op kinds come from ``tf_ops``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from graphpass.dialects.tf_ops import READ_MODIFY_WRITE_OP, VARIABLE_OPS
from graphpass.dialects.tf_updates import resource_variable
from graphpass.ir.graph import Graph, Tensor
from graphpass.runtimes.base import Execution
from graphpass.runtimes.tf_kernels import renamed_by_onednn

# Kernels whose IsExpensive() is false: the executor runs them inline, on the thread
# that made them ready, before it takes up the next expensive node.
INLINE_OPS = frozenset({
    "Const", "HostConst", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Rank",
    "Size", "Reshape", "Squeeze", "ExpandDims", "ReadVariableOp", "VarHandleOp",
    "VariableV2", "Variable", "Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
    "_Arg", "_Retval", "StopGradient", "PreventGradient", "Snapshot", "Switch", "Merge",
    "Enter", "Exit", "NextIteration", "LoopCond", "ControlTrigger",
})
# Outputs that share the buffer of the same-numbered input (no copy is made).
ALIAS_OPS = frozenset({
    "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
    "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast", "Enter", "Exit",
    "NextIteration",
})
# Elementwise kernels that write their output into an input's buffer when they hold
# the only reference to it (``forward_input_or_allocate_output``): the input slots.
_UNARY_FORWARD = (
    "Abs", "Neg", "Sign", "Reciprocal", "Inv", "Square", "Sqrt", "Rsqrt", "Exp", "Expm1",
    "Log", "Log1p", "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Erf", "Erfc", "Floor", "Ceil",
    "Round", "Rint", "Relu", "Relu6", "Elu", "Selu", "Softplus", "Softsign", "LeakyRelu",
    "LogicalNot", "ClipByValue", "_UnaryOpsComposition", "Snapshot",
)
_BINARY_FORWARD = (
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "Maximum",
    "Minimum", "Pow", "SquaredDifference", "FloorDiv", "FloorMod", "TruncateDiv", "BiasAdd",
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SoftplusGrad", "SoftsignGrad",
    "LeakyReluGrad", "TanhGrad", "SigmoidGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad",
    "InvGrad", "LogicalAnd", "LogicalOr",
)
FORWARD_SLOTS = {op: (0,) for op in _UNARY_FORWARD} | {op: (0, 1) for op in _BINARY_FORWARD} \
    | {"Select": (1, 2), "SelectV2": (1, 2)}
# Ops Grappler's arithmetic optimizer rewrites together with their neighbours
# (elementwise chains, sums of products, reshapes), which a control edge out of
# the op stops (``RuntimeModel.rewritten_with_neighbours``).
REWRITTEN_WITH_NEIGHBOURS = frozenset(FORWARD_SLOTS) | ALIAS_OPS | {"AddN"}
# oneDNN's layout pass merges a convolution's filter gradient with the bias gradient
# of the same incoming gradient (``_MklNativeConv2DBackpropFilterWithBias``) only
# when both wait on the same control inputs: op -> (its gradient's input slot, the
# sibling's op, the sibling's slot).
MERGED_GRADIENTS = {"Conv2DBackpropFilter": (2, "BiasAddGrad", 0),
                    "BiasAddGrad": (0, "Conv2DBackpropFilter", 2)}


def merged_gradients(graph: Graph, name: str) -> list[str]:
    """The nodes oneDNN merges with ``name`` (:data:`MERGED_GRADIENTS`): those reading
    the node its incoming gradient comes from in the sibling's slot."""
    found = MERGED_GRADIENTS.get(graph.node(name).op)
    inputs = graph.inputs(name)
    if found is None or len(inputs) <= found[0]:
        return []
    slot, sibling, sibling_slot = found
    producer = inputs[slot].node
    return sorted(user for user in graph.data_users(producer) if user != name
                  and graph.node(user).op == sibling
                  and len(graph.inputs(user)) > sibling_slot
                  and graph.inputs(user)[sibling_slot].node == producer)


def copied_on_update(graph: Graph, name: str) -> list[list[Tensor]]:
    """``RuntimeModel.copied_on_update`` for TF: every resource variable a read-modify-write
    kernel updates, with the ``ReadVariableOp`` values of it (which share the
    variable's buffer, where TF1's ref variables are written in place regardless)."""
    if not READ_MODIFY_WRITE_OP.match(graph.node(name).op):
        return []
    variables = (resource_variable(graph, handle) for handle in graph.inputs(name))
    return [sorted(Tensor(user, 0) for user in graph.data_users(variable)
                   if graph.node(user).op == "ReadVariableOp")
            for variable in variables if variable is not None]


def execution(graph: Graph, nodes: set[str], known: frozenset[str], fetched: frozenset[str],
              is_back_edge: Callable[[str, str], bool],
              is_stateful: Callable[[str], bool], onednn: bool,
              positions: Mapping[str, int] | None = None) -> Execution:
    """The executor's order with one inter-op thread (``executor.cc``) on the graph
    Grappler hands it (``GrapplerView``), and the reads Grappler rewires past the
    nodes it bypasses: a node's newly ready successors,
    data edges before control edges, go to its thread's inline queue if their
    kernel is inexpensive; of the expensive ones the last continues on this
    thread (when nothing inline waits) and the others are queued on the pool,
    whose owner thread takes its own work back newest first (Eigen's run queue).
    Roots (variable handles, constants) are taken as run first: TF interleaves
    them with the forward pass, but they allocate nothing, and an update that
    waits for its slot variable's handle would hold its gradient to the end.
    ``onednn``: whether TF runs oneDNN's kernels (``runtime_ordered``);
    ``positions``: each node's place in one order of Grappler's output, by name."""
    members = runtime_ordered(graph, nodes, is_back_edge, onednn, positions or {})
    view = GrapplerView(graph, members, known, fetched, is_back_edge, is_stateful)
    view.optimize()
    order = executor_order([n for n in members if n not in view.bypassed],
                           view.successors(),
                           lambda n: n in view.noop or graph.node(n).op in INLINE_OPS)
    return Execution(order, view.forwarded())


def runtime_ordered(graph: Graph, nodes: set[str], is_back_edge: Callable[[str, str], bool],
                    onednn: bool, positions: Mapping[str, int]) -> list[str]:
    """``nodes`` in the order of the graph TF's executor runs, where ``positions``
    places some of them (their places in one order of Grappler's output: the
    step's own, or as a graph calling it runs it), else in the graph's order.

    The order decides which of several ready branches the executor follows (its
    successor lists and first ready nodes are in graph order), and Grappler's
    output is a topological sort of its own rewritten graph (first in, first
    out: a node follows the last of its inputs to be placed), not the graph as
    exported. A node without a position (one added since, as remat's copies) is
    placed so too: right after the latest of its producers. With oneDNN on, the
    nodes its layout pass replaces come after all the others
    (``tf_kernels.renamed_by_onednn``)."""
    if not any(n in positions for n in nodes):
        return [n for n in graph if n in nodes]
    index = {n: i for i, n in enumerate(graph)}
    placed: dict[str, int] = {}
    added: set[str] = set()
    for name in graph.topological_order(ignore_edge=is_back_edge):
        position = positions.get(name)
        if position is None:
            added.add(name)
            position = max((placed[p] for p in graph.producers(name)
                            if p in placed and not is_back_edge(p, name)), default=-1)
        placed[name] = position
    return sorted(nodes, key=lambda n: (renamed_by_onednn(graph, n, onednn), placed[n], n in added,
                                        index[n]))


#: Ops Grappler's dependency optimizer bypasses (``IsIdentity``, ``IsIdentityN``,
#: ``IsNoOp``).
BYPASSED_OPS = frozenset({"Identity", "RefIdentity", "IdentityN", "NoOp"})
#: Inputs an Identity is never bypassed after (``SafeToRemoveIdentity``: variable reads).
_NOT_BYPASSED_AFTER = VARIABLE_OPS | {"ReadVariableOp", "_Recv", "_HostRecv", "Switch",
                                      "RefSwitch"}
#: Users a multi-input ``IdentityN`` is never bypassed into (``SafeToRemoveIdentity``).
_NOT_BYPASSED_INTO = frozenset({"_Retval", "Merge", "RefMerge"})


class GrapplerView:
    """The dependencies of ``nodes`` after Grappler's rewrites that move work in time:

    * ``known`` nodes (stored and folded values) wait for nothing but a control
      input that runs in the step (a constant made in a ``control_dependencies``
      context, which carries the context's edges): constant folding makes them
      constants, which run first, so the dependency optimizer prunes control
      edges out of them and between them;
    * a control input that another input already implies is dropped (transitive
      reduction);
    * a stateless node whose outputs no one reads becomes a NoOp (its data inputs
      control inputs), as the dependency optimizer's ``SafeToConvertToNoOp`` does;
    * NoOp, Identity and IdentityN nodes are bypassed where that adds no edges
      (``BypassingNodeIsBeneficial``: fan-in x fan-out <= fan-in + fan-out; for an
      ``IdentityN`` of several values, its edges counted one by one, since each
      output goes to its own readers; never a fetched node or one after a variable
      read): their users read their inputs directly and wait on their control
      inputs (``bypassed``: out of the executor's graph; ``forwarded``: the reads
      rewired). Keras 3's optimizers pass every gradient through one ``IdentityN``:
      bypassed, each gradient is applied as soon as it exists, not after the last.

    Conversion and bypass repeat until nothing changes, as the optimizer's work
    list does.
    """

    def __init__(self, graph: Graph, members: list[str], known: frozenset[str],
                 fetched: frozenset[str], is_back_edge: Callable[[str, str], bool],
                 is_stateful: Callable[[str], bool]) -> None:
        self.fetched, self.known = fetched, known
        self.members = members  # in the order Grappler's output has them
        nodes = set(members)
        self.ops = {n: graph.node(n).op for n in self.members}
        # What a sweep may convert: fixed by the op alone (stateless, not bypassed
        # itself) and not fetched; converted nodes join what may be bypassed.
        self.stateless = {n for n in self.members if n not in fetched and
                          self.ops[n] not in BYPASSED_OPS and not is_stateful(n)}
        self.position = {n: i for i, n in enumerate(self.members)}
        # A node's inputs: its data inputs (``reads``, in slot order) first, then its
        # control inputs, as (producer, is_control).
        self.inputs: dict[str, list[tuple[str, bool]]] = {}
        self.reads: dict[str, list[Tensor]] = {}
        self.users: dict[str, set[str]] = {n: set() for n in self.members}
        self.noop: set[str] = set()
        self.bypassed: set[str] = set()
        self.sources: dict[str, list[Tensor]] = {}  # a bypassed node: what it read
        for name in self.members:
            runs = {p for p in graph.producers(name)
                    if p in nodes and not is_back_edge(p, name)}
            # A known node waits only on a control input that runs in the step.
            reads = [] if name in known else [t for t in graph.inputs(name) if t.node in runs]
            control = [c for c in graph.control_inputs(name) if c in runs and c not in known]
            self.reads[name] = reads
            self.inputs[name] = [(t.node, False) for t in reads] + [(c, True) for c in control]
            for producer, _ in self.inputs[name]:
                self.users[producer].add(name)
    def successors(self) -> dict[str, list[str]]:
        """Each node's successors after the rewrites: data successors before control
        successors (the executor propagates data edges first), each in graph order."""
        members = [n for n in self.members if n not in self.bypassed]
        data: dict[str, list[str]] = {n: [] for n in members}
        control: dict[str, list[str]] = {n: [] for n in members}
        for name in members:
            entries = self.inputs[name]
            readers = {p for p, is_control in entries if not is_control}
            for producer in dict.fromkeys(p for p, _ in entries):
                (data if producer in readers else control)[producer].append(name)
        return {n: data[n] + control[n] for n in members}

    def optimize(self, rounds: int = 8) -> None:
        """The dependency optimizer as the meta optimizer runs it (twice): drop control
        inputs other inputs imply, then convert and bypass until nothing changes (at
        most ``rounds`` sweeps). A sweep visits only the nodes whose op allows a
        change, in graph order."""
        sweep = [n for n in self.members if n in self.stateless or
                 (n not in self.fetched and self.ops[n] in BYPASSED_OPS)]
        for _ in range(2):
            self._reduce()
            for _ in range(rounds):
                changed = False
                for name in sweep:
                    if self._convertible(name):
                        self.noop.add(name)
                        self.inputs[name] = [(p, True) for p in dict.fromkeys(
                            p for p, _ in self.inputs[name]) if p not in self.known]
                        self.reads[name] = []
                        changed = True
                    if self._bypassable(name):
                        self._bypass(name)
                        changed = True
                if not changed:
                    break

    def _reduce(self) -> None:
        """Drop each control input that another input already depends on
        (``DependencyOptimizer::TransitiveReduction``), with ancestor bitsets.
        A producer is no ancestor of itself (the graph is acyclic), so "an ancestor
        of another input" is "in the union of the inputs' ancestors": one union
        per node, not one test per pair of inputs (quadratic in a train op's
        hundreds of control inputs). A node's bit is made when used and its
        ancestors are dropped once its last reader is done: each bitset is as long
        as the graph, so keeping them all is quadratic in memory."""
        position = self.position
        readers = Counter(p for n in self.members
                          for p in dict.fromkeys(q for q, _ in self.inputs[n]))
        ancestors: dict[str, int] = {}
        for name in self._topological():
            entries = self.inputs[name]
            producers = dict.fromkeys(p for p, _ in entries)
            implied = 0
            for producer in producers:
                # Absent when users and inputs disagree after a bypass (a node
                # reached before its producer): that input implies nothing more.
                implied |= ancestors.get(producer, 0)
            mask = implied
            for producer in producers:
                mask |= 1 << position[producer]
                readers[producer] -= 1
                if not readers[producer]:
                    ancestors.pop(producer, None)
            if readers[name]:
                ancestors[name] = mask
            if not any(c for _, c in entries):
                continue
            kept = []
            for producer, is_control in entries:
                if is_control and implied >> position[producer] & 1:
                    self.users[producer].discard(name)
                    continue
                kept.append((producer, is_control))
            self.inputs[name] = kept

    def _topological(self) -> list[str]:
        pending = {n: len(dict.fromkeys(p for p, _ in self.inputs[n])) for n in self.members}
        ready = [n for n in self.members if not pending[n]]
        order = []
        while ready:
            name = ready.pop()
            order.append(name)
            for user in self.users[name]:
                pending[user] -= 1
                if not pending[user]:
                    ready.append(user)
        return order

    def _op(self, name: str) -> str:
        return "NoOp" if name in self.noop else self.ops[name]

    def _convertible(self, name: str) -> bool:
        if name not in self.stateless or name in self.noop or not self.users[name]:
            return False
        return all((name, False) not in self.inputs[u] for u in self.users[name])

    def _bypassable(self, name: str) -> bool:
        op, entries, users = self._op(name), self.inputs[name], self.users[name]
        if op not in BYPASSED_OPS or name in self.fetched or not users:
            return False
        reads = self.reads[name]
        if op != "NoOp" and (not reads or self.ops[reads[0].node] in _NOT_BYPASSED_AFTER):
            return False
        if len(reads) > 1:  # an IdentityN of several values
            if any(self.ops[u] in _NOT_BYPASSED_INTO for u in users):
                return False
            controls = len(entries) - len(reads)
            edges = len(reads) + controls * len(users) + sum(
                len(entries) if is_control else 1
                for u in users for p, is_control in self.inputs[u] if p == name)
            return edges <= len(entries) + len(users)
        return len(entries) * len(users) <= len(entries) + len(users)

    def _bypass(self, name: str) -> None:
        """Rewire ``name``'s users to its inputs (``DependencyOptimizer::OptimizeNode``):
        a read of its output ``k`` reads its input ``k``, a control edge from it
        becomes one from its first input's producer, and its control inputs become
        each user's."""
        sources = self.reads[name]
        carried = [p for p, is_control in self.inputs[name] if is_control]
        for user in sorted(self.users[name], key=self.position.__getitem__):
            reads = [sources[t.port] if t.node == name else t for t in self.reads[user]]
            rewired = [(t.node, False) for t in reads]
            for producer, is_control in self.inputs[user]:
                if is_control and producer != name:
                    rewired.append((producer, True))
                elif is_control and sources:
                    rewired.append((sources[0].node, True))
            present = {p for p, _ in rewired}
            rewired += [(p, True) for p in carried if p not in present]
            self.reads[user], self.inputs[user] = reads, rewired
            for producer, _ in rewired:
                self.users[producer].add(user)
        for producer, _ in self.inputs[name]:
            self.users[producer].discard(name)
        if sources:
            self.sources[name] = sources
        self.inputs[name], self.reads[name], self.users[name] = [], [], set()
        self.bypassed.add(name)

    def forwarded(self) -> dict[Tensor, Tensor]:
        """Each output of a bypassed node to the value its readers read instead (an
        output of a node that runs)."""
        found = {}
        for name, sources in self.sources.items():
            for port, tensor in enumerate(sources):
                while tensor.node in self.sources:
                    tensor = self.sources[tensor.node][tensor.port]
                found[Tensor(name, port)] = tensor
        return found


def executor_order(nodes: list[str], successors: dict[str, list[str]],
                   inline: Callable[[str], bool]) -> list[str]:
    """Simulate TF's executor on ``nodes`` (in the graph's order) with one inter-op
    thread (see :func:`execution`); ``inline(n)``: n's kernel is inexpensive."""
    from collections import deque

    pending = dict.fromkeys(nodes, 0)
    for users in successors.values():
        for user in users:
            pending[user] += 1
    pool: deque[str] = deque()
    ready = deque(n for n in nodes if pending[n] == 0)
    order: list[str] = []
    while ready or pool:
        if not ready:
            ready.append(pool.popleft())
        while ready:
            name = ready.popleft()
            order.append(name)
            expensive = None
            for user in successors[name]:
                pending[user] -= 1
                if pending[user]:
                    continue
                if inline(user):
                    ready.append(user)
                    continue
                if expensive is not None:
                    pool.appendleft(expensive)
                expensive = user
            if expensive is not None:
                if ready:
                    pool.appendleft(expensive)
                else:
                    ready.append(expensive)
    return order
