"""Byte counts: parsed from options (``300MiB``) and formatted for people."""

from __future__ import annotations

import re
from decimal import Decimal

from graphpass.errors import GraphpassError

#: The most bytes a count may hold: an int64, as the planner's arrays do.
MAX_BYTES = 2**63 - 1

_UNITS = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_bytes(value: int | str, option: str = "--memory-budget-bytes") -> int:
    """A byte count: an integer, or a number with a binary unit (``300MiB``, ``1.5GiB``);
    ``option`` names the option in the error."""
    if isinstance(value, int) and not isinstance(value, bool):
        amount, unit = value, ""
    else:
        found = _SIZE.fullmatch(str(value))
        if not found or found.group(2) not in _UNITS:
            raise GraphpassError(
                f"{option} {value!r}: expected a byte count such as 314572800 "
                f"or a number with a unit ({', '.join(u for u in _UNITS if u)}), e.g. 300MiB")
        # Exact decimal arithmetic: a float is infinite past 1e308 and loses digits.
        amount, unit = Decimal(found.group(1)), found.group(2)
    if amount < 0:
        raise GraphpassError(f"{option} {value!r}: must not be negative")
    total = amount * _UNITS[unit]
    if total > MAX_BYTES:
        raise GraphpassError(f"{option} {quoted(value)}: out of range; at most "
                             f"{MAX_BYTES} bytes (8 EiB)")
    return int(total)


def quoted(value: int | str) -> str:
    """``value`` as an error quotes it: a number of hundreds of digits by its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def format_bytes(value: int) -> str:
    """Bytes for people: MiB, or KiB below one MiB (small test graphs)."""
    if value < 2**20:
        return f"{value / 2**10:.1f} KiB"
    return f"{value / 2**20:.2f} MiB"
