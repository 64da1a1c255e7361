"""Which dialect serves which format, and which type holds a format's graph-level
data: the tables ``Graph.dialect`` and a new ``Graph``'s ``format_state`` read.

The IR sits below the dialects and formats (they import it), so it cannot name
them: each format registers itself here (``register_format``), from the package's
composition root (``graphpass/__init__.py``), with factories that import the
heavy TF and ONNX modules on first use. A format nobody registered is an error
that says so, never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_DIALECTS: dict[str, Callable[[], Any]] = {}
_STATES: dict[str, Callable[[], Any]] = {}


def register_format(format: str, dialect: Callable[[], Any],
                    empty_state: Callable[[], Any]) -> None:
    """Serve ``format`` with ``dialect()`` (a ``graphpass.dialects.base.Dialect``)
    and give its graphs built from nothing ``empty_state()`` as their record."""
    _DIALECTS[format] = dialect
    _STATES[format] = empty_state


def dialect_for(format: str) -> Any:
    """The dialect (a ``graphpass.dialects.base.Dialect``) for a format name."""
    return _made(_DIALECTS, format, "dialect")


def empty_state(format: str) -> Any:
    """A format's graph-level record for a graph built from nothing (no file)."""
    return _made(_STATES, format, "format state")


def _made(table: dict[str, Callable[[], Any]], format: str, what: str) -> Any:
    try:
        factory = table[format]
    except KeyError:
        known = ", ".join(sorted(table)) or "none"
        raise ValueError(f"no {what} registered for format {format!r} "
                         f"(registered: {known}; see ir.dialects.register_format)") from None
    return factory()
