"""A quiet CLI process: the runtimes' start-up logging silenced before they load.

TensorFlow prints its start-up lines (oneDNN, CUDA probing, absl's "before
InitializeLog" notice) from C++ while it is imported, whatever
``TF_CPP_MIN_LOG_LEVEL`` says; onnxruntime logs session warnings to stderr.
For the CLI's own process only, :func:`quiet_runtimes` sets
``TF_CPP_MIN_LOG_LEVEL=3`` unless the environment sets it, sends file
descriptor 2 to /dev/null while ``tensorflow`` is first imported (unless that
level is 0), and sets onnxruntime's default log severity (and its Python
loggers' level) to errors once it is imported. ``--verbose`` skips all of it.
The library never calls this, and ``TF_ENABLE_ONEDNN_OPTS`` is never touched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
#: onnxruntime's severity for "errors and fatal only" (0 verbose ... 4 fatal).
ORT_ERROR = 3


@contextmanager
def quiet_runtimes(verbose: bool) -> Iterator[None]:
    """Within the block, the first import of each runtime is quiet (see the module)."""
    if verbose:
        yield
        return
    os.environ.setdefault(TF_LOG_LEVEL, "3")
    hooks: dict[str, Callable] = {}
    if "tensorflow" not in sys.modules and _tf_level() >= 1:
        hooks["tensorflow"] = _nothing
    if "onnxruntime" not in sys.modules:
        hooks["onnxruntime"] = _ort_errors_only
    finder = QuietFirstImport(hooks)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


class QuietFirstImport(importlib.abc.MetaPathFinder):
    """For the top-level modules in ``hooks``: import them with file descriptor 2
    silenced, then call the module's hook. Finds nothing itself: it wraps the
    loader the ordinary path finder returns."""

    def __init__(self, hooks: dict[str, Callable]) -> None:
        self.hooks = hooks

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.hooks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _QuietLoader(spec.loader, self.hooks[fullname])
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader, after: Callable) -> None:
        self.loader = loader
        self.after = after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # its real loader from now
        with _stderr_silenced():
            self.loader.exec_module(module)
        self.after(module)


@contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null within the block (C++ writes there directly)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield  # no usable stderr: nothing to silence
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _tf_level() -> int:
    try:
        return int(os.environ.get(TF_LOG_LEVEL, "3"))
    except ValueError:
        return 3


def _nothing(module) -> None:
    pass


def _ort_errors_only(module) -> None:
    """Errors only, from its C++ sessions and from its Python tools' loggers (its
    symbolic shape inference warns of merges it guesses)."""
    import logging

    setter = getattr(module, "set_default_logger_severity", None)
    if setter is not None:
        setter(ORT_ERROR)
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
