"""What a pass may need from a dialect beyond :class:`~graphpass.dialects.base.Dialect`.

A pass names the capabilities it needs (``Pass.requires``); the pipeline checks
the graph's dialect against them before any pass runs and refuses a pass the
format cannot serve with one line, instead of failing halfway through a rewrite.
Only the TF dialect implements these today; ONNX has neither variables as ops,
nor conditionals the stale pass could gate with, nor device strings.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from graphpass.ir.graph import Tensor


class ResourceVariable(NamedTuple):
    """The nodes of a variable a pass created (``ConditionalBuilder.resource_variable``;
    names as TF's ``get_variable`` gives them)."""

    handle: str
    initializer: str
    read: Tensor
    initial_value: Tensor


@runtime_checkable
class ConditionalBuilder(Protocol):
    """Variables, conditionals (v1 Switch/Merge and a functional If) and collections:
    what the stale-gradient pass builds its conditional apply from."""

    def switch(self, graph, name, data, pred, device="") -> Any: ...

    def merge(self, graph, name, tensors, device="") -> Any: ...

    def functional_if(self, graph, name, pred, branches, results, device="",
                      inlined=False) -> Any: ...

    def noop(self, graph, name, control_inputs, device="") -> str: ...

    def constant(self, graph, name, value, dtype, device="") -> Any: ...

    def read_variable(self, graph, name, variable, control_inputs=(), device=None) -> Any: ...

    def resource_variable(self, graph, name, value, dtype, device="") -> Any: ...

    def assign_add_variable(self, graph, name, variable, value, control_inputs=()) -> str: ...

    def register_global_variable(self, graph, variable) -> bool: ...

    def add_to_collection(self, graph, key, tensor) -> bool: ...

    def scalar_summary(self, graph, name, tag, value) -> Any: ...

    def frame_depths(self, graph) -> dict[str, int]: ...

    def is_ref(self, graph, tensor) -> bool: ...

    def has_outputs(self, graph, name) -> bool: ...

    def colocate(self, graph, name, with_node) -> None:
        """Run ``name`` wherever ``with_node`` runs (the step counter's device)."""

    def initializer_groups(self, graph) -> list[str]:
        """The graph's init op(s): what must also initialise a variable a pass adds."""


@runtime_checkable
class TargetLowering(Protocol):
    """Device strings and XLA compilability: what target lowering needs."""

    def place(self, graph, names: list[str], device_type: str) -> bool: ...

    def xla_unsupported(self, graph, names: list[str]) -> list[tuple[str, str]]: ...

    def xla_clusterable(self, graph, name: str) -> bool:
        """Whether ``name`` may join an XLA cluster (fed values and ref variables
        stay outside)."""

    def mark_xla_cluster(self, graph, names: list[str], scope: str) -> str:
        """Mark ``names`` as one XLA cluster named ``scope``; returns how they are
        marked, for the report."""
