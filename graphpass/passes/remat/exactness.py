"""What the remat pass says of a rewrite's exactness, as the runtime judged it
(``RuntimeModel.exactness``): checked under which configurations, which copies it
left out because the runtime computes them otherwise, or why it could not ask.

A copy the runtime computes otherwise is not written: the pass undoes the rewrite
and makes it again with those values kept (``RuntimeModel.knowing_computed_otherwise``),
at most ``EXACTNESS_ROUNDS`` times, then without copying anything; where even that
differs, the pass leaves the graph as it was. What it keeps widens per difference
(``Exactness.keep``): the nearest copies first, every copy near it when found again
or in the last round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphpass.ir.graph import Graph
from graphpass.passes.exactness import (
    Trusted,
    checked_json,
    checked_line,
    differences_json,
    inexact_lines,
    kept_names,
)
from graphpass.passes.remat.marks import SCOPE
from graphpass.runtimes import Difference, ExactnessCheck
from graphpass.runtimes.base import StandsFor

#: Rewrites made again after a check found copies computed otherwise.
EXACTNESS_ROUNDS = 3
#: How many distances of copies a difference found the first time keeps.
NEAREST = 1


def stands_for_in(graph: Graph, segments: list[dict]) -> StandsFor:
    """Which original each node of the rewritten ``graph`` stands for: a copy, the
    node it copies (``segments``: the pass's entries, with their copies); a node
    the runtime made of a copy (unknown to the IR, under the copies' scope), the
    original it would have made it of; the other nodes graphpass added (ties,
    ordering reads, kept readers), None: they only order others."""
    copies = {c: o for entry in segments for c, o in zip(entry["copies"], entry["recomputes"])}

    def stands_for(name: str) -> str | None:
        if name in copies:  # not always the scope plus its name: a second copy is renamed
            return copies[name]
        if name.startswith(SCOPE) and name not in graph:
            return name[len(SCOPE):]
        return kept_names(name)

    return stands_for


@dataclass
class Exactness:
    """``check``: the runtime's check, None where the runtime cannot be asked."""

    check: ExactnessCheck | Trusted | None
    left_out: list[Difference] = field(default_factory=list)
    copying_nothing: bool = False
    refused: bool = False
    #: What the runtime computes otherwise in the rewrite written anyway
    #: (``--exactness allow-inexact``).
    written_anyway: list[Difference] = field(default_factory=list)
    #: The originals kept, not recomputed, because copies computed otherwise.
    kept: set[str] = field(default_factory=set)
    #: The differences found in earlier rewrites, by ``Difference.found_at``.
    found_before: set[str] = field(default_factory=set)

    def keep(self, found: list[Difference], last: bool) -> set[str]:
        """The originals the next rewrite keeps for ``found``: of a difference found
        the first time, its nearest copies' (Grappler regroups by how many read the
        values beside a node: every copy near it is far more than the cause); found
        again, or for the ``last`` rewrite the rounds allow, every copy near it (the
        cause sat further away, or keeping values moved it). So a difference costs
        at most two rewrites more. ``found`` is recorded as left out."""
        self.left_out.extend(found)
        widened = {d.found_at for d in found if last or d.found_at in self.found_before}
        self.found_before |= {d.found_at for d in found}
        chosen = {o for d in found
                  for o in d.copied(None if d.found_at in widened else NEAREST)}
        self.kept |= chosen
        return chosen

    def summary(self) -> list[str]:
        if self.written_anyway:
            return checked_line(self.check, "the rewrite computes otherwise") \
                + inexact_lines(self.written_anyway)
        lines = checked_line(self.check, "the rewrite computed otherwise and was not made"
                             if self.refused else
                             "every copy and original computes what the original does")
        if not lines or self.check.unchecked:
            return lines
        kept = sorted(self.kept)
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
        checked = checked_json(self.check)
        if not checked["checked"]:
            return checked
        return {**checked, "refused": self.refused,
                "kept": sorted(self.kept),
                "differences": differences_json(self.left_out),
                "inexact": differences_json(self.written_anyway)}
