"""Names in the IR: a tensor's ``(node, port)`` name, its text form, and the one
name uniquifier of graphpass.

Pure functions of strings: nothing here holds or reads a graph (``Graph.unique_name``
calls ``free_suffix`` with its own membership test).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple


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


def fresh_name(base: str, taken: Callable[[str], bool]) -> str:
    """``base`` if not ``taken``, else ``base_1``, ``base_2``, ... (deterministic): the
    one name uniquifier of graphpass (IR nodes, ONNX values, TF library functions)."""
    return suffixed(base, free_suffix(base, taken, 0))


def free_suffix(base: str, taken: Callable[[str], bool], first: int) -> int:
    """The lowest suffix from ``first`` on whose name is not ``taken`` (0: ``base``)."""
    for i in itertools.count(first):
        if not taken(suffixed(base, i)):
            return i
    raise AssertionError("unreachable")


def suffixed(base: str, suffix: int) -> str:
    """``base`` with suffix ``suffix`` (none for 0)."""
    return f"{base}_{suffix}" if suffix else base
