"""What a TF file carries besides the graph's nodes, typed: the container it came
in, its versions and function library, the MetaGraphDef or SavedModel around the
GraphDef, and, for a TF2 step, the function whose body the IR is.

The reader fills a :class:`TFState` (``Graph.format_state``) and the writer
re-emits from it; dialects and commands read it. It holds the file's own protos,
shared between copies of a graph and never mutated in place (an edit copies the
proto first, ``tf_library``); it must not hold anything an analysis computed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphpass.formats.files import GRAPHDEF


@dataclass
class TFFunction:
    """The FunctionDef whose body the IR is (a TF2 training step)."""

    name: str
    control_ret: dict[str, str]
    args: frozenset[str]
    nodes: frozenset[str]
    xla_must_compile: bool
    #: argument name -> the variable the caller passes (``inspect`` names it)
    variables: dict[str, str] = field(default_factory=dict)


@dataclass
class TFState:
    """A TF GraphDef / MetaGraphDef / SavedModel's data outside the nodes."""

    container: str = GRAPHDEF
    text: bool = False
    versions: Any = None  # VersionDef, None where the file has none
    library: Any = None  # FunctionDefLibrary, None where the file has none
    graph_version: int = 0
    metagraph: Any = None  # a MetaGraphDef's, without its graph_def
    savedmodel: Any = None  # a SavedModel's SavedModel proto
    metagraph_index: int | None = None  # which of the SavedModel's MetaGraphs
    source_dir: Path | None = None  # the SavedModel directory (variables/, assets/)
    signatures: list[dict] | None = None  # what ``inspect`` lists
    function: TFFunction | None = None  # the step's function, for a TF2 step
    outer_graph_def: Any = None  # the GraphDef around ``function``

    def copy(self) -> TFState:
        """Independent containers (a dialect may add to them), shared protos."""
        function = self.function and dataclasses.replace(
            self.function, control_ret=dict(self.function.control_ret),
            variables=dict(self.function.variables))
        signatures = None if self.signatures is None else list(self.signatures)
        return dataclasses.replace(self, function=function, signatures=signatures)

    def provenance(self) -> frozenset[str]:
        """Fields that say where the graph came from, not what it is (``diff``)."""
        return frozenset({"text", "source_dir", "container", "metagraph_index"})

    def describe(self) -> dict:
        """What ``inspect`` says of the container: its kind, the signatures a
        MetaGraph lists, and the function whose body the IR is."""
        facts: dict = {"container": self.container}
        if self.signatures is not None:
            facts["signatures"] = self.signatures
        if self.function is not None:
            facts["function"] = self.function.name
        return facts

    def variable_of(self, argument: str) -> str | None:
        """The variable the caller passes for a function argument (``sgd/iteration``);
        None for a top-level graph, whose variables are nodes."""
        return self.function.variables.get(argument) if self.function else None
