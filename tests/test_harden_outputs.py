"""Outputs that can never be lost (issue 27): every output path is distinct from
every input and from every other output (also through links), an output that
exists must be what graphpass writes there, and a bad output path is one line,
exit 2, before anything is read or written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from tf_helpers import listing

from graphpass.cli import main

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    shutil.copyfile(DATA / "onnx_mlp.onnx", path)
    return path


def _refused(capsys, argv, directory: Path, mentions: str = "") -> str:
    """Exit 2, one ``graphpass: error:`` line, and nothing in ``directory`` changed."""
    before = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    names = listing(directory)
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0], lines[0]
    assert listing(directory) == names
    assert {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()} == before
    return lines[0]


def test_report_naming_the_graph_output_is_refused(model, tmp_path, capsys):
    """``--report X -o X`` exited 0 with X holding the report: the graph was lost."""
    out = tmp_path / "out.onnx"
    _refused(capsys, ["rewrite", str(model), "-o", str(out), "--report", str(out)], tmp_path,
             "is the same file as --report")


def test_report_naming_the_input_is_refused_even_in_place(model, tmp_path, capsys):
    _refused(capsys, ["rewrite", str(model), "-o", str(model), "--in-place",
                      "--report", str(model)], tmp_path, "is the same file as the input")


@pytest.mark.parametrize("link", ["symlink", "hardlink", "spelling"])
def test_output_reaching_the_input_through_a_link_is_refused(model, tmp_path, capsys, link):
    other = tmp_path / "other.onnx"
    if link == "symlink":
        other.symlink_to(model)
    elif link == "hardlink":
        os.link(model, other)
    else:
        other = tmp_path / "sub" / ".." / "model.onnx"
        (tmp_path / "sub").mkdir()
    _refused(capsys, ["rewrite", str(model), "-o", str(other)], tmp_path, "--in-place")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"),
                      "--report", str(other)], tmp_path, "the input")


def test_report_reaching_the_config_is_refused(model, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("quiet = true\n")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--config",
                      str(config), "--report", str(config)], tmp_path, "--config")


def test_dumps_that_would_clear_an_input_or_output_are_refused(model, tmp_path, capsys):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    kept = dumps / "00-input.onnx.txt"
    kept.write_text("an input the dumps would clear")
    _refused(capsys, ["rewrite", str(kept), "-o", str(tmp_path / "o.onnx"),
                      "--dump-dir", str(dumps)], tmp_path, "would replace the input")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--dump-dir",
                      str(dumps), "--report", str(dumps / "index.json")], tmp_path,
             "would replace --report")
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--dump-dir",
                      str(model)], tmp_path, "not a directory")
    # a name the dumps do not own may live there
    assert main(["rewrite", str(model), "-o", str(dumps / "out.onnx"), "--quiet",
                 "--dump-dir", str(dumps)]) == 0
    assert (dumps / "out.onnx").is_file() and (dumps / "index.json").is_file()


def test_memory_plot_over_an_input_is_refused(model, tmp_path, capsys):
    _refused(capsys, ["inspect", str(model), "--memory-plot", str(model)], tmp_path,
             "--memory-plot")


def test_output_inside_an_input_directory_is_refused(tmp_path, capsys):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    _refused(capsys, ["rewrite", str(saved), "-o", str(tmp_path / "o"), "--report",
                      str(saved / "r.json")], tmp_path, "lies inside the input")


def test_existing_output_that_is_no_savedmodel_directory_is_refused(tmp_path, capsys):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("the user's")
    _refused(capsys, ["rewrite", str(saved), "-o", str(tmp_path / "a_file")], tmp_path,
             "a SavedModel is a directory")
    _refused(capsys, ["rewrite", str(saved), "-o", str(tmp_path / "full")], tmp_path,
             "is not a SavedModel")


def test_dev_null_is_refused_before_anything_is_written(model, tmp_path, capsys):
    """As root, the rename would have replaced the system's /dev/null by a file."""
    before = os.stat("/dev/null")
    _refused(capsys, ["rewrite", str(model), "-o", "/dev/null", "--report",
                      str(tmp_path / "r.json")], tmp_path, "is a device")
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_rdev, after.st_mode) == \
        (before.st_ino, before.st_rdev, before.st_mode)


@pytest.mark.parametrize("flag", ["-o", "--report", "--memory-plot"])
def test_fifo_output_is_refused(model, tmp_path, capsys, flag):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    argv = ["inspect", str(model), flag, str(fifo)] if flag == "--memory-plot" else \
        ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), flag, str(fifo)] \
        if flag != "-o" else ["rewrite", str(model), "-o", str(fifo)]
    _refused(capsys, argv, tmp_path, "is a FIFO")
    assert fifo.is_fifo()


@pytest.mark.parametrize("length", [250, 300, 5000])
@pytest.mark.parametrize("flag", ["-o", "--report", "--dump-dir"])
def test_names_over_the_limit_are_one_line(model, tmp_path, capsys, length, flag):
    """OSError: File name too long escaped from the checks; a name under the limit
    whose temporary name beside it is over failed after the dumps were written."""
    long = str(tmp_path / ("a" * length))
    argv = ["rewrite", str(model), "-o", long] if flag == "-o" else \
        ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), flag, long]
    line = _refused(capsys, argv, tmp_path, "too long")
    assert len(line) < 600


def test_long_input_name_is_one_line(tmp_path, capsys):
    _refused(capsys, ["inspect", str(tmp_path / ("b" * 100_000))], tmp_path)
