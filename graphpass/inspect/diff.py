"""What changed between two states of a graph: ``graph_diff(a, b)``.

One function serves both the pipeline dumps (the graph before and after a
pass) and ``graphpass diff A B`` (two files), so a dump's highlighting and the
diff command can never disagree about what a pass did.

Edges are compared by what they *mean*, not by networkx keys: a data edge is
"input slot ``s`` of node ``dst`` reads tensor ``t``", a control edge is
"``dst`` runs after ``src``". A slot that reads a different tensor is a
*rewired* edge (the remat pass's consumers are rewired this way); a slot or
control dependency that did not exist before is an *added* edge.

Changes are grouped by *scope*: passes put their nodes under
``graphpass/<pass>/...``, so that prefix (two components) groups them; any
other node is grouped by the first component of its name (``block1``,
``gradients``, ``Adam``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from graphpass.ir.graph import Graph, Tensor

#: Nodes without a ``/`` in their name are grouped here.
TOP_SCOPE = "(top)"


CATEGORIES = (
    "added_nodes", "removed_nodes", "changed_nodes",
    "added_data_edges", "removed_data_edges", "rewired_edges",
    "added_control_edges", "removed_control_edges",
)


@dataclass(frozen=True)
class DataEdge:
    """Input ``slot`` of ``dst`` reads ``src`` (``before`` is the old source when rewired)."""

    dst: str
    slot: int
    src: Tensor
    before: Tensor | None = None

    def __str__(self) -> str:
        if self.before is not None:
            return f"{self.dst} input {self.slot}: {self.before} -> {self.src}"
        return f"{self.src} -> {self.dst} input {self.slot}"


@dataclass(frozen=True)
class ControlEdge:
    """``dst`` runs after ``src`` (TF ``^src``)."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"^{self.src} -> {self.dst}"


@dataclass
class GraphDiff:
    """Everything that differs from graph ``a`` to graph ``b``.

    ``changed_nodes`` kept their name but not their op, device or attributes
    (a constant's value, a dtype). ``meta`` names graph-level data that differs
    (the function library, versions, ONNX initializers, ...).
    """

    added_nodes: list[str] = field(default_factory=list)
    removed_nodes: list[str] = field(default_factory=list)
    changed_nodes: list[str] = field(default_factory=list)
    added_data_edges: list[DataEdge] = field(default_factory=list)
    removed_data_edges: list[DataEdge] = field(default_factory=list)
    rewired_edges: list[DataEdge] = field(default_factory=list)
    added_control_edges: list[ControlEdge] = field(default_factory=list)
    removed_control_edges: list[ControlEdge] = field(default_factory=list)
    meta: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.meta and not any(getattr(self, c) for c in CATEGORIES)

    def counts(self) -> dict[str, int]:
        counts = {c: len(getattr(self, c)) for c in CATEGORIES}
        counts["meta"] = len(self.meta)
        return counts

    def rewired_nodes(self) -> list[str]:
        """Nodes in both graphs whose inputs (data or control) changed."""
        added = set(self.added_nodes)
        touched = [e.dst for e in self.rewired_edges + self.added_data_edges
                   + self.removed_data_edges]
        touched += [e.dst for e in self.added_control_edges + self.removed_control_edges]
        return sorted({n for n in touched if n not in added and n not in self.removed_nodes})

    def by_scope(self) -> dict[str, dict[str, list[str]]]:
        """``{scope: {category: [item, ...]}}``; edges belong to their consumer's scope."""
        groups: dict[str, dict[str, list[str]]] = {}
        for category in CATEGORIES:
            for item in getattr(self, category):
                name = item if isinstance(item, str) else item.dst
                scope = groups.setdefault(scope_of(name), {})
                scope.setdefault(category, []).append(str(item))
        return dict(sorted(groups.items()))

    def scope_counts(self) -> dict[str, dict[str, int]]:
        return {scope: {c: len(items) for c, items in cats.items()}
                for scope, cats in self.by_scope().items()}

    def to_json(self) -> dict:
        """A JSON-able form: equal, totals, per-scope counts and items, meta changes."""
        return {
            "equal": self.equal,
            "counts": self.counts(),
            "rewired_nodes": self.rewired_nodes(),
            "scopes": {
                scope: {"counts": {c: len(v) for c, v in cats.items()}, **cats}
                for scope, cats in self.by_scope().items()
            },
            "meta": list(self.meta),
        }


def scope_of(name: str) -> str:
    """``graphpass/remat/block1/MatMul`` -> ``graphpass/remat``; ``block1/W`` -> ``block1``."""
    parts = name.split("/")
    if len(parts) == 1:
        return TOP_SCOPE
    if parts[0] == "graphpass" and len(parts) > 2:
        return f"graphpass/{parts[1]}"
    return parts[0]


