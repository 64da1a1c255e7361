"""ONNX external data: which files a model reads, and how a model and its data
files are replaced as one unit.

A written model never reuses its input's data-file names. Each data file is
copied beside the output under a name of the output's own, derived from the
output's name and the file's content (``NAME.<16 hex digits of SHA-256>.data``),
and the model's locations are rewritten to those names. So:

* the same input and options give the same bytes, whatever the output
  directory held before;
* a data file of the new model never overwrites one the old model reads
  (equal names mean equal content), so the data files go into place first and
  the one rename of the model file switches from the old model to the new;
  killed at any point, the output path holds the old model with its data or
  the new model with its data;
* after the switch, the names the output owns (``NAME.<hex>.data``) that the
  new model does not read are removed (the old generation, or what a killed
  write left), except a file the model was read from;
* no location from the untrusted model names a file graphpass writes: only the
  content-derived names are written.

A data file already at its content-derived name (a model graphpass wrote,
rewritten in place) is shared, not copied.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from graphpass.errors import GraphpassError
from graphpass.formats.files import (
    atomic_output,
    check_output_path,
    kill_point,
    remove_stale_temps,
    temp_beside,
)

#: Hex digits of the content hash in a data file's name.
DIGEST_CHARS = 16
_CHUNK = 1 << 20


def data_name(model_name: str, digest: str) -> str:
    """The name of the data file of ``model_name`` whose content hashes to ``digest``."""
    return f"{model_name}.{digest[:DIGEST_CHARS]}.data"


def owned_pattern(model_name: str) -> re.Pattern:
    """The names beside a model that graphpass's writer owns as its data files."""
    return re.compile(re.escape(model_name) + rf"\.[0-9a-f]{{{DIGEST_CHARS}}}\.data")


def owns(model: Path, path: Path) -> bool:
    """Whether ``path`` is (or, through links, reaches) a name the writer of
    ``model`` creates or removes beside it."""
    directory, pattern = os.path.realpath(model.parent), owned_pattern(model.name)
    return any(os.path.dirname(spelling) == directory
               and pattern.fullmatch(os.path.basename(spelling))
               for spelling in (os.path.join(os.path.realpath(path.parent), path.name),
                                os.path.realpath(path)))


# -- which tensors and files --------------------------------------------------


def external_tensors(model) -> Iterator:
    """Every ``TensorProto`` of ``model`` stored as external data: initializers
    (dense and sparse) and attribute tensors, in every graph, subgraph and
    model-local function (walked iteratively)."""
    import onnx

    containers = [model.graph, *model.functions]
    while containers:
        container = containers.pop(0)
        tensors = []
        if isinstance(container, onnx.GraphProto):
            tensors += list(container.initializer)
            for sparse in container.sparse_initializer:
                tensors += [sparse.values, sparse.indices]
        for node in container.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    tensors.append(attr.t)
                tensors += list(attr.tensors)
                for sparse in [attr.sparse_tensor] * attr.HasField("sparse_tensor") + \
                        list(attr.sparse_tensors):
                    tensors += [sparse.values, sparse.indices]
                containers += [attr.g] if attr.HasField("g") else list(attr.graphs)
        yield from (t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL)


def locations(model) -> list[str]:
    """The distinct external-data locations of ``model``, in order."""
    found: list[str] = []
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value and entry.value not in found:
                found.append(entry.value)
    return found


def data_files_of(path: Path) -> list[Path]:
    """The files an ONNX model at ``path`` reads as external data (locations that
    are relative and stay in its directory; the reader refuses the others), or
    none where the model cannot be parsed (the reader says why)."""
    import onnx
    from google.protobuf import message as pb_message

    model = onnx.ModelProto()
    try:
        model.ParseFromString(Path(path).read_bytes())
    except (OSError, pb_message.DecodeError):
        return []
    return [Path(path).parent / location for location in locations(model)
            if location.isprintable() and not Path(location).is_absolute()
            and ".." not in Path(location).parts]


# -- writing ---------------------------------------------------------------


@dataclass
class _DataFile:
    source: Path
    target: Path
    digest: str

    @property
    def shared(self) -> bool:
        """The target already is the source (nothing to copy)."""
        try:
            return self.target.exists() and os.path.samefile(self.source, self.target)
        except OSError:
            return False


