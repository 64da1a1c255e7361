"""What every pass runs with, built once per pipeline run.

The options decide *what* to rewrite; the context carries the decisions every
pass must agree on (TVM's ``PassContext``): the resolved target (``--device
tpu`` implies xla), the device, the target runtime's model (which also says
how remat orders copies unless told otherwise), the instruments around the
passes, and the analysis manager that
computes regions, shapes and the memory estimate on demand (under the region
overrides) and forgets them when a pass changes the graph. A pass
never resolves these itself, so two passes cannot disagree about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from graphpass.analysis.manager import AnalysisManager
from graphpass.analysis.measured import Profiler
from graphpass.ir.graph import Graph
from graphpass.options import PipelineOptions, RuntimeConfig
from graphpass.options.types import CHECK
from graphpass.passes.instrument import Instrument
from graphpass.runtimes import RuntimeModel, runtime_for


@dataclass(frozen=True)
class PassContext:
    """``target``: ``tf``, ``xla`` or ``litert``;
    ``estimates``: whether passes estimate the step's memory for their reports.
    The CLI turns it off when no report is shown (``--quiet`` without ``--report``),
    as nobody would see the estimates and they cost real time on big graphs. A pass
    that plans by the estimate (``--recompute auto``) estimates regardless.
    ``profiler``: ``--profile``'s runner of the step (``analysis.measured``), or None:
    then nothing runs. ``runtime_config``: the target runtime's configuration
    (oneDNN, threads), which :meth:`runtime` hands the runtime model; ``exactness``:
    ``check`` (passes ask that runtime whether a rewrite computes what the
    original does before they keep it), ``allow-inexact`` (they ask, and keep it
    anyway, naming what differs) or ``trust`` (they do not ask)."""

    target: str = "tf"
    device: str | None = None
    runtime_config: RuntimeConfig = field(default_factory=RuntimeConfig)
    exactness: str = CHECK
    instruments: tuple[Instrument, ...] = ()
    analyses: AnalysisManager = field(default_factory=AnalysisManager)
    estimates: bool = True
    profiler: Profiler | None = None

    @classmethod
    def from_options(cls, options: PipelineOptions, instruments: Sequence[Instrument] = (),
                     estimates: bool = True, profiler: Profiler | None = None
                     ) -> PassContext:
        return cls(target=options.target, device=options.device,
                   runtime_config=options.runtime, exactness=options.exactness,
                   instruments=tuple(instruments),
                   analyses=AnalysisManager(options.regions), estimates=estimates,
                   profiler=profiler)

    def runtime(self, graph: Graph) -> RuntimeModel:
        """The model of the runtime ``graph`` is written for (``graphpass.runtimes``):
        the target's, under the configuration the options give."""
        return runtime_for(graph, self.target, self.runtime_config)
