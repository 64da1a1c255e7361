"""The one exception type for user errors.

A :class:`GraphpassError` means the *input or the options* are wrong, not the
code: the CLI prints its message as a single line and exits with status 2.
Anything else that escapes is an internal bug and keeps its traceback.
"""


class GraphpassError(Exception):
    """A problem the user can fix; the message says what is wrong and how."""
