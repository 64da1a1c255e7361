"""Reading a node's edges: the queries ``Graph`` answers about inputs, users and
edges, over its ``networkx.MultiDiGraph``.

Every read goes through networkx's public API (``predecessors``, ``successors``,
``get_edge_data``, ``adjacency``), never its private ``_pred``/``_succ`` dicts, so a
networkx upgrade that changes its internal layout cannot break the IR. The
cheapest public calls are the ones used: ``get_edge_data`` and ``adjacency`` hand
back networkx's own ``{key: data}`` dicts, where the ``pred``/``succ`` views make an
object per neighbour and per call.

Only reads: nothing here adds or removes a node or an edge (``Graph`` does, and
keeps both directions of every edge consistent by only calling networkx's
``add_edge``/``remove_edge``/``remove_node``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from graphpass.ir.names import Tensor

if TYPE_CHECKING:
    import networkx as nx

    from graphpass.ir.node import Node

#: The key of a control edge; a data edge's key is its input slot.
CONTROL_KEY = "^"


def has_data_edge(keyed: dict) -> bool:
    """Whether the edges between two nodes (networkx's ``{key: data}``) include a
    data edge: control edges are keyed ``CONTROL_KEY``, data edges by their slot."""
    return len(keyed) > 1 or CONTROL_KEY not in keyed


class EdgeQueries:
    """The edge reads of ``Graph`` (its base class): a node's inputs by slot, its
    control inputs in added order, its users, whole-graph sweeps, and what a set of
    nodes reaches along or against the edges."""

    _g: nx.MultiDiGraph
    _views: dict[str, Node]

    def _predecessors(self, name: str) -> Iterator[str]:
        """The nodes with an edge into ``name``, in networkx's order."""
        if name not in self._views:
            raise KeyError(f"no node named {name!r} in the graph")
        return self._g.predecessors(name)

    def _successors(self, name: str) -> Iterator[str]:
        """The nodes with an edge from ``name``, in networkx's order."""
        if name not in self._views:
            raise KeyError(f"no node named {name!r} in the graph")
        return self._g.successors(name)

    def inputs(self, name: str) -> list[Tensor]:
        """Data inputs of ``name`` in slot order (a data edge's key is its slot)."""
        get = self._g.get_edge_data
        edges = [(key, src, data["src_port"]) for src in self._predecessors(name)
                 for key, data in get(src, name).items() if key != CONTROL_KEY]
        if len(edges) > 1:
            edges.sort()
        return [Tensor(src, port) for _, src, port in edges]

    def input_slots(self, name: str) -> dict[int, Tensor]:
        """Data inputs of ``name`` by slot (ONNX may leave optional slots empty).

        A data edge's key is its slot (``set_input``), so the keys alone tell
        data from control edges and give the slot."""
        get = self._g.get_edge_data
        return {
            key: Tensor(src, data["src_port"])
            for src in self._predecessors(name)
            for key, data in get(src, name).items()
            if key != CONTROL_KEY
        }

    def control_inputs(self, name: str) -> list[str]:
        """Control inputs of ``name`` in the order they were added."""
        get = self._g.get_edge_data
        edges = []
        for src in self._predecessors(name):
            keyed = get(src, name)
            if CONTROL_KEY in keyed:
                edges.append((keyed[CONTROL_KEY]["order"], src))
        edges.sort()
        return [src for _, src in edges]

    def input_nodes(self, name: str) -> tuple[list[str], list[str]]:
        """The producers of ``name``'s data inputs in slot order and its control
        inputs in added order, from one look at its in-edges: what ``inputs`` and
        ``control_inputs`` give, for analyses that ask both of every node."""
        get = self._g.get_edge_data
        data, control = [], []
        for src in self._predecessors(name):
            for key, edge in get(src, name).items():
                if key == CONTROL_KEY:
                    control.append((edge["order"], src))
                else:
                    data.append((key, src))
        data.sort()
        control.sort()
        return [src for _, src in data], [src for _, src in control]

    def input_texts(self, name: str) -> list[str]:
        """``name``'s inputs as text, as a NodeDef lists them: each data input's
        ``str`` in slot order, then ``^`` and each control input in added order.
        One look at the node's in-edges, for writers, which ask it of every node."""
        get = self._g.get_edge_data
        data, control = [], []
        for src in self._predecessors(name):
            for key, edge in get(src, name).items():
                if key == CONTROL_KEY:
                    control.append((edge["order"], CONTROL_KEY + src))
                else:
                    port = edge["src_port"]
                    data.append((key, src if port == 0 else f"{src}:{port}"))
        data.sort()
        control.sort()
        return [text for _, text in data] + [text for _, text in control]

    def consumers(self, tensor: Tensor) -> list[tuple[str, int]]:
        """``(consumer, slot)`` pairs reading ``tensor``."""
        get, src, port = self._g.get_edge_data, tensor.node, tensor.port
        return [
            (dst, key)
            for dst in self._successors(src)
            for key, data in get(src, dst).items()
            if key != CONTROL_KEY and data["src_port"] == port
        ]

    def data_producers(self, name: str) -> list[str]:
        get = self._g.get_edge_data
        return [src for src in self._predecessors(name) if has_data_edge(get(src, name))]

    def data_users(self, name: str) -> list[str]:
        get = self._g.get_edge_data
        return [dst for dst in self._successors(name) if has_data_edge(get(name, dst))]

    def control_users(self, name: str) -> list[str]:
        get = self._g.get_edge_data
        return [dst for dst in self._successors(name) if CONTROL_KEY in get(name, dst)]

    def users(self, name: str) -> list[str]:
        return list(self._successors(name))

    def producers(self, name: str) -> list[str]:
        return list(self._predecessors(name))

    def used_ports(self, name: str) -> list[int]:
        """Output ports of ``name`` that some node reads."""
        get = self._g.get_edge_data
        return sorted({data["src_port"]
                       for dst in self._successors(name)
                       for key, data in get(name, dst).items() if key != CONTROL_KEY})

    def data_edges(self) -> Iterator[tuple[str, str, int, int]]:
        """Every data edge as ``(producer, consumer, slot, port)``, producers in
        graph order: one sweep for whole-graph checks, cheaper than networkx's
        edge view."""
        for src, users in self._g.adjacency():
            for dst, keyed in users.items():
                for slot, data in keyed.items():
                    if slot != CONTROL_KEY:
                        yield src, dst, slot, data["src_port"]

    # -- reachability --------------------------------------------------------

    def ancestors(self, names: Iterable[str], *, follow_control: bool = True) -> set[str]:
        """All nodes ``names`` depend on (excluding ``names`` themselves, unless on a cycle)."""
        return self._reach(names, False, follow_control)

    def descendants(self, names: Iterable[str], *, follow_control: bool = True) -> set[str]:
        """All nodes that depend on ``names``."""
        return self._reach(names, True, follow_control)

    def _reach(self, names: Iterable[str], forward: bool, follow_control: bool) -> set[str]:
        """Breadth-first from ``names`` along edges (``forward``) or against them."""
        step = self._successors if forward else self._predecessors
        get = self._g.get_edge_data
        seen: set[str] = set()
        queue = deque(names)
        while queue:
            name = queue.popleft()
            for other in step(name):
                if other in seen:
                    continue
                if follow_control or has_data_edge(get(name, other) if forward
                                                   else get(other, name)):
                    seen.add(other)
                    queue.append(other)
        return seen
