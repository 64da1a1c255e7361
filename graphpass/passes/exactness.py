"""What every pass shares of a rewrite's exactness: the check the options ask for
(the target runtime's, ``RuntimeModel.exactness``, or none with ``--exactness
trust``) and which node of a rewrite stands for which original.

A pass asks before it keeps a rewrite: remat repairs what the runtime would
compute otherwise (``passes/remat/exactness.py``), the stale gate refuses it.
"""

from __future__ import annotations

from graphpass.ir.graph import Graph
from graphpass.options.types import ALLOW_INEXACT, TRUST
from graphpass.passes.context import PassContext
from graphpass.runtimes import Difference, ExactnessCheck

#: Names graphpass gives the nodes it adds (the readers' return values, copies,
#: gates, counters): none of them is a user's node.
GENERATED_SCOPE = "graphpass/"


class Trusted:
    """``--exactness trust``: the check the user chose not to make."""

    configurations: tuple[str, ...] = ()
    unchecked = "--exactness trust"

    def differences(self, rewritten: Graph, stands_for) -> list[Difference]:
        return []


def checks_exactness(ctx: PassContext) -> bool:
    """The options ask the runtime to check rewrites (not ``--exactness trust``)."""
    return ctx.exactness != TRUST


def exactness_check(ctx: PassContext, graph: Graph,
                    fetches: list[str]) -> ExactnessCheck | Trusted | None:
    """The check of rewrites of ``graph`` the options ask for: the target runtime's
    (None where it cannot be asked), or :class:`Trusted`."""
    if not checks_exactness(ctx):
        return Trusted()
    return ctx.runtime(graph).exactness(graph, fetches)


def inexact_allowed(ctx: PassContext) -> bool:
    """``--exactness allow-inexact``: a rewrite the runtime computes otherwise is
    written, what differs named (the CLI measures by how much)."""
    return ctx.exactness == ALLOW_INEXACT


def inexact_lines(found: list[Difference]) -> list[str]:
    """The summary's lines of a rewrite written although the runtime computes
    ``found`` otherwise."""
    return [f"  written although TF computes {len(found)} value(s) otherwise "
            "(--exactness allow-inexact; the difference is measured below):",
            *(f"    {d.describe()}" for d in found[:3])]


def differences_json(found: list[Difference]) -> list[dict]:
    return [{"node": d.node, "original": d.original, "reason": d.reason,
             "configuration": d.configuration} for d in found]


def checked_line(check: ExactnessCheck | Trusted | None, verdict: str) -> list[str]:
    """The summary's line of a check: where it asked and ``verdict``, or why not."""
    if check is None:
        return []
    if check.unchecked:
        return [f"exactness not checked: {check.unchecked} (check with verify)"]
    return [f"exactness checked on the graph TF runs, {' and '.join(check.configurations)}: "
            + verdict]


def checked_json(check: ExactnessCheck | Trusted | None) -> dict:
    """The report's ``exactness``: where it was checked, or why not."""
    if check is None or check.unchecked:
        return {"checked": False,
                "reason": check.unchecked if check else "the target runtime cannot be asked"}
    return {"checked": True, "configurations": list(check.configurations)}


def added_nodes(rewritten: Graph, original: Graph):
    """A rewrite that copies nothing but adds nodes (a gate, a counter): every node
    stands for the node of its name, except those added, and what the runtime
    makes of them (named under them: TF's Switches of a lowered conditional),
    which only order or gate others."""
    added = set(rewritten) - set(original)

    def stands_for(name: str) -> str | None:
        prefix = name
        while prefix:
            if prefix in added:
                return None
            prefix = prefix.rpartition("/")[0]
        return name

    return stands_for


def kept_names(name: str) -> str | None:
    """The nodes of a rewrite that are no copies: each stands for the node of its
    name, except what graphpass added (under ``GENERATED_SCOPE``), which only
    orders or gates others."""
    return None if name.startswith(GENERATED_SCOPE) else name
