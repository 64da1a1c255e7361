"""Instruments: hooks around the passes of a pipeline (timing, dumps, progress).
They never change the graph; a pass never knows they are there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from graphpass.ir.graph import Graph


class NamedPass(Protocol):
    """What an instrument may read of a pass: its name (and its ``report``)."""

    name: str


class Instrument:
    """Hooks around passes; subclasses override the ones they need."""

    def before_pipeline(self, graph: Graph, passes: Sequence[NamedPass]) -> None: ...

    def before_pass(self, pass_: NamedPass, graph: Graph) -> None: ...

    def after_pass(self, pass_: NamedPass, graph: Graph, changed: bool,
                   seconds: float) -> None: ...

    def after_pipeline(self, graph: Graph) -> None: ...

    def on_failure(self, graph: Graph) -> None:
        """A pass (or an instrument) raised after ``before_pipeline``: drop what was
        prepared for the end of the pipeline."""
