"""Fuzz ``graphpass inspect`` and ``graphpass rewrite`` with mutated models and
hostile command lines.

Every case must end in exit 0, or exit 2 with one ``graphpass: error:`` line
and nothing written: never a traceback, a crash (signal), a hang or a lost
output. Model cases are mutated from small seed models (a GraphDef, its text
form, a MetaGraphDef, a MetaGraphDef with a function library, an ONNX training
step), mostly *structurally* (ports, attrs, cycles, names, strings that are not
UTF-8, recursive or dangling functions, extreme dims, external-data locations;
``fuzz_mutators.py`` holds the second round's) so that they get past the
parsers, partly byte-level; each runs ``inspect`` and one rewrite of
:data:`REWRITES`. Command-line cases (``cli``) point outputs at inputs, at each
other, at devices, FIFOs and links, with long names and extreme numbers.
``fuzz_strategies.py`` adds a field-level mutator of any protobuf message and
the ``hostile`` family (SavedModel link cycles, ``verify`` pairs and feeds,
``--target litert``, huge budgets).

Cases run in batches inside worker subprocesses: TF is imported once per
worker, and a worker that dies (segfault) or stops answering (hang) takes only
its current case with it; the next worker resumes after that case.

    python -m tools.fuzz --cases 5000 --seed 1 [--keep DIR]
    python -m tools.fuzz --family tf --cases 10000 --seed 2027   # a benchmark run

``tests/test_fuzz.py`` runs the short version (fixed seeds) in the suite.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("graphdef", "pbtxt", "metagraph", "library", "onnx", "cli", "hostile")
#: The format families a benchmark run counts separately (``--family``).
FAMILIES = {"tf": ("graphdef", "pbtxt", "metagraph", "library"), "onnx": ("onnx",),
            "cli": ("cli",), "hostile": ("hostile",)}
#: The rewrite a case runs besides ``inspect``, picked per case: a no-pass round
#: trip, the planner, stale dropping, and every op recomputed for XLA (which
#: imports the library into TF for shapes).
REWRITES = ((), ("--recompute", "auto", "--batch-size", "2"), ("--drop-stale", "2"),
            ("--recompute", ".*", "--target", "xla"))
#: Ports that once crashed or aliased: 2^31 and up overflow TF's int32 port.
_PORTS = (1, 2, 7, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**63 - 1, 10**30)
_BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")


@dataclass
class Case:
    """One mutated model file and the mutations that made it."""

    ident: str
    fmt: str
    path: Path
    mutations: list[str]


@dataclass
class Outcome:
    """What one command did with one case; ``problem`` is None when it behaved."""

    ident: str
    command: str
    status: int | str
    problem: str | None = None


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.problem]

    def counts(self) -> Counter:
        return Counter((o.ident.split("-")[0], o.command, o.status) for o in self.outcomes)


# -- seeds -------------------------------------------------------------------


def seed_models() -> dict[str, object]:
    """The parsed seed of each format: a small Adam MLP (TF) and SGD MLP (ONNX)."""
    from tools.fixtures import onnx_models, tf_models

    tf_model = tf_models.block_mlp(batch=2, width=4, blocks=2)
    flow = tf_models.control_flow(batch=2)
    meta = type(tf_model.meta_graph)()
    meta.CopyFrom(tf_model.meta_graph)
    from tools.fuzz_mutators import library_seed

    return {
        "graphdef": tf_model.graph_def,
        "pbtxt": flow.graph_def,
        "metagraph": meta,
        "library": library_seed(),
        "onnx": onnx_models.block_mlp(batch=2, width=4, blocks=2, check=False).model,
    }


# -- mutations ---------------------------------------------------------------


def _tf_mutators(fmt: str = "graphdef") -> list[Callable]:
    from tools import fuzz_mutators, fuzz_strategies

    basic = [_bad_port, _bad_port, _bad_port, _bad_type_attr, _bad_type_attr,
             _placeholder_attr, _empty_attr, _bad_shape_attr, _cycle, _cycle,
             _missing_input, _drop_node, _duplicate_name, _unknown_op, _bad_device,
             _shuffle_inputs, _control_of_self, _bad_tensor_attr,
             *fuzz_mutators.tf_mutators(),
             *fuzz_strategies.tf_strategies()]
    if fmt == "library":  # mostly the library, sometimes the graph around it
        return fuzz_mutators.library_mutators() * 3 + basic
    return basic


def _graph_def(message):
    return message.graph_def if hasattr(message, "meta_info_def") else message


def _pick_node(rng: random.Random, graph_def):
    return graph_def.node[rng.randrange(len(graph_def.node))] if graph_def.node else None


def _bad_port(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    others = [n for n in graph_def.node if n.name != node.name]
    producer = rng.choice(others).name
    port = rng.choice(_PORTS)
    text = f"{producer}:{port}" if rng.random() < 0.9 else f"{producer}:-{port}"
    if node.input and rng.random() < 0.7:
        node.input[rng.randrange(len(node.input))] = text
    else:
        node.input.append(text)
    return f"port {node.name} <- {text}"


def _bad_type_attr(rng, graph_def) -> str:
    picked = _attr_of_kind(rng, graph_def, "type")
    if picked is None:
        return _bad_port(rng, graph_def)
    node, key = picked
    value = rng.choice([0, 24, 99, 101, 120, 200, 1000, -1, 2**31 - 1])
    node.attr[key].type = value
    return f"type {node.name}.{key} = {value}"


def _placeholder_attr(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    key = rng.choice(list(node.attr) or ["T"])
    node.attr[key].placeholder = rng.choice(["T", "", "dtype", "\u00e9"])
    return f"placeholder {node.name}.{key}"


def _empty_attr(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    key = rng.choice(list(node.attr) or ["T"])
    node.attr[key].Clear()
    return f"empty attr {node.name}.{key}"


def _attr_of_kind(rng, graph_def, kind: str):
    """A random ``(node, attr key)`` whose value is of ``kind``, or None."""
    candidates = [(n, k) for n in graph_def.node for k, v in n.attr.items()
                  if v.WhichOneof("value") == kind]
    return rng.choice(candidates) if candidates else None


def _bad_shape_attr(rng, graph_def) -> str:
    picked = _attr_of_kind(rng, graph_def, "shape")
    if picked is None:
        return _empty_attr(rng, graph_def)
    node, key = picked
    shape = node.attr[key].shape
    shape.ClearField("dim")
    for _ in range(rng.randrange(4)):
        shape.dim.add(size=rng.choice([-7, -1, 0, 3, 2**40, 2**62]))
    shape.unknown_rank = rng.random() < 0.2
    return f"shape {node.name}.{key}"


def _bad_tensor_attr(rng, graph_def) -> str:
    picked = _attr_of_kind(rng, graph_def, "tensor")
    if picked is None:
        return _empty_attr(rng, graph_def)
    node, key = picked
    tensor = node.attr[key].tensor
    choice = rng.randrange(3)
    if choice == 0:
        tensor.dtype = rng.choice([0, 99, 101])
    elif choice == 1:
        tensor.tensor_shape.dim.add(size=rng.choice([-3, 2**40]))
    else:
        tensor.tensor_content = rng.randbytes(rng.randrange(1, 9))
    return f"tensor {node.name}.{key} #{choice}"


def _cycle(rng, graph_def) -> str:
    """Make a node read one of its descendants (or itself)."""
    node = _pick_node(rng, graph_def)
    readers = {n.name: [] for n in graph_def.node}
    for n in graph_def.node:
        for text in n.input:
            src = text.lstrip("^").split(":")[0]
            if src in readers:
                readers[src].append(n.name)
    seen, stack = [], [node.name]
    while stack and len(seen) < 50:
        name = stack.pop()
        if name not in seen:
            seen.append(name)
            stack.extend(readers.get(name, []))
    target = rng.choice(seen)
    text = ("^" if rng.random() < 0.3 else "") + target
    if text.startswith("^"):
        node.input.append(text)
    elif node.input and not node.input[0].startswith("^"):
        node.input[0] = text
    else:
        node.input.insert(0, text)
    return f"cycle {node.name} <- {text}"


def _missing_input(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    text = rng.choice(["nowhere", "nowhere:3", "^nowhere", "", ":", "a:b:c", "x:"])
    node.input.insert(rng.randrange(len(node.input) + 1), text)
    return f"missing {node.name} <- {text!r}"


def _drop_node(rng, graph_def) -> str:
    index = rng.randrange(len(graph_def.node))
    name = graph_def.node[index].name
    del graph_def.node[index]
    return f"drop {name}"


def _duplicate_name(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    other = _pick_node(rng, graph_def)
    node.name = rng.choice([other.name, "", "a:1", "^x", "a b", "\u00e9/x"])
    return f"rename -> {node.name!r}"


def _unknown_op(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    node.op = rng.choice(["NoSuchOp", "", "Switch", "Merge", "NextIteration", "Identity",
                          "VarHandleOp", "AssignVariableOp", "PartitionedCall", "If"])
    return f"op {node.name} = {node.op!r}"


def _bad_device(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    node.device = rng.choice(["/device:QPU:0", "garbage", "/job:ps/task:-1", "\u00e9" * 3])
    return f"device {node.name}"


def _shuffle_inputs(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    inputs = list(node.input)
    rng.shuffle(inputs)
    del node.input[:]
    node.input.extend(inputs)
    return f"shuffle {node.name}"


def _control_of_self(rng, graph_def) -> str:
    node = _pick_node(rng, graph_def)
    node.input.append("^" + node.name)
    return f"self-control {node.name}"


def _onnx_mutators() -> list[Callable]:
    from tools import fuzz_mutators, fuzz_strategies

    return [_onnx_bad_utf8, _onnx_bad_utf8, _onnx_missing_input, _onnx_cycle,
            _onnx_op_type, _onnx_external, _onnx_external, _onnx_dims, _onnx_opset,
            _onnx_duplicate_output, _onnx_attr, _onnx_drop_initializer,
            *fuzz_mutators.onnx_mutators() * 2,
            *fuzz_strategies.onnx_strategies()]


def _onnx_bad_utf8(rng, model) -> str:
    """Recorded here, applied to the bytes in :func:`_serialize` (protobuf keeps str)."""
    graph = model.graph
    node = graph.node[rng.randrange(len(graph.node))]
    where = rng.choice(["name", "op_type", "output", "input", "graph_output", "domain"])
    return f"utf8 {where} {node.name}"


def _onnx_missing_input(rng, model) -> str:
    node = rng.choice(model.graph.node)
    node.input.append(rng.choice(["nowhere", "", node.output[0]]))
    return f"missing {node.name}"


def _onnx_cycle(rng, model) -> str:
    nodes = model.graph.node
    late = nodes[rng.randrange(len(nodes) // 2, len(nodes))]
    early = nodes[rng.randrange(len(nodes) // 2)]
    early.input.append(late.output[0])
    return f"cycle {early.name} <- {late.output[0]}"


def _onnx_op_type(rng, model) -> str:
    node = rng.choice(model.graph.node)
    node.op_type = rng.choice(["NoSuchOp", "", "If", "Loop", "Identity", "Constant"])
    node.domain = rng.choice(["", "", "com.example", "ai.onnx.ml"])
    return f"op {node.name} = {node.op_type}"


def _onnx_external(rng, model) -> str:
    from tools.fuzz_mutators import external_tensor

    tensor = external_tensor(rng, model)
    location = rng.choice(["../outside.bin", "/etc/passwd", "data.bin", "", "sub/../../x.bin",
                           "link.bin", "missing.bin"])
    tensor.external_data.add(key="location", value=location)
    if rng.random() < 0.5:
        tensor.external_data.add(key="offset", value=rng.choice(["0", "-4", "x", str(2**40)]))
    if rng.random() < 0.5:
        tensor.external_data.add(key="length", value=rng.choice(["4", "-1", str(2**40)]))
    return f"external {tensor.name} at {location!r}"


def _onnx_dims(rng, model) -> str:
    value = rng.choice(list(model.graph.input) + list(model.graph.output))
    dims = value.type.tensor_type.shape.dim
    if dims:
        dims[0].dim_value = rng.choice([0, 2**40, 2**62])
    value.type.tensor_type.elem_type = rng.choice([1, 1, 0, 99])
    return f"dims {value.name}"


def _onnx_opset(rng, model) -> str:
    model.opset_import[0].version = rng.choice([0, 1, 7, 99, 2**40])
    model.ir_version = rng.choice([model.ir_version, 0, 3, 99])
    return f"opset {model.opset_import[0].version} ir {model.ir_version}"


def _onnx_duplicate_output(rng, model) -> str:
    a, b = rng.sample(list(model.graph.node), 2)
    b.output[0] = a.output[0]
    return f"duplicate output {a.output[0]}"


def _onnx_attr(rng, model) -> str:
    import onnx

    node = rng.choice(model.graph.node)
    attr = node.attribute.add(name=rng.choice(["perm", "axis", "keepdims", "x"]))
    attr.type = rng.choice([0, onnx.AttributeProto.INT, onnx.AttributeProto.GRAPH,
                            onnx.AttributeProto.STRINGS])
    if rng.random() < 0.5:
        attr.ints.extend([2**40, -5])
    return f"attr {node.name}.{attr.name}"


def _onnx_drop_initializer(rng, model) -> str:
    index = rng.randrange(len(model.graph.initializer))
    name = model.graph.initializer[index].name
    del model.graph.initializer[index]
    return f"drop initializer {name}"


def _mutated(mutator: Callable, rng: random.Random, target) -> str:
    """``mutator``'s description, or a note where an earlier field-level mutation
    left nothing it works on (an emptied node list, a cleared graph)."""
    try:
        return mutator(rng, target)
    except (IndexError, ValueError, KeyError, AttributeError, StopIteration) as exc:
        return f"{mutator.__name__}: not applicable ({type(exc).__name__})"


def _byte_mutation(rng, data: bytes) -> tuple[bytes, str]:
    if not data:
        return data, "empty"
    kind = rng.randrange(4)
    pos = rng.randrange(len(data))
    if kind == 0:
        return data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1:], f"byte {pos}"
    if kind == 1:
        return data[:pos], f"truncate {pos}"
    if kind == 2:
        return data[:pos] + rng.randbytes(rng.randrange(1, 16)) + data[pos:], f"insert {pos}"
    end = min(len(data), pos + rng.randrange(1, 64))
    return data[:end] + data[pos:end] + data[end:], f"repeat {pos}:{end}"


def _serialize(fmt: str, message, utf8_marks: list[str], rng: random.Random) -> bytes:
    if fmt == "pbtxt":
        from google.protobuf import text_format

        return text_format.MessageToString(message).encode()
    data = message.SerializeToString()
    for mark in utf8_marks:  # swap one byte of a string for bytes that are not UTF-8
        name = mark.split(" ", 2)[2].encode()
        if name and name in data:
            cut = rng.randrange(len(name))
            bad = name[:cut] + rng.choice(_BAD_UTF8) + name[cut + 1:]
            data = data.replace(name, bad, 1) if len(bad) == len(name) else _rewrite_string(
                data, name, bad)
    return data


def _rewrite_string(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replace one length-delimited string ``old`` by ``new``, fixing its length byte."""
    pos = data.find(bytes([len(old)]) + old)
    if pos < 0 or len(new) > 127:
        return data
    return data[:pos] + bytes([len(new)]) + new + data[pos + 1 + len(old):]


