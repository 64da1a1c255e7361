"""Analyses of a Graph, pure functions of it: training regions (``regions``), shape
inference (``shapes``), tensor sizes and the peak-memory estimate (``memory``).
Passes ask the ``manager.AnalysisManager`` for them: computed on demand, cached per
graph, invalidated when a pass changes the graph unless it preserves them."""
