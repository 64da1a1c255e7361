"""Symbolic links inside a SavedModel (issue 43): the copy of ``variables/`` and
``assets/`` enters each directory once and never follows a link back up the
model's tree; a link cycle, or a directory reached twice, is one line, exit 2,
before anything is copied."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tf_helpers import write_saved_model

from graphpass.cli import main


def _tree(directory: Path) -> list[tuple[str, str]]:
    """Every path under ``directory`` and what it is, links not followed."""
    found = []
    for top, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(top) / name
            kind = f"-> {os.readlink(path)}" if path.is_symlink() else \
                "dir" if path.is_dir() else path.read_bytes().hex()[:64]
            found.append((str(path.relative_to(directory)), kind))
    return sorted(found)


@pytest.fixture(scope="module")
def saved_model(models, tmp_path_factory):
    small = models.model("harden_mlp", "block_mlp", batch=2, width=4, blocks=2)
    return write_saved_model(tmp_path_factory.mktemp("links_sm") / "model", small)


def _model(saved_model: Path, tmp_path: Path, links: dict[str, str],
           dirs: tuple[str, ...] = ()) -> Path:
    model = tmp_path / "model"
    subprocess.run(["cp", "-a", str(saved_model), str(model)], check=True)
    for name in dirs:
        (model / name).mkdir(parents=True)
        (model / name / "file.txt").write_text(name)
    for name, target in links.items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).symlink_to(target)
    return model


@pytest.mark.parametrize("links,dirs,mentions", [
    ({"variables/a": ".", "variables/b": "."}, (), "(a link cycle)"),
    ({"assets/up": ".."}, (), "(a link cycle)"),
    ({"assets/deep/up": "../.."}, ("assets/deep",), "(a link cycle)"),
    ({"assets/vars": "../variables"}, (), "are the same directory"),
    ({"assets/again": "sub"}, ("assets/sub",), "are the same directory"),
    ({"assets/one": "two", "assets/two": "one"}, (), "not a regular file or directory"),
], ids=["two-links-to-dot", "up", "deep-up", "to-variables", "twice", "link-loop"])
def test_link_cycles_are_refused_before_copying(saved_model, tmp_path, capsys, links, dirs,
                                                mentions):
    """Two links to ``.`` in ``variables/`` copied the model exponentially until
    killed; ``assets/up -> ..`` copied it 40 levels deep and ended in an error line
    of up to 2,000 characters."""
    model = _model(saved_model, tmp_path, links, dirs)
    before = _tree(tmp_path)
    out = tmp_path / "out"
    assert main(["rewrite", str(model), "-o", str(out), "--quiet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), lines
    assert mentions in lines[0] and len(lines[0]) < 400, lines[0]
    assert _tree(tmp_path) == before and not out.exists()


def test_links_to_files_and_to_a_directory_once_are_copied(saved_model, tmp_path):
    """What a reader follows and the copy can hold: a link to a file (even one
    outside the extras), and one link to a directory entered nowhere else."""
    model = _model(saved_model, tmp_path, {"assets/pb": "../saved_model.pb",
                                           "assets/data": "../data"}, ("data",))
    out = tmp_path / "out"
    assert main(["rewrite", str(model), "-o", str(out), "--quiet"]) == 0
    assert (out / "assets" / "data" / "file.txt").read_text() == "data"
    assert not (out / "assets" / "data").is_symlink()
    assert (out / "assets" / "pb").read_bytes() == (model / "saved_model.pb").read_bytes()
    assert sorted(p.name for p in (out / "variables").iterdir()) == sorted(
        p.name for p in (model / "variables").iterdir())
