"""The passes: the contract, context and pipeline (``base``, ``context``), and the
registry, in pipeline order. Each pass is ``run(graph, ctx) -> changed`` with its own
frozen options (``graphpass.options``) and the shared ``PassContext``.

Rematerialization first (it needs the plain forward/backward structure), then
target lowering (it labels the step by region analysis, which must still see the
apply ops), then stale-gradient dropping, which for XLA moves the apply ops into
an ``If`` branch function; its conditional form follows the context's resolved
target, the same one lowering uses.
"""

from __future__ import annotations

from graphpass.options import PipelineOptions
from graphpass.passes.base import Pass, Pipeline
from graphpass.passes.context import PassContext


def registered_passes() -> list[type[Pass]]:
    """Every pass, in the order the pipeline runs them."""
    from graphpass.passes.lower import LowerPass
    from graphpass.passes.remat import RematPass
    from graphpass.passes.stale import StalePass

    return [RematPass, LowerPass, StalePass]


def build_passes(options: PipelineOptions) -> list[Pass]:
    """The passes ``options`` ask for (a pass's options field is named like the pass)."""
    return [cls(getattr(options, cls.name)) for cls in registered_passes()
            if getattr(options, cls.name) is not None]


def estimates_memory(options: PipelineOptions, estimates: bool = True) -> bool:
    """Whether running ``options``' passes estimates the step's memory, which reads
    every node's shape: a caller then loads with ``shapes=True``."""
    ctx = PassContext.from_options(options, estimates=estimates)
    return any(p.estimates_memory(ctx) for p in build_passes(options))


__all__ = ["Pass", "PassContext", "Pipeline", "build_passes", "estimates_memory",
           "registered_passes"]
