"""The training step as TensorFlow writes it (``TFStep``, the TF dialect's
``step``): the apply ops (``Apply*`` ops, and updates made of plain ops, found by
``tf_updates``), the step counter's increments, and the step's boundary: its
placeholders, and where the step is a TF2 function, its results (``_Retval``)
and whether XLA must compile it.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphpass.dialects import tf_updates
from graphpass.dialects.base import StepStructure
from graphpass.dialects.tf_ops import (
    APPLY_OP,
    INTEGER_DTYPES,
    RESULT_OP,
    STEP_INCREMENT_OPS,
    op_def,
)
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph, Tensor


class TFStep(StepStructure):
    """A TF1 graph's step or a TF2 function body's; the TF dialect lends it
    OpDef argument slots and variable kinds."""

    # -- updates -------------------------------------------------------------

    def optimizer_applies(self, graph: Graph) -> dict[str, list[Tensor]]:
        """Apply ops (``ApplyAdam``, ``ResourceSparseApplyMomentum``, ...) -> gradients."""
        return self._applies(graph, strict=True)

    def applies_for(self, graph: Graph, train_ops: Sequence[str]) -> dict[str, list[Tensor]]:
        """With ``--train-op``, plain-op updates that apply no gradient found are left
        to the optimizer instead of reported."""
        return self._applies(graph, strict=not train_ops)

    def _applies(self, graph: Graph, strict: bool) -> dict[str, list[Tensor]]:
        """``Apply*`` ops, and plain-op updates of the variables they do not train (a
        TF 1.x optimizer's sparse path: Adam's ``ScatterAdd``, SGD's ``ScatterSub``)."""
        applies = {}
        for node in graph.nodes():
            if APPLY_OP.match(node.op) and op_def(node.op) is not None:
                inputs = graph.inputs(node.name)
                # The gradient is "grad", except for (Resource)ApplyGradientDescent's "delta".
                slots = self.dialect.input_arg_slots(graph, node.name, "grad") or \
                    self.dialect.input_arg_slots(graph, node.name, "delta")
                applies[node.name] = [inputs[s] for s in slots if s < len(inputs)]
        if applies:
            trained = tf_updates.applied_variables(graph, applies)
            plain = tf_updates.plain_updates(graph, strict=False, skip=trained, applied=[
                t for tensors in applies.values() for t in tensors])
            if not plain:
                return applies
            return {n: applies[n] if n in applies else plain[n] for n in graph
                    if n in applies or n in plain}
        updates = tf_updates.plain_updates(graph, strict=strict)
        listed = graph.format_state.signatures
        if not updates and listed and graph.format_state.function is None:
            raise GraphpassError(
                "no signature of this SavedModel holds a training step (signatures: "
                f"{', '.join(s['signature'] for s in listed)}); export the train function "
                "as one (signatures={'train': module.train}) or name it with --signature")
        return updates

    def split_steps(self, graph: Graph, applies: dict[str, list[Tensor]]) -> list[list[str]]:
        """Plain-op updates by the gradient computation they read (``Apply*`` ops
        keep one step per train op, as v1 graphs always had)."""
        if not applies or any(APPLY_OP.match(graph.node(a).op) for a in applies):
            return [list(applies)]
        return tf_updates.gradient_steps(graph, applies)

    def ends_train_step(self, graph: Graph, name: str) -> bool:
        op = graph.node(name).op
        if op == RESULT_OP:  # the step ends when the function returns: one train op
            return name == _first_result(graph)
        return op == "NoOp" or \
            op.startswith(("Assign", "ResourceScatter", "Scatter")) or bool(APPLY_OP.match(op))

    def counter_increments(self, graph: Graph) -> list[tuple[str, str]]:
        """``(increment op, integer variable)`` pairs: candidates for global_step."""
        found = []
        for node in graph.nodes():
            if node.op not in STEP_INCREMENT_OPS:
                continue
            inputs = graph.inputs(node.name)
            variable = inputs[0].node if inputs else None
            if variable and self.dialect.is_variable(graph, variable) and \
                    self.dialect.get_attr(graph, variable, "dtype") in INTEGER_DTYPES:
                found.append((node.name, variable))
        return found + [pair for pair in tf_updates.step_increments(graph) if pair not in found]

    def update_math(self, graph: Graph, applies: list[str]) -> set[str]:
        """The slot updates and learning-rate arithmetic of updates made of plain ops
        (Keras optimizers; the sparse path of TF 1.x Adam and SGD); ``Apply*`` ops
        hold theirs."""
        plain = [a for a in applies if not APPLY_OP.match(graph.node(a).op)]
        return tf_updates.update_math(graph, plain) if plain else set()

    # -- what the step is fed and hands back, and where it lives -------------

    def graph_inputs(self, graph: Graph) -> list[str]:
        return [n.name for n in graph.nodes() if n.op.startswith("Placeholder")]

    def in_function_body(self, graph: Graph) -> bool:
        return graph.format_state.function is not None

    def default_dependency(self, graph: Graph) -> str:
        """Data for a function body that XLA must compile (``jit_compile=True``:
        XLA ignores control edges), else control."""
        function = graph.format_state.function
        return "data" if function and function.xla_must_compile else "control"

    def is_fetch(self, graph: Graph, name: str) -> bool:
        """A function result (``_Retval``), or an ``Identity`` only results read."""
        op = graph.node(name).op
        if op != "Identity":
            return op == "_Retval"
        # Iterative, each Identity once: a malformed graph may loop Identities.
        seen, stack, results = {name}, [name], False
        while stack:
            users = graph.data_users(stack.pop())
            if not users:
                return False
            for user in users:
                user_op = graph.node(user).op
                if user_op == "_Retval":
                    results = True
                elif user_op != "Identity":
                    return False
                elif user not in seen:
                    seen.add(user)
                    stack.append(user)
        return results


def _first_result(graph: Graph) -> str | None:
    """The function's result with the lowest index: it stands for all of them (they
    all wait for the step), so a step returning its loss and metrics is one train op."""
    results = [n for n in graph.nodes() if n.op == RESULT_OP]
    return min(results, key=lambda n: n.attrs["index"].i).name if results else None
