"""A one-line progress indicator for long operations (verify steps, dumps).

It writes only when its stream is a terminal and the user did not ask for
``--quiet``: build logs and CI output stay clean, and a person at a terminal
sees that a slow step is moving. The line is redrawn in place (``\\r``) and
erased when the operation ends, so it never mixes with the real output.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from graphpass.ir.graph import Graph
from graphpass.passes.instrument import Instrument, NamedPass


class Progress:
    """``with Progress("verify", total=3) as p: p.update(1, "step 1")``."""

    def __init__(self, label: str, total: int | None = None, *, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _is_terminal(self.stream)
        self._width = 0

    def update(self, done: int, detail: str = "") -> None:
        """Redraw the line: ``label done/total detail``."""
        if not self.enabled:
            return
        count = f"{done}/{self.total}" if self.total is not None else str(done)
        text = f"graphpass: {self.label} {count} {detail}".rstrip()
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def close(self) -> None:
        """Erase the line so the next output starts clean."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False


class PassProgress(Instrument):
    """Pipeline instrument: ``rewrite pass 2/3 remat (52000 nodes)`` on a terminal,
    naming each pass as it starts and erasing the line when the pipeline ends."""

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.stream = stream
        self.progress: Progress | None = None
        self._total = self._done = 0

    def before_pipeline(self, graph: Graph, passes: Sequence[NamedPass]) -> None:
        self._total, self._done = len(passes), 0
        self.progress = Progress("rewrite pass", total=self._total, quiet=self.quiet,
                                 stream=self.stream)

    def before_pass(self, pass_: NamedPass, graph: Graph) -> None:
        self.progress.update(self._done + 1, f"{pass_.name} ({len(graph)} nodes)")

    def after_pass(self, pass_: NamedPass, graph: Graph, changed: bool, seconds: float) -> None:
        self._done += 1
        if self._done == self._total:
            self.progress.close()