def graph_diff(a: Graph, b: Graph) -> GraphDiff:
    """What changed from ``a`` to ``b`` (nodes, data edges by slot, control edges, meta).

    Pure: neither graph is touched. Lists are sorted so the result is stable.
    """
    diff = GraphDiff()
    names_a, names_b = set(a), set(b)
    diff.added_nodes = [n for n in b if n not in names_a]
    diff.removed_nodes = [n for n in a if n not in names_b]
    diff.changed_nodes = [n for n in b if n in names_a and _node_differs(a, b, n)]
    _diff_data_edges(a, b, diff)
    _diff_control_edges(a, b, diff)
    diff.meta = _meta_differences(a, b)
    return diff


def _node_differs(a: Graph, b: Graph, name: str) -> bool:
    """Same name, different node: op, domain, device, attrs or declared outputs."""
    x, y = a.node(name), b.node(name)
    return (x.op, x.domain, x.device, x.outputs) != (y.op, y.domain, y.device, y.outputs) \
        or x.attrs != y.attrs


def _data_inputs(graph: Graph) -> dict[tuple[str, int], Tensor]:
    return {(dst, d["dst_port"]): Tensor(src, d["src_port"])
            for src, dst, d in graph.nx.edges(data=True) if not d["control"]}


def _control_inputs(graph: Graph) -> set[tuple[str, str]]:
    return {(src, dst) for src, dst, d in graph.nx.edges(data=True) if d["control"]}


def _diff_data_edges(a: Graph, b: Graph, diff: GraphDiff) -> None:
    before, after = _data_inputs(a), _data_inputs(b)
    for (dst, slot), src in sorted(after.items()):
        old = before.get((dst, slot))
        if old is None:
            diff.added_data_edges.append(DataEdge(dst, slot, src))
        elif old != src:
            diff.rewired_edges.append(DataEdge(dst, slot, src, before=old))
    diff.removed_data_edges = [DataEdge(dst, slot, src)
                               for (dst, slot), src in sorted(before.items())
                               if (dst, slot) not in after]


def _diff_control_edges(a: Graph, b: Graph, diff: GraphDiff) -> None:
    before, after = _control_inputs(a), _control_inputs(b)
    diff.added_control_edges = [ControlEdge(s, d) for s, d in sorted(after - before)]
    diff.removed_control_edges = [ControlEdge(s, d) for s, d in sorted(before - after)]


def _meta_differences(a: Graph, b: Graph) -> list[str]:
    """Graph-level data that differs; the TF function library is itemised by function."""
    if a.format != b.format:
        return [f"format: {a.format} -> {b.format}"]
    notes = []
    provenance = a.format_state.provenance()
    for key in sorted(f.name for f in dataclasses.fields(a.format_state)):
        if key in provenance:
            continue
        x, y = _comparable(a, key), _comparable(b, key)
        if x == y:
            continue
        if key == "library" and a.format == "tf":
            notes += _library_differences(x, y)
        else:
            notes.append(f"{key} differs")
    return notes


def _comparable(graph: Graph, key: str):
    """A SavedModel is compared without the GraphDef the IR replaces on writing."""
    value = getattr(graph.format_state, key)
    if key != "savedmodel" or value is None:
        return value
    copy = type(value)()
    copy.CopyFrom(value)
    copy.meta_graphs[graph.format_state.metagraph_index].ClearField("graph_def")
    return copy


def _library_differences(x, y) -> list[str]:
    """Functions added / removed / changed in a TF ``FunctionDefLibrary``."""
    def functions(library) -> dict:
        return {f.signature.name: f for f in library.function} if library is not None else {}

    before, after = functions(x), functions(y)
    notes = [f"library function added: {n}" for n in sorted(set(after) - set(before))]
    notes += [f"library function removed: {n}" for n in sorted(set(before) - set(after))]
    notes += [f"library function changed: {n}" for n in sorted(set(before) & set(after))
              if before[n] != after[n]]
    return notes or ["library differs (gradients or other non-function entries)"]


_SIGNS = {
    "added_nodes": "+ node", "removed_nodes": "- node", "changed_nodes": "~ node",
    "added_data_edges": "+ edge", "removed_data_edges": "- edge", "rewired_edges": "~ edge",
    "added_control_edges": "+ ctrl", "removed_control_edges": "- ctrl",
}


def format_diff(diff: GraphDiff, a_label: str, b_label: str, *, limit: int | None = 20) -> str:
    """Human-readable diff: totals, then each scope with its counts and (up to ``limit``
    per category) its items; ``limit=None`` lists everything."""
    if diff.equal:
        return f"{a_label} and {b_label}: equal graphs"
    totals = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in diff.counts().items() if v)
    lines = [f"{a_label} -> {b_label}: {totals}"]
    for scope, categories in diff.by_scope().items():
        counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in categories.items())
        lines.append(f"  {scope}: {counts}")
        for category, items in categories.items():
            shown = items if limit is None else items[:limit]
            lines += [f"    {_SIGNS[category]} {item}" for item in shown]
            if len(shown) < len(items):
                lines.append(f"    ... {len(items) - len(shown)} more {category.replace('_', ' ')}"
                             " (--all lists them)")
    lines += [f"  graph: {note}" for note in diff.meta]
    return "\n".join(lines)
