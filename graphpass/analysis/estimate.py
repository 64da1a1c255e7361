"""The estimate of a step's memory that remat's plan and report and the memory
plots read: the runtime model's heap policy picks the simulation over its
schedule (``RuntimeModel.heap``: a static
arena is packed, ``analysis.arena``; an allocator's heap is walked,
``analysis.memory``)."""

from __future__ import annotations

from collections.abc import Sequence

from graphpass.analysis.arena import arena_profile
from graphpass.analysis.buffers import MemoryProfile
from graphpass.analysis.memory import memory_profile
from graphpass.ir.graph import Graph
from graphpass.runtimes import ARENA, RuntimeModel, runtime_for


def step_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                 loop_trips: int | None = None, runtime: RuntimeModel | None = None,
                 replay: Sequence[str] | None = None) -> MemoryProfile:
    """The step running ``fetches`` on ``runtime`` (default: the format's runtime
    under the default configuration), simulated as its heap policy allocates."""
    runtime = runtime or runtime_for(graph)
    if runtime.heap == ARENA:
        return arena_profile(graph, fetches, batch_size, runtime)
    return memory_profile(graph, fetches, batch_size, loop_trips, replay, runtime)
