"""Rematerialization: marks, the automatic planner (plan) and the rewrite."""

from __future__ import annotations

from graphpass.passes.remat.rewrite import RematPass

__all__ = ["RematPass"]
