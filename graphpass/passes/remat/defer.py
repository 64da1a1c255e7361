"""Deferring the parameter updates to the end of the step, for steps that return
their updates rather than assign them (``StepStructure.returned_values``: an ONNX
training step's updated parameters and optimizer state are graph outputs).

The runtime holds a returned value from the moment it is computed to the end of
the step (onnxruntime allocates each graph output as a result of the run). An
update that runs as soon as its gradient exists, as onnxruntime's schedule runs
it, so holds the updated parameter and its optimizer state (two or three
parameter-sized values) through the rest of the backward pass, where its
gradient alone would be one; with a momentum optimizer that can be the step's
peak.

So each update reads its gradient gated on every gradient of the step,
``g + stop_gradient(0 * s)`` with ``s`` summing each gradient's first element
(``order.gate_by_data``, TF's ``GATE_GRAPH`` in data form): no update runs
before the last gradient exists. The order of ``s``'s inputs steers a runtime
that walks a node's inputs one by one (onnxruntime's depth-first schedule): in
one order each gradient is computed where the backward pass reaches it, in the
other only after the whole backward pass, its operands live all along. Which
order does what is the scheduler's business, so both are estimated on the
runtime model's schedule (``analysis.memory``), and the rewrite is kept only where one
lowers the estimated peak. The gate goes past the optimizer ops the runtime fuses
into the gradient's producer (``_gate_point``), so the step stays bit-exact.
"""

from __future__ import annotations

from graphpass.analysis.memory import MemoryProfile, estimated_peak_bytes, memory_profile
from graphpass.ir.graph import Graph, Tensor
from graphpass.passes.remat.marks import SCOPE, is_generated
from graphpass.passes.remat.order import gate_by_data
from graphpass.passes.remat.rewrite import Step

DEFER_SCOPE = f"{SCOPE}deferred_updates"
#: The least estimated gain, as a fraction of the peak, worth the gate's nodes
#: (four per parameter): below it the gain is the gate's own scalars
#: moving the peak by a few bytes, not updates that no longer pile up.
MIN_GAIN_FRACTION = 0.01


def defer_updates(graph: Graph, step: Step, batch_size: int | None = None,
                  peak_bytes: int | None = None) -> tuple[int, MemoryProfile] | None:
    """Gate the updates on every gradient when that lowers the estimated peak
    (``peak_bytes``: the estimate as the graph is, estimated here if not given)
    by ``MIN_GAIN_FRACTION`` at least. Returns the peak without and the profile
    with, or None when the graph is left as it is."""
    gradients = [_gate_point(graph, t, step) for t in _deferrable(graph, step)]
    if not gradients:
        return None
    if peak_bytes is None:
        peak_bytes = estimated_peak_bytes(graph, step.fetches, batch_size, step.loop_trips,
                                          step.runtime)
    position = {name: i for i, name in enumerate(step.runtime.schedule(graph))}
    computed = sorted(gradients, key=lambda t: position[t.node])
    best, chosen = None, None
    for order in (computed, computed[::-1]):
        trial = graph.copy()
        _gate(trial, order, step)
        profile = memory_profile(trial, step.fetches, batch_size, step.loop_trips,
                                 runtime=step.runtime)
        bar = best.peak_bytes if best else peak_bytes - int(MIN_GAIN_FRACTION * peak_bytes)
        if profile.peak_bytes < bar:
            best, chosen = profile, order
    if chosen is None:
        return None
    _gate(graph, chosen, step)
    return peak_bytes, best


def can_defer(graph: Graph, step: Step) -> bool:
    """Whether ``defer_updates`` may change the graph (else it estimates nothing)."""
    return bool(_deferrable(graph, step))


def _deferrable(graph: Graph, step: Step) -> list[Tensor]:
    """The gradients to gate the updates on: none unless the step returns its
    updates (the runtime holds them to its end), and none once graphpass has
    gated them (a second run changes nothing)."""
    returned = graph.dialect.step.returned_values(graph)
    if len(step.gradients) < 2 or not any(t.node in step.optimizer for t in returned):
        return []
    if any(is_generated(t.node) or any(is_generated(c) and c in step.optimizer
                                       for c, _ in graph.consumers(t))
           for t in step.gradients):
        return []
    return list(step.gradients)


def _gate_point(graph: Graph, gradient: Tensor, step: Step) -> Tensor:
    """Where to gate ``gradient``: past the optimizer ops that the runtime fuses
    into the op computing it (``RuntimeModel.fuses_into_producer``: onnxruntime folds
    SGD's ``lr * g`` into the weight gradient's MatMul, and momentum's
    ``mu * v + g`` with it into one Gemm). Gating between them would leave
    them unfused, which rounds differently from the original step."""
    while True:
        readers = graph.consumers(gradient)
        if len(readers) != 1 or readers[0][0] not in step.optimizer or \
                not step.runtime.fuses_into_producer(graph, *readers[0]):
            return gradient
        gradient = Tensor(readers[0][0], 0)


def _gate(graph: Graph, gradients: list[Tensor], step: Step) -> None:
    """The optimizer's reads of each gradient go through the gate."""
    gate_by_data(graph, DEFER_SCOPE, gradients, lambda reader: reader in step.optimizer,
                 step.runtime)
