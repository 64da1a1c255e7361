"""Which dialect serves which format: the table ``Graph.dialect`` reads.

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
