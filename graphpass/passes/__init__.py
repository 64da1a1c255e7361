"""The pass registry, in pipeline order: rewrites first, target lowering last."""

from __future__ import annotations

from graphpass.passes.base import Pass, Pipeline, RegionOptions


def registered_passes() -> list[type[Pass]]:
    """Every pass, in the order the pipeline runs them."""
    from graphpass.passes.stale import StalePass

    return [StalePass]


def build_passes(settings: dict) -> list[Pass]:
    """The passes that ``settings`` (CLI options merged with a config file) ask for."""
    passes = []
    for cls in registered_passes():
        configured = cls.from_settings(settings)
        if configured is not None:
            passes.append(configured)
    return passes


__all__ = ["Pass", "Pipeline", "RegionOptions", "build_passes", "registered_passes"]
