"""What every pass runs with, built once per pipeline run.

The options decide *what* to rewrite; the context carries the decisions every
pass must agree on (TVM's ``PassContext``): the resolved target (``--device
tpu`` implies xla), the device, the dependency mode remat uses unless told
otherwise, the region overrides, and the instruments around the passes. A pass
never resolves these itself, so two passes cannot disagree about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphpass.options import PipelineOptions, RegionOptions

if TYPE_CHECKING:
    from graphpass.analysis.regions import Regions
    from graphpass.ir.graph import Graph
    from graphpass.passes.base import Instrument


@dataclass(frozen=True)
class PassContext:
    """``target``: ``tf`` or ``xla``; ``dependency``: remat's default ordering
    (``data`` for xla, which ignores control edges; None: the dialect's first mode)."""

    target: str = "tf"
    device: str | None = None
    dependency: str | None = None
    regions: RegionOptions = field(default_factory=RegionOptions)
    instruments: tuple[Instrument, ...] = ()

    @classmethod
    def from_options(cls, options: PipelineOptions,
                     instruments: Sequence[Instrument] = ()) -> PassContext:
        return cls(target=options.target, device=options.device,
                   dependency="data" if options.target == "xla" else None,
                   regions=options.regions, instruments=tuple(instruments))

    def analyze_regions(self, graph: Graph) -> Regions:
        """Region analysis of ``graph`` under the overrides."""
        from graphpass.analysis.regions import analyze

        return analyze(graph, loss=self.regions.loss,
                       train_ops=list(self.regions.train_ops) or None,
                       global_step=self.regions.global_step)
