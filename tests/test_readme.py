"""The README as a user meets it: every command of its Commands section answers
``--help`` in plain text, every concrete ``graphpass`` example in its code
blocks runs and exits 0 (outputs under /tmp go to the test's own directory), and
the quick start prints the lines the README shows, figures included."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from graphpass.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: reStructuredText a help text must not show: ``literals``, `interpreted text`,
#: roles (:class:`x`), directives (.. note::).
RST = re.compile(r"`|:[a-z]+:`|^\s*\.\. \w+::", re.M)


def code_lines() -> list[tuple[str, str]]:
    """``(section heading, line)`` for each line of the README's code blocks
    (fenced, or indented by four spaces)."""
    lines, section, fenced = [], "", False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            section = line.lstrip("#").strip()
        elif fenced or line.startswith("    "):
            lines.append((section, line.strip()))
    return lines


def commands(in_commands_section: bool) -> list[str]:
    """``graphpass ...`` lines (the part after the last ``&&``) inside or outside the
    Commands section."""
    found = []
    for section, line in code_lines():
        line = line.rpartition("&& ")[2]
        if line.startswith("graphpass ") and (section == "Commands") == in_commands_section:
            found.append(line)
    return found


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def test_commands_section_lists_every_command():
    listed = [shlex.split(line)[1] for line in commands(in_commands_section=True)]
    assert sorted(listed) == sorted(cls.name for cls in COMMANDS)


@pytest.mark.parametrize("argv", [["--help"]] + [[shlex.split(line)[1], "--help"]
                                                 for line in commands(True)],
                         ids=lambda argv: " ".join(argv))
def test_help_is_plain_text(argv):
    status, out, _ = _run(argv)
    assert status == 0 and out.startswith("usage: graphpass")
    assert not RST.search(out), RST.search(out)


@pytest.mark.slow
def test_readme_examples_run(tmp_path, monkeypatch):
    examples = commands(in_commands_section=False)
    assert len(examples) >= 4  # quick start, verify, dump and plot examples
    monkeypatch.chdir(ROOT)
    for line in examples:
        argv = [arg.replace("/tmp/", f"{tmp_path}/") for arg in shlex.split(line)[1:]]
        status, _, err = _run(argv)
        assert status == 0, f"{line}\n{err}"
    assert (tmp_path / "mlp_memory.svg").is_file() and (tmp_path / "mlp_dumps/memory.svg").is_file()


#: The comment that marks the fenced block holding the quick start's output.
OUTPUT_MARK = "<!-- quick-start output"


def quick_start() -> tuple[str, list[str]]:
    """The quick start's ``graphpass rewrite`` line and the output lines the README
    shows for it (the fenced block after :data:`OUTPUT_MARK`)."""
    command = next(line.rpartition("&& ")[2] for section, line in code_lines()
                   if section == "Quick start" and "graphpass rewrite" in line)
    text = README.read_text()
    block = text[text.index(OUTPUT_MARK):].split("```")[1]
    return command, block.strip("\n").splitlines()


def _pattern(shown: str, tmp: str) -> re.Pattern:
    """A README output line as a pattern: "..." inside a line stands for text left
    out; everything else, figures included, must be printed as shown."""
    parts = [re.escape(part.replace("/tmp/", f"{tmp}/")) for part in shown.split("...")]
    return re.compile(".*".join(parts))


def test_quick_start_prints_what_the_readme_shows(tmp_path, monkeypatch):
    command, shown = quick_start()
    assert any("estimated peak" in line for line in shown)  # the figures are shown
    monkeypatch.chdir(ROOT)
    argv = [arg.replace("/tmp/", f"{tmp_path}/") for arg in shlex.split(command)[1:]]
    status, out, err = _run(argv)
    assert status == 0, err
    printed = (out + err).splitlines()
    position = 0
    for line in shown:
        if line.strip() == "...":  # lines left out
            continue
        pattern = _pattern(line, str(tmp_path))
        found = next((i for i in range(position, len(printed))
                      if pattern.fullmatch(printed[i])), None)
        assert found is not None, f"README shows {line!r}; the command printed:\n{out}{err}"
        position = found + 1
