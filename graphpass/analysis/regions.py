"""Region analysis: find the loss, the gradients, the optimizer and global_step,
and label every node ``forward`` / ``backward`` / ``optimizer`` / ``other``.

It works from the graph's shape, not from name scopes, so graphs built under
``gradients/``, ``training/...`` or a custom scope analyse alike:

* **Apply ops** (the dialect's ``step`` knows them) read the final gradients in known
  input slots; whatever post-processing (clipping, all-reduce, loss scaling)
  sits between the raw gradients and the apply is backward.
* **Train ops** are the sinks downstream of apply ops; each one is a training
  step with its own apply ops and gradients. A function body has one train op
  (it returns when the step is done); when its updates come from separate
  gradient computations (two models trained in one function), the dialect
  splits them, and each part is a step of its own, as separate train ops are.
* **The loss** is the common ancestor of a step's gradients whose value the
  gradients do not use: every consumer of it on the way to the gradients reads
  only its shape (``Fill(Shape(loss), 1)`` is how TF seeds ``tf.gradients``).
* ``forward`` = the loss and its ancestors; ``backward`` = ancestors of the
  gradients that are not forward; ``optimizer`` = the apply ops, what depends
  on them, and the rest of what the train ops need.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from graphpass.analysis.shapes import infer_shapes
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor

FORWARD, BACKWARD, OPTIMIZER, OTHER = "forward", "backward", "optimizer", "other"


@dataclass
class TrainStep:
    """One training step: a train op, its apply ops with the gradients each reads
    (``updates``), the loss."""

    train_op: str
    updates: dict[str, list[Tensor]]
    loss: Tensor
    #: Every train op of the step, ``train_op`` first (more than one when the
    #: dialect's step sets ``single_train_step``: ONNX returns each update as an output).
    train_ops: list[str] = field(default_factory=list)

    @property
    def applies(self) -> list[str]:
        return list(self.updates)

    @property
    def gradients(self) -> list[Tensor]:
        return [t for tensors in self.updates.values() for t in tensors]


@dataclass
class Regions:
    steps: list[TrainStep]
    global_step: str | None
    labels: dict[str, str] = field(repr=False)

    def label(self, name: str) -> str:
        return self.labels.get(name, OTHER)

    def nodes(self, label: str) -> list[str]:
        return [n for n, lab in self.labels.items() if lab == label]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys((FORWARD, BACKWARD, OPTIMIZER, OTHER), 0)
        for lab in self.labels.values():
            counts[lab] += 1
        return counts

    @property
    def loss(self) -> Tensor:
        return self.steps[0].loss

    @property
    def fetches(self) -> list[str]:
        """The nodes one training step runs: every train op, then every loss."""
        fetches = [t for s in self.steps for t in s.train_ops or [s.train_op]]
        return list(dict.fromkeys(fetches + [s.loss.node for s in self.steps]))


def analyze(
    graph: Graph,
    *,
    loss: str | None = None,
    train_ops: list[str] | None = None,
    global_step: str | None = None,
) -> Regions:
    """Find the training steps of ``graph`` and label its nodes.

    ``loss``, ``train_ops`` and ``global_step`` override detection. The labels
    live in the result, never on the nodes (they would go stale once a pass adds
    nodes); loss detection reads its candidates' shapes, inferred then.
    """
    dialect = graph.dialect
    applies = dialect.step.applies_for(graph, train_ops or ())
    if not applies:
        raise GraphpassError(
            "found no optimizer apply ops (Apply*/ResourceApply*), so this is not a training "
            "graph; export the graph after building the train op"
        )
    sinks = _train_ops(graph, applies, train_ops)
    groups = [sinks] if dialect.step.single_train_step and sinks else [[s] for s in sinks]
    steps = [step for group in groups for step in _train_steps(graph, group, applies, loss)]
    found = _label(graph, steps)
    labels = {name: found.get(name, OTHER) for name in graph}
    split = len({s.train_op for s in steps}) < len(steps)
    step_var = _global_step(graph, labels, global_step, len(steps) if split else 1)
    return Regions(steps=steps, global_step=step_var, labels=labels)


def _train_ops(graph: Graph, applies: dict, requested: list[str] | None) -> list[str]:
    downstream = graph.descendants(applies) | set(applies)
    is_step_end = graph.dialect.step.ends_train_step
    sinks = [n for n in graph if n in downstream and not graph.users(n) and is_step_end(graph, n)]
    if not requested:
        return sinks
    for name in requested:
        if name not in graph:
            raise GraphpassError(f"--train-op {name!r} is not a node; train ops found: {sinks}")
        if not (graph.ancestors([name]) | {name}) & set(applies):
            raise GraphpassError(
                f"--train-op {name!r} applies no gradients (no apply op among its inputs); "
                f"train ops found: {sinks}"
            )
    return list(requested)


def _train_steps(graph: Graph, group: list[str], applies: dict,
                 loss: str | None) -> list[TrainStep]:
    """The training steps the train ops ``group`` run: one, or (no ``--loss`` given)
    one per separate gradient computation among their apply ops, each with its
    own loss, like separate train ops."""
    upstream = graph.ancestors(group) | set(group)
    mine = {a: applies[a] for a in applies if a in upstream}
    parts = graph.dialect.step.split_steps(graph, mine) if loss is None else [list(mine)]
    return [_train_step(graph, group, part, applies, loss) for part in parts]


def _train_step(graph: Graph, group: list[str], mine: list[str], applies: dict,
                loss: str | None) -> TrainStep:
    train_op = group[0]
    updates = {a: applies[a] for a in mine}
    if loss is not None:
        loss_tensor = _tensor_arg(graph, loss, "--loss")
    else:
        loss_tensor = _find_loss(graph, [t for a in mine for t in applies[a]], train_op, mine)
    return TrainStep(train_op=train_op, updates=updates, loss=loss_tensor,
                     train_ops=list(group))


def _find_loss(graph: Graph, gradients: list[Tensor], train_op: str, applies: list[str]) -> Tensor:
    """The end of the forward computation whose gradients these are.

    Candidates are float scalars (or of unknown rank) that nothing reads except
    shape-only ops or non-float consumers (summaries): a loss is fetched, not
    computed with. TF may seed gradients from ``Shape(loss)`` or from a constant
    shape, so the loss itself need not feed the gradients; but it is computed
    from values they read (activations, weights), and only such candidates
    count. Two facts single it out among them (which include dangling gradients, e.g.
    of a constant factor):

    * the loss's computation is a *prefix* of the gradient computation: all of
      it exists before any gradient op (you need the loss to differentiate it),
      so every value the gradients read but the loss does not comes later in
      the graph's node order (control edges aside: ``minimize`` under
      ``control_dependencies(update_ops)`` orders gradients after earlier ops);
    * of those, it covers the most of what the gradient ops read, and among
      equals it is the deepest.

    v1 ``while_loop`` gradients add stack pushes to the forward loop after the
    fact, so the first fact is scored (fewest values out of order) rather
    than required.

    Linear: the scores come from one sweep over the candidates' upstream
    (``_upstream_scores``), not from an ancestor walk per candidate; the
    scalar test reads the shapes of the best-scored candidates first
    (``_best_scalars``).
    """
    producers = {t.node for t in gradients}
    toward_grads = graph.ancestors(producers, follow_control=False) | producers
    after_update = graph.descendants(applies) | set(applies)
    # A loss is computed from some value the gradients read: candidates outside
    # what those values feed are left out without looking at them.
    related = graph.descendants(toward_grads, follow_control=False) | toward_grads
    order = {name: i for i, name in enumerate(graph)}
    toward_grads_order = sorted(order[n] for n in toward_grads)
    fetched = [n for n in graph if n in related and n not in after_update
               and n not in producers and _only_fetched(graph, n)]
    score = {}
    for name, (last, covered) in _upstream_scores(graph, fetched, toward_grads,
                                                  order).items():
        # Values the gradients read that precede the loss's last op but are not
        # part of it: all of toward_grads before it, less those upstream of the
        # candidate (every upstream node but the last precedes it).
        earlier = bisect.bisect_left(toward_grads_order, order[last])
        out_of_order = earlier - (covered - (last in toward_grads))
        score[name] = (out_of_order, -covered)
    top = _best_scalars(graph, score)
    above_others = graph.ancestors(top)  # candidates with another top one downstream
    deepest = sorted(c for c in top if c not in above_others)
    if len(deepest) != 1:
        found = ", ".join(deepest) or "none"
        raise GraphpassError(
            f"cannot tell the loss of train op {train_op!r} (candidates: {found}); "
            "name it with --loss"
        )
    return Tensor(deepest[0], 0)


def _only_fetched(graph: Graph, name: str) -> bool:
    """A computed float value that nothing computes with (only its shape is read, or
    it is returned as a function result). Its readers are looked at first: most
    values have one that computes with them, which settles it."""
    dialect = graph.dialect
    # The first output's readers: a loss op's other outputs may feed its gradient
    # (onnxruntime's SoftmaxCrossEntropyLoss hands its log-probabilities on).
    readers = [user for user, _ in graph.consumers(Tensor(name, 0))]
    return all(dialect.is_shape_only(graph, user) or dialect.step.is_fetch(graph, user)
               or not dialect.is_float(graph, Tensor(user, 0))
               for user in readers) \
        and not dialect.is_source(graph, name) and dialect.is_float(graph, Tensor(name, 0))


def _best_scalars(graph: Graph, score: dict[str, tuple]) -> set[str]:
    """The candidates of the best score among those that are scalars (or of
    unknown rank): a loss is a scalar.

    Scored first, shape-tested after: the best-scored group's shapes are read
    first, and only if none of it is a scalar are all the others' read, at
    once. The loss usually scores best alone, and its upstream is the forward
    pass, where the other candidates (a gradient computation's unread
    values) reach back through the backward pass, a large part of the graph
    to infer."""
    groups: dict[tuple, list[str]] = {}
    for name, value in score.items():
        groups.setdefault(value, []).append(name)
    ranked = [groups[value] for value in sorted(groups)]
    if ranked:
        infer_shapes(graph, ranked[0])
        if not any(_scalar_or_unknown(graph, Tensor(n, 0)) for n in ranked[0]):
            infer_shapes(graph, [n for group in ranked[1:] for n in group])
    for group in ranked:
        scalars = {n for n in group if _scalar_or_unknown(graph, Tensor(n, 0))}
        if scalars:
            return scalars
    return set()


def _scalar_or_unknown(graph: Graph, tensor: Tensor) -> bool:
    shape = graph.dialect.shape(graph, tensor)
    return shape is None or len(shape) == 0


def _upstream_scores(graph: Graph, candidates: list[str], marked: set[str],
                     order: dict[str, int]) -> dict[str, tuple[str, int]]:
    """For each candidate, over itself and its data ancestors: the last node in
    ``order``, and how many are ``marked``.

    One sweep over the strongly connected components of their data edges
    (loops make cycles), in dependency order for the last node and in reverse
    for which candidates each component feeds, as a bitset: a marked node
    counts for every candidate whose bit it carries.
    """
    upstream = graph.ancestors(candidates, follow_control=False) | set(candidates)
    components = _components(graph, upstream)
    component_of = {n: i for i, members in enumerate(components) for n in members}
    last: list[int] = []
    for i, members in enumerate(components):
        last.append(max([order[n] for n in members] + [
            last[component_of[p]] for n in members for p in graph.data_producers(n)
            if component_of[p] != i]))
    bit = {c: 1 << k for k, c in enumerate(candidates)}
    feeds = [0] * len(components)
    for i in reversed(range(len(components))):
        for n in components[i]:
            feeds[i] |= bit.get(n, 0)
            for user in graph.data_users(n):
                if user in component_of:
                    feeds[i] |= feeds[component_of[user]]
    weight: dict[int, int] = {}
    for n in marked & upstream:
        mask = feeds[component_of[n]]
        weight[mask] = weight.get(mask, 0) + 1
    covered = _bit_sums(weight, len(candidates))
    names = list(order)
    return {c: (names[last[component_of[c]]], covered[k]) for k, c in enumerate(candidates)}


def _bit_sums(weights: dict[int, int], bits: int) -> list[int]:
    """For each bit ``k < bits``, the sum of the weights of the masks with bit ``k``
    set: a 0/1 matrix of the masks (numpy, some thousand rows at a time) times
    the weights, in integers, since a Python loop over each mask's bits would be
    most of scoring thousands of candidates."""
    import numpy as np

    if not weights or not bits:
        return [0] * bits
    width = (bits + 7) // 8
    masks, counts = list(weights), list(weights.values())
    sums = np.zeros(bits, dtype=np.int64)
    rows = max(1, 2**20 // bits)
    for start in range(0, len(masks), rows):
        chunk = b"".join(m.to_bytes(width, "little") for m in masks[start:start + rows])
        matrix = np.unpackbits(np.frombuffer(chunk, dtype=np.uint8).reshape(-1, width),
                               axis=1, count=bits, bitorder="little")
        sums += np.asarray(counts[start:start + rows], dtype=np.int64) @ matrix
    return sums.tolist()


def _components(graph: Graph, nodes: set[str]) -> list[list[str]]:
    """Strongly connected components of the data edges among ``nodes``, each
    after every component it reads from. Only loops make cycles: without them
    each node is a component of its own, in the topological order the graph
    keeps (the checker's), so no search is needed."""
    try:
        order = graph.topological_order()
    except ValueError:  # a v1 while loop: its back edges make cycles
        return _strong_components(graph, nodes)
    return [[name] for name in order if name in nodes]


def _strong_components(graph: Graph, nodes: set[str]) -> list[list[str]]:
    """``_components`` by Tarjan's algorithm (iterative, over producers;
    deterministic: roots in graph order)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(name: str) -> tuple[str, Iterator[str]]:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        return name, iter(graph.data_producers(name))

    for root in graph:
        if root not in nodes or root in index:
            continue
        work = [visit(root)]
        while work:
            name, producers = work[-1]
            for producer in producers:
                if producer not in nodes:
                    continue
                if producer not in index:
                    work.append(visit(producer))
                    break
                if producer in on_stack:
                    low[name] = min(low[name], index[producer])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[name])
                if low[name] == index[name]:
                    members = []
                    while not members or members[-1] != name:
                        members.append(stack.pop())
                        on_stack.discard(members[-1])
                    components.append(members)
    return components


def _label(graph: Graph, steps: list[TrainStep]) -> dict[str, str]:
    """Each step's forward, backward and optimizer nodes (a later step's labels win).
    What a step's train ops wait for is its optimizer, except another step's forward
    or backward pass when steps share train ops (two steps in one function)."""
    labels: dict[str, str] = {}
    passes = []
    for step in steps:
        forward = graph.ancestors([step.loss.node]) | {step.loss.node}
        producers = {t.node for t in step.gradients}
        passes.append((forward, _backward(graph, producers, forward)))
    ends_of = [step.train_ops or [step.train_op] for step in steps]
    ends_count = Counter(t for ends in ends_of for t in ends)
    passed = set().union(*(f | b for f, b in passes)) if max(ends_count.values(), default=0) > 1 \
        else set()
    for step, ends, (forward, backward) in zip(steps, ends_of, passes):
        optimizer = (graph.descendants(step.applies) | set(step.applies)
                     | graph.ancestors(ends) | set(ends)) - forward - backward
        if any(ends_count[t] > 1 for t in ends):
            optimizer -= passed
        for names, label in ((optimizer, OPTIMIZER), (backward, BACKWARD), (forward, FORWARD)):
            labels.update(dict.fromkeys(names, label))
    return labels


def gradient_computation(graph: Graph, producers: set[str], forward: set[str]) -> set[str]:
    """What the gradients are computed from by *data* edges, minus the forward pass:
    ops a graph orders before the gradients by control edges alone stay outside."""
    return (graph.ancestors(producers, follow_control=False) | producers) - forward


def _backward(graph: Graph, producers: set[str], forward: set[str]) -> set[str]:
    """What the gradients are computed from, minus the forward pass.

    Data ancestors, plus the control-only ancestors that themselves depend on
    gradient ops (TF's ``tuple/group_deps``). Ops a graph orders before its
    gradients by control edges alone, such as moving-average updates under
    ``control_dependencies(update_ops)``, are not gradient computation: they
    read forward values only, and land with the optimizer.
    """
    by_data = gradient_computation(graph, producers, forward)
    by_control = graph.ancestors(producers) - forward - by_data
    return by_data | (by_control & graph.descendants(by_data))


def _global_step(graph: Graph, labels: dict[str, str], requested: str | None,
                 steps: int) -> str | None:
    """The one step counter; None when there is none, or when the ``steps`` training
    steps of one train op (a function training two models) count each their own
    (two Keras optimizers' ``iterations``)."""
    increments = graph.dialect.step.counter_increments(graph)
    variables = sorted({var for inc, var in increments if labels.get(inc) == OPTIMIZER})
    if requested is not None:
        if requested not in graph or not graph.dialect.is_variable(graph, requested):
            what = "a node of the graph" if requested not in graph else "a variable"
            found = ", ".join(sorted({var for _, var in increments})) or "none"
            raise GraphpassError(f"--global-step {requested!r} is not {what}; "
                                 f"step counters found: {found}")
        return requested
    if 1 < len(variables) <= steps:
        return None
    if len(variables) > 1:
        raise GraphpassError(
            f"several step counters are incremented by the optimizer ({', '.join(variables)}); "
            "choose one with --global-step"
        )
    return variables[0] if variables else None


def _tensor_arg(graph: Graph, text: str, option: str) -> Tensor:
    tensor = graph.dialect.parse_tensor(graph, text)
    if tensor.node not in graph:
        raise GraphpassError(f"{option} {text!r} is not a node of the graph")
    return tensor
