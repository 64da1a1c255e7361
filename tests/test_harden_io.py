"""Inputs and outputs around ONNX external data and the dumps directory (issue 43,
found by the fuzzer through the CLI): an input's data files are inputs, the
data files written beside an output have names of the output's own, a model
and its data are replaced as one unit (also when killed), and a failed rewrite
leaves --dump-dir as it was."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tf_helpers import listing

from graphpass.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def _save(directory: Path, *, scale: float = 1.0, location: str | None = "data.bin") -> Path:
    """The small ONNX training step with its initializers (times ``scale``) as
    external data: one file ``location``, or one per tensor where it is None."""
    model = onnx.load(DATA / "onnx_mlp.onnx")
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * scale,
                                                tensor.name))
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, directory / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=location is not None, location=location,
                    size_threshold=0)
    return directory / "model.onnx"


def _weights(path: Path) -> dict[str, np.ndarray]:
    """The initializers of the model at ``path``, its external data loaded."""
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _data_name(model: str, data: Path) -> str:
    return f"{model}.{hashlib.sha256(data.read_bytes()).hexdigest()[:16]}.data"


def _snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
            for p in directory.rglob("*")}


def _refused(capsys, argv, directory: Path, mentions: str) -> str:
    """Exit 2, one ``graphpass: error:`` line, and nothing under ``directory`` changed."""
    before = _snapshot(directory)
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0], lines[0]
    assert _snapshot(directory) == before
    return lines[0]


# -- an input's external data is an input ---------------------------------------------


@pytest.mark.parametrize("flag", ["--report", "-o", "-o --in-place", "--memory-plot"])
def test_naming_the_inputs_data_file_as_an_output_is_refused(tmp_path, capsys, flag):
    """Each replaced the input's weights, exit 0."""
    model = _save(tmp_path / "in")
    data = str(tmp_path / "in" / "data.bin")
    argv = {"--report": ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"),
                         "--report", data],
            "-o": ["rewrite", str(model), "-o", data],
            "-o --in-place": ["rewrite", str(model), "-o", data, "--in-place"],
            "--memory-plot": ["inspect", str(model), "--memory-plot", data]}[flag]
    line = _refused(capsys, argv, tmp_path, "the input's external data file")
    assert "--in-place" not in line  # it would not help


def test_verify_memory_plot_naming_the_other_models_data_is_refused(tmp_path, capsys):
    original = _save(tmp_path / "a")
    rewritten = _save(tmp_path / "b", scale=2.0)
    _refused(capsys, ["verify", str(original), str(rewritten), "--memory-plot",
                      str(tmp_path / "b" / "data.bin")], tmp_path,
             "the rewritten's external data file")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.write_bytes(b"an onnxruntime checkpoint")
    _refused(capsys, ["verify", str(original), str(rewritten), "--checkpoint",
                      str(checkpoint), "--memory-plot", str(checkpoint)], tmp_path,
             "--checkpoint")


def test_dumps_that_would_clear_an_inputs_data_file_are_refused(tmp_path, capsys):
    model = _save(tmp_path / "in", location="index.json")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--dump-dir",
                      str(tmp_path / "in")], tmp_path, "would replace the input's external")


# -- the data written beside an output has names of its own ----------------------------


