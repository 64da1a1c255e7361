"""The plan depends on its inputs and options, not on the machine that builds it:
the runtime configuration it targets (``--onednn``, ``--intra-op-threads``) is an
option with a documented default, and the same input and options give the same
bytes whatever the build machine's oneDNN setting or CPUs.

Each rewrite runs in a process of its own, as a build script runs graphpass, with
``TF_ENABLE_ONEDNN_OPTS`` set explicitly (TF reads it once per process) or on one
CPU; where the process's oneDNN setting is not the target's, Grappler is asked
in a child process with the target's (``runtimes/tf_grappler``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.fixtures import keras3_models

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("host_independence")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(name)``: the Keras 3 model ``name`` as a ``train`` signature
    trained with Adam (test size), exported once per module."""
    found: dict[str, Path] = {}

    def export(name: str) -> Path:
        if name not in found:
            directory = tmp_path_factory.mktemp(name) / "model"
            found[name] = keras3_models.export(directory, name, "adam")
        return found[name]

    return export


@pytest.fixture(params=["convnet", "transformer"])
def saved_step(request, exported) -> Path:
    """A Keras 3 CNN with BatchNorm, and a transformer block."""
    return exported(request.param)


def _rewrite(model: Path, out: Path, onednn: str | None, cpus: str | None = None,
             options: tuple[str, ...] = ()) -> dict:
    """``graphpass rewrite --recompute auto`` in a fresh process; the report."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = onednn
    report = out.with_suffix(".json")
    command = [sys.executable, "-m", "graphpass.cli", "rewrite", str(model), "-o", str(out),
               "--recompute", "auto", "--max-extra-time", "none", "--report", str(report),
               "--quiet", *options]
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text())


def _contents(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_the_same_options_give_the_same_bytes_on_any_build_machine(saved_step, tmp_path):
    builds = {"onednn on": ("1", None), "onednn off": ("0", None),
              "one cpu": (None, "0")}
    written, reports = {}, {}
    for label, (onednn, cpus) in builds.items():
        out = tmp_path / label.replace(" ", "_")
        reports[label] = _rewrite(saved_step, out, onednn, cpus)
        written[label] = _contents(out)
    first = written["onednn on"]
    assert any(name.endswith(".pb") for name in first)
    for label, contents in written.items():
        assert contents.keys() == first.keys(), label
        differing = [name for name in first if contents[name] != first[name]]
        assert not differing, f"{label}: {differing}"
    remat = [r for r in reports["onednn on"]["passes"] if r["name"] == "remat"][0]["report"]
    assert remat["runtime"] == {"runtime": "tf", "heap": "best-fit", "onednn": True,
                                "intra_op_threads": 8}
    assert remat["nodes_added"] > 0  # a plan was written, not the input again


def test_the_target_configuration_is_an_option_and_reported(exported, tmp_path):
    """``--onednn off`` on a machine with oneDNN on plans for the machine without:
    the report says so, and the bytes are those a build with oneDNN off writes
    (the CNN, whose convolution gradients' kernels depend on oneDNN)."""
    saved_step = exported("convnet")
    asked = _rewrite(saved_step, tmp_path / "asked", "1",
                     options=("--onednn", "off", "--intra-op-threads", "2"))
    remat = [r for r in asked["passes"] if r["name"] == "remat"][0]["report"]
    assert remat["runtime"]["onednn"] is False and remat["runtime"]["intra_op_threads"] == 2
    there = _rewrite(saved_step, tmp_path / "there", "0",
                     options=("--onednn", "off", "--intra-op-threads", "2"))
    assert _contents(tmp_path / "asked") == _contents(tmp_path / "there")
    segments = [[p["report"].get("segments") for p in r["passes"]] for r in (asked, there)]
    assert segments[0] == segments[1]