def make_cases(fmt: str, count: int, seed: int, out_dir: Path, seeds: dict) -> list[Case]:
    """``count`` mutated ``fmt`` models under ``out_dir``, reproducible from ``seed``."""
    rng = random.Random(f"{fmt}:{seed}")
    if fmt == "cli":
        return _cli_cases(rng, count, seed, out_dir, seeds)
    if fmt == "hostile":
        return _hostile_cases(rng, count, seed, out_dir, seeds)
    mutators = _onnx_mutators() if fmt == "onnx" else _tf_mutators(fmt)
    suffix = {"graphdef": ".pb", "pbtxt": ".pbtxt", "metagraph": ".meta", "library": ".meta",
              "onnx": ".onnx"}[fmt]
    cases = []
    for index in range(count):
        message = type(seeds[fmt])()
        message.CopyFrom(seeds[fmt])
        target = message if fmt == "onnx" else _graph_def(message)
        mutations = [_mutated(rng.choice(mutators), rng, target)
                     for _ in range(1 + int(rng.random() < 0.3))]
        utf8 = [m for m in mutations if m.startswith("utf8")]
        data = _serialize(fmt, message, utf8, rng)
        if rng.random() < 0.15:
            data, what = _byte_mutation(rng, data)
            mutations.append(what)
        ident = f"{fmt}-{seed}-{index}"
        case_dir = out_dir / ident
        case_dir.mkdir(parents=True)
        path = case_dir / f"model{suffix}"
        path.write_bytes(data)
        if fmt == "onnx":
            _external_files(case_dir, out_dir)
        cases.append(Case(ident, fmt, path, mutations))
    return cases


