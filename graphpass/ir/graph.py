"""The graph IR: one :class:`Graph` wrapping a ``networkx.MultiDiGraph``.

Nodes are keyed by their (unique) name. Every edge is one tensor flowing into
one input slot (``src_port`` -> ``dst_port``) or a control dependency
(``control=True``). The multigraph is the single source of truth: a node's
input list is *derived* from its in-edges (data edges by slot, then control
edges in the order they were added), so the two directions of an edge can
never disagree.

Format-specific values (TF ``AttrValue`` protos, ONNX ``AttributeProto``) are
kept untouched in ``Node.attrs``; the IR never interprets them. Reading and
building them is the dialect's job (``graphpass.dialects.base``).

Passes use the methods here and never call networkx mutators themselves.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from graphpass.errors import GraphpassError

if TYPE_CHECKING:
    import networkx as nx

CONTROL_KEY = "^"


class Tensor(NamedTuple):
    """One output of one node: ``(node name, output index)``."""

    node: str
    port: int = 0

    def __str__(self) -> str:
        return self.node if self.port == 0 else f"{self.node}:{self.port}"


def parse_tensor_name(text: str) -> Tensor:
    """``"a"`` -> ``Tensor("a", 0)``, ``"a:2"`` -> ``Tensor("a", 2)``."""
    name, sep, port = text.rpartition(":")
    if sep and port.isdigit():
        return Tensor(name, int(port))
    return Tensor(text, 0)


class Node:
    """A live view of one node; edits go straight into the graph's node data.

    ``meta`` holds analysis results recorded on the node (region label, static
    shapes, ...) as torch.fx keeps shape metadata on its nodes.
    """

    __slots__ = ("name", "_data")

    def __init__(self, name: str, data: dict) -> None:
        self.name = name
        self._data = data

    op = property(lambda self: self._data["op"])
    domain = property(lambda self: self._data["domain"])
    attrs: dict = property(lambda self: self._data["attrs"])  # type: ignore[assignment]
    meta: dict = property(lambda self: self._data["meta"])  # type: ignore[assignment]
    outputs: list = property(lambda self: self._data["outputs"])  # type: ignore[assignment]

    @property
    def device(self) -> str:
        return self._data["device"]

    @device.setter
    def device(self, value: str) -> None:
        self._data["device"] = value

    def __repr__(self) -> str:
        return f"Node({self.name!r}, op={self.op!r})"


class Graph:
    """A dataflow graph plus the graph-level data its format carries.

    ``format`` names the dialect (``"tf"`` or ``"onnx"``); ``meta`` carries
    what the writer needs to re-emit everything that is not a node (versions,
    function library, MetaGraphDef collections, ONNX opsets, ...).
    """

    def __init__(self, format: str, meta: dict | None = None) -> None:
        self.format = format
        self.meta: dict[str, Any] = dict(meta or {})
        import networkx as nx  # here, not at the top: `graphpass --help` needs no networkx

        self._g = nx.MultiDiGraph()
        self._control_order = itertools.count()
        self._dialect = None

    # -- reading -----------------------------------------------------------

    @property
    def nx(self) -> nx.MultiDiGraph:
        """The underlying multigraph, for read-only algorithms in analyses."""
        return self._g

    @property
    def dialect(self):
        """The format's dialect (how to build small ops, which ops are stateful)."""
        if self._dialect is None:
            from graphpass.dialects.base import dialect_for

            self._dialect = dialect_for(self.format)
        return self._dialect

    def __contains__(self, name: object) -> bool:
        return name in self._g

    def __len__(self) -> int:
        return self._g.number_of_nodes()

    def __iter__(self) -> Iterator[str]:
        return iter(self._g)

    def node(self, name: str) -> Node:
        try:
            return Node(name, self._g.nodes[name])
        except KeyError:
            raise KeyError(f"no node named {name!r} in the graph") from None

    def nodes(self) -> Iterator[Node]:
        for name, data in self._g.nodes(data=True):
            yield Node(name, data)

    def _in_edges(self, name: str) -> Iterator[tuple[str, dict]]:
        """``(producer, edge data)`` for every in-edge of ``name``."""
        return self._edges(self._g._pred, name)

    def _out_edges(self, name: str) -> Iterator[tuple[str, dict]]:
        """``(consumer, edge data)`` for every out-edge of ``name``."""
        return self._edges(self._g._succ, name)

    @staticmethod
    def _edges(adjacency: dict, name: str) -> Iterator[tuple[str, dict]]:
        """Read networkx's adjacency dicts directly (read-only): the edge views
        cost an object per call, which dominated reading and writing large graphs."""
        try:
            keyed_by_other = adjacency[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in the graph") from None
        for other, keyed in keyed_by_other.items():
            for data in keyed.values():
                yield other, data

    def inputs(self, name: str) -> list[Tensor]:
        """Data inputs of ``name`` in slot order."""
        edges = [
            (d["dst_port"], src, d["src_port"]) for src, d in self._in_edges(name)
            if not d["control"]
        ]
        edges.sort()
        return [Tensor(src, port) for _, src, port in edges]

    def input_slots(self, name: str) -> dict[int, Tensor]:
        """Data inputs of ``name`` by slot (ONNX may leave optional slots empty)."""
        return {
            d["dst_port"]: Tensor(src, d["src_port"])
            for src, d in self._in_edges(name)
            if not d["control"]
        }

    def control_inputs(self, name: str) -> list[str]:
        """Control inputs of ``name`` in the order they were added."""
        edges = [(d["order"], src) for src, d in self._in_edges(name) if d["control"]]
        edges.sort()
        return [src for _, src in edges]

    def consumers(self, tensor: Tensor) -> list[tuple[str, int]]:
        """``(consumer, slot)`` pairs reading ``tensor``."""
        return [
            (dst, d["dst_port"])
            for dst, d in self._out_edges(tensor.node)
            if not d["control"] and d["src_port"] == tensor.port
        ]

    def data_producers(self, name: str) -> list[str]:
        return _unique(src for src, d in self._in_edges(name) if not d["control"])

    def data_users(self, name: str) -> list[str]:
        return _unique(dst for dst, d in self._out_edges(name) if not d["control"])

    def control_users(self, name: str) -> list[str]:
        return _unique(dst for dst, d in self._out_edges(name) if d["control"])

    def users(self, name: str) -> list[str]:
        return _unique(self._g.successors(name))

    def producers(self, name: str) -> list[str]:
        return _unique(self._g.predecessors(name))

    def used_ports(self, name: str) -> list[int]:
        """Output ports of ``name`` that some node reads."""
        return sorted({d["src_port"] for _, d in self._out_edges(name) if not d["control"]})

    # -- editing -----------------------------------------------------------

    def add_node(
        self,
        name: str,
        op: str,
        inputs: Iterable[Tensor] = (),
        control_inputs: Iterable[str] = (),
        *,
        attrs: dict | None = None,
        device: str = "",
        domain: str = "",
        outputs: list | None = None,
    ) -> Node:
        """Add a node; its inputs must already exist (add producers first)."""
        if name in self._g:
            raise ValueError(f"node {name!r} already exists; use graph.unique_name()")
        self._g.add_node(
            name,
            op=op,
            domain=domain,
            device=device,
            attrs=dict(attrs or {}),
            outputs=list(outputs or []),
            meta={},
        )
        for slot, tensor in enumerate(inputs):
            self.set_input(name, slot, tensor)
        for src in control_inputs:
            self.add_control_input(name, src)
        return self.node(name)

    def set_input(self, name: str, slot: int, tensor: Tensor) -> None:
        """Point input ``slot`` of ``name`` at ``tensor`` (replacing what was there)."""
        self._require(tensor.node, f"input {slot} of {name!r}")
        self.clear_input(name, slot)
        self._g.add_edge(
            tensor.node, name, key=slot, src_port=tensor.port, dst_port=slot, control=False
        )

    def clear_input(self, name: str, slot: int) -> None:
        """Leave input ``slot`` of ``name`` empty (ONNX optional inputs)."""
        # A data edge's key is its slot (set_input), so look the slot up per producer.
        for src in [s for s, keyed in self._g._pred[name].items() if slot in keyed]:
            self._g.remove_edge(src, name, slot)

    def add_control_input(self, name: str, src: str) -> None:
        """Make ``name`` run after ``src``; adding an existing one is a no-op."""
        self._require(src, f"control input of {name!r}")
        if not self._g.has_edge(src, name, CONTROL_KEY):
            self._g.add_edge(
                src,
                name,
                key=CONTROL_KEY,
                src_port=-1,
                dst_port=-1,
                control=True,
                order=next(self._control_order),
            )

    def remove_control_input(self, name: str, src: str) -> None:
        if self._g.has_edge(src, name, CONTROL_KEY):
            self._g.remove_edge(src, name, CONTROL_KEY)

    def replace_uses(
        self, old: Tensor, new: Tensor, where: Callable[[str], bool] | None = None
    ) -> int:
        """Rewire readers of ``old`` (those ``where`` accepts) to ``new``; returns the count."""
        rewired = 0
        for dst, slot in self.consumers(old):
            if dst != new.node and (where is None or where(dst)):
                self.set_input(dst, slot, new)
                rewired += 1
        return rewired

    def remove_node(self, name: str) -> None:
        """Remove a node that nobody reads; refuses otherwise, like torch.fx's erase_node."""
        users = self.users(name)
        if users:
            raise ValueError(f"cannot remove {name!r}: still used by {users[:5]}")
        self._g.remove_node(name)

    def unique_name(self, base: str) -> str:
        """``base`` if free, else ``base_1``, ``base_2``, ... (deterministic)."""
        if base not in self._g:
            return base
        for i in itertools.count(1):
            candidate = f"{base}_{i}"
            if candidate not in self._g:
                return candidate
        raise AssertionError("unreachable")

    def copy(self) -> Graph:
        """An independent copy of the structure; attr values are shared (never mutated)."""
        other = Graph(self.format, dict(self.meta))
        other._g = self._g.copy()
        for name in other._g:
            data = other._g.nodes[name]
            data["attrs"] = dict(data["attrs"])
            data["meta"] = dict(data["meta"])
            data["outputs"] = list(data["outputs"])
        other._control_order = itertools.count(next(self._control_order))
        return other

    # -- traversal ---------------------------------------------------------

    def ancestors(self, names: Iterable[str], *, follow_control: bool = True) -> set[str]:
        """All nodes ``names`` depend on (excluding ``names`` themselves, unless on a cycle)."""
        return self._reach(names, self._g._pred, follow_control)

    def descendants(self, names: Iterable[str], *, follow_control: bool = True) -> set[str]:
        """All nodes that depend on ``names``."""
        return self._reach(names, self._g._succ, follow_control)

    def _reach(self, names, adjacency, follow_control) -> set[str]:
        """Breadth-first over networkx's ``_pred`` or ``_succ`` dicts (read-only)."""
        seen: set[str] = set()
        queue = deque(names)
        while queue:
            for other, keyed in adjacency[queue.popleft()].items():
                if other in seen:
                    continue
                # Control edges are keyed CONTROL_KEY; any other key is a data edge.
                if follow_control or len(keyed) > 1 or CONTROL_KEY not in keyed:
                    seen.add(other)
                    queue.append(other)
        return seen

    def topological_order(self, ignore_edge: Callable[[str, str], bool] | None = None) -> list[str]:
        """Nodes in dependency order; ties broken by insertion order (deterministic).

        ``ignore_edge(src, dst)`` drops loop back-edges (TF ``NextIteration``).
        Raises ``ValueError`` naming a node on a cycle if there is one.
        """
        index = {name: i for i, name in enumerate(self._g)}
        indegree = dict.fromkeys(self._g, 0)
        kept = []
        for src, dst in self._g.edges():
            if ignore_edge is None or not ignore_edge(src, dst):
                indegree[dst] += 1
                kept.append((src, dst))
        successors: dict[str, list[str]] = {}
        for src, dst in kept:
            successors.setdefault(src, []).append(dst)
        import heapq

        ready = [(index[n], n) for n, deg in indegree.items() if deg == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(name)
            for dst in successors.get(name, ()):
                indegree[dst] -= 1
                if indegree[dst] == 0:
                    heapq.heappush(ready, (index[dst], dst))
        if len(order) != len(indegree):
            stuck = next(n for n, deg in indegree.items() if deg > 0)
            raise ValueError(f"the graph has a cycle through {stuck!r}")
        return order

    def _require(self, name: str, what: str) -> None:
        if name not in self._g:
            raise GraphpassError(f"{what} names {name!r}, which is not a node of the graph")


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
