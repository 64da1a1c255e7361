"""A node of the IR as passes see it: ``Node``, a live view of one node's data in
the graph, and ``Attrs``, its attributes (the format's own values, by name).

Neither knows a format: attribute values are kept as the reader found them and
never interpreted here (that is the dialect's job). Neither touches edges: a
node's inputs live in the graph's multigraph (``Graph.inputs``).
"""

from __future__ import annotations

from typing import Any


class Attrs(dict):
    """A node's attributes: a dict that remembers whether it was edited since it was
    made, so that a writer re-emits a node as its file held it (``Graph.record``)
    only while it was not. Reads are dict reads; each editing method marks the dict
    edited first (conservatively: ``pop`` of a missing key counts too). ``edited``
    is a class attribute until the first edit sets it on the instance, so making
    one stays dict's own C ``__init__`` (graphs copy every node's attrs)."""

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
