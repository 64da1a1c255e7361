"""``--target litert`` before anything is read: TFLite's converter reads a
SavedModel's signatures, so the input must be a SavedModel directory. What the
converter makes of the step is the TFLite runtime model's check
(``runtimes/tflite``), run before anything is written."""

from __future__ import annotations

from pathlib import Path

from graphpass.errors import GraphpassError

TARGET = "litert"


def check_source(source: Path, target: str) -> None:
    """Before reading: TFLite converts SavedModels (directories) only."""
    if target == TARGET and not source.is_dir():
        raise GraphpassError(f"--target litert needs a TF2 SavedModel whose training step is "
                             f"a signature (TFLite's converter reads signatures); {source} is "
                             "not a SavedModel directory")