def _cli_cases(rng: random.Random, count: int, seed: int, out_dir: Path,
               seeds: dict) -> list[Case]:
    from tools.fuzz_mutators import make_cli_case

    cases = []
    for index in range(count):
        ident = f"cli-{seed}-{index}"
        case_dir = out_dir / ident
        case_dir.mkdir(parents=True)
        case = make_cli_case(rng, case_dir, seeds)
        cases.append(Case(ident, "cli", case_dir / "case.json", [" ".join(case["argv"])]))
    return cases


def _hostile_cases(rng: random.Random, count: int, seed: int, out_dir: Path,
                   seeds: dict) -> list[Case]:
    from tools.fuzz_strategies import make_hostile_case

    cases = []
    for index in range(count):
        ident = f"hostile-{seed}-{index}"
        case_dir = out_dir / ident
        case_dir.mkdir(parents=True)
        case = make_hostile_case(rng, case_dir, seeds, out_dir)
        cases.append(Case(ident, "hostile", case_dir / "case.json",
                          [f"{case['kind']}: {' '.join(case['argv'])}"]))
    return cases


def _external_files(case_dir: Path, out_dir: Path) -> None:
    """Files that the external-data mutations point at: one real, one a symlink out."""
    (case_dir / "data.bin").write_bytes(bytes(range(64)))
    outside = out_dir / "outside.bin"
    if not outside.exists():
        outside.write_bytes(b"secret" * 16)
    (case_dir / "link.bin").symlink_to(outside)


