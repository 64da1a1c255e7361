"""The pass contract and the pipeline that runs passes.

A pass is a name, a frozen options dataclass and ``run(graph) -> changed``,
editing the graph in place (XLA's ``HloPassInterface``). It may leave a
JSON-able ``report`` describing what it did. The pipeline verifies the IR at
its start and after every pass that changed something, and names the pass in
any failure. Timing, dumps and progress are *instruments* around the passes,
never code inside them.
"""

from __future__ import annotations

import argparse
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from graphpass.ir.graph import Graph
from graphpass.ir.verify import verify


@dataclass(frozen=True)
class RegionOptions:
    """Overrides for region analysis, shared by the passes that need regions."""

    loss: str | None = None
    train_ops: tuple[str, ...] = ()
    global_step: str | None = None

    @classmethod
    def from_settings(cls, settings: dict) -> RegionOptions:
        return cls(
            loss=settings.get("loss"),
            train_ops=tuple(settings.get("train_op") or ()),
            global_step=settings.get("global_step"),
        )

    def analyze(self, graph: Graph):
        from graphpass.analysis.regions import analyze

        return analyze(graph, loss=self.loss, train_ops=list(self.train_ops) or None,
                       global_step=self.global_step)


class Pass(ABC):
    """One graph rewrite. Subclasses set ``name`` and implement ``run``."""

    name: ClassVar[str]

    def __init__(self, options: Any) -> None:
        self.options = options
        self.report: dict[str, Any] = {}

    @abstractmethod
    def run(self, graph: Graph) -> bool:
        """Rewrite ``graph`` in place; return whether anything changed."""

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Declare this pass's command-line options."""

    @classmethod
    def from_settings(cls, settings: dict) -> Pass | None:
        """The configured pass, or None when the settings do not ask for it."""
        return None


class Instrument:
    """Hooks around passes (timing, dumps, progress); they never change the graph."""

    def before_pipeline(self, graph: Graph, passes: list[Pass]) -> None: ...

    def before_pass(self, pass_: Pass, graph: Graph) -> None: ...

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool, seconds: float) -> None: ...


@dataclass
class PassResult:
    name: str
    changed: bool
    seconds: float
    report: dict = field(default_factory=dict)


class Pipeline:
    """Runs passes in order, verifying the IR between them."""

    def __init__(self, passes: list[Pass], instruments: list[Instrument] = ()) -> None:
        self.passes = list(passes)
        self.instruments = list(instruments)

    def run(self, graph: Graph) -> list[PassResult]:
        verify(graph, after="input")
        for instrument in self.instruments:
            instrument.before_pipeline(graph, self.passes)
        results = []
        for pass_ in self.passes:
            for instrument in self.instruments:
                instrument.before_pass(pass_, graph)
            start = time.perf_counter()
            changed = pass_.run(graph)
            seconds = time.perf_counter() - start
            if changed:
                verify(graph, after=pass_.name)
            for instrument in self.instruments:
                instrument.after_pass(pass_, graph, changed, seconds)
            results.append(PassResult(pass_.name, changed, seconds, dict(pass_.report)))
        return results
