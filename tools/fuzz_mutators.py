"""Structure-aware mutators for ``tools/fuzz.py`` (issue 27): function libraries
(self and mutual recursion, dangling names, deep nesting, bodies reading what
they lack), attrs of the wrong kind or missing, extreme integers and dims, ONNX
local functions, subgraphs and external-data paths with odd bytes; and the
command-line family, whose cases are argv lists over a directory of inputs and
outputs that collide, are devices or FIFOs, have long names or carry extreme
numbers in flags and in ``--config``, or an ONNX input whose external data file
is one of the command's other paths (:func:`make_external_alias_case`).

Each mutator takes ``(rng, message)`` and returns a one-line description; a
command-line case is a ``case.json`` the fuzz worker runs with
:func:`check_cli_case`.
"""

from __future__ import annotations

import io
import json
import os
import random
import stat
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

_EXTREME = (-1, 0, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1)
_ODD_NAMES = ("", "a\x00b", "\n", "\x1b[31m", "\u00e9" * 3, "x" * 300, "../x", "a:b:c")


# -- TF function libraries ---------------------------------------------------


def library_seed():
    """A MetaGraphDef whose top level calls library functions (forward and gradient)."""
    from tools.fixtures import tf_models

    model = tf_models.function_library(batch=2)
    meta = type(model.meta_graph)()
    meta.CopyFrom(model.meta_graph)
    return meta


def _functions(graph_def) -> list:
    return list(graph_def.library.function)


def _call_node(fdef, name: str, callee: str, rng: random.Random):
    node = fdef.node_def.add(name=name, op=rng.choice(["PartitionedCall",
                                                       "StatefulPartitionedCall"]))
    node.input.extend(a.name for a in fdef.signature.input_arg)
    node.attr["f"].func.name = callee
    return node


def _lib_self_call(rng, graph_def) -> str:
    fdefs = _functions(graph_def)
    if not fdefs:
        return "no library"
    fdef = rng.choice(fdefs)
    if rng.random() < 0.5:
        _call_node(fdef, "again", fdef.signature.name, rng)
    else:
        fdef.node_def.add(name="again", op=fdef.signature.name).input.extend(
            a.name for a in fdef.signature.input_arg)
    return f"self call {fdef.signature.name}"


def _lib_mutual(rng, graph_def) -> str:
    fdefs = _functions(graph_def)
    if len(fdefs) < 2:
        return _lib_self_call(rng, graph_def)
    a, b = rng.sample(fdefs, 2)
    _call_node(a, "to_b", b.signature.name, rng)
    _call_node(b, "to_a", a.signature.name, rng)
    return f"mutual {a.signature.name} <-> {b.signature.name}"


def _lib_dangling(rng, graph_def) -> str:
    name = rng.choice(["ghost", "", " ", "\u00e9", "a" * 500])
    calls = [n for n in graph_def.node if n.op in ("PartitionedCall", "StatefulPartitionedCall")]
    calls += [n for f in _functions(graph_def) for n in f.node_def
              if n.op in ("PartitionedCall", "StatefulPartitionedCall")]
    choice = rng.randrange(3)
    if calls and choice == 0:
        node = rng.choice(calls)
        node.attr["f"].func.name = name
        return f"dangling call {node.name} -> {name[:20]!r}"
    if choice == 1 and graph_def.library.function:
        graph_def.library.gradient.add(function_name=graph_def.library.function[0]
                                       .signature.name, gradient_func=name)
        return f"dangling gradient -> {name[:20]!r}"
    node = rng.choice(list(graph_def.node))
    node.attr[rng.choice(["f", "then_branch", "body"])].func.name = name
    return f"dangling attr {node.name} -> {name[:20]!r}"