def test_a_config_where_the_data_used_to_go_is_kept(tmp_path, capsys):
    """The data file was copied beside the output under its input location, over a
    --config of that name (exit 0, the config replaced by weights)."""
    model = _save(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    config = out / "data.bin"
    config.write_text("quiet = true\n")
    assert main(["rewrite", str(model), "-o", str(out / "model.onnx"), "--config",
                 str(config)]) == 0
    assert config.read_text() == "quiet = true\n"
    assert _same_weights(_weights(out / "model.onnx"), _weights(model))
    name = _data_name("model.onnx", tmp_path / "in" / "data.bin")
    assert sorted(p.name for p in out.iterdir()) == ["data.bin", "model.onnx", name]


@pytest.mark.parametrize("flag", ["--config", "--report", "--feed", "--dump-dir"])
def test_inputs_and_outputs_named_as_the_outputs_data_are_refused(tmp_path, capsys, flag):
    """The writer creates and removes NAME.<hash>.data beside -o NAME: nothing else
    may bear such a name, an input least of all."""
    model = _save(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    taken = out / _data_name("model.onnx", tmp_path / "in" / "data.bin")
    if flag in ("--config", "--feed"):
        np.save(out / "x.npy", np.zeros(2, np.float32))
        taken.write_bytes((out / "x.npy").read_bytes() if flag == "--feed"
                          else b"quiet = true\n")
    spec = [f"x={taken}", "--profile", "--recompute", "auto"] if flag == "--feed" \
        else [str(taken)]
    _refused(capsys, ["rewrite", str(model), "-o", str(out / "model.onnx"), flag, *spec],
             tmp_path, "gives its external data files")
    # any hash: an older generation's name is removed after the next write
    other = out / "model.onnx.0123456789abcdef.data"
    _refused(capsys, ["rewrite", str(model), "-o", str(out / "model.onnx"), "--report",
                      str(other)], tmp_path, "gives its external data files")


def test_a_report_where_the_data_used_to_go_is_not_read_as_weights(tmp_path):
    """--report naming the output's data file: exit 0, and the output read the JSON
    report as its weights."""
    model = _save(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    report = out / "data.bin"
    assert main(["rewrite", str(model), "-o", str(out / "model.onnx"), "--quiet",
                 "--report", str(report)]) == 0
    assert json.loads(report.read_text())["format"] == "onnx"
    assert _same_weights(_weights(out / "model.onnx"), _weights(model))


def test_a_location_naming_the_output_is_harmless_or_refused(tmp_path, capsys):
    """A location equal to the output's file name: the output read its weights from
    its own bytes (exit 0). Now the output reads a copy under its own data name; a
    location that *is* the output file (same directory) is refused."""
    model = _save(tmp_path / "in", location="out.onnx")
    elsewhere = tmp_path / "o"
    elsewhere.mkdir()
    assert main(["rewrite", str(model), "-o", str(elsewhere / "out.onnx"), "--quiet"]) == 0
    assert _same_weights(_weights(elsewhere / "out.onnx"), _weights(model))
    assert _locations(elsewhere / "out.onnx") == \
        {_data_name("out.onnx", tmp_path / "in" / "out.onnx")}
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "in" / "out.onnx")],
             tmp_path, "is the same file as the input's external data file")


def test_a_location_naming_the_output_is_refused_by_the_writer(tmp_path):
    """Without the command's checks (the library's save), the same refusal."""
    import graphpass
    from graphpass.errors import GraphpassError

    model = _save(tmp_path / "in", location="out.onnx")
    graph = graphpass.load(model)
    before = _snapshot(tmp_path)
    with pytest.raises(GraphpassError, match="is the output .* itself"):
        graphpass.save(graph, tmp_path / "in" / "out.onnx")
    assert _snapshot(tmp_path) == before


def test_a_new_generation_removes_the_old_data_and_never_an_input(tmp_path):
    """Writing model B over model A removes A's data files; a data file the input
    was read from is kept even when it bears one of the output's data names."""
    out = tmp_path / "out"
    out.mkdir()
    first, second = _save(tmp_path / "a"), _save(tmp_path / "b", scale=3.0)
    assert main(["rewrite", str(first), "-o", str(out / "m.onnx"), "--quiet"]) == 0
    old = _data_name("m.onnx", tmp_path / "a" / "data.bin")
    assert (out / old).is_file()
    assert main(["rewrite", str(second), "-o", str(out / "m.onnx"), "--quiet"]) == 0
    new = _data_name("m.onnx", tmp_path / "b" / "data.bin")
    assert sorted(p.name for p in out.iterdir()) == ["m.onnx", new]
    assert _same_weights(_weights(out / "m.onnx"), _weights(second))
    # an input beside the output whose data file has one of the output's names
    # under a stale hash: copied to its true name, and left in place
    stale = "m.onnx.0000000000000000.data"
    copy = _save(out / "sub", location=stale)
    os.replace(copy, out / "copy.onnx")
    os.replace(out / "sub" / stale, out / stale)
    assert main(["rewrite", str(out / "copy.onnx"), "-o", str(out / "m.onnx"),
                 "--quiet"]) == 0
    assert (out / stale).is_file()
    assert _same_weights(_weights(out / "copy.onnx"), _weights(first))
    assert _same_weights(_weights(out / "m.onnx"), _weights(first))


def test_the_written_bytes_do_not_depend_on_what_the_directory_held(tmp_path):
    model = _save(tmp_path / "in")
    other = _save(tmp_path / "other", scale=2.0)
    for name in ("fresh", "used"):
        (tmp_path / name).mkdir()
    assert main(["rewrite", str(other), "-o", str(tmp_path / "used" / "m.onnx"),
                 "--quiet"]) == 0
    for name in ("fresh", "used"):
        assert main(["rewrite", str(model), "-o", str(tmp_path / name / "m.onnx"),
                     "--quiet"]) == 0
    assert _snapshot(tmp_path / "fresh") == _snapshot(tmp_path / "used")


# -- the dumps directory -------------------------------------------------------------


def test_onnx_text_dump_writes_no_model_into_the_dumps(tmp_path):
    """The text dump wrote a temporary model with its data into the dumps directory,
    over a file there of the data file's name."""
    model = _save(tmp_path / "in")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "data.bin").write_text("the user's")
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--quiet",
                 "--dump-dir", str(dumps)]) == 0
    assert (dumps / "data.bin").read_text() == "the user's"
    assert not [p for p in listing(dumps) if p.endswith((".onnx", ".data", ".tmp"))]
    assert (dumps / "00-input.onnx.txt").is_file() and (dumps / "index.json").is_file()


