"""The training step as ONNX writes it (``ONNXStep``, the ONNX dialect's ``step``):
one graph whose outputs are the step's results, each updated parameter and piece
of optimizer state among them, replacing the input or initializer it updates.
The updates are found by structure (``onnx_training``) and cached per graph; the
step counter is the state update that counts a one-element value up by a constant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from graphpass.dialects.base import Dialect, StepStructure
from graphpass.dialects.onnx_training import (
    Updates,
    computed_outputs,
    find_updates,
    named_updates,
)
from graphpass.errors import GraphpassError
from graphpass.formats.onnx_order import INPUT
from graphpass.formats.ort_artifacts import EVAL, OPTIMIZER, not_a_step
from graphpass.ir.graph import Graph, Tensor


class ONNXStep(StepStructure):
    """An ONNX training step (or an onnxruntime training artifact's); the ONNX
    dialect lends it shapes and constant values, which the update search compares."""

    single_train_step = True

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        self._updates_cache: tuple | None = None

    # -- updates (onnx_training) ---------------------------------------------

    def optimizer_applies(self, graph: Graph) -> dict[str, list[Tensor]]:
        """Parameter updates (with their gradients) and optimizer state updates
        (with none), found by what they read and write: see ``onnx_training``.
        Refuses a step whose updates cannot be attributed, naming the candidates."""
        updates = self.updates(graph)
        if updates.problem:
            raise GraphpassError(updates.problem)
        return updates.applies

    def applies_for(self, graph: Graph, train_ops: Sequence[str]) -> dict[str, list[Tensor]]:
        """With ``--train-op``: the named nodes are the updates (for steps whose
        updates structure alone cannot attribute)."""
        self.dialect.ensure_shapes(graph)
        applies = named_updates(graph, list(train_ops)).applies if train_ops else \
            self.optimizer_applies(graph)
        if not applies and not train_ops:
            raise GraphpassError(_no_step(graph))
        return applies

    def counter_increments(self, graph: Graph) -> list[tuple[str, str]]:
        """``(increment, counter)`` for each optimizer state update that counts a
        one-element input or initializer up by a constant (``t' = t + 1``, Adam's
        step, the preview ops' ``T``): candidates for the global step."""
        found = []
        for source, update in self.updates(graph).state.items():
            inputs = graph.inputs(update)
            counted = [t for t in inputs if t.node != source]
            shape = self.dialect.shape(graph, Tensor(source, 0))
            if graph.node(update).op in ("Add", "Sum") and len(inputs) == 2 and \
                    len(counted) == 1 and \
                    self.dialect.constant_value(graph, counted[0]) is not None and \
                    shape is not None and math.prod(shape) == 1:
                found.append((update, source))
        return found

    def updates(self, graph: Graph) -> Updates:
        """The step's parameter and state updates and their gradients
        (``onnx_training.find_updates``), cached per graph and its outputs
        (the dialect's ``is_variable`` asks once per node). Updates are found from
        the graph outputs upward and stop at the gradients, so a pass that adds
        nodes below them (remat's copies, once per segment) keeps them: keying on
        the node count would redo the search and a shape inference every segment."""
        key = (id(graph), tuple(v.name for v in graph.format_state.outputs))
        if self._updates_cache is None or self._updates_cache[0] != key:
            self.dialect.ensure_shapes(graph)  # the update cones compare shapes
            self._updates_cache = (key, find_updates(graph))
        return self._updates_cache[1]

    # -- what the step is fed and hands back ---------------------------------

    def graph_inputs(self, graph: Graph) -> list[str]:
        """The ``graphpass.Input`` nodes (fed values), in the model's input order."""
        fed = {n.outputs[0]: n.name for n in graph.nodes() if n.op == INPUT}
        return [fed[v.name] for v in graph.format_state.inputs if v.name in fed]

    def graph_outputs(self, graph: Graph) -> list[str]:
        """The nodes producing the model's outputs, in output order."""
        wanted = [v.name for v in graph.format_state.outputs]
        producers = {value: n.name for n in graph.nodes() for value in n.outputs if value}
        return list(dict.fromkeys(producers[v] for v in wanted if v in producers))

    def returned_values(self, graph: Graph) -> list[Tensor]:
        """Every graph output an op computes: onnxruntime allocates it as the step's
        result and frees it only when the caller drops it (each updated parameter and
        piece of optimizer state of a training step lives to the end of the step)."""
        return computed_outputs(graph)


def _no_step(graph: Graph) -> str:
    """Why no training step was found, in ONNX's terms."""
    state = graph.format_state
    if state.artifact in (EVAL, OPTIMIZER):
        return not_a_step(state.artifact, state.source_dir)
    return ("found no parameter updates: no graph output replaces an input or "
            "initializer it is computed from, no ai.onnx.preview.training update op and "
            "no com.microsoft InPlaceAccumulatorV2 gradient accumulator; name the "
            "step's update nodes with --train-op")
