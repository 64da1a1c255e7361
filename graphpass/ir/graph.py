"""The graph IR: one :class:`Graph` wrapping a ``networkx.MultiDiGraph``.

Nodes are keyed by their (unique) name. Every edge is one tensor flowing into
one input slot (``src_port`` -> ``dst_port``) or a control dependency
(``control=True``). The multigraph is the single source of truth: a node's
input list is *derived* from its in-edges (data edges by slot, then control
edges in the order they were added), so the two directions of an edge can
never disagree.

networkx is the graph library by design, used through its public API only
(``add_edge``, ``remove_edge``, ``predecessors``, ``get_edge_data``,
``adjacency``, ``copy``, ...), never its private ``_pred``/``_succ``/``_node``
dicts: a networkx upgrade may change those, and the IR must not break with it.

Format-specific values (TF ``AttrValue`` protos, ONNX ``AttributeProto``) are
kept untouched in ``Node.attrs``; the IR never interprets them. Reading and
building them is the dialect's job (``graphpass.dialects.base``). Nothing here
imports a format, a dialect class, an analysis or a pass.

Passes use the methods here and never call networkx mutators themselves. The
IR's other modules: ``names`` (``Tensor``, name uniquifying), ``node`` (``Node``,
``Attrs``), ``edges`` (the edge reads, ``Graph``'s base), ``order`` (topological
orders), ``collector`` (``gc_paused``); their names are re-exported here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from graphpass.errors import GraphpassError
from graphpass.ir.collector import gc_paused
from graphpass.ir.dialects import empty_state
from graphpass.ir.edges import CONTROL_KEY, EdgeQueries
from graphpass.ir.names import Tensor, fresh_name, parse_tensor_name
from graphpass.ir.names import suffixed as _suffixed
from graphpass.ir.node import Attrs, Node
from graphpass.ir.order import is_topological, kahn_order, placed_order

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["CONTROL_KEY", "Attrs", "Graph", "Node", "Tensor", "fresh_name", "gc_paused",
           "parse_tensor_name"]


class Graph(EdgeQueries):
    """A dataflow graph plus the graph-level data its format carries.

    ``format`` names the dialect (``"tf"`` or ``"onnx"``); ``format_state`` is the
    format's typed record of what the writer needs to re-emit everything that is
    not a node (versions, function library, MetaGraphDef collections, ONNX opsets,
    ...): ``formats.tf_state.TFState`` or ``formats.onnx_state.ONNXState``. The IR
    holds it without looking inside, beyond copying it (its ``copy()``).
    """

    def __init__(self, format: str, format_state: Any = None) -> None:
        self.format = format
        self.format_state = format_state if format_state is not None else empty_state(format)
        import networkx as nx  # here, not at the top: `graphpass --help` needs no networkx

        self._g = nx.MultiDiGraph()
        self._control_order = itertools.count()
        self._dialect = None
        self._version = 0  # bumped by every structural edit (see ``version``)
        # One Node view per node, made when it is added: analyses ask for nodes
        # far more often than nodes are added.
        self._views: dict[str, Node] = {}
        self._order_cache: tuple[int, list[str]] | None = None
        # The last order over all edges known to be topological, of whatever
        # version: what ``check_acyclic`` places a pass's new nodes into.
        self._acyclic_order: tuple[int, list[str]] | None = None
        # Nodes added or whose inputs changed since the last ``take_edited`` (a
        # dict: ordered, so a failed check names the same node every run).
        self._edited: dict[str, None] = {}
        # base name -> a suffix below which ``unique_name`` found every name taken.
        self._taken_below: dict[str, int] = {}
        self._source: tuple[int, Any] | None = None

    # -- reading -----------------------------------------------------------

    @property
    def nx(self) -> nx.MultiDiGraph:
        """The underlying multigraph, for read-only algorithms in analyses."""
        return self._g

    @property
    def version(self) -> int:
        """Changes whenever a node or an edge is added or removed, so a result
        computed from the structure alone (the topological order) can be reused
        while it is unchanged. Attribute and metadata edits do not count."""
        return self._version

    def take_edited(self) -> list[str]:
        """The nodes added, or whose inputs changed, since the last call (in the
        order of their first edit), and start over: what the IR checker must look
        at after a pass, or in a graph its reader has not checked."""
        edited, self._edited = list(self._edited), {}
        return edited

    def keep_source(self, source: Any) -> None:
        """Remember the parsed file (a format's proto) the graph was just read from:
        while the graph is as read, a dialect may hand that to its runtime instead
        of lowering the IR again (TF shape inference)."""
        self._source = (self._version, source)

    def source(self) -> Any | None:
        """The parsed file, while the graph is as read: forgotten once the structure
        changes (``version``), a pass changes the graph or an attr is set through the
        dialect (``forget_source``: attrs are edited in place, uncounted); copies
        start without one."""
        if self._source is not None and self._source[0] == self._version:
            return self._source[1]
        return None

    def forget_source(self) -> None:
        self._source = None

    def keep_record(self, name: str, record: Any) -> None:
        """Remember the format's own record of node ``name`` as its file holds it (a
        TF ``NodeDef``), which its inputs, attrs and device stand for exactly."""
        self._g.nodes[name]["record"] = record

    def record(self, name: str) -> Any | None:
        """The record ``keep_record`` kept for ``name`` while the node is as read: a
        writer may emit it instead of lowering the node. Any edit through the IR
        forgets it: of its inputs (``set_input``, ``clear_input``, control
        inputs), its attrs (``Attrs``) or its device."""
        data = self._g.nodes[name]
        record = data.get("record")
        return None if record is None or data["attrs"].edited else record

    @property
    def dialect(self):
        """The format's dialect (how to build small ops, which ops are stateful)."""
        if self._dialect is None:
            from graphpass.ir.dialects import dialect_for

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
            return self._views[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in the graph") from None

    def nodes(self) -> Iterator[Node]:
        return iter(self._views.values())

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
        self._version += 1
        self._edited[name] = None
        self._g.add_node(
            name,
            op=op,
            domain=domain,
            device=device,
            attrs=Attrs(attrs or {}),
            outputs=list(outputs or []),
            meta={},
        )
        view = self._views[name] = Node(name, self._g.nodes[name])
        if inputs or control_inputs:  # a reader wires its nodes later (connect)
            self.connect(name, inputs, control_inputs)
        return view

    def connect(self, name: str, inputs: Iterable[Tensor] = (),
                control_inputs: Iterable[str] = ()) -> None:
        """Give ``name``, which has no inputs yet, its data inputs (slots 0, 1, ...)
        and control inputs as its file states them (a record kept for it stays):
        ``add_node``'s wiring, for readers, which add every node before any edge
        (a file may name an input before its producer). Unlike ``set_input`` it
        looks for no edge to replace, a search that would make reading a node with
        n inputs take n^2 steps."""
        if next(self._predecessors(name), None) is not None:
            raise ValueError(f"node {name!r} already has inputs; use set_input")
        for slot, tensor in enumerate(inputs):
            self._add_data_edge(name, slot, tensor)
        for src in control_inputs:
            self._add_control_edge(name, src)

    def set_input(self, name: str, slot: int, tensor: Tensor) -> None:
        """Point input ``slot`` of ``name`` at ``tensor`` (replacing what was there)."""
        self.clear_input(name, slot)
        self._add_data_edge(name, slot, tensor)
        self._forget_record(name)

    def _add_data_edge(self, name: str, slot: int, tensor: Tensor) -> None:
        """The edge of input ``slot`` of ``name``, which is empty."""
        self._require(tensor.node, f"input {slot} of {name!r}")
        self._version += 1
        self._edited[name] = None
        self._g.add_edge(
            tensor.node, name, key=slot, src_port=tensor.port, dst_port=slot, control=False
        )

    def clear_input(self, name: str, slot: int) -> None:
        """Leave input ``slot`` of ``name`` empty (ONNX optional inputs)."""
        # A data edge's key is its slot (set_input), so look the slot up per producer.
        get = self._g.get_edge_data
        for src in [s for s in self._predecessors(name) if slot in get(s, name)]:
            self._version += 1
            self._edited[name] = None
            self._forget_record(name)
            self._g.remove_edge(src, name, slot)

    def add_control_input(self, name: str, src: str) -> None:
        """Make ``name`` run after ``src``; adding an existing one is a no-op."""
        if self._add_control_edge(name, src):
            self._forget_record(name)

    def _add_control_edge(self, name: str, src: str) -> bool:
        """The control edge ``src`` -> ``name`` unless there is one; whether it was added."""
        self._require(src, f"control input of {name!r}")
        if self._g.has_edge(src, name, CONTROL_KEY):
            return False
        self._version += 1
        self._edited[name] = None
        self._g.add_edge(
            src,
            name,
            key=CONTROL_KEY,
            src_port=-1,
            dst_port=-1,
            control=True,
            order=next(self._control_order),
        )
        return True

    def remove_control_input(self, name: str, src: str) -> None:
        if self._g.has_edge(src, name, CONTROL_KEY):
            self._version += 1
            self._edited[name] = None
            self._forget_record(name)
            self._g.remove_edge(src, name, CONTROL_KEY)

    def _forget_record(self, name: str) -> None:
        """``name``'s inputs changed: its file's record no longer stands for it."""
        self._g.nodes[name]["record"] = None

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
        self._version += 1
        self._g.remove_node(name)
        del self._views[name]
        self._freed(name)

    def unique_name(self, base: str) -> str:
        """``base`` if free, else ``base_1``, ``base_2``, ... (deterministic): the lowest
        free one, as ``fresh_name``. The search starts where the last one for ``base``
        ended (lowered when a node is removed), so a pass naming thousands of nodes
        after one base does not search all their names each time."""
        suffix = self._taken_below.get(base, 0)
        while _suffixed(base, suffix) in self._g:
            suffix += 1
        self._taken_below[base] = suffix
        return _suffixed(base, suffix)

    def _freed(self, name: str) -> None:
        """``name`` is free again: no search may start past it."""
        self._taken_below.pop(name, None)
        base, _, digits = name.rpartition("_")
        if digits.isdigit() and base in self._taken_below:
            self._taken_below[base] = min(self._taken_below[base], int(digits))

    def copy(self) -> Graph:
        """An independent copy of the structure and of the format state's containers
        (a dialect may add to them in place); attr values and the format's protos
        are shared (never mutated)."""
        other = Graph(self.format, self.format_state.copy())
        with gc_paused():
            other._g = _copied_multigraph(self._g)
            for name, data in other._g.nodes(data=True):
                other._views[name] = Node(name, data)
        other._control_order = itertools.count(next(self._control_order))
        if self._acyclic_order is not None:  # a base for its checks, never current
            other._acyclic_order = (-1, self._acyclic_order[1])
        other._edited = dict(self._edited)
        return other

    def restore(self, snapshot: Graph) -> None:
        """Make this graph, in place, what ``snapshot`` (an earlier ``copy`` of it)
        holds: a pass that checked a rewrite and refused it undoes it. The version
        moves on, so nothing computed from the rewrite is reused."""
        version = max(self._version, snapshot._version) + 1
        self.__dict__.update(snapshot.copy().__dict__)
        self._version = version

    # -- order -------------------------------------------------------------

    def topological_order(self, ignore_edge: Callable[[str, str], bool] | None = None) -> list[str]:
        """Nodes in dependency order; ties broken by insertion order (deterministic).

        ``ignore_edge(src, dst)`` drops loop back-edges (TF ``NextIteration``).
        Raises ``ValueError`` naming a node on a cycle if there is one. The order
        over all edges is kept until the structure changes (``version``): the
        checker between passes and the passes themselves ask for the same one.
        """
        if ignore_edge is not None:
            return self._sorted(ignore_edge)
        if self._order_cache is None or self._order_cache[0] != self._version:
            self._order_cache = (self._version, self._sorted(None))
            self._acyclic_order = self._order_cache
        return list(self._order_cache[1])

    def check_acyclic(self) -> None:
        """Raise ``ValueError`` naming a node on a cycle (over all edges) if there is one.

        Linear where it can be: a pass mostly adds nodes read by nodes that were
        there before, so the last order known to be topological, with each node it
        lacks placed just before its earliest reader, is usually topological again,
        which one sweep over the edges proves. Only where that placement fails does
        the full sort run (the one that names a node on the cycle)."""
        if self._order_cache is not None and self._order_cache[0] == self._version:
            return
        if self._acyclic_order is not None and self._acyclic_order[0] == self._version:
            return
        if self._acyclic_order is not None:
            placed = placed_order(self._g, self._acyclic_order[1])
            if is_topological(self._g, placed):
                self._acyclic_order = (self._version, placed)
                return
        self.topological_order()

    def _sorted(self, ignore_edge: Callable[[str, str], bool] | None) -> list[str]:
        """A full topological sort (``order.kahn_order``)."""
        return kahn_order(self._g, ignore_edge)

    def _require(self, name: str, what: str) -> None:
        if name not in self._g:
            raise GraphpassError(f"{what} names {name!r}, which is not a node of the graph")


def _copied_multigraph(g: nx.MultiDiGraph) -> nx.MultiDiGraph:
    """What ``g.copy()`` gives (nodes, each node's successors and predecessors in
    the same orders), with each node's ``attrs``, ``meta`` and ``outputs`` copied one
    level too, and each edge added by ``add_edge``: ``copy()`` goes through
    ``add_edges_from``, which copies every edge's data twice more and makes three
    view objects per edge, and the planner copies a graph per trial."""
    other = type(g)()
    other.graph.update(g.graph)
    other.add_nodes_from((name, {**data, "attrs": data["attrs"].copy(), "meta": dict(data["meta"]),
                                 "outputs": list(data["outputs"])})
                         for name, data in g.nodes(data=True))
    add_edge = other.add_edge
    for src, users in g.adjacency():
        for dst, keyed in users.items():
            for key, data in keyed.items():
                add_edge(src, dst, key, **data)
    return other
