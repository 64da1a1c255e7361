"""How deeply a text file nests, read before a recursive parser sees it.

Protobuf's text parser and Python's TOML parser recurse once (or more) per
level, so a file nested a few thousand levels deep ends in ``RecursionError``
deep inside them. The depth is counted first, in one vectorised pass over the
text with quoted strings and comments blanked, and a file deeper than
:data:`MAX_DEPTH` is a user error.
"""

from __future__ import annotations

import re

from graphpass.errors import GraphpassError

#: The deepest nesting read: protobuf's own limit for binary messages, and far
#: beyond any GraphDef, MetaGraphDef or config file a tool writes.
MAX_DEPTH = 100
_QUOTED = re.compile(rb'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*')


def check_nesting(data: bytes, where: str, opens: bytes = b"{<[",
                  closes: bytes = b"}>]") -> None:
    """A user error naming ``where`` if ``data`` nests deeper than :data:`MAX_DEPTH`
    brackets of ``opens``/``closes`` (outside strings and ``#`` comments)."""
    import numpy as np

    if sum(data.count(bytes([c])) for c in opens) <= MAX_DEPTH:
        return  # cannot nest deeper than it opens
    codes = np.frombuffer(_QUOTED.sub(b"", data), dtype=np.uint8)
    step = np.isin(codes, list(opens)).astype(np.int64) - np.isin(codes, list(closes))
    depth = int(np.cumsum(step).max(initial=0))
    if depth > MAX_DEPTH:
        raise GraphpassError(f"{where}: nested {depth} levels deep, more than the "
                             f"{MAX_DEPTH} graphpass reads; the file is malformed or hostile")
