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

Long because the one class holds every accessor and mutator the passes use,
and each must keep the invariant above; split over modules, the invariant
would be too.
"""

from __future__ import annotations

import gc
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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


def fresh_name(base: str, taken: Callable[[str], bool]) -> str:
    """``base`` if not ``taken``, else ``base_1``, ``base_2``, ... (deterministic): the
    one name uniquifier of graphpass (IR nodes, ONNX values, TF library functions)."""
    return _suffixed(base, _free_suffix(base, taken, 0))


def _free_suffix(base: str, taken: Callable[[str], bool], first: int) -> int:
    """The lowest suffix from ``first`` on whose name is not ``taken`` (0: ``base``)."""
    for i in itertools.count(first):
        if not taken(_suffixed(base, i)):
            return i
    raise AssertionError("unreachable")


def _suffixed(base: str, suffix: int) -> str:
    return f"{base}_{suffix}" if suffix else base


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off while a large graph is built or copied: that makes
    millions of small containers and no cycles, and the collector's repeated
    scans of them took a third of reading a 100k-node GraphDef (making the time
    grow faster than the graph, tools/bench_io.py) and half of copying one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_tensor_name(text: str) -> Tensor:
    """``"a"`` -> ``Tensor("a", 0)``, ``"a:2"`` -> ``Tensor("a", 2)``."""
    name, sep, port = text.rpartition(":")
    if sep and port.isdigit():
        return Tensor(name, int(port))
    return Tensor(text, 0)


class Attrs(dict):
    """A node's attributes (the format's own values, by name): a dict that remembers
    whether it was edited since it was made, so that a writer re-emits a node as
    its file held it (``Graph.record``) only while it was not. Reads are dict
    reads; each editing method marks the dict edited first (conservatively:
    ``pop`` of a missing key counts too). ``edited`` is a class attribute until
    the first edit sets it on the instance: making one is dict's own ``__init__``
    (a Python one made copying a graph's attrs 8x slower)."""

    edited = False

    def copy(self) -> Attrs:
        other = Attrs(self)
        if self.edited:
            other.edited = True
        return other

    def __setitem__(self, key: str, value: Any) -> None:
        self.edited = True
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.edited = True
        super().__delitem__(key)

    def __ior__(self, other: Any) -> Attrs:
        self.edited = True
        return super().__ior__(other)

    def clear(self) -> None:
        self.edited = True
        super().clear()

    def pop(self, *args: Any) -> Any:
        self.edited = True
        return super().pop(*args)

    def popitem(self) -> tuple[str, Any]:
        self.edited = True
        return super().popitem()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.edited = True
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.edited = True
        super().update(*args, **kwargs)


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
        self._data["record"] = None  # no longer as read

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
        self._version = 0  # bumped by every structural edit (see ``version``)
        # One Node view per node, made when it is added: analyses ask for nodes
        # millions of times on large graphs, and making a view each time was
        # most of the cost of asking.
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
        self._g._node[name]["record"] = record

    def record(self, name: str) -> Any | None:
        """The record ``keep_record`` kept for ``name`` while the node is as read: a
        writer may emit it instead of lowering the node (rebuilding every NodeDef
        was most of writing a large graph). Any edit through the IR forgets it:
        of its inputs (``set_input``, ``clear_input``, control inputs), its attrs
        (``Attrs``) or its device."""
        data = self._g._node[name]
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

    @staticmethod
    def _adjacent(adjacency: dict, name: str) -> dict[str, dict]:
        """``other -> {edge key: edge data}`` from networkx's ``_pred`` or ``_succ``
        (read-only): the edge views cost an object per call, which dominated
        reading and writing large graphs."""
        try:
            return adjacency[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in the graph") from None

    def inputs(self, name: str) -> list[Tensor]:
        """Data inputs of ``name`` in slot order (a data edge's key is its slot)."""
        edges = [(key, src, data["src_port"])
                 for src, keyed in self._adjacent(self._g._pred, name).items()
                 for key, data in keyed.items() if key != CONTROL_KEY]
        if len(edges) > 1:
            edges.sort()
        return [Tensor(src, port) for _, src, port in edges]

    def input_slots(self, name: str) -> dict[int, Tensor]:
        """Data inputs of ``name`` by slot (ONNX may leave optional slots empty).

        A data edge's key is its slot (``set_input``), so the keys alone tell
        data from control edges and give the slot."""
        return {
            key: Tensor(src, data["src_port"])
            for src, keyed in self._adjacent(self._g._pred, name).items()
            for key, data in keyed.items()
            if key != CONTROL_KEY
        }

    def control_inputs(self, name: str) -> list[str]:
        """Control inputs of ``name`` in the order they were added."""
        edges = [(keyed[CONTROL_KEY]["order"], src)
                 for src, keyed in self._adjacent(self._g._pred, name).items()
                 if CONTROL_KEY in keyed]
        edges.sort()
        return [src for _, src in edges]

    def input_nodes(self, name: str) -> tuple[list[str], list[str]]:
        """The producers of ``name``'s data inputs in slot order and its control
        inputs in added order, from one look at its in-edges: what ``inputs`` and
        ``control_inputs`` give, for analyses that ask both of every node."""
        data, control = [], []
        for src, keyed in self._adjacent(self._g._pred, name).items():
            for key, edge in keyed.items():
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
        One look at the node's in-edges, for writers: asking ``inputs`` and
        ``control_inputs`` of every node was a third of lowering a large graph."""
        data, control = [], []
        for src, keyed in self._adjacent(self._g._pred, name).items():
            for key, edge in keyed.items():
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
        port = tensor.port
        return [
            (dst, key)
            for dst, keyed in self._adjacent(self._g._succ, tensor.node).items()
            for key, data in keyed.items()
            if key != CONTROL_KEY and data["src_port"] == port
        ]

    def data_producers(self, name: str) -> list[str]:
        return [src for src, keyed in self._adjacent(self._g._pred, name).items()
                if _has_data_edge(keyed)]

    def data_users(self, name: str) -> list[str]:
        return [dst for dst, keyed in self._adjacent(self._g._succ, name).items()
                if _has_data_edge(keyed)]

    def control_users(self, name: str) -> list[str]:
        return [dst for dst, keyed in self._adjacent(self._g._succ, name).items()
                if CONTROL_KEY in keyed]

    def users(self, name: str) -> list[str]:
        return list(self._adjacent(self._g._succ, name))

    def producers(self, name: str) -> list[str]:
        return list(self._adjacent(self._g._pred, name))

    def used_ports(self, name: str) -> list[int]:
        """Output ports of ``name`` that some node reads."""
        return sorted({data["src_port"]
                       for keyed in self._adjacent(self._g._succ, name).values()
                       for key, data in keyed.items() if key != CONTROL_KEY})

    def data_edges(self) -> Iterator[tuple[str, str, int, int]]:
        """Every data edge as ``(producer, consumer, slot, port)``, producers in
        graph order: one sweep for whole-graph checks, a fifth of the cost of
        networkx's edge view."""
        for src, users in self._g._succ.items():
            for dst, keyed in users.items():
                for slot, data in keyed.items():
                    if slot != CONTROL_KEY:
                        yield src, dst, slot, data["src_port"]

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
        view = self._views[name] = Node(name, self._g._node[name])
        if inputs or control_inputs:  # a reader wires its nodes later (connect)
            self.connect(name, inputs, control_inputs)
        return view

    def connect(self, name: str, inputs: Iterable[Tensor] = (),
                control_inputs: Iterable[str] = ()) -> None:
        """Give ``name``, which has no inputs yet, its data inputs (slots 0, 1, ...)
        and control inputs as its file states them (a record kept for it stays):
        ``add_node``'s wiring, for readers, which add every node before any edge
        (a file may name an input before its producer). Unlike ``set_input`` it
        looks for no edge to replace, a search that made reading a node with n
        inputs take n^2 steps (the global norm's ``AddN``)."""
        if self._g._pred[name]:
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
        for src in [s for s, keyed in self._g._pred[name].items() if slot in keyed]:
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
        self._g._node[name]["record"] = None

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
        ended (lowered when a node is removed): a pass naming thousands of nodes
        after one base searched all their names each time."""
        suffix = _free_suffix(base, self._g.__contains__, self._taken_below.get(base, 0))
        self._taken_below[base] = suffix
        return _suffixed(base, suffix)

    def _freed(self, name: str) -> None:
        """``name`` is free again: no search may start past it."""
        self._taken_below.pop(name, None)
        base, _, digits = name.rpartition("_")
        if digits.isdigit() and base in self._taken_below:
            self._taken_below[base] = min(self._taken_below[base], int(digits))

    def copy(self) -> Graph:
        """An independent copy of the structure and of ``meta``'s dicts and lists (one
        level: a dialect may add to them in place); attr values and the protos in
        ``meta`` are shared (never mutated)."""
        other = Graph(self.format, {key: type(value)(value) if type(value) in (dict, list)
                                    else value for key, value in self.meta.items()})
        with gc_paused():
            other._g = _copied_multigraph(self._g)
            for name, data in other._g._node.items():
                data["attrs"] = data["attrs"].copy()
                data["meta"] = dict(data["meta"])
                data["outputs"] = list(data["outputs"])
                other._views[name] = Node(name, data)
        other._control_order = itertools.count(next(self._control_order))
        if self._acyclic_order is not None:  # a base for its checks, never current
            other._acyclic_order = (-1, self._acyclic_order[1])
        other._edited = dict(self._edited)
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
                if follow_control or _has_data_edge(keyed):
                    seen.add(other)
                    queue.append(other)
        return seen

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
            placed = self._placed_order(self._acyclic_order[1])
            if self._is_topological(placed):
                self._acyclic_order = (self._version, placed)
                return
        self.topological_order()

    def _placed_order(self, base: list[str]) -> list[str]:
        """``base`` less the nodes removed since, with every node it lacks placed just
        before the earliest of its readers (after them all if it has none), placing
        the nodes in reverse insertion order so that a reader is placed first."""
        succ = self._g._succ
        position = {name: i for i, name in enumerate(base) if name in succ}
        end = len(base)
        key: dict[str, tuple[int, int]] = {}
        new = [name for name in succ if name not in position]
        for name in reversed(new):
            first = (end, 0)
            for user in succ[name]:
                at = (position[user], 0) if user in position else key.get(user)
                if at is not None and at < first:
                    first = at
            key[name] = (first[0], first[1] - 1)
        before: dict[int, list[str]] = {}
        for name in sorted(new, key=key.__getitem__):  # stable: ties in insertion order
            before.setdefault(key[name][0], []).append(name)
        order: list[str] = []
        for i, name in enumerate(base):
            order.extend(before.get(i, ()))
            if name in position:
                order.append(name)
        order.extend(before.get(end, ()))
        return order

    def _is_topological(self, order: list[str],
                        ignore_edge: Callable[[str, str], bool] | None = None) -> bool:
        """Whether ``order`` holds every node once and every edge (but those
        ``ignore_edge`` drops) goes forward in it: one sweep over the edges."""
        succ = self._g._succ
        index = {name: i for i, name in enumerate(order)}
        if len(index) != len(succ) or len(order) != len(succ):
            return False
        for src, users in succ.items():
            at = index.get(src)
            if at is None:
                return False
            for dst in users:
                if index[dst] <= at and (ignore_edge is None or not ignore_edge(src, dst)):
                    return False
        return True

    def _sorted(self, ignore_edge: Callable[[str, str], bool] | None) -> list[str]:
        """Kahn's algorithm over networkx's ``_succ``, the ready nodes in a heap of
        their insertion indexes. Where the insertion order is itself topological
        (a file as its exporter wrote it) that is the order Kahn's gives (the next
        node in it is always ready, and the least index), so it is returned after
        one sweep over the edges proves it."""
        import heapq

        names = list(self._g._succ)
        if self._is_topological(names, ignore_edge):
            return names
        index = {name: i for i, name in enumerate(names)}
        indegree = dict.fromkeys(names, 0)
        successors: dict[str, list[tuple[str, int]]] = {}
        for src, users in self._g._succ.items():
            kept = [(dst, len(keyed)) for dst, keyed in users.items()
                    if ignore_edge is None or not ignore_edge(src, dst)]
            successors[src] = kept
            for dst, edges in kept:
                indegree[dst] += edges
        ready = [i for i, name in enumerate(names) if indegree[name] == 0]  # sorted: a heap
        order = []
        while ready:
            name = names[heapq.heappop(ready)]
            order.append(name)
            for dst, edges in successors[name]:
                indegree[dst] -= edges
                if indegree[dst] == 0:
                    heapq.heappush(ready, index[dst])
        if len(order) != len(names):
            stuck = next(n for n, deg in indegree.items() if deg > 0)
            raise ValueError(f"the graph has a cycle through {stuck!r}")
        return order

    def _require(self, name: str, what: str) -> None:
        if name not in self._g._node:
            raise GraphpassError(f"{what} names {name!r}, which is not a node of the graph")


def _copied_multigraph(g: nx.MultiDiGraph) -> nx.MultiDiGraph:
    """What ``g.copy()`` gives (each node's and edge's data dict copied, nodes,
    successors and predecessors in the same orders), built straight into the new
    graph's dicts: networkx re-adds every edge through ``add_edges_from``, whose
    checks were most of copying a large graph (the planner copies it per trial).
    As networkx keeps them, ``_succ[u][v]`` and ``_pred[v][u]`` are one dict of
    the edges' data by key."""
    other = type(g)()
    other.graph.update(g.graph)
    succ, pred = other._succ, other._pred
    for name, data in g._node.items():
        other._node[name] = data.copy()
        succ[name], pred[name] = {}, {}
    for src, users in g._succ.items():
        out = succ[src]
        for dst, keyed in users.items():
            out[dst] = pred[dst][src] = {key: data.copy() for key, data in keyed.items()}
    return other


def _has_data_edge(keyed: dict) -> bool:
    """Whether the edges between two nodes (networkx's ``{key: data}``) include a
    data edge: control edges are keyed ``CONTROL_KEY``, data edges by their slot."""
    return len(keyed) > 1 or CONTROL_KEY not in keyed