def _lib_deep(rng, graph_def) -> str:
    """A chain of wrappers (depth up to 1500) in front of a function a call uses."""
    calls = [n for n in graph_def.node if n.op in ("PartitionedCall", "StatefulPartitionedCall")]
    if not calls:
        return _lib_self_call(rng, graph_def)
    call = rng.choice(calls)
    target = call.attr["f"].func.name
    fdef = next((f for f in graph_def.library.function if f.signature.name == target), None)
    if fdef is None:
        return "no callee"
    depth = rng.choice([10, 500, 1500])
    previous = target
    for i in range(depth):
        wrapper = graph_def.library.function.add()
        wrapper.signature.CopyFrom(fdef.signature)
        wrapper.signature.name = f"wrap_{i}"
        _call_node(wrapper, "call", previous, rng)
        for k, arg in enumerate(fdef.signature.output_arg):
            wrapper.ret[arg.name] = f"call:output:{k}"
        previous = wrapper.signature.name
    call.attr["f"].func.name = previous
    return f"deep {depth} -> {target}"


def _lib_body_input(rng, graph_def) -> str:
    fdefs = [f for f in _functions(graph_def) if any(n.input for n in f.node_def)]
    if not fdefs:
        return "no body input"
    fdef = rng.choice(fdefs)
    node = rng.choice([n for n in fdef.node_def if n.input])
    text = rng.choice(["nowhere:output:0", "MatMul:product:1e3", "MatMul:product:-1",
                       f"{node.name}:y:{2**40}", "a:b:c:d", "", "^nowhere",
                       f"{node.name}:output:0"])
    node.input[rng.randrange(len(node.input))] = text
    return f"body input {fdef.signature.name}/{node.name} <- {text!r}"


def _lib_body_attr(rng, graph_def) -> str:
    fdefs = [f for f in _functions(graph_def) if any(n.attr for n in f.node_def)]
    if not fdefs:
        return "no body attr"
    fdef = rng.choice(fdefs)
    node = rng.choice([n for n in fdef.node_def if n.attr])
    key = rng.choice(sorted(node.attr))
    return f"body {fdef.signature.name}/" + _damage_attr(rng, node, key)


def _lib_ret(rng, graph_def) -> str:
    fdefs = [f for f in _functions(graph_def) if f.ret]
    if not fdefs:
        return "no ret"
    fdef = rng.choice(fdefs)
    key = rng.choice(sorted(fdef.ret))
    fdef.ret[key] = rng.choice(["nowhere:output:0", "", fdef.signature.name])
    return f"ret {fdef.signature.name}.{key}"


def library_mutators() -> list:
    return [_lib_self_call, _lib_mutual, _lib_dangling, _lib_deep, _lib_body_input,
            _lib_body_attr, _lib_ret, attr_wrong_kind, attr_missing, extreme_shape]


# -- TF attrs and numbers ------------------------------------------------------


def _damage_attr(rng, node, key: str) -> str:
    value = node.attr[key]
    choice = rng.randrange(5)
    if choice == 0:
        value.i = rng.choice(_EXTREME)
    elif choice == 1:
        value.s = rng.choice([b"float32", b"\xff", b""])
    elif choice == 2:
        value.list.i.extend([2**63 - 1, -1])
    elif choice == 3:
        value.func.name = rng.choice(["", "ghost"])
    else:
        del node.attr[key]
    return f"attr {node.name}.{key} #{choice}"


def attr_wrong_kind(rng, graph_def) -> str:
    """A type (or any) attr given a value of another kind, or removed."""
    nodes = [n for n in graph_def.node if n.attr]
    if not nodes:
        return "no attrs"
    node = rng.choice(nodes)
    typed = [k for k, v in node.attr.items() if v.WhichOneof("value") in ("type", "list")]
    key = rng.choice(typed or sorted(node.attr))
    return _damage_attr(rng, node, key)


def attr_missing(rng, graph_def) -> str:
    """A required attr removed from a node (``T`` of an op feeding a While)."""
    nodes = [n for n in graph_def.node if n.attr and not n.name.startswith("save")]
    if not nodes:
        return "no attrs"
    node = rng.choice(nodes)
    key = "T" if "T" in node.attr and rng.random() < 0.6 else rng.choice(sorted(node.attr))
    del node.attr[key]
    return f"missing attr {node.name}.{key}"


