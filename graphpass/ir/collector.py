"""Python's cyclic garbage collector paused while a large graph is built or copied.

Only the context manager: it never collects, tunes thresholds or holds state past
the ``with`` block.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block: building or copying a graph makes
    millions of small containers and no cycles, and the collector's repeated scans
    of them would make reading and copying grow faster than the graph."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
