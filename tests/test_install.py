"""A fresh virtualenv with only the ``onnx`` extra: graphpass installs from this
checkout without TensorFlow, rewrites and verifies an ONNX model, sizes
onnxruntime's own ops with its symbolic shape inference (sympy comes with the
extra), never imports TensorFlow, and names the extra when asked to read a
TensorFlow graph.

Slow: it creates a venv and installs from PyPI (numpy, networkx, matplotlib, google-re2,
onnx, onnxruntime). Everything lives under the test's tmp_path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import graphpass

ROOT = Path(graphpass.__file__).resolve().parent.parent

SCRIPT = r"""
import contextlib, io, sys
from graphpass.cli import main

assert main(["rewrite", "model.onnx", "-o", "out.onnx", "--recompute", "block[1-3]/"]) == 0
assert main(["verify", "model.onnx", "out.onnx", "--steps", "1", "--quiet"]) == 0
import graphpass
from graphpass.analysis.shapes import infer_shapes
artifact = graphpass.load("artifact.onnx")
infer_shapes(artifact)
source = artifact.dialect.shape_source(artifact)
assert "could not be imported" not in source, source
err = io.StringIO()
with contextlib.redirect_stderr(err):
    assert main(["inspect", "mlp_train.pb"]) == 2
assert "pip install 'graphpass[tf]'" in err.getvalue(), err.getvalue()
assert "tensorflow" not in sys.modules, "graphpass imported TensorFlow"
try:
    import tensorflow  # noqa: F401
except ImportError:
    pass
else:
    raise AssertionError("TensorFlow is installed in the ONNX-only venv")
print("onnx-only ok")
"""


def _copy_checkout(target: Path) -> None:
    """What ``pip install`` needs, outside the repository (pip may build in place)."""
    target.mkdir()
    shutil.copy(ROOT / "setup.py", target)
    shutil.copytree(ROOT / "graphpass", target / "graphpass",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


@pytest.mark.slow
def test_onnx_only_install_runs_without_tensorflow(tmp_path):
    source, venv, work = tmp_path / "src", tmp_path / "venv", tmp_path / "work"
    _copy_checkout(source)
    work.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "onnx_mlp.onnx", work / "model.onnx")
    shutil.copy(ROOT / "examples" / "mlp_train.pb", work / "mlp_train.pb")
    shutil.copy(ROOT / "tests" / "data" / "ort_artifacts" / "transformer_ce" /
                "training_model.onnx", work / "artifact.onnx")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                              "--disable-pip-version-check", f"{source}[onnx]"],
                             capture_output=True, text=True, timeout=1800)
    assert install.returncode == 0, install.stderr[-4000:]
    run = subprocess.run([str(python), "-c", SCRIPT], cwd=work, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith("onnx-only ok")
    version = subprocess.run([str(venv / "bin" / "graphpass"), "--version"],
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    lines = dict(line.split(None, 1) for line in version.stdout.splitlines())
    assert lines["tensorflow"] == "not installed"
    assert lines["onnxruntime"] != "not installed" and lines["onnx"] != "not installed"
