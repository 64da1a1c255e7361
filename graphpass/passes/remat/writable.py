"""What the rewrite can write, known while planning: the planner considers only
segments whose copies can be ordered after their trigger in the step's
dependency mode (``Step.dependency``: one the runtime takes,
``RuntimeModel.dependency_modes``).

Control mode orders any segment. Data mode ties the copies' inputs from outside
the segment to the trigger (``order.order_by_data``): a segment whose copies
read no such value (an embedding's index arithmetic, a loop over tensor lists
and resources) cannot be ordered, and is not a candidate.
"""

from __future__ import annotations

from dataclasses import replace

from graphpass.analysis.forward import ForwardChain
from graphpass.ir.graph import Graph
from graphpass.passes.remat.marks import Segment
from graphpass.passes.remat.order import tieable
from graphpass.passes.remat.plan import Runs
from graphpass.passes.remat.rewrite import Step, segment_copies


def orderable_chain(graph: Graph, chain: ForwardChain, step: Step) -> ForwardChain:
    """``chain`` with each unit's ``tie_start`` (``analysis.forward.Unit``) set for
    data mode: 0 where one of its recomputable ops reads a tieable value that no
    copy recomputes (fed, stored, or computed by an op the runtime does not let a
    copy recompute), else one past the earliest unit it reads a tieable value from
    (a run starting after that unit has the value outside it), else past the last
    unit (never). It takes a run's copies to be all its recomputable ops, so it is
    a necessary test only, which spares the exact one (``writable_runs``) the
    runs it rules out."""
    if step.dependency != "data" or not chain.units:
        return chain
    unit_of = {name: index for index, unit in enumerate(chain.units)
               for name in chain.order[unit.start:unit.end]}
    recomputable = {name: step.runtime.recomputable(graph, name) for name in unit_of}
    starts = [len(chain.units)] * len(chain.units)
    for name, index in unit_of.items():
        if not recomputable[name]:
            continue
        for tensor in graph.inputs(name):
            source = unit_of.get(tensor.node)
            if source == index and recomputable[tensor.node] or not tieable(graph, tensor):
                continue
            start = 0 if source is None or not recomputable[tensor.node] else source + 1
            starts[index] = min(starts[index], start)
    return replace(chain, units=[replace(u, tie_start=s) for u, s in zip(chain.units, starts)])


def orderable(graph: Graph, segment: Segment, step: Step) -> bool:
    """Whether ``segment``'s rewrite can order its copies in the step's mode (one
    that copies nothing has nothing to order)."""
    if step.dependency != "data":
        return True
    copies, _ = segment_copies(graph, segment, step)
    members = set(copies)
    return not copies or any(t.node not in members and tieable(graph, t)
               for name in copies for t in graph.inputs(name))


def writable_runs(graph: Graph, chain: ForwardChain, step: Step) -> Runs | None:
    """The chain's runs the rewrite can order, asked of the runs a plan holds
    (``plan.Runs``); None in control mode, which orders every run."""
    if step.dependency != "data":
        return None
    return Runs(lambda first, last: orderable(
        graph, Segment(chain.label(first, last), chain.nodes(first, last)), step))


def chain_left_out(chain: ForwardChain, runs: Runs | None) -> list[str]:
    """Labels of what the chain planner could not take: units that start no run it
    can order (``Unit.tie_start``), and runs a plan held that it cannot."""
    units = [chain.label(i, i) for i, u in enumerate(chain.units) if u.tie_start > i]
    banned = sorted(runs.banned) if runs else []
    return units + [chain.label(first, last) for first, last in banned]


def left_out_note(graph: Graph, step: Step, labels: list[str]) -> str | None:
    """The plan's note on what it left out as unorderable, or None; it names
    control mode only where the runtime takes it (``dependency_modes``)."""
    if not labels:
        return None
    shown = ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")
    runtime = step.runtime
    other = "--dependency control orders them" \
        if "control" in runtime.dependency_modes(graph) else \
        f"data mode is the only one {runtime.name} takes"
    return (f"not planned as segments of their own, as their copies would read no float "
            f"value computed in the step, which data mode orders copies after their "
            f"gradient by ({other}): {shown}")
