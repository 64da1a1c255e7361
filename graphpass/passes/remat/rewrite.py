"""Rematerialization: the graph-level ``recompute_grad``.

For each marked *segment* of the forward pass, the segment's internal
activations are no longer kept for the backward pass: the recomputable part of
the segment is copied into the backward pass and its own gradient ops read the
copies instead. The copies are *triggered per segment*: they depend on the
gradient flowing into that segment, so each segment is recomputed when the
backward pass reaches it (not all at once, which is why Grappler's MANUAL mode
saves nothing on a chain of blocks).

What it never touches: stateful nodes (variable updates, random ops: their
outputs stay checkpoints, so a recomputed dropout uses the same mask), fed or
stored values (placeholders, variables, constants), a segment's *boundary*
outputs (values other forward nodes read: they are kept anyway as the next
segment's checkpoint), and anything graphpass generated (names under
``graphpass/``), which is what makes a second run a no-op.

Marks: ``--recompute`` patterns, ``_recompute_hint`` attributes, or ``--recompute
auto``, where the planner (``plan``) chooses name scopes for a memory budget
and they are rewritten exactly as those patterns would be.

Ordering: ``control`` mode gives the copies control inputs on the trigger
(TF runtime); ``data`` mode ties each float input of the copies to the trigger
as ``x + stop_gradient(tiny * s)``, ``s`` summing element 0 of each incoming
gradient and ``tiny`` the dtype's smallest normal number, exactly as
``recompute_grad(use_data_dep=True)`` does (XLA ignores control edges; ONNX has
none). The factor is the dialect's ``dependency_scale`` (ONNX: 0, see there).
"""

from __future__ import annotations

import difflib
import heapq
import math
import re
import time
from dataclasses import dataclass

from graphpass.analysis.cost import Sizes
from graphpass.analysis.forward import ForwardChain, computed_forward, forward_chain
from graphpass.analysis.memory import check_batch_size, estimated_peak_bytes, tensor_bytes
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.options import CHEAP, RematOptions
from graphpass.passes.base import Pass
from graphpass.passes.context import PassContext
from graphpass.passes.remat.plan import (
    ROUNDS,
    AutoPlan,
    ChainPlan,
    cheap_groups,
    cheap_keep,
    describe_runs,
    model_peak,
    over_budget_message,
    solve_budget,
    solve_min_peak,
)

GENERATED_SCOPE = "graphpass/"
SCOPE = "graphpass/remat/"
HINT_ATTR = "_recompute_hint"


@dataclass
class Segment:
    """A group of forward nodes recomputed together (one ``recompute_grad`` call).

    By default every value of the segment that gradient ops read and no forward
    op outside it reads is recomputed, from the segment's inputs. The ``cheap``
    policy names the values to recompute (``released``) and the values copies
    read as they are (``kept``), wherever in the forward pass they lie.
    """

    name: str
    nodes: list[str]
    released: list[Tensor] | None = None
    kept: frozenset[Tensor] | None = None


@dataclass(frozen=True)
class _Step:
    """What every segment's rewrite of one graph needs (decided once, before any)."""

    forward: set[str]
    backward: set[str]
    fetches: list[str]
    dependency: str


@dataclass
class _Plan:
    """What one segment's rewrite does, decided before the graph is touched."""

    copies: list[str]  # originals to copy, in graph order
    rewires: list[tuple[str, int, Tensor]]  # (consumer, slot, original tensor)
    triggers: list[Tensor]


def is_generated(name: str) -> bool:
    """Nodes graphpass added; passes never mark, copy or rewire them."""
    return name.startswith(GENERATED_SCOPE)


