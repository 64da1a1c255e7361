"""Where the training step lives, decided while loading (DESIGN: "where the step
lives"): a TF1 graph holds it at its top level; a GraphDef whose top level only
calls functions holds it in the body that updates variables.

The readers cannot tell which body that is without analysis, and must not run
any; so :func:`load` reads through ``formats.dispatch.load`` and answers that one
question for it. Nothing else is analysed here.
"""

from __future__ import annotations

import os

from graphpass.formats.dispatch import load as read
from graphpass.ir.graph import Graph


def load(path: str | os.PathLike, *, tag: str | None = None, signature: str | None = None,
         shapes: bool = False) -> Graph:
    """Read a TF GraphDef / MetaGraphDef / SavedModel or an ONNX model into a Graph.
    ``signature`` picks the TF2 signature whose function holds the training step;
    ``shapes``: infer a TF graph's shapes while reading it, for a command that reads
    them all."""
    return read(path, tag=tag, signature=signature, shapes=shapes, holds_step=holds_updates)


def holds_updates(body: Graph) -> bool:
    """Whether a function body holds the training step: its dialect finds optimizer
    updates in it (region analysis's first question)."""
    return bool(body.dialect.step.optimizer_applies(body))