def write_with_data(model, path: Path, source_dir: Path, keep: Iterable[str] = ()) -> None:
    """Write ``model`` (a ModelProto, changed here: its locations) to ``path`` with
    its external data copied beside it under content-derived names, and switch
    from the old model to the new with one rename (see the module). ``keep``: the
    locations (under ``source_dir``) of the model it was read from, whose files
    are never removed."""
    path = Path(path)
    check_output_path(path)
    files = _plan(model, path, Path(source_dir))
    by_location = {location: f.target.name for location, f in files.items()}
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in by_location:
                entry.value = by_location[entry.value]
    data = _serialize(model, path)
    remove_stale_temps(path)
    created = _place(list({f.target: f for f in files.values()}.values()), path)
    try:
        with atomic_output(path) as tmp:  # the switch: the one rename of the model
            tmp.write_bytes(data)
    except BaseException:
        for target in created:
            target.unlink(missing_ok=True)
        raise
    kill_point("switched")
    _remove_unread(path, {f.target.name for f in files.values()},
                   {source_dir / location for location in keep})


def _serialize(model, path: Path) -> bytes:
    try:
        return model.SerializeToString(deterministic=True)
    except ValueError as exc:  # protobuf refuses messages over 2 GiB
        raise GraphpassError(
            f"{path}: the model is too large to serialise ({exc}); save its initializers as "
            "external data (onnx.save_model(..., save_as_external_data=True)) and retry"
        ) from None


def _plan(model, path: Path, source_dir: Path) -> dict[str, _DataFile]:
    """Location -> the data file to place for it, every source and target checked
    (and hashed) before anything is written."""
    root = source_dir.resolve()
    files: dict[str, _DataFile] = {}
    for location in locations(model):
        try:
            source = _source(location, source_dir, root, path)
            digest = _digest(source)
        except (OSError, ValueError) as exc:  # a link loop, a name the system refuses
            raise GraphpassError(f"external data location {location!r}: cannot be read "
                                 f"({getattr(exc, 'strerror', None) or exc})") from None
        target = path.parent / data_name(path.name, digest)
        if target.exists() or target.is_symlink():
            check_output_path(target)  # a FIFO or device there would be replaced
        files[location] = _DataFile(source, target, digest)
    return files


def _source(location: str, source_dir: Path, root: Path, output: Path) -> Path:
    """The file ``location`` names; a user error for one outside the model's
    directory, missing, not a regular file, or the output itself."""
    relative = Path(location)
    if relative.is_absolute() or ".." in relative.parts:
        raise GraphpassError(
            f"external data location {location!r} leaves the model's directory; "
            "ONNX requires a relative path inside it (re-save the model)")
    source = source_dir / relative
    if not source.resolve().is_relative_to(root):
        raise GraphpassError(
            f"external data file {source} is a symbolic link to {source.resolve()}, "
            "outside the model's directory; copy the data into the directory instead")
    if not source.is_file():
        raise GraphpassError(f"external data file {source} is missing or not a regular "
                             "file; keep it beside the model it came with")
    if source.resolve() == output.resolve() or (output.exists()
                                                and os.path.samefile(source, output)):
        raise GraphpassError(f"external data location {location!r} is the output {output} "
                             "itself, which would be replaced; choose another -o")
    return source


def _digest(source: Path) -> str:
    digest = hashlib.sha256()
    with open(source, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _place(files: list[_DataFile], path: Path) -> list[Path]:
    """Copy each data file to a temporary name beside ``path``, then rename them
    all into place; returns the targets that did not exist before. A failure
    removes the temporaries and what it created."""
    temps: list[tuple[Path, _DataFile]] = []
    created: list[Path] = []
    try:
        for data_file in files:
            if not data_file.shared:
                temps.append((_copy(data_file, path), data_file))
        for tmp, data_file in temps:
            kill_point("data-written")
            if not data_file.target.exists():
                created.append(data_file.target)
            os.replace(tmp, data_file.target)
            kill_point("data-renamed")
    except BaseException as exc:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
        for target in created:
            target.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # the disk is full
            raise GraphpassError(f"{path}: cannot write its external data there "
                                 f"({exc.strerror or exc})") from None
        raise
    return created


def _copy(data_file: _DataFile, path: Path) -> Path:
    """``data_file``'s source in a temporary file beside ``path`` (named as the
    model's own temporaries, so a killed writer's are removed with them),
    checked against the digest it is named by."""
    tmp = temp_beside(path)
    digest = hashlib.sha256()
    try:
        with open(data_file.source, "rb") as source, open(tmp, "wb") as out:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != data_file.digest:
            raise GraphpassError(f"external data file {data_file.source} changed while it "
                                 "was copied; run again once nothing else writes it")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _remove_unread(path: Path, read: set[str], sources: set[Path]) -> None:
    """Remove the data files ``path`` owns that its model does not read (an older
    generation, or a killed writer's), never a file a model was read from."""
    pattern = owned_pattern(path.name)
    kept = {Path(os.path.realpath(s)) for s in sources}
    for candidate in sorted(path.parent.iterdir()):
        if pattern.fullmatch(candidate.name) and candidate.name not in read and \
                Path(os.path.realpath(candidate)) not in kept and not candidate.is_dir():
            candidate.unlink(missing_ok=True)