# -- running -----------------------------------------------------------------


def check_case(path: Path, fmt: str) -> list[Outcome]:
    """Run ``inspect`` and one ``rewrite`` (from :data:`REWRITES`, picked by the
    case's name) on one case, in this process."""
    from graphpass.cli import main

    if fmt == "cli":
        from tools.fuzz_mutators import check_cli_case

        return [Outcome(**o) for o in check_cli_case(path)]
    if fmt == "hostile":
        from tools.fuzz_strategies import check_hostile_case

        return [Outcome(**o) for o in check_hostile_case(path)]
    outcomes = []
    out = path.with_name("out" + path.suffix)
    extra = list(REWRITES[random.Random(path.parent.name).randrange(len(REWRITES))])
    # Not --quiet: the summary's estimates run too (the planner's, Grappler's graph).
    for command, argv in (("inspect", ["inspect", str(path)]),
                          ("rewrite", ["rewrite", str(path), "-o", str(out),
                                       *extra])):
        stderr = io.StringIO()
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(stderr):
                status = main(argv)
        except BaseException as exc:  # an escaping exception is the bug we look for
            outcomes.append(Outcome(path.parent.name, command, "traceback",
                                    f"{type(exc).__name__}: {str(exc)[:300]}"))
            continue
        outcomes.append(Outcome(path.parent.name, command, status,
                                _judge(command, status, stderr.getvalue(), out)))
    return outcomes