def _failing_runs(tmp_path: Path, model: Path) -> list[list[str]]:
    """Rewrites that fail inside the pipeline (an unmeetable budget) and after it
    (a FIFO where the output's data file goes)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    name = _data_name("model.onnx", model.parent / "data.bin")
    if not (out / name).exists():
        os.mkfifo(out / name)
    return [["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--recompute", "auto",
             "--memory-budget-bytes", "1"],
            ["rewrite", str(model), "-o", str(out / "model.onnx")]]


def test_a_failed_rewrite_leaves_the_dumps_as_they_were(tmp_path, capsys):
    model = _save(tmp_path / "in")
    dumps = tmp_path / "dumps"
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--quiet",
                 "--recompute", "auto", "--dump-dir", str(dumps)]) == 0
    (dumps / "notes.txt").write_text("mine")
    assert len(list(dumps.glob("0*-*.onnx.txt"))) >= 2 and (dumps / "memory.svg").exists()
    for argv in _failing_runs(tmp_path, model):
        for where in (dumps, tmp_path / "new" / "dumps"):
            _refused(capsys, [*argv, "--quiet", "--dump-dir", str(where)], tmp_path, "")
    assert not (tmp_path / "new").exists()
    # a run that succeeds replaces the old dumps, and only them
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--quiet",
                 "--dump-dir", str(dumps)]) == 0
    names = sorted(p.name for p in dumps.iterdir())
    assert names == ["00-input.dot", "00-input.onnx.txt", *(["00-input.svg"] * (
        "00-input.svg" in names)), "index.json", "memory.svg", "notes.txt"]


# -- killed while replacing a model and its data ----------------------------------------


def _graphpass(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    return subprocess.run([sys.executable, "-m", "graphpass.cli", *argv], env=env,
                          timeout=300, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("point,survivor", [
    ("data-written", "old"),  # the new data files complete under temporary names
    ("data-renamed", "old"),  # the first of them renamed into place, the others not
    ("written", "old"),  # every data file in place, the new model complete
    ("switched", "new"),  # the model renamed: the old generation's data still there
])
def test_an_external_data_write_survives_a_kill(tmp_path, point, survivor):
    """Killed (SIGKILL) at each rename of an ONNX write with several data files: the
    output holds the old model with its old data or the new one with its new data,
    and the next write removes what the killed one left."""
    old, new = _save(tmp_path / "old", location=None), _save(tmp_path / "new", scale=5.0,
                                                            location=None)
    assert len([p for p in (tmp_path / "new").iterdir() if p.suffix != ".onnx"]) > 2
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "model.onnx"
    assert _graphpass("rewrite", str(old), "-o", str(out), "--quiet").returncode == 0
    done = _graphpass("rewrite", str(new), "-o", str(out), "--quiet",
                      env={"GRAPHPASS_TEST_KILL_AT": point})
    assert done.returncode == -9, done.stderr
    expected = _weights(old if survivor == "old" else new)
    assert _same_weights(_weights(out), expected)
    onnx.checker.check_model(str(out))
    leftovers = {p.name for p in out_dir.iterdir()} - {"model.onnx", *_locations(out)}
    assert leftovers  # temporaries, new data not yet read, or the old generation's
    assert _graphpass("rewrite", str(new), "-o", str(out), "--quiet").returncode == 0
    assert _same_weights(_weights(out), _weights(new))
    assert {p.name for p in out_dir.iterdir()} == {"model.onnx", *_locations(out)}


def _locations(path: Path) -> set[str]:
    return {e.value for t in onnx.load(path, load_external_data=False).graph.initializer
            for e in t.external_data if e.key == "location"}


@pytest.mark.parametrize("layout", ["dangling", "under-dangling", "tensorboard-file",
                                    "index-dir"])
def test_dumps_that_could_not_move_in_are_refused_before_the_graph(tmp_path, capsys, layout):
    """The dumps move in after the graph is written, so what would stop them is
    refused first (the fuzzer's --dump-dir naming a dangling link wrote the graph,
    then failed)."""
    model = _save(tmp_path / "in")
    dumps = tmp_path / "dumps"
    if layout in ("dangling", "under-dangling"):
        dumps.symlink_to(tmp_path / "nowhere")
        dumps = dumps / "sub" if layout == "under-dangling" else dumps
    elif layout == "tensorboard-file":
        dumps.mkdir()
        (dumps / "tensorboard").write_text("not the event files' directory")
    else:
        (dumps / "index.json").mkdir(parents=True)
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--quiet",
                      "--dump-dir", str(dumps)], tmp_path, "--dump-dir")
