"""Analyses on demand, cached per graph, invalidated when a pass changes it.

As MLIR's ``AnalysisManager``: a pass asks for an analysis instead of running
it; the result is cached for that graph until a pass reports a change, after
which everything the pass does not declare in ``Pass.preserves`` is dropped.
Nothing is written into the IR as a side effect, except the shape metadata
that shape inference records on nodes (see ``analysis/shapes.py``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from graphpass.ir.graph import Graph
from graphpass.options import RegionOptions
from graphpass.runtimes import RuntimeModel

REGIONS, SHAPES, PEAK = "regions", "shapes", "peak_bytes"


class AnalysisManager:
    """``regions(graph)``, ``shapes(graph)`` and ``peak_bytes(graph, fetches)`` (its
    ``profile``),
    each computed once per graph until :meth:`invalidate`."""

    def __init__(self, regions: RegionOptions | None = None) -> None:
        self.overrides = regions or RegionOptions()
        self._cache: weakref.WeakKeyDictionary[Graph, dict[Any, Any]] = \
            weakref.WeakKeyDictionary()
        self.computed: dict[str, int] = {}  # analysis name -> times computed

    def regions(self, graph: Graph):
        """Region analysis under the overrides (raises its user errors each time)."""
        from graphpass.analysis.regions import analyze

        def compute():
            return analyze(graph, loss=self.overrides.loss,
                           train_ops=list(self.overrides.train_ops) or None,
                           global_step=self.overrides.global_step)

        return self._get(graph, REGIONS, compute)

    def shapes(self, graph: Graph) -> None:
        """Shape inference: after this, ``Dialect.shape`` knows what the format can infer."""
        from graphpass.analysis.shapes import infer_shapes

        self._get(graph, SHAPES, lambda: infer_shapes(graph))

    def peak_bytes(self, graph: Graph, fetches: Iterable[str], runtime: RuntimeModel) -> int:
        """The estimate of the step that runs ``fetches`` on ``runtime``
        (``analysis/estimate.py``), cached per runtime model, configuration and
        the oracle's orders the model follows (``RuntimeModel.following``)."""
        return self.profile(graph, fetches, runtime).peak_bytes

    def profile(self, graph: Graph, fetches: Iterable[str], runtime: RuntimeModel):
        """The simulated step behind :meth:`peak_bytes` (a ``MemoryProfile``)."""
        from graphpass.analysis.estimate import step_profile

        fetches = list(fetches)
        key = (PEAK, tuple(fetches), type(runtime).__name__, runtime.config, runtime.follows)
        return self._get(graph, key, lambda: step_profile(graph, fetches, runtime=runtime))

    def invalidate(self, graph: Graph, preserved: Iterable[str] = ()) -> None:
        """Drop every cached result for ``graph`` but the ``preserved`` analyses."""
        keep = set(preserved)
        cached = self._cache.get(graph, {})
        for key in list(cached):
            if (key[0] if isinstance(key, tuple) else key) not in keep:
                del cached[key]

    def _get(self, graph: Graph, key: Any, compute: Callable[[], Any]) -> Any:
        cached = self._cache.setdefault(graph, {})
        if key not in cached:
            name = key[0] if isinstance(key, tuple) else key
            self.computed[name] = self.computed.get(name, 0) + 1
            cached[key] = compute()
        return cached[key]
