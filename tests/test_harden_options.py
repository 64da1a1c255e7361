"""Options that hung or raised (issue 43): a ``--recompute`` pattern is matched by
RE2 in time linear in each name; byte budgets of hundreds of digits, above an
int64, or a huge relative factor are range-checked where they are read; argparse's
usage errors are one line naming the help. Each refusal: exit 2, one line,
nothing written, the input unchanged."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from tf_helpers import listing

from graphpass.cli import main

DATA = Path(__file__).resolve().parent / "data"
HUNDREDS_OF_NINES = "9" * 400


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    shutil.copyfile(DATA / "onnx_mlp.onnx", path)
    return path


def _refused(capsys, argv, directory: Path, mentions: str) -> str:
    before = listing(directory)
    inputs = {p: p.read_bytes() for p in directory.iterdir() if p.is_file()}
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0], lines[0]
    assert len(lines[0]) < 400, lines[0]
    assert listing(directory) == before
    assert {p: p.read_bytes() for p in inputs} == inputs
    return lines[0]


def test_backtracking_pattern_on_long_names_ends_at_once(tmp_path, capsys):
    """``(.*)*$x`` took time exponential in a name's length with Python's ``re``."""
    import onnx

    model = onnx.load(DATA / "onnx_mlp.onnx")
    for node in model.graph.node:
        node.name = f"{node.name}/{'n' * 5000}"
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    start = time.perf_counter()
    _refused(capsys, ["rewrite", str(path), "-o", str(tmp_path / "o.onnx"), "--recompute",
                      "(.*)*$x"], tmp_path, "matches no forward node")
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("pattern,mentions", [
    ("(?=block)", "invalid perl operator"),
    (r"(block)\1", "invalid escape sequence"),
    ("(a{999}){999}", "invalid repetition size"),
    ("(" * 300, "missing )"),
])
def test_patterns_re2_cannot_take_are_one_line(model, tmp_path, capsys, pattern, mentions):
    line = _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"),
                             "--recompute", pattern], tmp_path, mentions)
    assert "RE2's syntax" in line


def test_patterns_match_as_before(model, tmp_path):
    out = tmp_path / "o.onnx"
    assert main(["rewrite", str(model), "-o", str(out), "--recompute", "block[12]/",
                 "--quiet"]) == 0
    assert out.exists()


@pytest.mark.parametrize("flags,mentions", [
    (["--memory-budget-bytes", HUNDREDS_OF_NINES], "out of range; at most 9223372036854775807"),
    (["--memory-budget-bytes", "99999999999TiB"], "out of range"),
    (["--memory-budget-bytes", "8388608TiB"], "out of range"),
    (["--memory-budget", HUNDREDS_OF_NINES], "out of range"),
    (["--memory-budget", HUNDREDS_OF_NINES + "x"], "out of range; at most 1000x"),
    (["--memory-budget", "99999999999999999999999x"], "out of range; at most 1000x"),
])
def test_budgets_out_of_range_are_refused(model, tmp_path, capsys, flags, mentions):
    """OverflowError: a float of 400 digits is infinite, and an int past int64
    overflowed the planner's arrays."""
    line = _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"),
                             "--recompute", "auto", *flags], tmp_path, mentions)
    assert HUNDREDS_OF_NINES not in line  # a long number is quoted by its length


def test_budget_in_config_out_of_range_is_refused(model, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'recompute = "auto"\nmemory_budget_bytes = {2**63}\n')
    _refused(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--config",
                      str(config)], tmp_path, "out of range")


@pytest.mark.parametrize("budget", [["--memory-budget-bytes", str(2**63 - 1)],
                                    ["--memory-budget-bytes", "8388607.5TiB"],
                                    ["--memory-budget", "1000x"]])
def test_budgets_at_the_bounds_are_accepted(model, tmp_path, budget):
    assert main(["rewrite", str(model), "-o", str(tmp_path / "o.onnx"), "--quiet",
                 "--recompute", "auto", *budget]) == 0


@pytest.mark.parametrize("argv,mentions", [
    (["rewrite", "{model}", "-o"], "argument -o/--output: expected one argument; a value "
     "that starts with '-' is given as --option=VALUE; see graphpass rewrite --help"),
    (["rewrite", "{model}", "-o", "{out}", "--recompute", "-block"],
     "argument --recompute: expected one argument"),
    (["rewrite"], "the following arguments are required: input, -o/--output; see "
     "graphpass rewrite --help"),
    (["rewrite", "{model}", "-o", "{out}", "--bogus"],
     "unrecognized arguments: --bogus; see graphpass rewrite --help"),
    (["rewrite", "{model}", "-o", "{out}", "--target", "gpu9000"],
     "argument --target: invalid choice: 'gpu9000'"),
    (["verify", "{model}"], "required: rewritten; see graphpass verify --help"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command; see graphpass --help"),
])
def test_usage_errors_are_one_line(model, tmp_path, capsys, argv, mentions):
    """argparse printed its usage block (about 17 lines) before the error."""
    argv = [a.format(model=model, out=tmp_path / "o.onnx") for a in argv]
    _refused(capsys, argv, tmp_path, mentions)


def test_help_is_still_the_usage(capsys):
    assert main(["rewrite", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: graphpass rewrite")
