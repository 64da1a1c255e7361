"""What a run of the step measured, handed to the planner without the runtime.

``--profile`` runs the step (``graphpass.inspect.profile``: a runtime, so at
the inspect layer); the passes may not import a runtime, so they receive a
*profiler*: a callable from a graph (the original or a trial rewrite of it, with
the same fetches) to a :class:`StepMeasurement`. This module only declares
that contract; it runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from graphpass.ir.graph import Graph

#: The figure a profile judges by: the CPU allocator's own peak over the step
#: (where it keeps statistics and it is the larger), else the peak of the kernels'
#: allocation records plus the fed values the runtime holds (what the estimate
#: simulates).
ALLOCATOR, RECORDS = "allocator", "allocation records"


@dataclass(frozen=True)
class StepMeasurement:
    """One measured step: ``peak_bytes`` by ``source`` (``ALLOCATOR`` or
    ``RECORDS``), the records' peak beside it, and the nodes in the order the
    executor started them."""

    peak_bytes: int
    source: str
    records_peak_bytes: int
    order: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "source": self.source,
                "records_peak_bytes": self.records_peak_bytes,
                "nodes_run": len(self.order)}


#: ``profiler(graph, fetches)``: run one step of ``graph`` (after a warm-up step) and
#: measure it; raises ``GraphpassError`` when the graph does not run.
Profiler = Callable[[Graph, list[str]], StepMeasurement]