def _judge(command: str, status: int, stderr: str, out: Path) -> str | None:
    from tools.fuzz_mutators import exit_problem

    problem = exit_problem(status, stderr)
    if problem:
        return problem
    if status == 2:
        if command == "rewrite" and out.exists():
            return "exit 2 but the output was written"
    return None


def worker() -> int:
    """Read case lines (``path fmt``) from stdin, answer one JSON line per case (the
    parent sends the next case only after the answer, so no line waits in a buffer)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow  # noqa: F401

    import graphpass.cli  # noqa: F401  (import cost paid before the first case)
    print("ready", flush=True)
    for line in sys.stdin:
        path, fmt = line.split()
        if fmt == "crash":  # the harness's self-test: a case that kills its worker
            os.kill(os.getpid(), signal.SIGSEGV)
        outcomes = check_case(Path(path), fmt)
        print(json.dumps([vars(o) for o in outcomes]), flush=True)
    return 0


def run_cases(cases: list[Case], timeout_s: float = 30.0, workers: int = 2,
              progress: Callable[[int], None] | None = None) -> Summary:
    """Run cases through ``workers`` worker subprocesses at a time; crashes and hangs
    become outcomes. Outcomes come back in case order."""
    shares = [cases[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(lambda share: _run_share(share, timeout_s, progress), shares))
    order = {case.ident: index for index, case in enumerate(cases)}
    outcomes = sorted((o for part in parts for o in part.outcomes),
                      key=lambda o: order[o.ident])
    return Summary(outcomes)


def _run_share(cases: list[Case], timeout_s: float,
               progress: Callable[[int], None] | None) -> Summary:
    summary = Summary()
    pending = list(cases)
    while pending:
        pending = pending[_run_worker(pending, summary, timeout_s):]
        if progress:
            progress(len(cases) - len(pending))
    return summary


def _run_worker(cases: list[Case], summary: Summary, timeout_s: float) -> int:
    """Feed cases to one worker until it finishes, dies or hangs; returns cases used."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with tempfile.TemporaryFile("w+") as log:  # a pipe nobody reads would fill and block
        proc = subprocess.Popen([sys.executable, "-m", "tools.fuzz", "--worker"], cwd=ROOT,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log, text=True)
        try:
            if _read_line(proc, 120.0) != "ready\n":
                log.seek(0)
                raise RuntimeError(f"the fuzz worker did not start: {log.read()[-2000:]}")
            for index, case in enumerate(cases):
                proc.stdin.write(f"{case.path} {case.fmt}\n")
                proc.stdin.flush()
                answer = _read_line(proc, timeout_s)
                if not answer:
                    status = _death(proc, answer)
                    summary.outcomes.append(Outcome(case.ident, "worker", status,
                                                    f"{status}: {'; '.join(case.mutations)}"))
                    return index + 1
                summary.outcomes.extend(Outcome(**o) for o in json.loads(answer))
            return len(cases)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()


