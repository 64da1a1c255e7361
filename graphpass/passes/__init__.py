"""The pass registry, in pipeline order.

Rematerialization first (it needs the plain forward/backward structure), then
target lowering (it labels the step by region analysis, which must still see the
apply ops), then stale-gradient dropping, which for XLA moves the apply ops into
an ``If`` branch function and makes its own nodes' placement (colocated with
``global_step``) and conditional form from the same ``target`` setting.
"""

from __future__ import annotations

from graphpass.passes.base import Pass, Pipeline, RegionOptions


def registered_passes() -> list[type[Pass]]:
    """Every pass, in the order the pipeline runs them."""
    from graphpass.passes.lower import LowerPass
    from graphpass.passes.remat.rewrite import RematPass
    from graphpass.passes.stale import StalePass

    return [RematPass, LowerPass, StalePass]


def build_passes(settings: dict) -> list[Pass]:
    """The passes that ``settings`` (CLI options merged with a config file) ask for."""
    passes = []
    for cls in registered_passes():
        configured = cls.from_settings(settings)
        if configured is not None:
            passes.append(configured)
    return passes


__all__ = ["Pass", "Pipeline", "RegionOptions", "build_passes", "registered_passes"]