def extreme_shape(rng, graph_def) -> str:
    """Extreme integers in shape attrs and constant tensor shapes."""
    shaped = [(n, k) for n in graph_def.node for k, v in n.attr.items()
              if v.WhichOneof("value") in ("shape", "tensor")]
    if not shaped:
        return "no shapes"
    node, key = rng.choice(shaped)
    value = node.attr[key]
    shape = value.shape if value.WhichOneof("value") == "shape" else value.tensor.tensor_shape
    if shape.dim:
        shape.dim[rng.randrange(len(shape.dim))].size = rng.choice(_EXTREME)
    else:
        shape.dim.add(size=rng.choice(_EXTREME))
    return f"extreme shape {node.name}.{key}"


def tf_mutators() -> list:
    return [attr_wrong_kind, attr_missing, extreme_shape]


# -- ONNX --------------------------------------------------------------------


def _onnx_local_function(rng, model) -> str:
    """A model-local function that calls itself or another that calls it back,
    used by a node of the graph."""
    from onnx import helper

    domain = rng.choice(["local", "com.example"])
    names = ["fa"] if rng.random() < 0.5 else ["fa", "fb"]
    for i, name in enumerate(names):
        callee = names[(i + 1) % len(names)]
        body = [helper.make_node(callee, ["x"], ["y"], domain=domain)]
        model.functions.append(helper.make_function(
            domain, name, ["x"], ["y"], body,
            [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]))
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, 1))
    node = rng.choice(list(model.graph.node))
    model.graph.node.append(helper.make_node("fa", [node.output[0]], ["local_out"],
                                             domain=domain, name="local_call"))
    return f"local function {' -> '.join(names)} (recursive)"


def _onnx_subgraph(rng, model) -> str:
    """An ``If`` whose branches hold odd content: a cycle, an extreme dim, a
    node reading what nothing makes, or a nested If."""
    import onnx
    from onnx import helper

    node = rng.choice(list(model.graph.node))
    out = helper.make_tensor_value_info("branch_out", onnx.TensorProto.FLOAT, None)
    inner = [helper.make_node("Identity", [node.output[0]], ["branch_out"])]
    kind = rng.randrange(4)
    if kind == 0:
        inner = [helper.make_node("Identity", ["branch_out"], ["branch_out"])]
    elif kind == 1:
        out = helper.make_tensor_value_info("branch_out", onnx.TensorProto.FLOAT,
                                            [rng.choice(_EXTREME), 2])
    elif kind == 2:
        inner = [helper.make_node("Identity", ["nowhere"], ["branch_out"])]
    branch = helper.make_graph(inner, "branch", [], [out])
    if kind == 3:
        nested = helper.make_node("If", ["cond_in"], ["branch_out"], then_branch=branch,
                                  else_branch=branch)
        branch = helper.make_graph([nested], "outer", [], [out])
    cond = helper.make_node("Constant", [], ["cond_in"],
                            value=helper.make_tensor("c", onnx.TensorProto.BOOL, [], [True]))
    model.graph.node.extend([cond, helper.make_node(
        "If", ["cond_in"], ["if_out"], name="odd_if", then_branch=branch,
        else_branch=branch)])
    return f"subgraph #{kind}"


def _onnx_extreme_dims(rng, model) -> str:
    values = list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
    value = rng.choice(values)
    dims = value.type.tensor_type.shape.dim
    if not dims:
        dims.add()
    dim = dims[rng.randrange(len(dims))]
    choice = rng.randrange(3)
    if choice == 0:
        dim.dim_value = rng.choice(_EXTREME + (2**63 - 1,))
    elif choice == 1:
        dim.Clear()
    else:
        dim.dim_param = rng.choice(["N", "", "batch"])
    if rng.random() < 0.3 and model.graph.initializer:
        tensor = rng.choice(list(model.graph.initializer))
        tensor.dims[:] = [rng.choice(_EXTREME)] + list(tensor.dims[1:])
    return f"extreme dim {value.name} #{choice}"


def external_tensor(rng, model):
    """One of ``model``'s initializers, made to point at external data (no location
    yet): what every external-data mutation starts from."""
    import onnx

    tensor = rng.choice(list(model.graph.initializer))
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    return tensor


