"""Kernel parity of a rewrite, checked on the graph TF executes: every original
node and every remat copy must run the same kernel (the op after TF's rewrites,
its ``fused_ops``) as the node it stands for ran in the original graph, and a
node absorbed into a fusion there must be absorbed here too.

A copy stands for the node whose name it carries under ``graphpass/remat/``
(``_copy_nodes`` names each copy so; Grappler names the nodes it makes from a
node after that node, so those map the same way). Nodes graphpass added that
copy nothing (ties, gates) have no counterpart and are not compared.

The executed graph comes from a child process (``fidelity_child.py run``)
with ``TF_ENABLE_ONEDNN_OPTS`` set as asked: a session's partition graphs,
after Grappler, function inlining and oneDNN's rewrites. It checks; it never
rewrites (a test helper, not a ``verify`` check: asking TF means running a step
with the model's inputs, which only the tests and the benchmark have).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from graphpass.passes.remat.marks import SCOPE

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "fidelity_child.py"
TIMEOUT_S = 900


def child_env(onednn: bool) -> dict:
    """The environment of a child run: oneDNN set explicitly (the CPU's default
    differs between machines), the repository importable."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1" if onednn else "0",
               TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def run_child(command: str, *args, onednn: bool = True) -> None:
    subprocess.run([sys.executable, str(CHILD), command, *map(str, args)], check=True,
                   env=child_env(onednn), cwd=ROOT, timeout=TIMEOUT_S)


class Stepped(NamedTuple):
    """What one child run of ``STEPS`` training steps of a model gives."""

    kernels: dict[str, tuple]  # {node: (op, fused_ops, data inputs, attributes' digest)}
    values: dict[str, np.ndarray]  # every variable after the steps, and the losses


def stepped(model: Path, onednn: bool) -> Stepped:
    """Train ``model`` in a child process with oneDNN set as asked: the kernels its
    first step executed and the values its steps left."""
    return stepped_each([model], onednn)[0]


def stepped_each(models: list[Path], onednn: bool) -> list[Stepped]:
    """:func:`stepped` of each model, one after the other in one child process."""
    with tempfile.TemporaryDirectory() as scratch:
        run_child("run", scratch, *models, onednn=onednn)
        return [_stepped_in(Path(scratch) / str(i)) for i in range(len(models))]


def _stepped_in(directory: Path) -> Stepped:
    found = json.loads((directory / "kernels.json").read_text())
    with np.load(directory / "values.npz") as data:
        values = {key: data[key] for key in data.files}
    kernels = {name: (op, tuple(fused), tuple(inputs), attrs)
               for name, (op, fused, inputs, attrs) in found.items()}
    return Stepped(kernels, values)


def counterpart(name: str) -> str:
    """The original node an executed node of a rewritten graph stands for."""
    while name.startswith(SCOPE):
        name = name[len(SCOPE):]
    return name


def parity_errors(original: dict, rewritten: dict, original_nodes: set[str],
                  rewritten_nodes: set[str]) -> list[str]:
    """Where a node of the rewritten graph runs another kernel than it (or, for a
    copy, its original) ran in the original graph (empty: parity): op after TF's
    rewrites, ``fused_ops``, attributes, and present or absorbed. ``original``,
    ``rewritten``: ``stepped(...).kernels`` of each; ``*_nodes``: the node names of
    each graph as written (a SavedModel's step function body), so that a node
    absorbed into a fusion is compared too. A copy whose original Grappler rewrote
    out of the original graph by name (folded, or regrouped under other names: a
    causal mask's ``Minimum``) is not compared: the copy waits for its trigger, so
    Grappler leaves it as written; the rewrite's own check compares such values by
    value (``runtimes/tf_exactness``), and the tests every variable's bytes."""
    known = set(original) | original_nodes
    errors = [f"{name}: {_kernel(original.get(name))} in the original, "
              f"{_kernel(rewritten.get(name))} rewritten"
              for name in sorted(known)
              if not _same(original.get(name), rewritten.get(name))]
    for name in sorted(n for n in set(rewritten) | rewritten_nodes if n.startswith(SCOPE)):
        source = counterpart(name)
        if source in known and not _same(original.get(source), rewritten.get(name)) \
                and original.get(source) is not None:
            errors.append(f"copy {name}: {_kernel(rewritten.get(name))}, its original ran "
                          f"{_kernel(original.get(source))}")
    return errors


def expression_differences(original: dict, rewritten: dict, original_nodes: set[str]
                           ) -> list[str]:
    """Diagnostics, not a check: the original nodes that compute from other values
    than in the original graph, first causes only, as expressions over the
    step's inputs and stored values (``_Expressions``): a sum Grappler grouped
    otherwise shows here, not as another kernel. Noisy where Grappler rebuilds
    a chain and moves its names between the chain's nodes."""
    known = set(original) | original_nodes
    numbers: dict[tuple, int] = {}  # shared: equal numbers, equal expressions
    want = _Expressions(original, known, numbers)
    got = _Expressions(rewritten, known, numbers)
    return [f"{name}: computes from other values than in the original"
            for name in sorted(set(original) & set(rewritten))
            if _same(original[name], rewritten[name]) and want.of(name) != got.of(name)
            and _cause(want, got, name, name)]


