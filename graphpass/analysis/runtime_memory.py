"""The estimate of the graph the runtime really runs, where the runtime can say.

:func:`graphpass.analysis.memory.memory_profile` simulates the graph it is given
under the dialect's hand model of the runtime's rewrites. Where the runtime can
be asked for the graph it runs (the runtime model's oracle: TF's Grappler),
this module simulates that graph instead, in that graph's node orders, and gives
the runtime model that follows them for the hand model's estimates of the graph
asked about (``follow_runtime_order``). It records nothing on either graph: the
orders are held by the model (``RuntimeModel.following``).
"""

from __future__ import annotations

from collections.abc import Sequence

from graphpass.analysis.memory import MemoryProfile, memory_profile
from graphpass.ir.graph import Graph
from graphpass.runtimes import RuntimeGraph, RuntimeModel, runtime_for


def runtime_view(graph: Graph, fetches: list[str],
                 runtime: RuntimeModel | None = None) -> RuntimeGraph | None:
    """The graph the runtime really runs for ``fetches``, from the runtime model's
    oracle (TF: Grappler's output, or ``graph`` itself with the reason TF could
    not be asked); None for a runtime without one. Asking TF takes seconds
    (Grappler on the whole step): ask once per graph and pass the answer on."""
    return (runtime or runtime_for(graph)).oracle(graph, fetches)


def follow_runtime_order(graph: Graph, view: RuntimeGraph | None,
                         runtime: RuntimeModel | None = None) -> RuntimeModel:
    """The runtime model (default: ``graph``'s) whose estimates of ``graph``, and of
    copies made from it, run the nodes in the orders of the runtime's graph
    ``view`` (``RuntimeModel.following``); the model as it was where ``view`` is
    None (nothing asked)."""
    runtime = runtime or runtime_for(graph)
    return runtime if view is None else runtime.following(view)


def runtime_memory_profile(graph: Graph, fetches: list[str], batch_size: int | None = None,
                           loop_trips: int | None = None,
                           view: RuntimeGraph | None = None,
                           replay: Sequence[str] | None = None,
                           runtime: RuntimeModel | None = None) -> MemoryProfile:
    """:func:`memory_profile` of the graph the runtime really runs, where the runtime
    can be asked for it (the runtime model's oracle: TF's Grappler); else of
    ``graph`` under the hand model. ``model`` on the result says which, and why.
    ``view``: :func:`runtime_view`'s answer for ``graph`` where the caller has it;
    ``replay``: the order a traced step ran the nodes in (``memory_profile``).

    For the figures a user reads (original and final graph), not for every
    candidate a planner weighs."""
    runtime = runtime or runtime_for(graph)
    view = view or runtime_view(graph, fetches, runtime)
    if view is None:
        return memory_profile(graph, fetches, batch_size, loop_trips, replay, runtime)
    replay = replay or view.order or None
    profile = memory_profile(view.graph, fetches, batch_size, loop_trips, replay,
                             runtime.following(view))
    if view.graph is not graph and _lost_trips(profile):
        # Grappler lowers a While into frames whose accumulators and bound this
        # estimate does not follow: counting none of its iterations would be the
        # one figure sure to be wrong.
        profile = memory_profile(graph, fetches, batch_size, loop_trips, replay, runtime)
        profile.model = f"{runtime.hand_model} ({runtime.oracle_name} lowers the step's " \
                        f"loops into frames whose trip counts it cannot read)"
        return profile
    profile.model = f"{view.model} ({view.reason})" if view.reason else view.model
    return profile


def _lost_trips(profile: MemoryProfile) -> bool:
    """A loop of Grappler's graph whose trip count its graph does not give (the
    hand model reads it from the graph as exported, or takes ``--loop-trips``, and
    follows a ``While``'s TensorList accumulators, which lowered frames hide)."""
    return any(loop.trips_from != "graph" for loop in profile.loops)
