"""Fuzz strategies of issue 43 for ``tools/fuzz.py``: a field-level mutator of any
protobuf message (it walks the message's descriptor, so every field of a GraphDef,
a FunctionDef, an ONNX ModelProto or a SavedModel is reachable, not only those a
hand-written mutator names), and the ``hostile`` family: whole command lines over
prepared directories, namely SavedModels whose ``variables/`` and ``assets/`` hold
link cycles, ``verify`` pairs whose inputs differ and ``--feed`` arrays of the
wrong shape or dtype, ``--target litert`` on a SavedModel (its ``saved_model.pb``
field-mutated), and budgets of hundreds of digits.

A hostile case is a ``case.json`` (argv, the statuses it may end with) that the
fuzz worker runs with :func:`check_hostile_case`: exit 0 (or 1 for ``verify``,
which reports a difference so), or exit 2 with one error line and nothing under
the case directory changed; never a traceback, a signal or a hang.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import shutil
import stat
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
_INTS = (-1, 0, 1, 7, 2**31 - 1, -2**31, 2**32, 2**40, 2**62, 2**63 - 1, -2**63)
_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, 5e-324)
_STRINGS = ("", "^", "^x", "a:b:c", "x:2147483648", "\x00", "\u00e9", "x" * 300, "../x",
            "float32", "NoSuchOp", "T")
#: How many fields a walk collects at most: a large graph has thousands.
_MAX_FIELDS = 4000


# -- field-level mutation of any message --------------------------------------------


def field_mutation(rng: random.Random, message) -> str:
    """Mutate one field, anywhere in ``message``, by its descriptor's type; returns
    what it did."""
    fields = _fields(message, rng)
    if not fields:
        return "field: none"
    owner, field, path = rng.choice(fields)
    return f"field {path}: {_mutate(rng, owner, field)}"


def _is_repeated(field) -> bool:
    repeated = getattr(field, "is_repeated", None)
    return repeated if repeated is not None else field.label == field.LABEL_REPEATED


def _fields(message, rng: random.Random) -> list:
    """``(owner message, field descriptor, path)`` of every field of ``message`` and
    of the messages it holds (set or not, so an unset field can be filled), at most
    :data:`_MAX_FIELDS`, from a random sample of repeated messages."""
    found, stack = [], [(message, type(message).__name__)]
    while stack and len(found) < _MAX_FIELDS:
        owner, path = stack.pop()
        for field in owner.DESCRIPTOR.fields:
            found.append((owner, field, f"{path}.{field.name}"))
            if field.type != field.TYPE_MESSAGE:
                continue
            value = getattr(owner, field.name)
            if _is_repeated(field):
                if field.message_type.GetOptions().map_entry:
                    items = list(value.values()) if _map_of_messages(field) else []
                else:
                    items = list(value)
                for index in rng.sample(range(len(items)), min(len(items), 8)):
                    stack.append((items[index], f"{path}.{field.name}[{index}]"))
            elif owner.HasField(field.name):
                stack.append((value, f"{path}.{field.name}"))
    return found


def _map_of_messages(field) -> bool:
    value = field.message_type.fields_by_name["value"]
    return value.type == value.TYPE_MESSAGE


def _mutate(rng: random.Random, owner, field) -> str:
    name = field.name
    if field.type == field.TYPE_MESSAGE:
        return _mutate_message(rng, owner, field)
    if _is_repeated(field):
        values = getattr(owner, name)
        if values and rng.random() < 0.4:
            del values[rng.randrange(len(values))]
            return "removed one"
        value = _scalar(rng, field)
        try:
            values.append(value)
        except (TypeError, ValueError):
            return "kept"
        return f"appended {value!r:.40}"
    value = _scalar(rng, field)
    try:
        setattr(owner, name, value)
    except (TypeError, ValueError):  # out of the field's range, or a closed enum
        return "kept"
    return f"= {value!r:.40}"


def _mutate_message(rng: random.Random, owner, field) -> str:
    value = getattr(owner, field.name)
    if not _is_repeated(field):
        if owner.HasField(field.name) and rng.random() < 0.5:
            owner.ClearField(field.name)
            return "cleared"
        value.SetInParent()
        return "set (empty)"
    if field.message_type.GetOptions().map_entry:
        key = _scalar(rng, field.message_type.fields_by_name["key"])
        try:
            if _map_of_messages(field):
                value[key].SetInParent()
            else:
                value[key] = _scalar(rng, field.message_type.fields_by_name["value"])
        except (TypeError, ValueError):
            return "kept"
        return f"map [{key!r:.20}]"
    if value and rng.random() < 0.5:
        index = rng.randrange(len(value))
        if rng.random() < 0.5:
            del value[index]
            return f"removed [{index}]"
        value.add().CopyFrom(value[index])
        return f"duplicated [{index}]"
    value.add()
    return "added an empty one"


def _scalar(rng: random.Random, field):
    kind = field.type
    if kind in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return rng.choice(_FLOATS)
    if kind == field.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == field.TYPE_STRING:
        return rng.choice(_STRINGS)
    if kind == field.TYPE_BYTES:
        return rng.randbytes(rng.randrange(0, 17))
    if kind == field.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return rng.choice(values + [max(values) + 1, -1, 2**31 - 1])
    unsigned = kind in (field.TYPE_UINT32, field.TYPE_UINT64, field.TYPE_FIXED32,
                        field.TYPE_FIXED64)
    return abs(rng.choice(_INTS)) if unsigned else rng.choice(_INTS)


def tf_strategies() -> list:
    return [field_mutation, field_mutation]


def onnx_strategies() -> list:
    return [field_mutation, field_mutation]


# -- the hostile family ---------------------------------------------------------------


def make_hostile_case(rng: random.Random, case_dir: Path, seeds: dict,
                      work: Path) -> dict:
    """Lay out one hostile command line under ``case_dir`` (module docstring);
    returns its description, also written to ``case.json``."""
    kind = rng.choice(["links", "links", "verify", "feed", "feed", "litert", "budget",
                       "budget"])
    argv = {"links": _links_case, "verify": _verify_case, "feed": _feed_case,
            "litert": _litert_case, "budget": _budget_case}[kind](rng, case_dir, seeds, work)
    case = {"argv": argv, "kind": kind, "allowed": [0, 1, 2] if argv[0] == "verify"
            else [0, 2]}
    (case_dir / "case.json").write_text(json.dumps(case))
    return case


def tf2_seed(work: Path) -> Path:
    """A TF2 SavedModel whose ``train`` signature updates one variable (made once
    per run, under ``work``)."""
    path = work / "seed-tf2-savedmodel"
    if not (path / "saved_model.pb").exists():
        # In a process of its own: the TF1 seeds leave this one in graph mode.
        subprocess.run([sys.executable, "-m", "tools.fuzz_strategies", "export-tf2",
                        str(path)], cwd=ROOT, check=True, capture_output=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return path


def _export_tf2(path: Path) -> None:
    import tensorflow as tf

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones([4, 4]))

        @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32, name="x")])
        def train(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.matmul(x, self.w) ** 2)
            self.w.assign_sub(0.1 * tape.gradient(loss, self.w))
            return {"loss": loss}

    step = Step()
    tf.saved_model.save(step, str(path), signatures={"train": step.train})


_LINKS = (".", "..", "../..", "../variables", "../assets", "sub", "loop_b", "/etc",
          "../../outside", "variables.index", "../saved_model.pb", "nowhere")


def _links_case(rng, case_dir: Path, seeds: dict, work: Path) -> list[str]:
    model = case_dir / "model"
    shutil.copytree(tf2_seed(work), model, symlinks=True)
    (model / "assets" / "sub").mkdir(parents=True, exist_ok=True)
    (model / "assets" / "sub" / "file.txt").write_text("asset")
    for index in range(rng.randrange(1, 4)):
        where = model / rng.choice(["variables", "assets", "assets/sub"]) / f"link{index}"
        if not os.path.lexists(where):
            where.symlink_to(rng.choice(_LINKS))
    if rng.random() < 0.3:
        (model / "assets" / "loop_a").symlink_to("loop_b")
        (model / "assets" / "loop_b").symlink_to("loop_a")
    argv = ["rewrite", str(model), "-o", str(case_dir / "out"), "--quiet"]
    if rng.random() < 0.2:
        argv += ["--target", "litert"]
    return argv


def _seed_file(fmt: str, case_dir: Path, seeds: dict, name: str) -> Path:
    suffix = {"graphdef": ".pb", "metagraph": ".meta", "onnx": ".onnx"}[fmt]
    path = case_dir / f"{name}{suffix}"
    path.write_bytes(seeds[fmt].SerializeToString())
    return path


def _verify_case(rng, case_dir: Path, seeds: dict, work: Path) -> list[str]:
    """Two models: the same, one with an input of another shape or name, another
    model altogether, a training artifact against a plain model, or TF against
    ONNX."""
    import onnx

    fmt = rng.choice(["metagraph", "onnx"])
    a = _seed_file(fmt, case_dir, seeds, "a")
    choice = rng.randrange(5)
    if choice == 0 and fmt == "onnx":
        model = onnx.load(a)
        value = model.graph.input[0]
        dims = value.type.tensor_type.shape.dim
        if dims and rng.random() < 0.5:
            dims[0].dim_value = rng.choice([1, 5, 2**20])
        else:
            value.name = "renamed"
            for node in model.graph.node:
                node.input[:] = ["renamed" if i == model.graph.input[0].name else i
                                 for i in node.input]
        b = case_dir / "b.onnx"
        onnx.save(model, b)
    elif choice == 1:
        other = rng.choice(["control_flow.meta", "mlp_adam.meta", "onnx_conv_net.onnx",
                            "ort_artifacts/mlp_ce/training_model.onnx"])
        b = case_dir / Path(other).name
        shutil.copyfile(DATA / other, b)
    elif choice == 2:
        b = case_dir / "b.onnx"
        shutil.copyfile(DATA / "ort_artifacts" / "mlp_ce" / "training_model.onnx", b)
        if rng.random() < 0.5:
            a, b = b, a
    elif choice == 3:
        message = type(seeds[fmt])()
        message.CopyFrom(seeds[fmt])
        field_mutation(rng, message)
        b = case_dir / f"b{a.suffix}"
        b.write_bytes(message.SerializeToString())
    else:
        b = a
    return ["verify", str(a), str(b), "--steps", "1", "--quiet"]


def _feed_case(rng, case_dir: Path, seeds: dict, work: Path) -> list[str]:
    import numpy as np

    fmt = rng.choice(["metagraph", "onnx"])
    model = _seed_file(fmt, case_dir, seeds, "model")
    shape = rng.choice([(2, 4), (2, 4), (2, 4), (4, 8), (2, 8), (3, 5, 7), (), (0, 4),
                        (2, 4, 1)])  # the seeds' x is (2, 4)
    dtype = rng.choice(["float32", "float64", "int64", "bool", "complex128", "<U3", "uint8",
                        "float16"])
    array = np.zeros(shape, dtype=dtype)
    feed = case_dir / "feed.npy"
    np.save(feed, array)
    if rng.random() < 0.1:
        feed.write_bytes(feed.read_bytes()[:rng.randrange(1, 80)])
    name = rng.choice(["x", "x", "x:0", "nosuch", ""])
    if fmt == "metagraph" and rng.random() < 0.4:
        return ["rewrite", str(model), "-o", str(case_dir / "out.meta"), "--quiet",
                "--recompute", "auto", "--profile", "--feed", f"{name}={feed}"]
    return ["verify", str(model), str(model), "--steps", "1", "--quiet", "--feed",
            f"{name}={feed}"]


def _litert_case(rng, case_dir: Path, seeds: dict, work: Path) -> list[str]:
    from tensorflow.core.protobuf import saved_model_pb2

    model = case_dir / "model"
    shutil.copytree(tf2_seed(work), model, symlinks=True)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model / "saved_model.pb").read_bytes())
    library = saved.meta_graphs[0].graph_def.library
    target = rng.choice(list(library.function)) if library.function and \
        rng.random() < 0.7 else saved
    for _ in range(rng.randrange(1, 3)):
        field_mutation(rng, target)
    (model / "saved_model.pb").write_bytes(saved.SerializeToString())
    return ["rewrite", str(model), "-o", str(case_dir / "out"), "--quiet", "--target",
            rng.choice(["litert", "tflite"]),
            *rng.choice([[], ["--recompute", "auto"], ["--recompute", ".*"]])]


_HUGE = ("9" * 400, "1" + "0" * 19, str(2**63), str(2**63 - 1), "99999999999TiB",
         "8388608TiB", "1e400", "0.5", "-1", "1" + "0" * 5000 + "x", "99999999999999999999x",
         "1001x", "0x", "nanx", "infx", "\u0661\u0662MiB")


def _budget_case(rng, case_dir: Path, seeds: dict, work: Path) -> list[str]:
    fmt = rng.choice(["metagraph", "onnx"])
    model = _seed_file(fmt, case_dir, seeds, "model")
    out = case_dir / f"out{model.suffix}"
    value = rng.choice(_HUGE)
    flag = rng.choice(["--memory-budget-bytes", "--memory-budget"])
    argv = ["rewrite", str(model), "-o", str(out), "--quiet", "--recompute", "auto",
            "--batch-size", "2"]
    if rng.random() < 0.3:
        config = case_dir / "c.toml"
        key = flag.lstrip("-").replace("-", "_")
        config.write_text(f'{key} = "{value}"\n' if rng.random() < 0.5 or not value.isdigit()
                          else f"{key} = {value}\n")
        return argv + ["--config", str(config)]
    return argv + [f"{flag}={value}"]


def _tree(case_dir: Path) -> dict:
    """Every path under ``case_dir`` (links not followed): its kind and, for small
    regular files, its bytes."""
    found = {}
    for top, dirs, files in os.walk(case_dir):
        for name in dirs + files:
            path = Path(top) / name
            info = os.lstat(path)
            content = os.readlink(path) if stat.S_ISLNK(info.st_mode) else \
                path.read_bytes() if stat.S_ISREG(info.st_mode) and info.st_size < 2**22 \
                else info.st_size if stat.S_ISREG(info.st_mode) else None
            found[str(path)] = (stat.S_IFMT(info.st_mode), content)
    return found


def check_hostile_case(path: Path) -> list[dict]:
    """Run one hostile case in this process and judge it (module docstring)."""
    from graphpass.cli import main
    from tools.fuzz_mutators import exit_problem

    case = json.loads(path.read_text())
    case_dir = path.parent
    before = _tree(case_dir)
    stderr = io.StringIO()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(stderr):
            status = main(case["argv"])
    except BaseException as exc:  # an escaping exception is what we look for
        return [dict(ident=case_dir.name, command=case["kind"], status="traceback",
                     problem=f"{type(exc).__name__}: {str(exc)[:300]}")]
    text = stderr.getvalue()
    problem = None
    if status == 1 and 1 in case["allowed"]:
        pass  # verify: the two differ, said on stdout
    else:
        problem = exit_problem(status, text)
    if problem is None and status == 2:
        lines = text.strip().splitlines()
        after = _tree(case_dir)
        if len(lines[0]) > 3000 or not lines[0].isprintable():
            problem = "an error line too long or not printable"
        elif after != before:
            changed = sorted(set(before) ^ set(after)) + sorted(
                p for p in before if p in after and before[p] != after[p])
            problem = f"exit 2 but changed {changed[:3]}"
    return [dict(ident=case_dir.name, command=case["kind"], status=status, problem=problem)]


if __name__ == "__main__":  # python -m tools.fuzz_strategies export-tf2 DIR
    if sys.argv[1:2] == ["export-tf2"]:
        _export_tf2(Path(sys.argv[2]))
