"""Stale-gradient dropping, the drop counter: a float variable incremented on
each dropped step, initialised by the graph's init op(s), and the optional
``stale_counter / (global_step + 1)`` summary.

It adds the counter's nodes through the dialect's ``ConditionalBuilder``; it
never touches an existing Saver.
"""

from __future__ import annotations

from graphpass.dialects.capabilities import ResourceVariable
from graphpass.errors import GraphpassError
from graphpass.ir.graph import Graph
from graphpass.options import StaleOptions
from graphpass.passes.stale.gate import SCOPE

DEFAULT_COUNTER = "graphpass/stale_counter"
SUMMARY_TAG = "Gradient_staleness_percentage"


def make_counter(graph: Graph, opts: StaleOptions,
                  global_step: str) -> ResourceVariable | None:
    """The drop counter; None in a function body, which cannot gain a variable (its
    variables are the captured arguments its SavedModel passes): the If's result
    says whether a step was dropped there."""
    dialect = graph.dialect
    requested = opts.counter
    if dialect.step.in_function_body(graph):
        if requested or opts.summary:
            raise GraphpassError(
                "--stale-counter and --staleness-summary need a variable the rewrite adds, "
                "and a function body (a TF2 train signature) cannot gain one; leave them out")
        return None
    if requested is not None and requested in graph:
        raise GraphpassError(f"--stale-counter {requested!r} names an existing node; choose a "
                             "new name")
    name = requested or graph.unique_name(DEFAULT_COUNTER)
    counter = dialect.resource_variable(graph, name, 0.0, "float32",
                                        device=graph.node(global_step).device)
    dialect.colocate(graph, counter.handle, global_step)
    dialect.register_global_variable(graph, counter)
    return counter


def initialise(graph: Graph, counter: ResourceVariable) -> list[str]:
    """Make the graph's init op(s) initialise the counter too; returns their names."""
    groups = graph.dialect.initializer_groups(graph)
    for name in groups:
        graph.add_control_input(name, counter.initializer)
    return groups


def add_summary(graph: Graph, counter: ResourceVariable, global_step: str) -> str:
    """``stale_counter / (global_step + 1)``, as TF's optimizer summarises it."""
    dialect = graph.dialect
    scope = f"{SCOPE}/summary"
    device = graph.node(global_step).device
    step = dialect.read_variable(graph, f"{scope}/global_step", global_step)
    one = dialect.constant(graph, f"{scope}/one", 1, dialect.get_attr(graph, global_step,
                                                                          "dtype"), device)
    steps = dialect.cast(graph, f"{scope}/steps", dialect.binary(graph, f"{scope}/plus_one",
                                                                  "add", step, one), "float32")
    ratio = dialect.binary(graph, f"{scope}/ratio", "div", counter.read, steps)
    summary = dialect.scalar_summary(graph, f"{scope}/{SUMMARY_TAG}", SUMMARY_TAG, ratio)
    dialect.add_to_collection(graph, "summaries", summary)
    return summary.node
