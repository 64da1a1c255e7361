"""The files a command touches besides its options: models read through
``graphpass.load``, outputs checked before anything is written, the staged
``--report`` JSON and ``--feed`` arrays.

Each helper raises ``GraphpassError`` with a one-line message naming the file;
a missing runtime becomes the one line naming the extra to install. Nothing
here prints, and no model is written here (``graphpass.save`` does).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graphpass.errors import GraphpassError


def load(path, **kwargs):
    """``graphpass.load`` (``shapes=True`` for a command whose analyses read every
    shape), then everything alive moved out of the cyclic collector's reach
    (``gc.freeze``): the graph lives until the command ends, its many objects hold
    no garbage cycles, and every full collection would scan them all. Frozen
    objects are still freed when their last reference goes; ``main`` unfreezes
    when the command ends."""
    import graphpass
    from graphpass.runtimes import runtimes_required

    with runtimes_required("reading"):
        graph = graphpass.load(path, **kwargs)
    gc.freeze()
    return graph


@contextmanager
def frozen_graphs() -> Iterator[None]:
    """Undo, when the command ends, what :func:`load` froze (``main`` runs many
    commands in one process under the tests)."""
    try:
        yield
    finally:
        gc.unfreeze()


def check_output(source: Path, target: Path, in_place: bool, file: bool = False) -> None:
    """Checks before anything is read or written: not the input, a writable place
    (and for ``file``, not a directory)."""
    if target.exists() and source.exists() and target.resolve() == source.resolve() \
            and not in_place:
        raise GraphpassError(
            f"the output {target} is the input; choose another -o or pass --in-place"
        )
    from graphpass.formats.files import check_output_parent, check_output_path

    if file:
        check_output_path(target)
    else:
        check_output_parent(target)


@contextmanager
def staged_json(path: str | None, data: dict) -> Iterator[None]:
    """Write ``data`` to a temporary file beside ``path`` now, rename it when the
    block succeeds; no-op without a path."""
    if not path:
        yield
        return
    from graphpass.formats.files import staged_json as staged

    with staged(Path(path), data):
        yield


def read_feeds(specs: list[str]) -> dict:
    """``NAME=FILE.npy`` options as ``{NAME: array}``."""
    import numpy as np

    from graphpass.formats.container import check_regular_file

    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise GraphpassError(f"--feed {spec!r}: expected NAME=FILE.npy")
        check_regular_file(Path(path), f"--feed {name}=")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise GraphpassError(f"--feed {spec}: cannot read {path} as a .npy array "
                                 f"({exc})") from None
    return feeds
