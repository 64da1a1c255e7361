"""The user's name-scope patterns (``--recompute REGEX``), compiled by RE2.

A pattern comes from the command line or a config file and is matched against
every node name of a graph that may come from anyone. Python's ``re``
backtracks, so a pattern such as ``(.*)*$x`` takes time exponential in a
name's length; RE2 (``google-re2``) matches in time linear in the name, with
a bounded memory for the compiled pattern. Its syntax is Python's for what a
name-scope pattern needs (classes, groups, alternation, repetition, anchors);
lookaround and backreferences, which only a backtracking engine can offer,
are refused with one line.
"""

from __future__ import annotations

from graphpass.errors import GraphpassError

#: The most bytes RE2 may spend on one compiled pattern (its default, 8 MiB);
#: a pattern that needs more (``(a{999}){999}``) is refused.
MAX_PATTERN_MEMORY = 8 << 20


def compile_pattern(pattern: str, flag: str = "--recompute"):
    """``pattern`` compiled by RE2 (``.match(name)`` anchors at the start of the
    name, as Python's ``re.match``); a user error names what RE2 cannot take."""
    import re2

    options = re2.Options()
    options.log_errors = False  # RE2 writes to stderr otherwise: the error is ours
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise GraphpassError(f"{flag} {pattern!r} is not a pattern graphpass can match "
                             f"({why.split(':')[0]}); patterns use RE2's syntax, which has "
                             "no lookaround or backreferences") from None
