"""The container kinds, and atomic output: every file graphpass writes (graphs,
reports, dumps) goes to a temporary file (or directory) beside the target and is
renamed over it only once complete, so a failure never leaves a partial or
clobbered output; the checks before any output is written live here too.

A directory output (SavedModel) replaces an existing one by an atomic
*exchange* of the two directories (Linux ``renameat2`` ``RENAME_EXCHANGE``), so
that at every instant the target path holds the old or the new directory,
never neither, even if the process is killed. Temporary names carry the
writer's process id (``.NAME.graphpass-PID-XXXX``); a later write of the same
target removes those of processes that are gone (killed mid-write), and a
failing write removes its own.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graphpass.errors import GraphpassError

GRAPHDEF, METAGRAPH, SAVEDMODEL, ONNX = "graphdef", "metagraph", "savedmodel", "onnx"

_TEMP_TAG = "graphpass-"
#: Linux ``renameat2`` flag: swap two paths atomically.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def check_output_path(path: Path, *, directory: bool = False) -> None:
    """A user error unless ``path`` can receive a file (or a directory): checked
    before anything is written, so that no output is written before a later one fails."""
    check_output_parent(path)
    if directory and path.exists() and not path.is_dir():
        raise GraphpassError(f"{path}: a SavedModel is a directory, but this is a file; "
                             "choose a directory")
    if not directory and path.is_dir():
        raise GraphpassError(f"{path}: is a directory; name a file to write")


def check_output_parent(path: Path) -> None:
    """A user error unless the directory that will hold ``path`` exists and is writable."""
    parent = _parent(path)
    if parent.is_dir():
        if not os.access(parent, os.W_OK | os.X_OK):
            raise GraphpassError(f"{path}: cannot write there ({parent} is not writable)")
        return
    if parent.exists():
        raise GraphpassError(f"{path}: cannot write there ({parent} is a file, not a directory)")
    raise GraphpassError(f"{path}: the output directory {parent} does not exist")


@contextmanager
def atomic_output(path: Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it over ``path`` on success only."""
    check_output_parent(path)
    remove_stale_temps(path)
    prefix = f".{path.name}.{_TEMP_TAG}{os.getpid()}-"
    try:
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=_parent(path)))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=_parent(path))
            os.close(fd)
            tmp = Path(name)
    except OSError as exc:
        raise GraphpassError(f"{path}: cannot write there ({exc.strerror})") from None
    try:
        yield tmp
        _kill_point("written")
        _replace(tmp, path, directory)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError):  # e.g. -o names a directory, or the disk is full
            raise GraphpassError(f"{path}: cannot write there ({exc.strerror or exc})") from None
        raise


def remove_stale_temps(path: Path) -> None:
    """Remove temporaries for ``path`` left by writers that were killed."""
    for leftover in sorted(_parent(path).glob(f".{path.name}.{_TEMP_TAG}*")):
        pid = leftover.name[len(f".{path.name}.{_TEMP_TAG}"):].split("-")[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if leftover.name.endswith("-old") and not path.exists():
            os.replace(leftover, path)  # killed inside the two-rename fallback of _exchange
        else:
            _remove(leftover)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _replace(tmp: Path, path: Path, directory: bool) -> None:
    os.chmod(tmp, (0o777 if directory else 0o666) & ~_umask())
    if directory and path.is_dir():
        _exchange(tmp, path)  # tmp now holds the old directory
        _kill_point("exchanged")
        _remove(tmp)
    else:
        os.replace(tmp, path)


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories atomically (Linux); elsewhere, two renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None and renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD,
                                           os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return
    # No atomic exchange here: b is briefly absent (old kept at a until then).
    old = a.with_name(a.name + "-old")
    os.replace(b, old)
    os.replace(a, b)
    os.replace(old, a)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _kill_point(name: str) -> None:
    """Test hook: ``GRAPHPASS_TEST_KILL_AT=name`` kills the process here (SIGKILL), to
    check that an output survives a kill at this point of its replacement."""
    if os.environ.get("GRAPHPASS_TEST_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def staged_json(path: Path, data: dict) -> Iterator[None]:
    """``data`` as sorted, indented JSON in a temporary file beside ``path`` now,
    renamed over ``path`` when the block succeeds (so it lands after what the block
    writes, and not at all if that fails)."""
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        yield


def write_json(path: Path, data: dict) -> None:
    """``data`` as sorted, indented JSON, written atomically."""
    with staged_json(path, data):
        pass
