"""The pass contract and the pipeline that runs passes.

A pass is a name, a frozen options dataclass and ``run(graph, context) ->
changed``, editing the graph in place (XLA's ``HloPassInterface``); the
:class:`~graphpass.passes.context.PassContext` carries what all passes share. It may leave a
JSON-able ``report`` describing what it did. The pipeline verifies the IR at
its start and after every pass that changed something, and names the pass in
any failure. Timing, dumps and progress are *instruments* around the passes,
never code inside them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph
from graphpass.ir.verify import verify
from graphpass.passes.context import PassContext


class Pass(ABC):
    """One graph rewrite. Subclasses set ``name`` and implement ``run``; ``preserves``
    names the analyses (``analysis/manager.py``) still valid after it changed the graph."""

    name: ClassVar[str]
    preserves: ClassVar[frozenset[str]] = frozenset()
    #: Dialect capabilities (``dialects/capabilities.py``) the pass needs.
    requires: ClassVar[tuple[type, ...]] = ()

    def __init__(self, options: Any = None) -> None:
        self.options = options
        self.report: dict[str, Any] = {}

    @abstractmethod
    def run(self, graph: Graph, ctx: PassContext) -> bool:
        """Rewrite ``graph`` in place; return whether anything changed."""

    def estimates_memory(self, ctx: PassContext) -> bool:
        """Whether this run estimates the step's memory, which reads every node's
        shape: a reader then infers them all while it still holds the file's
        GraphDef and no IR (``graphpass.load(shapes=True)``), the lower peak."""
        return False


@dataclass
class PassResult:
    name: str
    changed: bool
    seconds: float
    report: dict = field(default_factory=dict)


class Pipeline:
    """Runs passes in order with one context, verifying the IR between them (with
    the checks the target's runtime model adds)."""

    def __init__(self, passes: list[Pass]) -> None:
        self.passes = list(passes)

    def run(self, graph: Graph, ctx: PassContext | None = None) -> list[PassResult]:
        ctx = ctx or PassContext()
        for pass_ in self.passes:
            _check_capabilities(pass_, graph)
        verify(graph, after="input", nodes=graph.take_edited())
        try:
            for instrument in ctx.instruments:
                instrument.before_pipeline(graph, self.passes)
            results = [self._run_pass(pass_, graph, ctx) for pass_ in self.passes]
            for instrument in ctx.instruments:
                instrument.after_pipeline(graph)
        except BaseException:
            for instrument in ctx.instruments:
                instrument.on_failure(graph)
            raise
        return results

    def _run_pass(self, pass_: Pass, graph: Graph, ctx: PassContext) -> PassResult:
        for instrument in ctx.instruments:
            instrument.before_pass(pass_, graph)
        start = time.perf_counter()
        changed = pass_.run(graph, ctx)
        seconds = time.perf_counter() - start
        if changed:
            graph.forget_source()
            ctx.analyses.invalidate(graph, pass_.preserves)
            verify(graph, after=pass_.name, nodes=graph.take_edited(),
                   checks=ctx.runtime(graph).ir_checks())
        for instrument in ctx.instruments:
            instrument.after_pass(pass_, graph, changed, seconds)
        return PassResult(pass_.name, changed, seconds, dict(pass_.report))


def _check_capabilities(pass_: Pass, graph: Graph) -> None:
    """Refuse, before anything runs, a pass whose needs the graph's dialect lacks."""
    for capability in pass_.requires:
        if not isinstance(graph.dialect, capability):
            raise GraphpassError(
                f"the {pass_.name} pass needs {capability.__name__} from the dialect, which "
                f"{graph.format} graphs do not have; drop its options for {graph.format} input")