def _death(proc: subprocess.Popen, answer: str | None) -> str:
    """How a worker stopped answering: a hang (None), or its exit on end of output."""
    if answer is None:
        return "hang"
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return "hang"
    return f"signal {-code}" if code < 0 else f"died {code}"


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """The worker's next stdout line, "" at end of output, or None after ``timeout_s``."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline() if ready else None


def _failure_kind(outcome: Outcome) -> str:
    """traceback, signal, hang, lost (an output written, changed or replaced where it
    must not be) or other (an exit status or error text out of the rules)."""
    status, problem = str(outcome.status), outcome.problem or ""
    if status == "traceback" or "Traceback" in problem:
        return "traceback"
    if status.startswith(("signal", "died")):
        return "signal"
    if status == "hang":
        return "hang"
    if "written" in problem or "changed" in problem or "exit 0 but" in problem:
        return "lost"
    return "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=int, default=1250, help="cases per format")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--format", action="append", choices=FORMATS)
    parser.add_argument("--family", choices=sorted(FAMILIES),
                        help="all formats of a family; --cases is then per family")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--workers", type=int, default=2, help="worker processes at a time")
    parser.add_argument("--keep", help="keep the cases (and outputs) in this directory")
    args = parser.parse_args(argv)
    if args.worker:
        return worker()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="graphpass-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    seeds = seed_models()
    formats = args.format or FORMATS
    per_format = {fmt: args.cases for fmt in formats}
    if args.family:
        formats = FAMILIES[args.family]
        per_format = {fmt: args.cases // len(formats) + (i < args.cases % len(formats))
                      for i, fmt in enumerate(formats)}
    cases = [case for fmt in formats
             for case in make_cases(fmt, per_format[fmt], args.seed, work, seeds)]
    summary = run_cases(cases, args.timeout, args.workers,
                        lambda n: print(f"  {n} cases", file=sys.stderr))
    mutations = {case.ident: "; ".join(case.mutations) for case in cases}
    for (fmt, command, status), n in sorted(summary.counts().items(), key=str):
        print(f"{fmt:10s} {command:8s} {status!s:10s} {n}")
    for failure in summary.failures:
        print(f"FAIL {failure.ident} {failure.command}: {failure.problem} "
              f"[{mutations[failure.ident]}]")
    kinds = Counter(_failure_kind(f) for f in summary.failures)
    print(f"cases {len(cases)} (seed {args.seed}): tracebacks {kinds['traceback']}, "
          f"signals {kinds['signal']}, hangs {kinds['hang']}, lost outputs {kinds['lost']}, "
          f"other {kinds['other']}")
    print(f"{len(summary.failures)} failure(s) in {time.perf_counter() - start:.0f}s; "
          f"cases in {work}")
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
