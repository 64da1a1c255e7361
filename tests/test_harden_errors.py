"""Error lines (issue 27): one printable line whatever the input names hold; a
name is quoted to at most about 200 characters, non-printable characters escaped."""

from __future__ import annotations

import shutil
from pathlib import Path

from graphpass.cli import main
from graphpass.errors import NAME_LIMIT, GraphpassError, error_line

DATA = Path(__file__).resolve().parent / "data"


def test_long_names_are_shortened_and_control_bytes_escaped():
    name = "n" * 100_000
    line = error_line(GraphpassError(f"node {name!r} reads x\x00y:\n\x1b[31m\udcff"))
    assert len(line) < 2 * NAME_LIMIT + 100
    assert "[99" in line and "characters]" in line
    assert line.isprintable() and "\\x00" in line and "\\n" in line and "\\x1b" in line
    assert "\\udcff" in line  # an undecodable byte of a file name prints as its escape


def test_many_short_words_are_bounded_too():
    assert len(error_line(GraphpassError("a " * 100_000))) < 2100


def test_cli_error_with_a_100k_name_and_nul_bytes_is_one_short_line(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    shutil.copyfile(DATA / "onnx_mlp.onnx", model)
    config = tmp_path / "c.toml"
    config.write_text('loss = "' + "l" * 100_000 + '\\u0000\\u0007"\n')
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--config",
                 str(config)]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), err[:500]
    assert len(lines[0]) < 1000 and "\x00" not in err and "\x07" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_report_path_with_a_nul_byte_is_one_line(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    shutil.copyfile(DATA / "onnx_mlp.onnx", model)
    config = tmp_path / "c.toml"
    config.write_text(f'report = "{tmp_path}/r\\u0000.json"\n')
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--config",
                 str(config)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "\\x00" in lines[0] and "\x00" not in lines[0]
