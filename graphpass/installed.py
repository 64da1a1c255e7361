"""The runtimes graphpass can use (TensorFlow, onnx, onnxruntime): are they there,
which versions, and the one-line error naming the extra to install.

They are found by *import name*, never by distribution name, so that any
distribution providing the module counts (``tensorflow`` or ``tensorflow-cpu``;
``onnxruntime`` or ``onnxruntime-training``). Looking them up here never imports
them: ``graphpass --version`` stays instant. This module does not configure the
runtimes (logging included; the CLI quiets its own process) and does not
install anything.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from graphpass.errors import GraphpassError


@dataclass(frozen=True)
class Runtime:
    """``module``: the import name; ``title``: the name in messages; ``extras``: what
    ``pip install 'graphpass[...]'`` provides it; ``kind``: what it reads or runs."""

    module: str
    title: str
    extras: tuple[str, ...]
    kind: str


TENSORFLOW = Runtime("tensorflow", "TensorFlow", ("tf", "tf-cpu"), "a TensorFlow graph")
ONNX = Runtime("onnx", "onnx", ("onnx",), "an ONNX model")
ONNXRUNTIME = Runtime("onnxruntime", "onnxruntime", ("onnx",), "an ONNX model")
RUNTIMES = (TENSORFLOW, ONNX, ONNXRUNTIME)


class MissingRuntime(GraphpassError):
    """A command needs a runtime that is not installed; the message names the extra."""


def installed(runtime: Runtime) -> bool:
    """Whether ``runtime``'s module can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(runtime.module) is not None
    except (ImportError, ValueError):
        return False


def missing(runtime: Runtime, doing: str) -> MissingRuntime:
    """``reading a TensorFlow graph needs TensorFlow: pip install 'graphpass[tf]' ...``"""
    first, *others = runtime.extras
    alternatives = "".join(f" (or 'graphpass[{extra}]')" for extra in others)
    return MissingRuntime(f"{doing} {runtime.kind} needs {runtime.title}: "
                          f"pip install 'graphpass[{first}]'{alternatives}")


def require(runtime: Runtime, doing: str = "reading") -> None:
    """Raise :class:`MissingRuntime` unless ``runtime`` can be imported; ``doing`` is
    the verb of the message (``reading``, ``verifying``)."""
    if not installed(runtime):
        raise missing(runtime, doing)


def require_tensorflow(doing: str = "reading") -> None:
    require(TENSORFLOW, doing)


def require_onnx(doing: str = "reading") -> None:
    require(ONNX, doing)


def require_onnxruntime(doing: str = "verifying") -> None:
    require(ONNXRUNTIME, doing)


@contextmanager
def runtimes_required(doing: str) -> Iterator[None]:
    """Turn a runtime's ``ModuleNotFoundError`` inside the block into :class:`MissingRuntime`
    (the boundary of a command: readers import their runtime lazily, deep inside)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        root = (exc.name or "").partition(".")[0]
        for runtime in RUNTIMES:
            if root == runtime.module:
                raise missing(runtime, doing) from None
        raise


#: onnxruntime's training build: no extra provides it, since it pins its own onnx and
#: numpy; it lives in an environment of its own.
ORT_TRAINING_SETUP = ("pip install onnxruntime-training-cpu==1.19.2 onnx==1.16.2 'numpy<2' "
                      "in a virtualenv of its own (the repository's "
                      "tools/make_ort_training_env.sh builds one)")


def require_onnxruntime_training(doing: str = "verifying") -> None:
    """Raise :class:`MissingRuntime` unless ``onnxruntime.training.api`` can be imported
    (onnxruntime-training provides it; plain onnxruntime has no training kernels)."""
    try:
        found = importlib.util.find_spec("onnxruntime.training.api") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingRuntime(f"{doing} onnxruntime training artifacts needs "
                             f"onnxruntime-training: {ORT_TRAINING_SETUP}")


def versions() -> dict[str, str | None]:
    """``{import name: version}`` of each runtime, None when not installed; where two
    distributions provide one module (``tensorflow`` and ``tensorflow-cpu``), each is
    named. Reads package metadata only."""
    found = {r.module: None for r in RUNTIMES}
    present = [r.module for r in RUNTIMES if installed(r)]
    if not present:
        return found
    from importlib import metadata

    providers = metadata.packages_distributions()
    for module in present:
        dists = {}
        for dist in providers.get(module, ()):
            try:
                dists[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        found[module] = _describe(module, dists)
    return found


def _describe(module: str, dists: dict[str, str]) -> str:
    """``2.21.0``, ``1.19.2 (onnxruntime-training)`` or ``2.21.0 (tensorflow, tensorflow-cpu)``."""
    if not dists:
        return "installed (version unknown)"
    names = sorted(dists)
    if len(set(dists.values())) == 1:
        version = next(iter(dists.values()))
        return version if names == [module] else f"{version} ({', '.join(names)})"
    return ", ".join(f"{name} {dists[name]}" for name in names)
