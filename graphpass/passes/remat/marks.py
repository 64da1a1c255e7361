"""Marks: which forward nodes remat recomputes, grouped into segments.

A segment is marked by a ``--recompute`` pattern (one segment per matched
text), by ``_recompute_hint`` attributes (connected nodes with the same hint
value), or chosen by the planner (``auto``). Nothing graphpass generated (names
under ``graphpass/``) is ever marked, which is what makes a second run a no-op.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor
from graphpass.options import RematOptions
from graphpass.options.patterns import compile_pattern
from graphpass.passes.exactness import GENERATED_SCOPE

SCOPE = "graphpass/remat/"
KEPT_SCOPE = "graphpass/remat_kept/"
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
    #: Its copies wait also for the weight gradients of the segment recomputed
    #: before it (``order.order_segments``); the planner drops that where the
    #: estimate is lower without.
    in_turn: bool = True


def is_generated(name: str) -> bool:
    """Nodes graphpass added; passes never mark, copy or rewire them."""
    return name.startswith(GENERATED_SCOPE)


def marked_segments(graph: Graph, options: RematOptions, forward: set[str],
                    backward: set[str]) -> tuple[list[Segment], list[str]]:
    """Marked forward nodes grouped into segments, and the marked gradient ops
    that are skipped (marks on initializers or optimizer state pass silently)."""
    marked: dict[str, list[str]] = {}
    skipped: list[str] = []
    for pattern in options.patterns:
        hits = _match(graph, pattern)
        in_forward = {k: [n for n in v if n in forward] for k, v in hits.items()}
        if not any(in_forward.values()):
            raise GraphpassError(_no_match_message(graph, pattern, forward))
        for key, names in hits.items():
            skipped.extend(n for n in names if n in backward)
            marked.setdefault(key, []).extend(n for n in in_forward[key])
    if options.use_hints:
        hinted, hint_skipped = _hint_segments(graph, forward, backward)
        marked.update(hinted)
        skipped.extend(hint_skipped)
    return [Segment(k, unique(v)) for k, v in marked.items() if v], sorted(set(skipped))


def _match(graph: Graph, pattern: str) -> dict[str, list[str]]:
    """Matched text -> node names, in graph order (one segment per matched text)."""
    regex = compile_pattern(pattern)
    hits: dict[str, list[str]] = {}
    for name in graph:
        found = regex.match(name)
        if found and found.group(0) and not is_generated(name):
            hits.setdefault(found.group(0), []).append(name)
    return hits


def _no_match_message(graph: Graph, pattern: str, forward: set[str]) -> str:
    scopes = sorted({n.rsplit("/", 1)[0] + "/" for n in forward if "/" in n})
    close = difflib.get_close_matches(pattern[:200], scopes, n=5, cutoff=0.3) or scopes[:5]
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


def scope_of(segment: str, part: str) -> str:
    """Where a segment's nodes that keep the runtime's view (``order``'s reads,
    the kept readers) are named: beside the copies' scope, which holds copies
    and ties only; the segment's name made a name scope (a hint segment's
    ``hint 1 #0`` has characters no node name may hold)."""
    return f"{KEPT_SCOPE}{re.sub(r'[^A-Za-z0-9_./-]', '_', segment.rstrip('/'))}/{part}"


def unique(items) -> list:
    """``items`` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))
