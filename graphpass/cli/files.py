"""The files a command touches besides its options: models read through
``graphpass.load``, outputs checked before anything is written, the staged
``--report`` JSON and ``--feed`` arrays.

Each helper raises ``GraphpassError`` with a one-line message naming the file;
a missing runtime becomes the one line naming the extra to install. Nothing
here prints, and no model is written here (``graphpass.save`` does).
"""

from __future__ import annotations

import gc
import os
import stat
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
    from graphpass.installed import runtimes_required

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


#: How each kind of output is written: a file renamed into place, a SavedModel
#: directory exchanged for the old one, or a dumps directory written into.
FILE, GRAPH, DUMPS = "file", "graph", "dumps"


def check_outputs(inputs: dict[str, Path], outputs: dict[str, tuple[Path, str]],
                  in_place: bool = False) -> None:
    """Checks before anything is read or written. ``inputs``: ``{label: path}`` of
    every file the command reads; ``outputs``: ``{label: (path, kind)}`` of every
    output (kinds above). Each output is distinct from every input and every other
    output (compared as resolved paths and, where both exist, as the same file
    through links), lies in no input directory, holds no input, and where it exists
    is what graphpass would write there. ``in_place`` allows the graph (``-o``) to
    be its input."""
    from graphpass.formats.files import check_output_path, existing

    for path in inputs.values():
        existing(path)  # a name too long to look up is one line, here
    outputs = {label: (_graph_output(path, inputs) if kind == GRAPH else path, kind)
               for label, (path, kind) in outputs.items()}
    for label, (path, kind) in outputs.items():
        if kind == DUMPS:
            _check_dumps_dir(label, path)
        else:
            check_output_path(path, directory=kind == GRAPH and _saved_model(inputs))
    for label, (path, kind) in outputs.items():
        for other, source in inputs.items():
            if not (kind == GRAPH and in_place and other == "input"):
                _check_apart(label, path, kind, other, source, input_=True)
    for label, (path, kind) in outputs.items():
        for other, (target, _) in outputs.items():
            if other != label:
                _check_apart(label, path, kind, other, target, input_=False)


def _saved_model(inputs: dict[str, Path]) -> bool:
    source = inputs.get("input")
    return source is not None and source.is_dir()


def _graph_output(path: Path, inputs: dict[str, Path]) -> Path:
    """The SavedModel directory a SavedModel input's ``-o`` names (``-o dir/saved_model.pb``
    writes ``dir``), as the writer reads it."""
    if _saved_model(inputs) and path.name in ("saved_model.pb", "saved_model.pbtxt"):
        return path.parent
    return path


def _check_dumps_dir(label: str, path: Path) -> None:
    from graphpass.formats.files import check_name_length, existing
    from graphpass.inspect.dump import MEMORY_PLOT, TENSORBOARD_DIR

    found = existing(path)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise GraphpassError(f"{label} {path}: exists and is not a directory")
    if found is None:
        check_name_length(path)
        return
    # The fixed names the dumps write: each, where it exists, of the kind written.
    for name, directory in ((TENSORBOARD_DIR, True), ("index.json", False),
                            (MEMORY_PLOT, False)):
        inside = existing(path / name)
        if inside is not None and stat.S_ISDIR(inside.st_mode) != directory:
            raise GraphpassError(f"{label} {path}: {name} there is not a "
                                 f"{'directory' if directory else 'regular file'}, which "
                                 "the dumps write; remove it or choose another directory")


def _check_apart(label: str, path: Path, kind: str, other: str, that: Path, *,
                 input_: bool) -> None:
    """A user error if writing ``path`` would replace or write into ``that``."""
    named = f"{other} {that}" if other.startswith("-") else f"the {other} {that}"
    if _same(path, that):
        fix = "choose another -o or pass --in-place" if kind == GRAPH and input_ else \
            f"give {label} a path of its own"
        raise GraphpassError(f"{label} {path} is the same file as {named}; {fix}")
    if input_ and _inside(path, that) and that.is_dir():
        raise GraphpassError(f"{label} {path} lies inside {named}, which graphpass only "
                             "reads; write it elsewhere")
    if kind != FILE and _inside(that, path) and (kind == GRAPH or _dump_owns(path, that)):
        # A SavedModel output directory is replaced as a whole; a dumps directory
        # clears and writes the file names it owns.
        raise GraphpassError(f"{label} {path} would replace {named} inside it; write "
                             f"{label} elsewhere")


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _same(a: Path, b: Path) -> bool:
    if _resolved(a) == _resolved(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except (OSError, ValueError):
        return False


def _inside(a: Path, b: Path) -> bool:
    """Whether ``a`` lies strictly inside ``b`` (resolved)."""
    a, b = _resolved(a), _resolved(b)
    return a != b and a.is_relative_to(b)


def _dump_owns(dump_dir: Path, path: Path) -> bool:
    """Whether the dumps in ``dump_dir`` would clear or write ``path``."""
    from graphpass.inspect.dump import _OWN_FILE, MEMORY_PLOT, TENSORBOARD_DIR

    parts = _resolved(path).relative_to(_resolved(dump_dir)).parts
    return parts[0] == TENSORBOARD_DIR or (len(parts) == 1 and (
        bool(_OWN_FILE.match(parts[0])) or parts[0] in ("index.json", MEMORY_PLOT)))


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


def check_tensor_options(graph, loss: str | None) -> None:
    """``--loss NODE:PORT`` names an output the node has (``loss:5`` of a one-output
    node, or a port TF would wrap, would otherwise be taken at its word)."""
    if not loss:
        return
    tensor = graph.dialect.parse_tensor(graph, loss)
    if tensor.node not in graph:
        return  # region analysis names the missing node
    count = graph.dialect.num_outputs(graph, tensor.node)
    if count is not None and not 0 <= tensor.port < count:
        raise GraphpassError(f"--loss {loss!r}: {tensor.node!r} has {count} output(s), so "
                             f"there is no output {tensor.port}")
