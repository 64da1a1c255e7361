"""A candidate plan judged as the pass would write it: rewritten on a copy of the
graph and estimated on the step's runtime, never modelled apart from the rewrite.
``auto``'s planners (the chain's DP and its refinement, the time limit, ``cheap``)
ask one :class:`Trials` of the graph for every figure they compare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from graphpass.analysis.cost import StepTime
from graphpass.analysis.estimate import step_profile
from graphpass.analysis.forward import ForwardChain
from graphpass.analysis.memory import MemoryProfile
from graphpass.ir.graph import Graph
from graphpass.options import RematOptions
from graphpass.passes.remat.defer import can_defer, defer_updates
from graphpass.passes.remat.marks import Segment
from graphpass.passes.remat.pin import add_waits, pin_updates, state_math_waits, update_reads
from graphpass.passes.remat.plan import ChainPlan
from graphpass.passes.remat.rewrite import Step, rewrite_segments

#: The estimate a plan is judged by: the step's graph, its fetches and the batch size.
Estimator = Callable[[Graph, list[str], "int | None"], MemoryProfile]


def step_estimator(step: Step) -> Estimator:
    """The estimate of ``step``'s runtime (``analysis.estimate.step_profile``), with
    the user's ``--loop-trips``."""
    return lambda graph, fetches, batch: step_profile(graph, fetches, batch, step.loop_trips,
                                                      step.runtime)


class Trials:
    """The candidates of one planning run over ``chain``: each rewritten on a copy
    of ``graph`` with the optimizer values that wait for their gradients and the
    updates pinned (``pin``: both move work in the executor's order), estimated by
    ``step``'s runtime, its copies timed by ``time_model``."""

    def __init__(self, graph: Graph, step: Step, options: RematOptions,
                 chain: ForwardChain, time_model: StepTime) -> None:
        self.graph, self.step, self.chain, self.time_model = graph, step, chain, time_model
        self.batch_size, self.tupleize_grads = options.batch_size, options.tupleize_grads
        self.waits = state_math_waits(graph, step)
        self.deferrable = can_defer(graph, step)
        self._run = step_estimator(step)
        #: Where the executor runs the newest ready node first and copies are tied by
        #: control edges, recomputing segments in turn can matter (``turns``).
        self._in_turn_matters = step.runtime.queues_newest_first and \
            step.dependency == "control"

    def rewritten(self, segments: list[Segment]) -> tuple[Graph, list[dict]]:
        """A copy rewritten as the pass writes ``segments``, and the rewrite's entries."""
        copy = self.graph.copy()
        entries = rewrite_segments(copy, segments, self.step, self.tupleize_grads)
        add_waits(copy, self.waits)
        pin_updates(copy, self.step)
        return copy, entries

    def estimate(self, segments: list[Segment]) -> int:
        """The peak of the step as the pass writes it: the updates deferred where
        that is lower (``defer``)."""
        copy = self.rewritten(segments)[0]
        peak = self._run(copy, self.step.fetches, self.batch_size).peak_bytes
        deferred = defer_updates(copy, self.step, self.batch_size, peak)
        return peak if deferred is None else deferred[1].peak_bytes

    def unplanned(self, before: int) -> int:
        """The step as written without a segment (the chain model is calibrated on
        it): ``before`` unless the rewrite adds waits or pins update reads."""
        return self.estimate([]) if self.waits or update_reads(self.graph, self.step) \
            else before

    def turns(self, segments: list[Segment], in_turn: int | None = None
              ) -> tuple[list[Segment], int]:
        """``segments`` recomputed in turn (``order.order_segments``) or each only
        after its own trigger, whichever the estimate puts lower, and its figure
        (``in_turn``: the estimate in turn, where the caller has it). Waiting in
        turn bounds the copies held at once where the executor would leave weight
        gradients to the end; where groups share copies (``cheap``), or a
        weight's gradient itself waits for the weight's readers (``pin``), the
        waits can hold copies longer instead."""
        if in_turn is None:
            in_turn = self.estimate(segments)
        if len(segments) < 2 or not self._in_turn_matters:
            return segments, in_turn
        alone = [replace(s, in_turn=False) for s in segments]
        other = self.estimate(alone)
        return (alone, other) if other < in_turn else (segments, in_turn)

    def segments(self, plan: ChainPlan, in_turn: bool = True) -> list[Segment]:
        """One segment per recomputed run of the chain's units (labels for display)."""
        return [Segment(self.chain.label(first, last), self.chain.nodes(first, last),
                        in_turn=in_turn) for first, last in plan.runs]

    def chain_estimate(self, plan: ChainPlan) -> int:
        return self.estimate(self.segments(plan))

    def chain_trial(self, runs: tuple[tuple[int, int], ...]):
        """A chain plan rewritten on a copy: the copy, each run's copies, the step
        (the updates not deferred: the refinement reads what the runs leave live
        in the backward pass, which deferring moves nothing of)."""
        copy, entries = self.rewritten(self.segments(ChainPlan(runs, 0, 0)))
        return (copy, [e["copies"] for e in entries],
                self._run(copy, self.step.fetches, self.batch_size))

    def extra_time(self, plan: ChainPlan) -> float:
        """What the plan's copies add to the step's predicted time (``StepTime``)."""
        entries = self.rewritten(self.segments(plan))[1]
        return self.time_model.extra([o for e in entries for o in e["recomputes"]])
