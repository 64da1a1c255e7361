"""The container kinds, and atomic output: every file graphpass writes (graphs,
reports, dumps) goes to a temporary file (or directory) beside the target and is
renamed over it only once complete, so a failure never leaves a partial or
clobbered output."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graphpass.errors import GraphpassError

GRAPHDEF, METAGRAPH, SAVEDMODEL, ONNX = "graphdef", "metagraph", "savedmodel", "onnx"


@contextmanager
def atomic_output(path: Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it over ``path`` on success only."""
    parent = path.parent if str(path.parent) else Path(".")
    check_output_parent(path)
    try:
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as exc:
        raise GraphpassError(f"{path}: cannot write there ({exc.strerror})") from None
    try:
        yield tmp
        _replace(tmp, path, directory)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True) if directory else tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # e.g. -o names a directory, or the disk is full
            raise GraphpassError(f"{path}: cannot write there ({exc.strerror or exc})") from None
        raise


def check_output_parent(path: Path) -> None:
    """A user error unless the directory that will hold ``path`` exists."""
    parent = path.parent if str(path.parent) else Path(".")
    if parent.is_dir():
        return
    if parent.exists():
        raise GraphpassError(f"{path}: cannot write there ({parent} is a file, not a directory)")
    raise GraphpassError(f"{path}: the output directory {parent} does not exist")


def _replace(tmp: Path, path: Path, directory: bool) -> None:
    if not directory:
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return
    if path.is_dir():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    """``data`` as sorted, indented JSON, written atomically."""
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
