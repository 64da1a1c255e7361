"""Runtimes as extras and a quiet CLI: ``--version`` names the runtimes without
importing them, a missing runtime is one line naming the extra to install, and
the runtimes' start-up logging never reaches graphpass's stdout or stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphpass
from graphpass.cli import main
from graphpass.cli.quiet import QuietFirstImport, quiet_runtimes

ROOT = Path(graphpass.__file__).resolve().parent.parent


def _python(code: str, env: dict | None = None, timeout: int = 120):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_version_names_each_runtime_without_importing_it():
    result = _python("import sys; from graphpass.cli import main; rc = main(['--version']); "
                     "assert rc == 0, rc; "
                     "assert not {'tensorflow', 'onnx', 'onnxruntime'} & set(sys.modules)")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"graphpass {graphpass.__version__}"
    assert [line.split()[0] for line in lines[1:]] == ["tensorflow", "onnx", "onnxruntime"]
    assert result.stderr == ""


def test_version_says_not_installed(monkeypatch, capsys):
    from graphpass import installed as runtimes

    monkeypatch.setattr(runtimes, "installed", lambda runtime: runtime.module != "tensorflow")
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow   not installed" in out and "onnx         not installed" not in out


@pytest.mark.parametrize("module, model, extra", [
    ("tensorflow", "examples/mlp_train.pb",
     "reading a TensorFlow graph needs TensorFlow: pip install 'graphpass[tf]' "
     "(or 'graphpass[tf-cpu]')"),
    ("onnx", "tests/data/onnx_mlp.onnx",
     "reading an ONNX model needs onnx: pip install 'graphpass[onnx]'"),
])
def test_a_missing_runtime_is_one_line_naming_the_extra(module, model, extra):
    # None in sys.modules: the import fails as if the runtime were not installed.
    code = (f"import sys; sys.modules[{module!r}] = None; from graphpass.cli import main; "
            f"sys.exit(main(['inspect', {model!r}]))")
    result = _python(code)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"graphpass: error: {extra}\n"
    assert result.stdout == ""


def test_a_missing_onnxruntime_names_the_onnx_extra_for_verify():
    model = "tests/data/onnx_mlp.onnx"
    code = ("import sys; sys.modules['onnxruntime'] = None; from graphpass.cli import main; "
            f"sys.exit(main(['verify', {model!r}, {model!r}, '--steps', '1']))")
    result = _python(code)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("graphpass: error: verifying an ONNX model needs onnxruntime: "
                             "pip install 'graphpass[onnx]'\n")


def test_the_runtimes_are_found_by_import_name(monkeypatch):
    """onnxruntime-training provides the module ``onnxruntime``: what counts is the module."""
    from graphpass import installed as runtimes

    monkeypatch.setattr(runtimes.importlib.util, "find_spec",
                        lambda name: object() if name == "onnxruntime" else None)
    assert runtimes.installed(runtimes.ONNXRUNTIME)
    assert not runtimes.installed(runtimes.TENSORFLOW)
    runtimes.require_onnxruntime()
    with pytest.raises(runtimes.MissingRuntime, match=r"graphpass\[tf\]"):
        runtimes.require_tensorflow()


def _write_noisy_module(directory: Path, name: str) -> None:
    (directory / f"{name}.py").write_text(
        "import os\nos.write(2, b'C++ start-up chatter\\n')\nLOADED = True\n")


def test_the_first_import_is_quiet_and_runs_its_hook(tmp_path, monkeypatch, capfd):
    name = "graphpass_test_noisy_runtime"
    _write_noisy_module(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    called = []
    finder = QuietFirstImport({name: called.append})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = __import__(name)
    assert module.LOADED and called == [module]
    assert module.__loader__ is module.__spec__.loader  # its real loader, not the wrapper
    assert "chatter" not in capfd.readouterr().err
    print("graphpass's own line", file=sys.stderr)
    assert "own line" in capfd.readouterr().err  # stderr works again afterwards


@pytest.mark.parametrize("verbose, level, quiet_tf", [
    (False, None, True), (True, None, False), (False, "0", False), (False, "2", True)])
def test_quiet_respects_verbose_and_the_users_log_level(monkeypatch, verbose, level, quiet_tf):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    if level is None:
        monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
    with quiet_runtimes(verbose):
        finders = [f for f in sys.meta_path if isinstance(f, QuietFirstImport)]
        hooked = any("tensorflow" in f.hooks for f in finders)
        env = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    assert hooked == quiet_tf
    assert env == (level if level is not None else (None if verbose else "3"))
    assert not any(isinstance(f, QuietFirstImport) for f in sys.meta_path)


@pytest.mark.slow
def test_quick_start_prints_only_graphpass_lines(tmp_path):
    """The README's rewrite in a fresh process, with the environment the user has
    (no TF_CPP_MIN_LOG_LEVEL): TensorFlow's start-up lines must not appear."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "graphpass.cli", "rewrite", "examples/mlp_train.pb", "-o",
         str(tmp_path / "x.pb"), "--recompute", "block[1-7]/"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("graphpass: examples/mlp_train.pb -> ")
    assert all(line.startswith("  ") for line in lines[1:]), lines
