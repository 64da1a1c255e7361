"""Graphviz views of what a pass changed: the *rewritten neighbourhood*.

``dot`` cannot lay out a big training graph, and nobody could read it
if it did, so a view shows only what a pass touched -- the nodes it added or
changed, the consumers it rewired, the edges it added -- plus their direct
neighbours, greyed, for context. The whole graph is drawn only on request
(``full=True``). Each kind of change has its own colour, and every view
carries a legend, so a picture can be read without this docstring.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from graphpass.inspect.diff import GraphDiff
from graphpass.ir.graph import Graph

#: Context nodes drawn at most; beyond this a hub's neighbours are elided (and said so).
MAX_CONTEXT_NODES = 400
RENDER_TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class Style:
    label: str
    node: str
    edge: str


# One entry per kind of change; the legend is drawn from this table.
STYLES = {
    "added": Style("added node", 'style=filled fillcolor="#b7e4a8" color="#2e7d32"',
                   'color="#2e7d32"'),
    "changed": Style("changed node (op/attrs)", 'style=filled fillcolor="#fff3a0" '
                     'color="#b59f00"', ""),
    "rewired": Style("rewired consumer", 'style="filled,bold" fillcolor="#ffe0b2" '
                     'color="#e65100" penwidth=2', ""),
    "removed": Style("removed node", 'style=dashed color="#c62828" fontcolor="#c62828"',
                     'style=dotted color="#c62828"'),
    "context": Style("context (1 hop, unchanged)", 'style=filled fillcolor="#eeeeee" '
                     'color="#9e9e9e" fontcolor="#757575"', 'color="#bdbdbd"'),
    "new_data": Style("new data edge", "", 'color="#1565c0" penwidth=2'),
    "new_control": Style("new control edge", "", 'color="#8e24aa" style=dashed penwidth=2'),
    "rewired_edge": Style("rewired edge", "", 'color="#e65100" penwidth=2.5'),
    "edge": Style("unchanged edge", "", 'color="#616161"'),
}


def neighbourhood_dot(graph: Graph, diff: GraphDiff | None, *, before: Graph | None = None,
                      full: bool = False, title: str = "") -> str:
    """Graphviz source for ``graph`` with ``diff``'s changes highlighted.

    ``before`` supplies the removed nodes (they are no longer in ``graph``).
    With ``diff=None`` (the input graph) nothing is highlighted: the view is
    the whole graph when ``full``, else just a note and the legend.
    """
    roles = _node_roles(graph, diff, before)
    view, elided = _select_view(graph, roles, full)
    lines = [f"digraph {_quote(title or 'graph')} {{", "  rankdir=TB;",
             '  node [shape=box fontname="Helvetica" fontsize=10];',
             '  edge [fontname="Helvetica" fontsize=8];',
             f"  label={_quote(_caption(title, diff, len(view), elided))} labelloc=t;"]
    untouched = "plain" if full else "context"
    for name in view:
        lines.append(_node_line(graph, before, name, roles.get(name, untouched)))
    lines += _edge_lines(graph, before, diff, set(view), set(roles))
    if not view:
        lines.append('  "(no changes to draw)" [shape=note];')
    lines += _legend()
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_path: Path) -> tuple[Path | None, str | None]:
    """Run the real Graphviz ``dot -Tsvg``; ``(svg path, None)`` or ``(None, why not)``."""
    dot = shutil.which("dot")
    if dot is None:
        return None, ("no .svg dumps: Graphviz `dot` is not on PATH "
                      "(install it: apt-get install -y graphviz); the .dot files are written")
    svg_path = dot_path.with_suffix(".svg")
    try:
        subprocess.run([dot, "-Tsvg", str(dot_path), "-o", str(svg_path)], check=True,
                       capture_output=True, text=True, timeout=RENDER_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return None, (f"no .svg for {dot_path.name}: dot took over {RENDER_TIMEOUT_SECONDS}s "
                      "(the view is too big; drop --dump-full)")
    except subprocess.CalledProcessError as exc:
        first = (exc.stderr or "").strip().splitlines()[:1]
        return None, f"no .svg for {dot_path.name}: dot failed ({' '.join(first) or exc})"
    return svg_path, None


def _node_roles(graph: Graph, diff: GraphDiff | None, before: Graph | None) -> dict[str, str]:
    """Which highlight each touched node gets; later roles win over earlier ones."""
    if diff is None:
        return {}
    roles = dict.fromkeys(diff.rewired_nodes(), "rewired")
    roles.update(dict.fromkeys(diff.changed_nodes, "changed"))
    roles.update(dict.fromkeys(diff.added_nodes, "added"))
    if before is not None:
        roles.update(dict.fromkeys(diff.removed_nodes, "removed"))
    return roles


def _select_view(graph: Graph, roles: dict[str, str], full: bool) -> tuple[list[str], int]:
    """The nodes to draw, in a stable order, and how many context nodes were elided."""
    if full:
        return list(graph) + [n for n in roles if n not in graph], 0
    focus = [n for n in roles if n in graph]
    context: dict[str, None] = {}
    for name in focus:
        for other in graph.producers(name) + graph.users(name):
            if other not in roles:
                context[other] = None
    kept = list(context)[:MAX_CONTEXT_NODES]
    return list(roles) + kept, len(context) - len(kept)


def _caption(title: str, diff: GraphDiff | None, drawn: int, elided: int) -> str:
    if diff is None:
        text = f"{title}: the input graph (nothing rewritten yet)"
    else:
        counts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in diff.counts().items() if v)
        text = f"{title}: {counts or 'no change'}"
    text += f" ({drawn} nodes drawn"
    text += f", {elided} context nodes elided)" if elided else ")"
    return text


def _node_line(graph: Graph, before: Graph | None, name: str, role: str) -> str:
    source = graph if name in graph else before
    op = source.node(name).op if source is not None else "?"
    style = STYLES[role].node if role in STYLES else ""
    return f"  {_quote(name)} [label={_quote(name + chr(10) + op)} {style}];"


def _edge_lines(graph: Graph, before: Graph | None, diff: GraphDiff | None,
                view: set[str], touched: set[str]) -> list[str]:
    """Every edge of ``graph`` between drawn nodes, styled by what the diff says of it.

    Unchanged edges that touch no changed node are context, greyed like context nodes.
    """
    kinds = _edge_kinds(diff)
    lines = []
    for src, dst, data in graph.nx.edges(data=True):
        if src not in view or dst not in view:
            continue
        slot = "^" if data["control"] else data["dst_port"]
        kind = kinds.get((src, dst, slot), "edge")
        if kind == "edge" and diff is not None and not {src, dst} & touched:
            kind = "context"
        style = STYLES[kind].edge
        if data["control"] and kind in ("edge", "context"):
            style += " style=dashed"
        label = "^" if data["control"] else f"{data['src_port']}:{data['dst_port']}"
        lines.append(f"  {_quote(src)} -> {_quote(dst)} [label={_quote(label)} {style}];")
    lines += _removed_edge_lines(before, diff, view)
    return lines


def _removed_edge_lines(before: Graph | None, diff: GraphDiff | None, view: set[str]) -> list:
    if before is None or diff is None or not diff.removed_nodes:
        return []
    removed = set(diff.removed_nodes)
    return [f"  {_quote(s)} -> {_quote(d)} [{STYLES['removed'].edge}];"
            for s, d in before.nx.edges() if (s in removed or d in removed)
            and s in view and d in view]


def _edge_kinds(diff: GraphDiff | None) -> dict[tuple, str]:
    if diff is None:
        return {}
    kinds: dict[tuple, str] = {}
    for edge in diff.added_data_edges:
        kinds[(edge.src.node, edge.dst, edge.slot)] = "new_data"
    for edge in diff.rewired_edges:
        kinds[(edge.src.node, edge.dst, edge.slot)] = "rewired_edge"
    for edge in diff.added_control_edges:
        kinds[(edge.src, edge.dst, "^")] = "new_control"
    return kinds


def _legend() -> list[str]:
    """A boxed legend: one sample node per node style, one sample edge per edge style."""
    lines = ["  subgraph cluster_legend {", '    label="legend"; fontsize=12; color="#9e9e9e";']
    for key in ("added", "changed", "rewired", "context", "removed"):
        lines.append(f"    {_quote('legend_' + key)} [label={_quote(STYLES[key].label)} "
                     f"{STYLES[key].node}];")
    for key in ("new_data", "new_control", "rewired_edge", "edge"):
        a, b = _quote(f"legend_{key}_a"), _quote(f"legend_{key}_b")
        lines.append(f'    {a} [label="" shape=point]; {b} [label="" shape=point];')
        lines.append(f"    {a} -> {b} [label={_quote(STYLES[key].label)} {STYLES[key].edge}];")
    lines.append("  }")
    return lines


def _quote(text: str) -> str:
    """A Graphviz double-quoted string (names may hold quotes, backslashes, newlines)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
