"""The estimate of the graph the runtime really runs, where the runtime can say.

:func:`graphpass.analysis.memory.memory_profile` simulates the graph it is given
under the dialect's hand model of the runtime's rewrites. Where the runtime can
be asked for the graph it runs (TF: Grappler's output, ``dialects/tf_grappler``),
this module simulates that graph instead, and can make the hand model follow
that graph's node order (``follow_runtime_order``: node meta, the one thing it
records on the graph it is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphpass.analysis.memory import MemoryProfile, memory_profile
from graphpass.ir.graph import Graph

if TYPE_CHECKING:
    from graphpass.dialects.tf_grappler import RuntimeGraph


def runtime_view(graph: Graph, fetches: list[str]) -> RuntimeGraph | None:
    """The graph the runtime really runs for ``fetches`` (TF: Grappler's output, or
    ``graph`` itself with the reason TF could not be asked); None for a format
    whose runtime this does not ask. Asking TF takes seconds (Grappler on the
    whole step): ask once per graph and pass the answer on."""
    if graph.dialect.name != "tf":
        return None
    from graphpass.dialects.tf_grappler import runtime_graph

    return runtime_graph(graph, fetches)


def follow_runtime_order(graph: Graph, view: RuntimeGraph | None) -> bool:
    """Make the hand model's estimates of ``graph`` (and of copies made from it
    after this) run the nodes in the order of the runtime's graph ``view``
    (``tf_grappler.record_order``); False where there is none to follow."""
    if view is None:
        return False
    from graphpass.dialects.tf_grappler import record_order

    return record_order(graph, view)


def runtime_memory_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                           loop_trips: int | None = None,
                           view: RuntimeGraph | None = None,
                           replay: Sequence[str] | None = None) -> MemoryProfile:
    """:func:`memory_profile` of the graph the runtime really runs, where the runtime
    can be asked for it (TF: Grappler's output, ``dialects/tf_grappler``); else of
    ``graph`` under the hand model. ``model`` on the result says which, and why.
    ``view``: :func:`runtime_view`'s answer for ``graph`` where the caller has it;
    ``replay``: the order a traced step ran the nodes in (``memory_profile``).

    For the figures a user reads (original and final graph), not for every
    candidate a planner weighs."""
    view = view or runtime_view(graph, fetches)
    if view is None:
        return memory_profile(graph, fetches, batch_size, loop_trips, replay)
    from graphpass.dialects.tf_grappler import HAND_MODEL

    profile = memory_profile(view.graph, fetches, batch_size, loop_trips, replay)
    if view.graph is not graph and _lost_trips(profile):
        # Grappler lowers a While into frames whose accumulators and bound this
        # estimate does not follow: counting none of its iterations would be the
        # one figure sure to be wrong.
        profile = memory_profile(graph, fetches, batch_size, loop_trips, replay)
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
