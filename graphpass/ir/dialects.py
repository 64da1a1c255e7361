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


def dialect_for(format: str) -> Any:
    """The dialect (a ``graphpass.dialects.base.Dialect``) for a format name."""
    try:
        module, cls = _DIALECTS[format].split(":")
    except KeyError:
        raise ValueError(f"no dialect for format {format!r}") from None
    return getattr(importlib.import_module(module), cls)()


_STATES: dict[str, str] = {
    "tf": "graphpass.formats.tf_state:TFState",
    "onnx": "graphpass.formats.onnx_state:ONNXState",
}


def empty_state(format: str) -> Any:
    """A format's graph-level record for a graph built from nothing (no file)."""
    try:
        module, cls = _STATES[format].split(":")
    except KeyError:
        raise ValueError(f"no format state for format {format!r}") from None
    return getattr(importlib.import_module(module), cls)()
