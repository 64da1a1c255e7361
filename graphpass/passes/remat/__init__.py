"""Rematerialization (graph-level ``recompute_grad``): the rewrite of marked forward
segments (``rewrite``: marks by pattern or ``_recompute_hint``, per-segment plan,
copies ordered by control or data dependencies) and the automatic planner behind
``--recompute auto`` (``plan``)."""

from __future__ import annotations

from graphpass.passes.remat.rewrite import RematPass

__all__ = ["RematPass"]