def _onnx_external_odd(rng, model) -> str:
    tensor = external_tensor(rng, model)
    location = rng.choice(["da\x00ta.bin", "data.bin\n", "\x1b.bin", "d" * 300 + ".bin",
                           "data.bin", "./data.bin", "sub//data.bin", "\u00e9.bin"])
    tensor.external_data.add(key="location", value=location)
    if rng.random() < 0.5:
        tensor.external_data.add(key=rng.choice(["offset", "length"]),
                                 value=rng.choice(["0", "1e3", "-0", "\u0661", str(2**63)]))
    return f"external odd {tensor.name} at {location[:20]!r}"


def onnx_mutators() -> list:
    return [_onnx_local_function, _onnx_subgraph, _onnx_extreme_dims, _onnx_external_odd]


# -- the command line ----------------------------------------------------------

#: The rewrite options the command-line family picks from, with extreme values.
_FLAG_VALUES = (
    ["--drop-stale", "1" + "0" * 29], ["--drop-stale", "-" + "9" * 30], ["--drop-stale", "2"],
    ["--batch-size", "1" + "0" * 30], ["--batch-size", "0"],
    ["--loss", "loss:2147483648"], ["--loss", "loss:5"], ["--loss", "loss:-1"],
    ["--memory-budget-bytes", "9" * 40], ["--recompute", "auto", "--batch-size", str(2**62)],
    ["--global-step", "x" * 5000], ["--recompute", "(" * 300],
)
_CONFIG_LINES = ("drop_stale = 1000000000000000000000000000000", "drop_stale = -1e400",
                 "batch_size = 99999999999999999999", 'loss = "loss:2147483648"',
                 'report = "r\\u0000.json"', 'loss = "' + "l" * 5000 + '"', "drop_stale = 2")


def make_cli_case(rng: random.Random, case_dir: Path, seeds: dict) -> dict:
    """Lay out a directory of inputs and outputs and the argv of one hostile command
    line; returns the case description (also written to ``case.json``)."""
    alias = random.Random(f"external-alias:{case_dir.name}")
    if alias.random() < 0.2:
        return make_external_alias_case(alias, case_dir, seeds)
    fmt = rng.choice(["graphdef", "onnx"])
    model = case_dir / ("model.onnx" if fmt == "onnx" else "model.pb")
    model.write_bytes(seeds[fmt].SerializeToString())
    out = case_dir / ("out.onnx" if fmt == "onnx" else "out.pb")
    special = _special_files(case_dir, rng)
    paths = {"model": model, "out": out, "report": case_dir / "report.json",
             "dumps": case_dir / "dumps", **special}
    argv = ["rewrite", str(model), "-o", str(paths[_pick(rng, paths, "out", 0.4)]), "--quiet"]
    if rng.random() < 0.5:
        argv += ["--report", str(paths[_pick(rng, paths, "report", 0.4)])]
    if rng.random() < 0.3:
        argv += ["--dump-dir", str(paths[_pick(rng, paths, "dumps", 0.5)])]
    if rng.random() < 0.4:
        argv += rng.choice(_FLAG_VALUES)
    if rng.random() < 0.3:
        config = case_dir / "c.toml"
        config.write_text(rng.choice(_CONFIG_LINES) + "\n")
        argv += ["--config", str(config)]
        if rng.random() < 0.3:
            argv += ["--report", str(config)]
    if rng.random() < 0.15:
        argv[3] = str(case_dir / ("n" * rng.choice([200, 240, 256, 4000])))
    if rng.random() < 0.1:
        argv += ["--in-place"]
    if rng.random() < 0.1:
        argv = ["inspect", str(model), "--memory-plot",
                str(paths[_pick(rng, paths, "plot", 0.6)] if rng.random() < 0.6
                    else case_dir / "plot.svg")]
    case = {"argv": argv, "format": fmt}
    (case_dir / "case.json").write_text(json.dumps(case))
    return case


