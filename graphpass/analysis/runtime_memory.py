"""The estimate of the graph the runtime really runs, where the runtime can say.

:func:`graphpass.analysis.memory.memory_profile` simulates the graph it is given
under the dialect's hand model of the runtime's rewrites. Where the runtime can
be asked for the graph it runs (TF: Grappler's output, ``dialects/tf_grappler``),
this module simulates that graph instead; it never edits the graph it is given.
"""

from __future__ import annotations

from graphpass.analysis.memory import MemoryProfile, memory_profile
from graphpass.ir.graph import Graph


def runtime_memory_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                           loop_trips: int | None = None) -> MemoryProfile:
    """:func:`memory_profile` of the graph the runtime really runs, where the runtime
    can be asked for it (TF: Grappler's output, ``dialects/tf_grappler``); else of
    ``graph`` under the hand model. ``model`` on the result says which, and why.

    Asking TF takes seconds per call (Grappler on the whole step): for the figures
    a user reads (original and final graph), not for every candidate a planner
    weighs."""
    if graph.dialect.name != "tf":
        return memory_profile(graph, fetches, batch_size, loop_trips)
    from graphpass.dialects.tf_grappler import HAND_MODEL, runtime_graph

    view = runtime_graph(graph, fetches)
    profile = memory_profile(view.graph, fetches, batch_size, loop_trips)
    if view.graph is not graph and _lost_trips(profile):
        # Grappler lowers a While into frames whose accumulators and bound this
        # estimate does not follow: counting none of its iterations would be the
        # one figure sure to be wrong.
        profile = memory_profile(graph, fetches, batch_size, loop_trips)
        profile.model = f"{HAND_MODEL} (Grappler lowers the step's loops into frames " \
                        f"whose trip counts it cannot read)"
        return profile
    profile.model = f"{view.model} ({view.reason})" if view.reason else view.model
    return profile


def _lost_trips(profile: MemoryProfile) -> bool:
    """A loop of Grappler's graph whose trip count its graph does not give (the
    hand model reads it from the graph as exported, or takes ``--loop-trips``, and
    follows a ``While``'s TensorList accumulators, which lowered frames hide)."""
    return any(loop.trips_from != "graph" for loop in profile.loops)