def _cause(want: _Expressions, got: _Expressions, original: str, rewritten: str) -> bool:
    """The node itself differs, not only what it reads: no input of the original
    that the rewritten graph has under its name (or its copy's, for a copy)
    computes differently there (inputs Grappler made are not compared by name)."""
    for reference in want.kernels[original][2]:
        node, _, port = reference.partition(":")
        other = SCOPE + node if rewritten.startswith(SCOPE) and SCOPE + node in got.kernels \
            else node
        if node in want.originals and other in got.kernels and \
                want.value(reference) != got.value(f"{other}:{port or 0}"):
            return False
    return True


class _Expressions:
    """Each executed value as an expression: a number standing for (kernel,
    attributes, the expressions it reads), equal across two graphs exactly when
    both compute the same thing the same way. Leaves: the step's inputs and
    stored values by the original's name (a copy's stands for its original's),
    constants by value. An ``Identity`` and a node graphpass added that copies
    nothing (an ordering ``Identity``, a data-mode tie ``x + signal``, which adds
    zero) stand for their first input."""

    def __init__(self, kernels: dict, originals: set[str], numbers: dict) -> None:
        self.kernels = kernels
        self.originals = originals
        self.numbers = numbers
        self.values: dict[str, tuple] = {}

    def of(self, name: str) -> tuple:
        return self.value(name + ":0")

    def value(self, reference: str) -> tuple:
        node, _, port = reference.partition(":")
        stack = [node]
        while stack:  # depth first without recursion: graphs are deep
            name = stack[-1]
            if name in self.values:
                stack.pop()
                continue
            inputs = [i.partition(":")[0] for i in self._inputs(name)]
            pending = [i for i in inputs if i not in self.values and i not in stack]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self.values[name] = self._number(name)
        passed = self._passes_on(node)
        if passed is not None:
            return self.value(passed)
        return (self.values[node], port or "0")

    def _inputs(self, name: str) -> tuple:
        kernel = self.kernels.get(name)
        return kernel[2] if kernel else ()

    def _passes_on(self, name: str) -> str | None:
        kernel = self.kernels.get(name)
        if not kernel or not kernel[2]:
            return None
        generated = name.startswith(SCOPE) and counterpart(name) not in self.originals
        return kernel[2][0] if kernel[0] == "Identity" or generated else None

    def _number(self, name: str) -> int:
        kernel = self.kernels.get(name)
        if kernel is None or not kernel[2]:
            key = ("const", kernel[3]) if kernel and kernel[0] == "Const" \
                else ("leaf", counterpart(name))
        else:
            passed = self._passes_on(name)
            if passed is not None:
                key = ("same",) + self.value(passed)
            else:
                inputs = [self.value(i) for i in kernel[2]]
                if kernel[0] in COMMUTATIVE or kernel[0] == "AddN" and len(inputs) == 2:
                    inputs.sort()  # a * b and b * a round alike
                key = (kernel[0], kernel[1], kernel[3], tuple(inputs))
        return self.numbers.setdefault(key, len(self.numbers))


#: Binary ops whose result does not depend on the order of their operands.
COMMUTATIVE = {"Mul", "AddV2", "Add", "Maximum", "Minimum", "SquaredDifference"}

#: Kernels that compute nothing, as good as absent: an ``Identity`` TF left
#: where it removed the node in the other graph (``x / 1`` made an ``Identity``,
#: dropped unless a control edge holds it) passes the same bits on; of equal
#: constants Grappler keeps one, whichever it meets first; a ``NoOp`` only
#: orders (one grouping a function's control outputs goes when they change); a
#: ``Reshape``, ``Squeeze`` or ``ExpandDims`` moves no data (Grappler removes one
#: whose output shape its input already has), so no number depends on it.
NOTHING = {None, ("Identity", ()), ("Const", ()), ("NoOp", ()), ("Reshape", ()),
           ("Squeeze", ()), ("ExpandDims", ())}


def _same(want, got) -> bool:
    """Same kernel and attributes (or both nothing)."""
    if want is not None and got is not None:
        return (want[0], want[1], want[3]) == (got[0], got[1], got[3]) or \
            {want[:2], got[:2]} <= NOTHING
    return {want and want[:2], got and got[:2]} <= NOTHING


def _kernel(kernel) -> str:
    if kernel is None:
        return "absent (absorbed or removed)"
    op, fused = kernel[:2]
    return f"{op}[{', '.join(fused)}]" if fused else op


def graph_node_names(model: Path) -> set[str]:
    """The node names of a model's step as graphpass reads it: the TF1 graph's,
    or the body of the function the ``train`` signature calls."""
    import graphpass

    return set(graphpass.load(str(model)))