class RematPass(Pass):
    """Recompute marked forward segments in the backward pass (graph-level recompute_grad)."""

    name = "remat"

    options: RematOptions

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        step = self._analyze(graph, ctx)
        batch = self.options.batch_size
        peak_before = ctx.analyses.peak_bytes(graph, step.fetches) if batch is None \
            else estimated_peak_bytes(graph, step.fetches, batch)
        auto = None
        if self.options.auto:
            auto, segments = self._auto_plan(graph, step, peak_before)
            skipped = []
        else:
            segments, skipped = self._segments(graph, step.forward, step.backward)
        entries = self._rewrite(graph, segments, step)
        changed = any(e["copied"] for e in entries)
        peak_after = estimated_peak_bytes(graph, step.fetches, batch) if changed \
            else peak_before
        self.report = _report(entries, skipped, step.dependency, peak_before, peak_after, auto)
        return changed

    def _analyze(self, graph: Graph, ctx: PassContext) -> _Step:
        """Dependency mode, regions and fetches, once: the planner's trial rewrites
        of copies of the graph reuse them (node names are the same there)."""
        modes = graph.dialect.dependency_modes
        dependency = self.options.dependency or ctx.dependency or \
            graph.dialect.default_dependency(graph)
        if dependency not in modes:
            raise GraphpassError(
                f"--dependency {dependency} is not possible for {graph.format} graphs "
                f"(they support: {', '.join(modes)})"
            )
        regions = ctx.analyses.regions(graph)
        return _Step(forward=set(regions.nodes("forward")),
                     backward=set(regions.nodes("backward")),
                     fetches=regions.fetches, dependency=dependency)

    def _rewrite(self, graph: Graph, segments: list[Segment], step: _Step) -> list[dict]:
        """Plan and apply each segment in turn (a plan sees the earlier rewrites)."""
        entries = []
        # Tupleized gradients tie a segment's gradient ops to each other, which
        # may run against the order the reachability shortcut relies on.
        reach = _Reach(graph, step.backward, ordered=not self.options.tupleize_grads)
        for segment in segments:
            segment_plan = _plan(graph, segment, step.forward, step.backward, reach)
            entries.append(self._apply(graph, segment, segment_plan, step.dependency))
            if entries[-1]["copied"]:
                reach.rewritten(segment_plan)
        return entries

    # -- marks ---------------------------------------------------------------

    def _segments(self, graph: Graph, forward: set[str],
                  backward: set[str]) -> tuple[list[Segment], list[str]]:
        """Marked forward nodes grouped into segments, and the marked gradient ops
        that are skipped (marks on initializers or optimizer state pass silently)."""
        marked: dict[str, list[str]] = {}
        skipped: list[str] = []
        for pattern in self.options.patterns:
            hits = _match(graph, pattern)
            in_forward = {k: [n for n in v if n in forward] for k, v in hits.items()}
            if not any(in_forward.values()):
                raise GraphpassError(_no_match_message(graph, pattern, forward))
            for key, names in hits.items():
                skipped.extend(n for n in names if n in backward)
                marked.setdefault(key, []).extend(n for n in in_forward[key])
        if self.options.use_hints:
            hinted, hint_skipped = _hint_segments(graph, forward, backward)
            marked.update(hinted)
            skipped.extend(hint_skipped)
        return [Segment(k, _unique(v)) for k, v in marked.items() if v], sorted(set(skipped))

    # -- the automatic planner ------------------------------------------------

    def _auto_plan(self, graph: Graph, step: _Step,
                   before: int) -> tuple[AutoPlan, list[Segment]]:
        """The planner (``plan``) on the forward chain; a plan is rewritten on a copy
        of the graph and estimated once, never per candidate."""
        start = time.perf_counter()
        options = self.options
        check_batch_size(graph, step.fetches, options.batch_size)
        sizes = Sizes(graph, options.batch_size)
        chain = forward_chain(graph, computed_forward(graph, step.forward), step.backward,
                              sizes, ignore_reader=is_generated)
        budget = options.memory_budget_bytes
        if options.memory_budget_fraction is not None:
            budget = int(options.memory_budget_fraction * before)
        plan = AutoPlan(options.policy, budget, len(chain.units), chain.width, "none", 0.0,
                        before, before, max(0, before - model_peak(chain.units, ())))

        def estimate(segments: list[Segment]) -> int:
            trial = graph.copy()
            self._rewrite(trial, segments, step)
            return estimated_peak_bytes(trial, step.fetches, options.batch_size)

        if any(n.startswith(SCOPE) for n in graph):
            plan.solver = "none (already rematerialized by graphpass)"
            segments = []
        elif options.policy == CHEAP:
            segments = self._plan_cheap(graph, chain, sizes, plan, estimate)
        else:
            segments = self._plan_chain(chain, plan, estimate)
        plan.seconds = time.perf_counter() - start
        return plan, segments

    def _plan_chain(self, chain: ForwardChain, plan: AutoPlan, estimate) -> list[Segment]:
        """``min-peak`` or ``budget``: solve the chain, rewrite once, estimate. A
        budget plan is searched by bisection over the model's budget, between the
        lowest plan (known to fit) and the budget less the model's offset, keeping
        the cheapest plan whose estimate fits; ``ROUNDS`` estimates at most."""
        units = chain.units
        chosen = solve_min_peak(units)
        estimated = estimate(_chain_segments(chain, chosen))
        if estimated >= plan.estimate_before:  # the model was wrong: recompute nothing
            chosen, estimated = ChainPlan((), 0, 0), plan.estimate_before
        budget = plan.budget_bytes
        if budget is not None and estimated > budget:
            raise GraphpassError(over_budget_message(
                _budget_option(self.options), budget, estimated,
                [chain.label(*r) for r in chosen.runs], plan.estimate_before))
        if budget is not None:
            low, high = chosen.peak, budget - plan.model_offset
            target = high
            for plan.rounds in range(1, ROUNDS + 1):
                found = solve_budget(units, target)
                if found is None or found.cost >= chosen.cost:
                    break
                peak = estimate(_chain_segments(chain, found))
                if peak <= budget:
                    chosen, estimated, low = found, peak, target
                else:
                    high = target
                if high - low <= budget // 100:
                    break
                target = (low + high) // 2
        plan.solver, plan.gap = "chain dp", chosen.gap
        plan.estimate = estimated
        plan.segments = describe_runs(chain, chosen.runs)
        return _chain_segments(chain, chosen)

    def _plan_cheap(self, graph: Graph, chain: ForwardChain, sizes: Sizes, plan: AutoPlan,
                    estimate) -> list[Segment]:
        """``cheap``: keep what one min cut says; recompute the rest per unit."""
        keep = frozenset(cheap_keep(graph, chain, sizes))
        segments = []
        for label, released in cheap_groups(chain, keep):
            segments.append(Segment(label, [], released, keep))
            plan.segments.append({
                "label": label, "nodes": len(_unique(t.node for t in released)),
                "estimated_bytes_saved": sum(sizes.bytes(t) for t in released),
                "recompute_flops": sum(sizes.flops(n) for n in _unique(t.node for t in released))})
        plan.solver, plan.gap = "min cut (networkx max-flow)", 0.0
        plan.estimate = estimate(segments)
        if plan.estimate >= plan.estimate_before:  # saves nothing: recompute nothing
            plan.estimate, plan.segments = plan.estimate_before, []
            return []
        return segments

    # -- rewrite -------------------------------------------------------------

    def _apply(self, graph: Graph, segment: Segment, plan: _Plan, dependency: str) -> dict:
        entry = {"segment": segment.name, "marked": len(segment.nodes), "copied": 0,
                 "copies": [], "triggers": [str(t) for t in plan.triggers],
                 "released": [], "released_bytes": 0, "note": ""}
        if not plan.rewires:
            entry["note"] = "no gradient op reads this segment's internal values"
            return entry
        if not plan.triggers:
            entry["note"] = "no gradient flows into this segment; left as is"
            return entry
        copy_of = _copy_nodes(graph, plan.copies)
        if dependency == "control":
            _order_by_control(graph, copy_of, plan.triggers)
        else:
            _order_by_data(graph, copy_of, plan.triggers, segment.name)
        released = sorted({orig for _, _, orig in plan.rewires})
        for consumer, slot, original in plan.rewires:
            graph.set_input(consumer, slot, Tensor(copy_of[original.node], original.port))
        for original in copy_of:  # still computed in the forward pass: exactly as before
            if graph.users(original):
                graph.dialect.keep_as_written(graph, original)
        if self.options.tupleize_grads:
            _tupleize(graph, segment.name, [c for c, _, _ in plan.rewires], dependency)
        entry.update(copied=len(copy_of), copies=list(copy_of.values()),
                     released=[str(t) for t in released],
                     released_bytes=sum(tensor_bytes(graph, t) or 0 for t in released))
        return entry


