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
import errno
import json
import os
import shutil
import signal
import stat
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
    before anything is written, so that no output is written before a later one fails.
    An output that exists must be what graphpass would write there (a regular file,
    or a directory for ``directory``): a device, FIFO or socket would be replaced
    by the rename, not written to."""
    found = existing(path)
    if found is not None:
        _check_kind(path, found, directory)
    check_output_parent(path)
    check_name_length(path)


def _check_kind(path: Path, found: os.stat_result, directory: bool) -> None:
    if directory and not stat.S_ISDIR(found.st_mode):
        what = "a file" if stat.S_ISREG(found.st_mode) else _kind(found)
        raise GraphpassError(f"{path}: a SavedModel is a directory, but this is {what}; "
                             "choose a directory")
    if directory and any(path.iterdir()) and not any(
            (path / name).is_file() for name in ("saved_model.pb", "saved_model.pbtxt")):
        # The output directory is replaced as a whole: never one that holds something else.
        raise GraphpassError(f"{path}: the directory exists and is not a SavedModel, so it "
                             "would be replaced; choose a new or empty output directory")
    if not directory and stat.S_ISDIR(found.st_mode):
        raise GraphpassError(f"{path}: is a directory; name a file to write")
    if not directory and not stat.S_ISREG(found.st_mode):
        raise GraphpassError(f"{path}: exists and is {_kind(found)}, not a regular file; "
                             "graphpass replaces an output by renaming a new file over it, "
                             "so it writes only to a new path or a regular file")


def existing(path: Path) -> os.stat_result | None:
    """``path``'s status (following links), or None where nothing is there; a name
    the system cannot look up (too long, a NUL byte, a link loop) is a user error."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ENOENT or os.path.islink(path):
            return None  # a dangling link: the rename replaces the link itself
        raise GraphpassError(f"{path}: {exc.strerror}") from None
    except ValueError as exc:  # an embedded NUL byte
        raise GraphpassError(f"{path!r}: not a usable file name ({exc})") from None


def check_name_length(path: Path) -> None:
    """A user error unless the temporary name beside ``path`` (its name plus the
    writer's tag) fits the file system's limit, checked before any output is written."""
    parent = _parent(path)
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    needed = len(os.fsencode(f".{path.name}.{_TEMP_TAG}{os.getpid()}-xxxxxxxx-old.tmp"))
    if needed > limit:
        raise GraphpassError(
            f"{path}: the file name is too long ({len(os.fsencode(path.name))} bytes; this "
            f"file system allows {limit}, and graphpass's temporary name beside it adds "
            f"{needed - len(os.fsencode(path.name))}); choose a shorter name")


def _kind(found: os.stat_result) -> str:
    mode = found.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_output_parent(path: Path) -> None:
    """A user error unless the directory that will hold ``path`` exists and is writable."""
    parent = _parent(path)
    found = existing(parent)
    if found is not None and stat.S_ISDIR(found.st_mode):
        if not os.access(parent, os.W_OK | os.X_OK):
            raise GraphpassError(f"{path}: cannot write there ({parent} is not writable)")
        return
    if found is not None:
        raise GraphpassError(f"{path}: cannot write there ({parent} is a file, not a directory)")
    raise GraphpassError(f"{path}: the output directory {parent} does not exist")


@contextmanager
def atomic_output(path: Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it over ``path`` on success only."""
    check_output_path(path, directory=directory)
    remove_stale_temps(path)
    tmp = temp_beside(path, directory=directory)
    try:
        yield tmp
        kill_point("written")
        _replace(tmp, path, directory)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError):  # e.g. -o names a directory, or the disk is full
            raise GraphpassError(f"{path}: cannot write there ({exc.strerror or exc})") from None
        raise


def temp_beside(path: Path, *, directory: bool = False) -> Path:
    """A new, empty temporary file (or directory) beside ``path``, with the mode a
    new file gets, named ``.NAME.graphpass-PID-XXXX`` so that a later write of
    ``path`` removes it once this process is gone."""
    prefix = f".{path.name}.{_TEMP_TAG}{os.getpid()}-"
    try:
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=_parent(path)))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=_parent(path))
            os.close(fd)
            tmp = Path(name)
        os.chmod(tmp, (0o777 if directory else 0o666) & ~_umask())
    except OSError as exc:
        raise GraphpassError(f"{path}: cannot write there ({exc.strerror})") from None
    return tmp


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
    if directory and path.is_dir():
        _exchange(tmp, path)  # tmp now holds the old directory
        kill_point("exchanged")
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


def kill_point(name: str) -> None:
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
