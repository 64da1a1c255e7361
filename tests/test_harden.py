"""Hostile and careless inputs (issue 12): each is refused with one error line and
exit 2, before anything is written, or handled; outputs survive a kill at any
point of their replacement."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tf_helpers import listing, write_message, write_saved_model

import graphpass
from graphpass.cli import EXIT_BROKEN_PIPE, main

ROOT = Path(__file__).resolve().parent.parent


def _user_error(capsys, argv, directory: Path, mentions: str = "") -> str:
    """Exit 2, one ``graphpass: error:`` line, and no file added to ``directory``."""
    before = listing(directory)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphpass: error: "), captured.err
    assert mentions in lines[0], lines[0]
    assert listing(directory) == before
    return lines[0]


def _graphpass(*argv: str, env: dict | None = None, timeout: float = 120,
               **kwargs) -> subprocess.CompletedProcess:
    """``graphpass ARGV`` in its own process (for crashes, kills, pipes, FIFOs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    kwargs.setdefault("capture_output", True)
    return subprocess.run([sys.executable, "-m", "graphpass.cli", *argv], env=env,
                          timeout=timeout, text=True, **kwargs)


def _stderr(done: subprocess.CompletedProcess) -> list[str]:
    """graphpass's stderr lines, without TF's start-up chatter (absl logs it before
    TF_CPP_MIN_LOG_LEVEL applies)."""
    return [line for line in done.stderr.splitlines()
            if not line.startswith(("WARNING: All log messages", "I0000 "))]


@pytest.fixture(scope="module")
def small(models):
    return models.model("harden_mlp", "block_mlp", batch=2, width=4, blocks=2)


@pytest.fixture
def graph_def(small):
    copy = type(small.graph_def)()
    copy.CopyFrom(small.graph_def)
    return copy


def _node(graph_def, name: str):
    return next(n for n in graph_def.node if n.name == name)


# -- malformed graphs ----------------------------------------------------------------


@pytest.mark.parametrize("port", [1, 2**31 - 1, 2**31, 2**32, 2**63])
def test_output_port_out_of_range_is_refused_before_tf(graph_def, tmp_path, capsys, port):
    """Port >= 2^31 crashed TF's importer (exit 139); 2^32 was read as port 0."""
    _node(graph_def, "block1/MatMul").input[0] = f"x:{port}"
    path = write_message(tmp_path / "model.pb", graph_def)
    line = (f"graphpass: error: node 'block1/MatMul' reads x:{port}, "
            + ("but 'x' has only 1 output" if port < 2**31 else "an output port out of range")
            + "; the GraphDef is malformed: re-export it")
    if port == 2**31:  # the crashing case, in a process of its own
        done = _graphpass("inspect", str(path))
        assert (done.returncode, _stderr(done)) == (2, [line])
    for argv in (["inspect", str(path)], ["rewrite", str(path), "-o", str(tmp_path / "o.pb")]):
        assert _user_error(capsys, argv, tmp_path) == line


@pytest.mark.parametrize("damage,mentions", [
    (lambda a: setattr(a, "type", 99), "attr 'T' holds DataType 99"),
    (lambda a: setattr(a, "type", 0), "attr 'T' holds DataType 0"),
    (lambda a: a.Clear(), "attr 'T' should hold a type but holds nothing"),
    (lambda a: setattr(a, "placeholder", "T"), "attr 'T' is a function placeholder ($T)"),
])
def test_bad_attrs_are_refused(graph_def, tmp_path, capsys, damage, mentions):
    damage(_node(graph_def, "block1/MatMul").attr["T"])
    path = write_message(tmp_path / "model.pb", graph_def)
    for argv in (["inspect", str(path)], ["rewrite", str(path), "-o", str(tmp_path / "o.pb")]):
        line = _user_error(capsys, argv, tmp_path, mentions)
        assert line.startswith("graphpass: error: node 'block1/MatMul': ")


def test_cyclic_graph_is_a_user_error_on_rewrite(graph_def, tmp_path, capsys):
    """inspect describes it (exit 0); rewrite, even with no pass, refuses it (exit 2)."""
    _node(graph_def, "block1/MatMul").input.append("^block2/MatMul")
    path = write_message(tmp_path / "model.pb", graph_def)
    assert main(["inspect", str(path)]) == 0
    capsys.readouterr()
    _user_error(capsys, ["rewrite", str(path), "-o", str(tmp_path / "o.pb")], tmp_path,
                "in the input graph: the graph has a cycle through")


@pytest.fixture(scope="module")
def onnx_model():
    from tools.fixtures import onnx_models

    return onnx_models.block_mlp(batch=2, width=4, blocks=2, check=False).model


@pytest.mark.parametrize("name,where", [
    (b"block1/MatMul", "model.graph.node[0].output[0]"),  # node name and output name
    (b"Transpose", ".op_type"),
])
def test_onnx_strings_that_are_not_utf8_are_refused(onnx_model, tmp_path, capsys, name, where):
    data = onnx_model.SerializeToString()
    path = tmp_path / "model.onnx"
    path.write_bytes(data.replace(name, name[:1] + b"\xff" + name[2:]))
    for argv in (["inspect", str(path)], ["rewrite", str(path), "-o", str(tmp_path / "o.onnx")]):
        _user_error(capsys, argv, tmp_path, f"{where} is not valid UTF-8")


# -- pipes and special files -----------------------------------------------------------


@pytest.mark.parametrize("command", ["passes", "diff"])
def test_closed_stdout_stops_quietly(small, tmp_path, command):
    """``graphpass passes | head -1``: the reader is gone before the output is written."""
    path = write_message(tmp_path / "a.pb", small.graph_def)
    empty = write_message(tmp_path / "b.pb", type(small.graph_def)(node=small.graph_def.node[:3]))
    argv = ["passes"] if command == "passes" else ["diff", str(path), str(empty), "--all"]
    read, write = os.pipe()
    os.close(read)  # every write to stdout now fails with EPIPE
    try:
        done = _graphpass(*argv, stdout=write, capture_output=False, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert done.returncode == EXIT_BROKEN_PIPE
    assert _stderr(done) == []


@pytest.mark.parametrize("role", ["input", "config"])
def test_fifo_is_refused_not_read(small, tmp_path, role):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    model = write_message(tmp_path / "model.pb", small.graph_def)
    argv = ["inspect", str(fifo)] if role == "input" else \
        ["rewrite", str(model), "-o", str(tmp_path / "o.pb"), "--config", str(fifo)]
    done = _graphpass(*argv, timeout=60)  # reading it would block forever
    assert done.returncode == 2
    assert _stderr(done) == [f"graphpass: error: {'--config ' if role == 'config' else ''}"
                             f"{fifo}: not a regular file (a FIFO, socket or device); "
                             "pass a file"]


# -- outputs: all checked before any is written ----------------------------------------


@pytest.mark.parametrize("report", ["a_directory", "a_file/report.json", "missing/r.json"])
def test_bad_report_path_writes_no_graph(small, tmp_path, capsys, report):
    model = write_message(tmp_path / "model.pb", small.graph_def)
    (tmp_path / "a_directory").mkdir()
    (tmp_path / "a_file").write_text("x")
    _user_error(capsys, ["rewrite", str(model), "-o", str(tmp_path / "o.pb"),
                         "--report", str(tmp_path / report)], tmp_path)


def _external(model, directory: Path) -> Path:
    """``model`` saved with every initializer in ``data.bin`` beside it."""
    import onnx

    directory.mkdir(exist_ok=True)
    copy = type(model)()
    copy.CopyFrom(model)
    onnx.save_model(copy, directory / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="data.bin", size_threshold=0)
    return directory / "model.onnx"


def test_onnx_bad_external_location_writes_nothing(onnx_model, tmp_path, capsys):
    """One good data file and one bad location: the good one is not copied first."""
    import onnx

    path = _external(onnx_model, tmp_path / "in")
    model = onnx.load(path, load_external_data=False)
    bad = model.graph.initializer[-1]
    next(e for e in bad.external_data if e.key == "location").value = "../secret.bin"
    onnx.save_model(model, path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.bin").write_text("the user's own file")
    _user_error(capsys, ["rewrite", str(path), "-o", str(out / "model.onnx")], tmp_path,
                "leaves the model's directory")
    assert listing(out) == ["data.bin"] and (out / "data.bin").read_text() == "the user's own file"


@pytest.mark.parametrize("link", ["file", "directory"])
def test_onnx_external_data_through_a_symlink_out_is_refused(onnx_model, tmp_path, capsys, link):
    import onnx

    secret = tmp_path / "secret"
    secret.mkdir()
    path = _external(onnx_model, tmp_path / "in")
    if link == "file":
        (secret / "data.bin").write_bytes((tmp_path / "in" / "data.bin").read_bytes())
        (tmp_path / "in" / "data.bin").unlink()
        (tmp_path / "in" / "data.bin").symlink_to(secret / "data.bin")
    else:
        (tmp_path / "in" / "data.bin").rename(secret / "data.bin")
        (tmp_path / "in" / "sub").symlink_to(secret)
        model = onnx.load(path, load_external_data=False)
        for tensor in model.graph.initializer:
            next(e for e in tensor.external_data if e.key == "location").value = "sub/data.bin"
        onnx.save_model(model, path)
    out = tmp_path / "out"
    out.mkdir()
    _user_error(capsys, ["rewrite", str(path), "-o", str(out / "model.onnx")], tmp_path,
                "outside the model's directory")
    assert listing(out) == []


@pytest.fixture(scope="module")
def saved_model(small, tmp_path_factory):
    return write_saved_model(tmp_path_factory.mktemp("harden_sm") / "model", small)


def _copy_tree(source: Path, target: Path) -> Path:
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)
    return target


@pytest.mark.parametrize("link", ["variables", "a variables file"])
def test_saved_model_variables_through_a_symlink_out_are_refused(saved_model, tmp_path, capsys,
                                                                  link):
    model = _copy_tree(saved_model, tmp_path / "model")
    elsewhere = tmp_path / "elsewhere"
    if link == "variables":
        (model / "variables").rename(elsewhere)
        (model / "variables").symlink_to(elsewhere)
    else:
        elsewhere.mkdir()
        index = model / "variables" / "variables.index"
        index.rename(elsewhere / "variables.index")
        index.symlink_to(elsewhere / "variables.index")
    _user_error(capsys, ["rewrite", str(model), "-o", str(tmp_path / "out")], tmp_path,
                "outside the SavedModel directory")


def test_saved_model_output_respects_the_umask(saved_model, tmp_path, capsys):
    old = os.umask(0o027)
    try:
        assert main(["rewrite", str(saved_model), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o750


# -- kills -------------------------------------------------------------------------


def _temporaries(directory: Path) -> list[str]:
    return [name for name in listing(directory) if ".graphpass-" in name]


@pytest.mark.slow
@pytest.mark.parametrize("point,survivor", [("written", "old"), ("exchanged", "new")])
def test_saved_model_replace_survives_a_kill(saved_model, small, tmp_path, point, survivor):
    """Killed (SIGKILL) with the new directory complete, or just after the exchange:
    the output path holds the old or the new model, never neither; the next run
    removes what the killed one left behind."""
    out = tmp_path / "out"
    assert _graphpass("rewrite", str(saved_model), "-o", str(out), "--quiet").returncode == 0
    (out / "old-marker").write_text("the old output")
    done = _graphpass("rewrite", str(saved_model), "-o", str(out), "--quiet",
                      "--drop-stale", "1", env={"GRAPHPASS_TEST_KILL_AT": point})
    assert done.returncode == -9, done.stderr
    assert (out / "old-marker").exists() == (survivor == "old")
    stale_ops = [n for n in graphpass.load(out).nodes() if n.name.startswith("graphpass/")]
    assert bool(stale_ops) == (survivor == "new")
    assert _temporaries(tmp_path)  # the killed run's leftovers
    assert _graphpass("rewrite", str(saved_model), "-o", str(out), "--quiet").returncode == 0
    assert _temporaries(tmp_path) == []
    assert sorted(p.name for p in out.iterdir()) == ["saved_model.pb", "variables"]


@pytest.mark.slow
def test_file_output_survives_a_kill_and_temporaries_are_cleaned(small, tmp_path):
    model = write_message(tmp_path / "model.pb", small.graph_def)
    out = tmp_path / "out.pb"
    out.write_bytes(b"old")
    done = _graphpass("rewrite", str(model), "-o", str(out), "--quiet",
                      env={"GRAPHPASS_TEST_KILL_AT": "written"})
    assert done.returncode == -9
    assert out.read_bytes() == b"old" and len(_temporaries(tmp_path)) == 1
    assert _graphpass("rewrite", str(model), "-o", str(out), "--quiet").returncode == 0
    assert _temporaries(tmp_path) == [] and graphpass.load(out).format == "tf"


def test_temporaries_of_a_live_writer_are_kept(small, tmp_path):
    """Cleaning is by process: another running graphpass's temporary file stays."""
    live = tmp_path / f".out.pb.graphpass-{os.getpid()}-abc.tmp"
    live.write_text("being written")
    model = write_message(tmp_path / "model.pb", small.graph_def)
    assert main(["rewrite", str(model), "-o", str(tmp_path / "out.pb"), "--quiet"]) == 0
    assert live.exists()


# -- passes on v1 control flow ---------------------------------------------------------


def test_drop_stale_for_xla_on_a_v1_while_loop(models, tmp_path, capsys):
    """Moving the apply ops into an If used to walk the whole graph in topological
    order, which a v1 while loop's back edge makes cyclic (ValueError)."""
    from tools.fixtures import tf_models

    model = models.model("control_flow")
    path = write_message(tmp_path / "model.pb", model.graph_def)
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(path), "-o", str(out), "--quiet", "--drop-stale", "1",
                 "--target", "xla", "--xla-cluster", "none"]) == 0
    rewritten = graphpass.load(out)
    assert "If" in {n.op for n in rewritten.nodes()}
    from graphpass.formats.tf_io import graph_def_from_graph

    losses, values, _ = tf_models.run_steps(graph_def_from_graph(rewritten), model)
    ref_losses, ref_values, _ = tf_models.run_steps(model.graph_def, model)
    assert np.array_equal(losses, ref_losses)
    for name, value in ref_values.items():
        assert np.array_equal(values[name], value), name


# -- config files: the command line's schema -----------------------------------------


@pytest.mark.parametrize("line,mentions", [
    ("recompute = 5", "recompute = 5: expects a string or a list of strings"),
    ("recompute = [1, 2]", "recompute = [1, 2]: expects a string or a list of strings"),
    ("report = 1", "report = 1: expects a string"),
    ('device = "quantum"', "device = 'quantum': choose one of cpu, gpu, tpu"),
    ("stale_counter = 5", "stale_counter = 5: expects a string"),
    ('target = "gpu9000"', "target = 'gpu9000': choose one of tf, xla, litert, tflite"),
    ('xla-cluster = "maybe"', "xla-cluster = 'maybe': choose one of step, none"),
    ('in_place = "no"', "in_place = 'no': expects true or false"),
    ("drop_stale = 1.5", "drop_stale = 1.5: expects an integer or a string"),
    ("drop_stale = true", "drop_stale = True: expects an integer or a string"),
    ('output_format = "json"', "output_format = 'json': choose one of pb, pbtxt"),
    ("recompute_hints = 1", "recompute_hints = 1: expects true or false"),
    ("no_such_option = 1", "unknown option no_such_option; valid: "),
])
def test_config_values_are_validated(small, tmp_path, capsys, line, mentions):
    model = write_message(tmp_path / "model.pb", small.graph_def)
    config = tmp_path / "c.toml"
    config.write_text(line + "\n")
    before = model.read_bytes()
    error = _user_error(capsys, ["rewrite", str(model), "-o", str(model), "--config",
                                 str(config)], tmp_path, mentions)
    assert error.startswith(f"graphpass: error: --config {config}: ")
    assert model.read_bytes() == before  # in_place = "no" used to overwrite the input


def test_config_single_pattern_string_is_one_pattern(small, tmp_path, capsys):
    """``recompute = "block1/"`` is the pattern block1/, not b, l, o, c, k, 1, /."""
    model = write_message(tmp_path / "model.pb", small.graph_def)
    config = tmp_path / "c.toml"
    config.write_text('recompute = "block1/"\ndrop-stale = 2\n')
    assert main(["rewrite", str(model), "-o", str(tmp_path / "a.pb"), "--config", str(config),
                 "--quiet"]) == 0
    assert main(["rewrite", str(model), "-o", str(tmp_path / "b.pb"), "--recompute", "block1/",
                 "--drop-stale", "2", "--quiet"]) == 0
    assert (tmp_path / "a.pb").read_bytes() == (tmp_path / "b.pb").read_bytes()
    assert (tmp_path / "a.pb").read_bytes() != model.read_bytes()


def test_device_tpu_builds_the_xla_conditional(small, tmp_path):
    """--device tpu implies --target xla: drop-stale builds an If, not Switch/Merge."""
    model = write_message(tmp_path / "model.pb", small.graph_def)
    out = tmp_path / "out.pb"
    assert main(["rewrite", str(model), "-o", str(out), "--quiet", "--drop-stale", "1",
                 "--device", "tpu", "--xla-cluster", "none"]) == 0
    ops = {n.op for n in graphpass.load(out).nodes() if n.name.startswith("graphpass/")}
    assert "If" in ops and not ops & {"Switch", "Merge"}


# -- machine-independent memory figures ------------------------------------------------


@pytest.mark.slow
def test_verify_peak_is_measured_with_onednn_on_and_off(models, tmp_path):
    """TF keeps CPU allocator statistics only with oneDNN on (off by default on CPUs
    without avx512_vnni); verify reads the step's RunMetadata allocation records
    instead, so both settings give the same figures, and remat's saving shows.

    The same, not byte-equal: which scalars the executor still holds at the peak depends
    on the order its threads ran in, so a step's peak can differ by a few bytes between
    processes."""
    model = models.model("harden_mlp_wide", "block_mlp", batch=256, width=128, blocks=4,
                         optimizer="sgd")
    original = write_message(tmp_path / "model.pb", model.graph_def)
    rewritten = tmp_path / "remat.pb"
    assert main(["rewrite", str(original), "-o", str(rewritten), "--recompute", "block[1-3]/",
                 "--quiet"]) == 0
    peaks = {}
    for onednn in ("0", "1"):
        done = _graphpass("verify", str(original), str(rewritten), "--json",
                          env={"TF_ENABLE_ONEDNN_OPTS": onednn})
        assert done.returncode == 0, done.stderr
        peaks[onednn] = json.loads(done.stdout)["median_peak_bytes"]
    assert peaks["0"] == pytest.approx(peaks["1"], rel=0.01)
    before, after = peaks["0"]
    assert 0 < after < 0.8 * before
