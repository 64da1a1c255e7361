"""The ONNX Runtime training environment for tests: ``.venv-ort-training/``
(``tools/make_ort_training_env.sh``), where onnxruntime-training runs, apart from
the main environment's onnxruntime, onnx and numpy.

Tests that train artifacts run a script in it as a subprocess (:func:`run_in_env`).
Without it they skip, naming the script; with ``GRAPHPASS_REQUIRE_ORT_TRAINING=1``
(CI) they fail instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "data" / "ort_artifacts"
VENV = Path(os.environ.get("GRAPHPASS_ORT_TRAINING_VENV", ROOT / ".venv-ort-training"))


def python() -> Path:
    """The training environment's python, or skip (fail under CI's flag)."""
    exe = VENV / "bin" / "python"
    if not exe.exists():
        message = (f"no ONNX Runtime training environment at {VENV}; "
                   "build it with tools/make_ort_training_env.sh")
        if os.environ.get("GRAPHPASS_REQUIRE_ORT_TRAINING") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return exe


def run_in_env(code: str, *args: str, timeout: int = 600) -> dict:
    """Run ``code`` (a script printing one JSON line last) in the training environment
    with this checkout first on its path; the parsed JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(python()), "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

