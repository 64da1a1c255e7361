"""Which dialect serves which format, and which type holds a format's graph-level
data: the tables ``Graph.dialect`` and a new ``Graph``'s ``format_state`` read.

Module paths, not imports: the IR sits below the dialects (which import it),
and TF's and ONNX's dialects are heavy, so each is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_DIALECTS: dict[str, str] = {
    "tf": "graphpass.dialects.tf:TFDialect",
    "onnx": "graphpass.dialects.onnx:ONNXDialect",
}
_STATES: dict[str, str] = {
    "tf": "graphpass.formats.tf_state:TFState",
    "onnx": "graphpass.formats.onnx_state:ONNXState",
}


def dialect_for(format: str) -> Any:
    """The dialect (a ``graphpass.dialects.base.Dialect``) for a format name."""
    return _made(_DIALECTS, format, "dialect")


def empty_state(format: str) -> Any:
    """A format's graph-level record for a graph built from nothing (no file)."""
    return _made(_STATES, format, "format state")


def _made(table: dict[str, str], format: str, what: str) -> Any:
    """An instance of the class ``table`` names for ``format``, imported on first use."""
    try:
        module, cls = table[format].split(":")
    except KeyError:
        raise ValueError(f"no {what} for format {format!r}") from None
    return getattr(importlib.import_module(module), cls)()
