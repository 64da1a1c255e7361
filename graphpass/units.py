"""Byte counts: parsed from options (``300MiB``) and formatted for people."""

from __future__ import annotations

import re

from graphpass.errors import GraphpassError

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
        amount, unit = float(found.group(1)), found.group(2)
    if amount < 0:
        raise GraphpassError(f"{option} {value!r}: must not be negative")
    return int(amount * _UNITS[unit])


def format_bytes(value: int) -> str:
    """Bytes for people: MiB, or KiB below one MiB (small test graphs)."""
    if value < 2**20:
        return f"{value / 2**10:.1f} KiB"
    return f"{value / 2**20:.2f} MiB"