def make_external_alias_case(rng: random.Random, case_dir: Path, seeds: dict) -> dict:
    """An ONNX input whose external data file is another path of the command: an
    output (``-o``, ``--report``, ``--memory-plot``, an entry of ``--dump-dir``, a
    name the output gives its own data), the ``--config``, or, with the outputs in
    a subdirectory, the name those take beside the output (where a writer that kept
    the input's locations would copy the data). ``weights`` in the case: what the
    written model must read (:func:`_judge_weights`)."""
    import hashlib

    from onnx import TensorProto, numpy_helper

    out_dir = case_dir / rng.choice([".", "o"])
    out_dir.mkdir(exist_ok=True)
    dumps = rng.choice([case_dir / "dumps", out_dir / "dumps", out_dir])
    paths = {"-o": out_dir / "out.onnx", "--report": out_dir / "report.json",
             "--config": out_dir / "c.toml", "--memory-plot": out_dir / "plot.svg",
             "--dump-dir": dumps}
    model = type(seeds["onnx"])()
    model.CopyFrom(seeds["onnx"])
    data, weights = b"", {}
    for tensor in model.graph.initializer:
        raw = numpy_helper.to_array(tensor).tobytes()
        weights[tensor.name] = hashlib.sha256(raw).hexdigest()
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", ""), ("offset", len(data)), ("length", len(raw))):
            tensor.external_data.add(key=key, value=str(value))
        data += raw
    digest = hashlib.sha256(data).hexdigest()[:16]
    aliased = [*paths.values(), dumps / "index.json", dumps / "memory.svg",
               dumps / "00-input.onnx.txt", out_dir / f"out.onnx.{digest}.data",
               out_dir / "out.onnx.0123456789abcdef.data"]
    target = rng.choice(aliased)
    location = os.path.relpath(target, case_dir if rng.random() < 0.6 else out_dir)
    if location.startswith(".."):  # (locations leaving the model's directory: other mutators)
        location = os.path.relpath(target, case_dir)
    if (case_dir / location).is_dir():  # the dumps directory is the outputs' own
        location = os.path.relpath(case_dir / location / "index.json", case_dir)
    for tensor in model.graph.initializer:
        tensor.external_data[0].value = location
    (case_dir / location).parent.mkdir(parents=True, exist_ok=True)
    (case_dir / location).write_bytes(data)
    (case_dir / "model.onnx").write_bytes(model.SerializeToString())
    if rng.random() < 0.2:
        argv = ["inspect", str(case_dir / "model.onnx"), "--memory-plot",
                str(paths["--memory-plot"])]
    else:
        argv = ["rewrite", str(case_dir / "model.onnx"), "-o", str(paths["-o"]), "--quiet"]
        for flag in ("--report", "--dump-dir", "--config"):
            if rng.random() < 0.5:
                argv += [flag, str(paths[flag])]
        if "--config" in argv and not paths["--config"].exists():
            paths["--config"].write_text("quiet = true\n")
    case = {"argv": argv, "format": "onnx", "weights": weights,
            "mutation": f"external data at {location!r}"}
    (case_dir / "case.json").write_text(json.dumps(case))
    return case


def _judge_weights(case: dict, status: int) -> str | None:
    """On exit 0, the written model reads the weights its input held (not a report,
    a config or its own bytes): every initializer's bytes, loaded by onnx."""
    argv = case["argv"]
    if status != 0 or "weights" not in case or "-o" not in argv:
        return None
    import hashlib

    import onnx
    from onnx import numpy_helper

    output = argv[argv.index("-o") + 1]
    try:
        model = onnx.load(output)
    except Exception as exc:  # any failure to load is what this judge reports
        return f"exit 0 but {output} does not load its external data: {str(exc)[:200]}"
    read = {t.name: hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()
            for t in model.graph.initializer}
    wrong = sorted(name for name, digest in case["weights"].items() if read.get(name) != digest)
    return f"exit 0 but {output} reads other weights for {wrong[:3]}" if wrong else None


def _pick(rng: random.Random, paths: dict, own: str, odd: float) -> str:
    """``own`` usually; with probability ``odd`` another path of the case (a collision)."""
    if own in paths and rng.random() >= odd:
        return own
    return rng.choice(sorted(paths))