def _budget_option(options: RematOptions) -> str:
    return "--memory-budget" if options.memory_budget_fraction is not None \
        else "--memory-budget-bytes"


def _chain_segments(chain: ForwardChain, plan: ChainPlan) -> list[Segment]:
    """One segment per recomputed run of units (labels for display only)."""
    return [Segment(chain.label(first, last), chain.nodes(first, last))
            for first, last in plan.runs]


def _match(graph: Graph, pattern: str) -> dict[str, list[str]]:
    """Matched text -> node names, in graph order (one segment per matched text)."""
    regex = re.compile(pattern)
    hits: dict[str, list[str]] = {}
    for name in graph:
        found = regex.match(name)
        if found and found.group(0) and not is_generated(name):
            hits.setdefault(found.group(0), []).append(name)
    return hits


def _no_match_message(graph: Graph, pattern: str, forward: set[str]) -> str:
    scopes = sorted({n.rsplit("/", 1)[0] + "/" for n in forward if "/" in n})
    close = difflib.get_close_matches(pattern, scopes, n=5, cutoff=0.3) or scopes[:5]
    return (f"--recompute {pattern!r} matches no forward node; closest scopes: "
            f"{', '.join(close) or '(none)'}")


def _hint_segments(graph: Graph, forward: set[str],
                   backward: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Nodes with the same hint value that are connected form one segment."""
    import networkx as nx

    dialect = graph.dialect
    by_hint: dict[str, list[str]] = {}
    skipped = []
    for name in graph:
        hint = dialect.get_attr(graph, name, HINT_ATTR)
        if hint is None or is_generated(name):
            continue
        if name not in forward:
            if name in backward:
                skipped.append(name)
            continue
        by_hint.setdefault(str(hint), []).append(name)
    segments = {}
    for hint, names in by_hint.items():
        parts = nx.connected_components(graph.nx.subgraph(names).to_undirected(as_view=True))
        position = {n: i for i, n in enumerate(names)}
        ordered = sorted((sorted(p, key=position.__getitem__) for p in parts),
                         key=lambda p: position[p[0]])
        for i, part in enumerate(ordered):
            segments[f"hint {hint}" + (f" #{i}" if len(ordered) > 1 else "")] = part
    return segments, skipped


def _plan(graph: Graph, segment: Segment, forward: set[str], backward: set[str],
          reach: _Reach | None = None) -> _Plan:
    """Decide copies, rewires and triggers for one segment (graph untouched).
    ``reach``: shared by the segments of one rewrite (made here if not given)."""
    dialect = graph.dialect
    if segment.kept is None:
        recomputable = {n for n in segment.nodes if dialect.is_recomputable(graph, n)}
        released = _internal_values(graph, segment, recomputable, forward)

        def recompute(tensor: Tensor) -> bool:
            return tensor.node in recomputable
    else:
        released = segment.released or []

        def recompute(tensor: Tensor) -> bool:
            return tensor not in segment.kept and tensor.node in forward \
                and not is_generated(tensor.node) and dialect.is_recomputable(graph, tensor.node)
    rewires = [(consumer, slot, tensor) for tensor in released
               for consumer, slot in graph.consumers(tensor)
               if consumer in backward and not is_generated(consumer)]
    needed = _upstream(graph, {t.node for _, _, t in rewires}, recompute)
    if segment.kept is None:
        copies = [n for n in segment.nodes if n in needed]
    else:
        copies = [n for n in graph if n in needed]
    consumers = {c for c, _, _ in rewires}
    return _Plan(copies=copies, rewires=rewires,
                 triggers=_triggers(graph, consumers, backward,
                                    reach or _Reach(graph, backward)))


def _internal_values(graph: Graph, segment: Segment, recomputable: set[str],
                     forward: set[str]) -> list[Tensor]:
    """The values a segment recomputes: those of its recomputable nodes that no
    forward node outside it reads (those are boundaries, kept anyway)."""
    members = set(segment.nodes)
    return [Tensor(name, port) for name in segment.nodes if name in recomputable
            for port in graph.used_ports(name)
            if not _is_boundary(graph.consumers(Tensor(name, port)), members, forward)]


def _triggers(graph: Graph, consumers: set[str], backward: set[str],
              reach: _Reach) -> list[Tensor]:
    """The gradient flowing into the segment: computed float backward tensors that
    the segment's gradient ops read and that do not depend on them.

    Fused gradient ops (TF ``ReluGrad(grad, relu)``) read the incoming gradient
    next to the activation. Decomposed ones (ONNX: ``Greater(z, 0)`` then
    ``Where(., grad, 0)``; ``Mul(t, t)`` then ``Mul(grad, 1 - .)``) read the
    activation alone and the gradient joins further down; then the nearest
    layer of their backward descendants that reads such a gradient gives the
    trigger. There, values computed from forward tensors and constants only
    (``Transpose(h)``) are not gradients and are passed over while a real one
    exists. Stored values (constants, variable reads) trigger only when
    nothing else can: they order little (a TF graph whose gradients wait on
    the moving-average updates, ``control_dependencies(update_ops)``, has
    every gradient downstream of its segments' own update ops).
    """
    dialect = graph.dialect
    after = reach.downstream(consumers)

    def entering(nodes: set[str], sources: bool = False) -> list[Tensor]:
        return _unique(
            t for c in sorted(nodes) for t in graph.inputs(c)
            if t.node in backward and t.node not in after
            and (sources or not dialect.is_source(graph, t.node))
            and dialect.is_float(graph, t)
        )

    direct = entering(consumers)
    if direct:
        return direct
    fallback: list[Tensor] = []
    seen, layer = set(consumers), set(consumers)
    while layer:
        layer = {u for n in layer for u in graph.data_users(n)
                 if u in backward and u not in seen}
        seen |= layer
        found = entering(layer)
        gradients = [t for t in found if reach.carries_gradient(t.node)]
        if gradients:
            return gradients
        fallback = fallback or found
    return fallback or entering(consumers, sources=True)


class _Reach:
    """The two reachability questions of the trigger search, answered for the
    graph as the earlier segments' rewrites left it, without a walk of the whole
    graph per segment (which made rewriting quadratic in the segments).

    * ``downstream(consumers)``: the nodes that depend on ``consumers``, walked
      only as far as asked: a node depends only on nodes before it in a
      topological order, so asking about ``x`` walks the consumers' descendants
      that come before ``x``. A rewrite keeps the order of the original graph
      valid as long as each segment's triggers come before its rewired
      consumers (what copies and ties connect); checked after every segment,
      and once it fails (or the graph has a cycle) the walk is unbounded.
    * ``carries_gradient(name)``: computed from some backward value (not from
      forward values and constants alone, as a ``Transpose`` of an activation
      or a weight is). One walk before any rewrite; a rewrite adds ancestors
      to an original node only through the copies and ties it added, which the
      walk from ``name`` follows up to the original nodes (a rewired consumer
      reads an activation, so it is itself computed backward).
    """

    def __init__(self, graph: Graph, backward: set[str], ordered: bool = True) -> None:
        self.graph = graph
        self.computed = {n for n in backward if not graph.dialect.is_source(graph, n)}
        self.from_computed = graph.descendants(self.computed)
        self.original = set(graph)
        self.position: dict[str, int] | None = None
        if ordered:
            try:
                self.position = {n: i for i, n in enumerate(graph.topological_order())}
            except ValueError:  # a cycle (TF loops): no order to bound the walks by
                pass

    def downstream(self, consumers: set[str]) -> _Downstream:
        return _Downstream(self.graph, consumers, self.position)

    def rewritten(self, plan: _Plan) -> None:
        """After ``plan`` was applied: does the original order still hold?"""
        position = self.position
        if position is not None and max(position[t.node] for t in plan.triggers) >= \
                min(position[c] for c, _, _ in plan.rewires):
            self.position = None

    def carries_gradient(self, name: str) -> bool:
        if name in self.from_computed:
            return True
        seen, stack = {name}, [name]
        while stack:
            for producer in self.graph.producers(stack.pop()):
                if producer in self.computed or producer in self.from_computed:
                    return True
                if producer not in self.original and producer not in seen:
                    seen.add(producer)
                    stack.append(producer)
        return False


class _Downstream:
    """``descendants(consumers) | consumers``, walked lazily (see ``_Reach``)."""

    def __init__(self, graph: Graph, consumers: set[str],
                 position: dict[str, int] | None) -> None:
        self.graph = graph
        self.position = position
        self.members = set(consumers)
        self.pending = sorted((self._key(c, 0), c) for c in consumers)

    def _key(self, name: str, parent_key: float) -> float:
        """Position in the order; a node a rewrite added walks with its producer."""
        if self.position is None:
            return 0
        return self.position.get(name, parent_key)

    def __contains__(self, name: str) -> bool:
        if name in self.members:
            return True
        bound = math.inf if self.position is None else self.position.get(name, math.inf)
        while self.pending and self.pending[0][0] <= bound:
            key, node = heapq.heappop(self.pending)
            for user in self.graph.users(node):
                if user not in self.members:
                    self.members.add(user)
                    heapq.heappush(self.pending, (self._key(user, key), user))
        return name in self.members


def _is_boundary(readers: list[tuple[str, int]], members: set[str], forward: set[str]) -> bool:
    """Read by a forward node outside the segment (the next segment, the loss): a
    value kept anyway as a checkpoint, so recomputing it saves nothing."""
    return any(c in forward and c not in members for c, _ in readers)


def _upstream(graph: Graph, names: set[str], recompute) -> set[str]:
    """``names`` and the producers of the values they read that ``recompute``
    accepts, transitively: what must be copied to recompute ``names``."""
    seen = set(names)
    stack = list(names)
    while stack:
        for tensor in graph.inputs(stack.pop()):
            if tensor.node not in seen and recompute(tensor):
                seen.add(tensor.node)
                stack.append(tensor.node)
    return seen


def _copy_nodes(graph: Graph, originals: list[str]) -> dict[str, str]:
    """Copy ``originals`` (in graph order) under ``graphpass/remat/``; inputs inside
    the copied set point at the copies, everything else at the original tensors."""
    dialect = graph.dialect
    copy_of = {}
    for name in originals:  # one at a time: a name taken here is not free for the next
        copy_of[name] = graph.unique_name(SCOPE + name)
        dialect.copy_node(graph, name, copy_of[name])
    for name in originals:
        for slot, tensor in graph.input_slots(name).items():
            source = copy_of.get(tensor.node)
            graph.set_input(copy_of[name], slot,
                            Tensor(source, tensor.port) if source else tensor)
        for control in graph.control_inputs(name):
            graph.add_control_input(copy_of[name], copy_of.get(control, control))
    return copy_of


def _order_by_control(graph: Graph, copy_of: dict[str, str], triggers: list[Tensor]) -> None:
    """Copies that read no other copy wait, by control edges, for the trigger."""
    copies = set(copy_of.values())
    for copy in copy_of.values():
        if not any(t.node in copies for t in graph.inputs(copy)):
            for trigger in triggers:
                graph.add_control_input(copy, trigger.node)


def _order_by_data(graph: Graph, copy_of: dict[str, str], triggers: list[Tensor],
                   segment: str) -> None:
    """Tie the copies' float inputs from outside to the trigger:
    ``x + stop_gradient(tiny * s)`` (recompute_grad's use_data_dep).

    Like ``recompute_grad``, which ties the function's arguments and not the
    variables it reads, only activations are tied: tying a weight would make a
    weight-sized temporary per segment. Weights are tied only when a segment
    reads nothing else. Constants are never tied: they are there from the start
    anyway, and a tied constant is no longer one to the runtime's optimizer, which
    would then compute the copy differently from its original (Grappler turns
    ``x / const`` into ``x * (1 / const)`` only for a constant).
    """
    dialect = graph.dialect
    copies = set(copy_of.values())
    external = _unique(
        t for c in copy_of.values() for t in graph.inputs(c)
        if t.node not in copies and dialect.is_float(graph, t)
        and not dialect.is_constant(graph, t.node)
    )
    if not external:
        raise GraphpassError(
            f"segment {segment!r} has no float input to tie to the gradient in data mode; "
            "mark a larger segment (one that reads a float tensor) or use --dependency control"
        )
    activations = [t for t in external if not dialect.is_variable_value(graph, t.node)]
    # Who reads each external tensor, once (a scan of every copy per tensor was
    # quadratic in the segment); copies in order, then slots as the graph lists them.
    readers: dict[Tensor, list[tuple[str, int]]] = {}
    for copy in copy_of.values():
        for slot, source in graph.input_slots(copy).items():
            readers.setdefault(source, []).append((copy, slot))
    scope = f"{SCOPE}{segment.rstrip('/')}/dep"
    signal: dict[str, Tensor] = {}
    for tensor in activations or external:
        dtype = dialect.dtype(graph, tensor)
        if dtype not in signal:
            signal[dtype] = _tiny_signal(graph, f"{scope}/{dtype}", triggers, dtype)
        tied = dialect.binary(graph, f"{scope}/tie", "add", tensor, signal[dtype])
        for copy, slot in readers[tensor]:
            graph.set_input(copy, slot, tied)


def _tiny_signal(graph: Graph, scope: str, tensors: list[Tensor], dtype: str) -> Tensor:
    """``stop_gradient(scale * sum(first elements))`` in ``dtype`` (``scale``: the
    dialect's ``dependency_scale``, ``tiny`` by default): numerically nothing
    for any normal value, but a data dependency no compiler may drop."""
    dialect = graph.dialect
    firsts = [
        dialect.cast(graph, f"{scope}/cast", dialect.first_element(graph, f"{scope}/first", t),
                     dtype)
        for t in tensors
    ]
    total = dialect.add_n(graph, f"{scope}/sum", firsts)
    tiny = dialect.scalar(graph, f"{scope}/tiny", dialect.dependency_scale(dtype), dtype)
    return dialect.stop_gradient(graph, f"{scope}/stop",
                                 dialect.binary(graph, f"{scope}/scaled", "mul", total, tiny))


def _tupleize(graph: Graph, segment: str, gradient_ops: list[str], dependency: str) -> None:
    """Gate the segment's gradient outputs so none is consumed before all exist."""
    dialect = graph.dialect
    ops = set(gradient_ops)
    # Values that flow back into the segment's own gradient ops are internal to
    # it; gating those on all the ops would be a cycle.
    internal = graph.ancestors(ops)
    outputs = _unique(
        Tensor(op, port) for op in sorted(ops) for port in graph.used_ports(op)
        if dialect.is_float(graph, Tensor(op, port))
        and _leaves(graph.consumers(Tensor(op, port)), ops, internal)
    )
    scope = f"{SCOPE}{segment.rstrip('/')}/tuple"
    producers = _unique(t.node for t in outputs)
    signal: dict[str, Tensor] = {}
    for tensor in outputs:
        if dependency == "control":
            gated = dialect.identity(graph, f"{scope}/gate", tensor, producers)
        else:
            dtype = dialect.dtype(graph, tensor)
            if dtype not in signal:
                signal[dtype] = _tiny_signal(graph, f"{scope}/{dtype}", outputs, dtype)
            gated = dialect.binary(graph, f"{scope}/gate", "add", tensor, signal[dtype])
        graph.replace_uses(tensor, gated,
                           where=lambda c: c not in ops and not c.startswith(scope))


def _leaves(readers: list[tuple[str, int]], ops: set[str], internal: set[str]) -> bool:
    outside = [c for c, _ in readers if c not in ops]
    return bool(outside) and not any(c in internal for c in outside)


def _report(entries: list[dict], skipped: list[str], dependency: str, peak_before: int,
            peak_after: int, auto: AutoPlan | None = None) -> dict:
    summary = auto.summary() if auto else []
    for e in entries:
        line = f"segment {e['segment']}: "
        if e["copied"]:
            line += (f"{e['copied']} nodes recomputed, {len(e['released'])} tensors no longer "
                     f"kept (~{e['released_bytes'] / 2**20:.1f} MiB), trigger "
                     f"{', '.join(e['triggers'][:3])}")
        else:
            line += e["note"]
        summary.append(line)
    if skipped:
        summary.append(f"{len(skipped)} marked gradient ops were skipped (only forward "
                       f"nodes are recomputed) "
                       f"(e.g. {', '.join(skipped[:3])})")
    if peak_before:
        summary.append(f"estimated peak {peak_before / 2**20:.1f} MiB -> "
                       f"{peak_after / 2**20:.1f} MiB ({peak_after / peak_before:.2f}x)")
    extra = {"auto": auto.to_json()} if auto else {}
    return {
        **extra,
        "dependency": dependency,
        "estimated_peak_bytes_before": peak_before,
        "estimated_peak_bytes_after": peak_after,
        "segments": entries,
        "skipped_marks": skipped,
        "nodes_added": sum(e["copied"] for e in entries),
        "released_bytes": sum(e["released_bytes"] for e in entries),
        "summary": summary,
    }


def _unique(items) -> list:
    return list(dict.fromkeys(items))
