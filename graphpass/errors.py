"""The one exception type for user errors, and the one place its text is made
safe to print.

A :class:`GraphpassError` means the *input or the options* are wrong, not the
code: the CLI prints :func:`error_line` of it as a single line and exits with
status 2. Anything else that escapes is an internal bug and keeps its traceback.
Nothing here decides what a message says; :func:`error_line` only shortens and
escapes what the raiser wrote.
"""

from __future__ import annotations

import re

#: The most characters of any one name (a run without spaces) an error line quotes.
NAME_LIMIT = 200
#: The most characters of a whole error line: names with spaces are runs of short words.
LINE_LIMIT = 2000

_WORD = re.compile(r"\S+")


class GraphpassError(Exception):
    """A problem the user can fix; the message says what is wrong and how."""


def escaped(text: str) -> str:
    """``text`` with every non-printable character (NUL, newlines, other control
    bytes, lone surrogates from undecodable file names) written as its Python
    escape, so that an error stays one printable line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shortened(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` cut in the middle to about ``limit`` characters, saying how many
    were left out (both ends of a name are the parts that tell names apart)."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]}...[{len(text) - head - tail} characters]...{text[-tail:]}"


def error_line(exc: BaseException) -> str:
    """The printable one-line form of ``exc``'s message: escaped, no name longer
    than :data:`NAME_LIMIT`, the whole at most about :data:`LINE_LIMIT`."""
    text = escaped(str(exc))
    text = _WORD.sub(lambda m: shortened(m.group()), text)
    return shortened(text, LINE_LIMIT)