def _special_files(case_dir: Path, rng: random.Random) -> dict:
    """A FIFO, a character device of our own (never the system's), links to the
    model, a directory that is not a SavedModel, a dangling link."""
    found = {}
    fifo = case_dir / "fifo"
    os.mkfifo(fifo)
    found["fifo"] = fifo
    device = case_dir / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        found["device"] = device
    except (OSError, AttributeError):
        pass
    model = next(p for p in case_dir.iterdir() if p.name.startswith("model"))
    (case_dir / "sym").symlink_to(model.name)
    os.link(model, case_dir / "hard")
    found.update(sym=case_dir / "sym", hard=case_dir / "hard")
    (case_dir / "a_dir").mkdir()
    (case_dir / "a_dir" / "keep.txt").write_text("keep")
    found["a_dir"] = case_dir / "a_dir"
    (case_dir / "dangling").symlink_to("nowhere")
    found["dangling"] = case_dir / "dangling"
    return found


def _snapshot(case_dir: Path) -> dict:
    """Every path under ``case_dir``: its kind and, for regular files, its bytes."""
    found = {}
    for path in sorted(case_dir.rglob("*")):
        info = os.lstat(path)
        kind = stat.S_IFMT(info.st_mode)
        found[str(path)] = (kind, path.read_bytes() if stat.S_ISREG(info.st_mode)
                            and info.st_size < 2**22 else info.st_ino)
    return found


def check_cli_case(path: Path) -> list[dict]:
    """Run one command-line case in this process; judge it: exit 0 or 2, one error
    line on 2, nothing under the case directory changed on 2, and on 0 the inputs
    unchanged, every special file still what it was, and each output what it
    should be (no output lost or replaced by another)."""
    from graphpass.cli import main

    case = json.loads(path.read_text())
    case_dir = path.parent
    before = _snapshot(case_dir)
    stderr = io.StringIO()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(stderr):
            status = main(case["argv"])
    except BaseException as exc:  # an escaping exception is what we look for
        return [dict(ident=case_dir.name, command="cli", status="traceback",
                     problem=f"{type(exc).__name__}: {str(exc)[:300]}")]
    after = _snapshot(case_dir)
    problem = _judge_cli(case, status, stderr.getvalue(), before, after, case_dir) or \
        _judge_weights(case, status)
    return [dict(ident=case_dir.name, command="cli", status=status, problem=problem)]


def exit_problem(status: int, stderr: str) -> str | None:
    """What is wrong with how a command ended: only 0, or 2 with one error line."""
    if status not in (0, 2):
        return f"exit {status}: {stderr.strip()[-300:]}"
    lines = stderr.strip().splitlines()
    if status == 2 and (len(lines) != 1 or not lines[0].startswith("graphpass: error: ")):
        return f"exit 2 without one error line: {stderr.strip()[-300:]!r}"
    return None


def _judge_cli(case: dict, status: int, stderr: str, before: dict, after: dict,
               case_dir: Path) -> str | None:
    argv = case["argv"]
    problem = exit_problem(status, stderr)
    if problem:
        return problem
    if status == 2:
        lines = stderr.strip().splitlines()
        if len(lines[0]) > 3000 or not lines[0].isprintable():
            return "an error line too long or not printable"
        # dumps may be created before a later refusal? No: all checks come first.
        changed = sorted(set(before) ^ set(after)) + sorted(
            p for p in before if p in after and before[p] != after[p])
        return f"exit 2 but changed {changed[:3]}" if changed else None
    written = {str(Path(argv[i + 1])) for i, a in enumerate(argv)
               if a in ("-o", "--report", "--memory-plot")}
    dumps = [str(Path(argv[i + 1])) for i, a in enumerate(argv) if a == "--dump-dir"]
    for path, (kind, content) in before.items():
        if path in written or any(path.startswith(d + os.sep) for d in dumps):
            continue
        if after.get(path) != (kind, content) and "--in-place" not in argv:
            return f"exit 0 but {path} changed (an input or a file not named as output)"
    for flag in ("-o", "--report"):
        if flag in argv:
            target = Path(argv[argv.index(flag) + 1])
            if not target.is_file() or target.is_symlink():
                return f"exit 0 but {flag} {target} is no regular file"
            data = target.read_bytes()
            if (flag == "--report") != data.lstrip().startswith(b"{"):
                return f"exit 0 but {flag} {target} holds the other output"
    return None
