"""A SavedModel's files besides ``saved_model.pb`` (``variables/``, ``assets/``,
``assets.extra/``): planned and checked first, then copied by the plan.

A reader of the model follows symbolic links, so the copy does too, but only
to what the plan walked: each directory is entered once, a link to a directory
that holds the link (``assets/up -> ..``, ``variables/x -> .``) is a cycle, and
a directory reached a second time (two links to it, or a link to another extra)
is refused, so the copy is as large as the files the model holds, never more.
Anything that resolves outside the model's directory, or is not a regular file
or directory, is refused. Every refusal comes before anything is copied; the
copy reads only the resolved paths the plan checked.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from graphpass.errors import GraphpassError

#: The directories (or files) a SavedModel holds beside ``saved_model.pb``.
EXTRAS = ("variables", "assets", "assets.extra")


@dataclass(frozen=True)
class Entry:
    """One item of the copy: the resolved path read, its path inside the output."""

    source: Path
    target: Path
    directory: bool


def plan_extras(source_dir: Path) -> list[Entry]:
    """Every directory and file the extras of the SavedModel at ``source_dir`` hold,
    parents before children; a user error for the first item that may not be copied
    (module docstring)."""
    root = Path(os.path.realpath(source_dir))
    entered: dict[Path, Path] = {}  # real directory -> the path it was first entered by
    plan: list[Entry] = []
    for name in EXTRAS:
        top = source_dir / name
        if not os.path.lexists(top):
            continue
        stack = [(top, Path(name), root)]
        while stack:
            item, target, container = stack.pop()
            real = Path(os.path.realpath(item))
            if not real.is_relative_to(root):
                raise GraphpassError(f"{item}: a symbolic link to {real}, outside the SavedModel "
                                     "directory; graphpass copies only files inside it")
            kind = _kind(real)
            if kind == "directory":
                _check_enter(item, real, container, entered)
                entered[real] = item
                plan.append(Entry(real, target, True))
                children = sorted(os.listdir(real), reverse=True)
                stack.extend((item / child, target / child, real) for child in children)
            elif kind == "file":
                plan.append(Entry(real, target, False))
            else:
                raise GraphpassError(f"{item}: not a regular file or directory (or a broken "
                                     "link); a SavedModel holds only files and directories")
    return plan


def _kind(real: Path) -> str | None:
    try:
        mode = os.stat(real).st_mode
    except OSError:  # broken, or a loop of links (ELOOP)
        return None
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else None


def _check_enter(item: Path, real: Path, container: Path, entered: dict[Path, Path]) -> None:
    """Refuse to enter ``real`` (reached by ``item``, a name in the real directory
    ``container``) where it holds ``item`` itself or was entered before."""
    if container == real or container.is_relative_to(real):
        raise GraphpassError(f"{item}: a symbolic link to {real}, which holds the link (a "
                             "link cycle); a SavedModel's links may not lead back up its tree")
    if real in entered:
        raise GraphpassError(f"{item} and {entered[real]} are the same directory (through a "
                             "symbolic link); graphpass copies each directory once")


def copy_extras(plan: list[Entry], into: Path) -> None:
    """Copy what :func:`plan_extras` planned into the directory ``into``; directories
    take their modes and times last, as ``shutil.copytree`` gives them."""
    for entry in plan:
        if entry.directory:
            (into / entry.target).mkdir()
        else:
            shutil.copy2(entry.source, into / entry.target)
    for entry in reversed(plan):
        if entry.directory:
            shutil.copystat(entry.source, into / entry.target)
