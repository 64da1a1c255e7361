"""What the remat pass says of a rewrite's exactness, as the runtime judged it
(``RuntimeModel.exactness``): checked under which configurations, which copies it
left out because the runtime computes them otherwise, or why it could not ask.

A copy the runtime computes otherwise is not written: the pass undoes the rewrite
and makes it again with those values kept (``RuntimeModel.knowing_computed_otherwise``),
at most ``EXACTNESS_ROUNDS`` times, then without copying anything; where even that
differs, the pass leaves the graph as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphpass.ir.graph import Graph
from graphpass.passes.remat.marks import GENERATED_SCOPE, SCOPE
from graphpass.runtimes import Difference, ExactnessCheck
from graphpass.runtimes.base import StandsFor

#: Rewrites made again after a check found copies computed otherwise.
EXACTNESS_ROUNDS = 3


def stands_for_in(graph: Graph, segments: list[dict]) -> StandsFor:
    """Which original each node of the rewritten ``graph`` stands for: a copy, the
    node it copies (``segments``: the pass's entries, with their copies); a node
    the runtime made of a copy (unknown to the IR, under the copies' scope), the
    original it would have made it of; the other nodes graphpass added (ties,
    ordering reads, kept readers), None: they only order others."""
    copies = {c for entry in segments for c in entry["copies"]}

    def stands_for(name: str) -> str | None:
        if name in copies or (name.startswith(SCOPE) and name not in graph):
            return name[len(SCOPE):]
        return None if name.startswith(GENERATED_SCOPE) else name

    return stands_for


class Trusted:
    """``--exactness trust``: the check the user chose not to make."""

    configurations: tuple[str, ...] = ()
    unchecked = "--exactness trust"

    def differences(self, rewritten: Graph, stands_for: StandsFor) -> list[Difference]:
        return []


@dataclass
class Exactness:
    """``check``: the runtime's check, None where the runtime cannot be asked."""

    check: ExactnessCheck | None
    left_out: list[Difference] = field(default_factory=list)
    copying_nothing: bool = False
    refused: bool = False

    def summary(self) -> list[str]:
        if self.check is None:
            return []
        if self.check.unchecked:
            return [f"exactness not checked: {self.check.unchecked} (check with verify)"]
        checked = " and ".join(self.check.configurations)
        lines = [f"exactness checked on the graph TF runs, {checked}: "
                 + ("the rewrite computed otherwise and was not made" if self.refused
                    else "every copy and original computes what the original does")]
        kept = sorted({o for d in self.left_out for o in d.copied})
        if self.copying_nothing and not self.refused:
            lines.append("  nothing is recomputed: with copies, TF computed otherwise where "
                         "no copy is near (the rewrite's ordering)")
        elif kept:
            lines.append(f"  {len(kept)} values kept, not recomputed, where copies "
                         f"computed otherwise: {', '.join(kept[:3])}"
                         f"{' ...' if len(kept) > 3 else ''}")
        if self.left_out:
            lines.extend(f"    {d.describe()}" for d in self.left_out[:3])
        return lines

    def to_json(self) -> dict:
        if self.check is None or self.check.unchecked:
            reason = self.check.unchecked if self.check else \
                "the target runtime cannot be asked"
            return {"checked": False, "reason": reason}
        return {"checked": True, "configurations": list(self.check.configurations),
                "refused": self.refused,
                "kept": sorted({o for d in self.left_out for o in d.copied}),
                "differences": [{"node": d.node, "original": d.original, "reason": d.reason,
                                 "configuration": d.configuration}
                                for d in self.left_out]}
