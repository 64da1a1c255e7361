"""Kernel parity of a rewrite, checked on the graph TF executes: every original
node and every remat copy must run the same kernel (the op after TF's rewrites,
its ``fused_ops``) as the node it stands for ran in the original graph, and a
node absorbed into a fusion there must be absorbed here too.

A copy stands for the node whose name it carries under ``graphpass/remat/``
(``_copy_nodes`` names each copy so; Grappler names the nodes it makes from a
node after that node, so those map the same way). Nodes graphpass added that
copy nothing (ties, gates) have no counterpart and are not compared.

The executed graph comes from a child process (``fidelity_child.py kernels``)
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


def executed_kernels(model: Path, onednn: bool) -> dict[str, tuple]:
    """``{node: (op, fused_ops, data inputs)}`` of one executed step of ``model``."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "kernels.json"
        run_child("kernels", model, out, onednn=onednn)
        found = json.loads(out.read_text())
    return {name: (op, tuple(fused), tuple(inputs))
            for name, (op, fused, inputs) in found.items()}


def counterpart(name: str) -> str:
    """The original node an executed node of a rewritten graph stands for."""
    while name.startswith(SCOPE):
        name = name[len(SCOPE):]
    return name


def parity_errors(original: dict, rewritten: dict, original_nodes: set[str],
                  rewritten_nodes: set[str]) -> list[str]:
    """Where the rewritten graph's kernels differ from the original's (empty: parity):
    a node's kernel, or what it reads (the originals its inputs stand for, in
    order: Grappler regroups sums by their readers, ``AddN`` of other terms).

    ``original``, ``rewritten``: ``executed_kernels`` of each; ``*_nodes``: the
    node names of each graph as written (its step function's body, for a
    SavedModel), so that a node absorbed into a fusion is compared too.
    """
    errors = []
    stands_for = _Counterparts(rewritten, set(original) | original_nodes)
    for name in sorted(set(original) | original_nodes):
        want, got = original.get(name), rewritten.get(name)
        if not _same(want, got):
            errors.append(f"{name}: {_kernel(want)} in the original, {_kernel(got)} rewritten")
        elif want and got and want[2] != stands_for.inputs(got[2]):
            errors.append(f"{name}: reads {list(want[2])} in the original, "
                          f"{list(stands_for.inputs(got[2]))} (as originals) rewritten")
    copies = {n for n in set(rewritten) | rewritten_nodes if n.startswith(SCOPE)}
    for name in sorted(copies):
        stands_for = counterpart(name)
        if stands_for not in original and stands_for not in original_nodes:
            continue  # graphpass's own nodes (ties, gates), or Grappler's made from them
        want, got = original.get(stands_for), rewritten.get(name)
        if not _same(want, got):
            errors.append(f"copy {name}: {_kernel(got)}, its original ran {_kernel(want)}")
        elif want and got and want[2] != stands_for.inputs(got[2]):
            errors.append(f"copy {name}: reads {list(stands_for.inputs(got[2]))} (as "
                          f"originals), its original read {list(want[2])}")
    return errors


class _Counterparts:
    """A rewritten graph's inputs as the originals they stand for: a copy's name
    less ``graphpass/remat/``; a node graphpass added that copies nothing (an
    ordering ``Identity``, a data-mode tie ``x + signal``) passes its first
    input on, which is what it computes (the tie adds zero in value)."""

    def __init__(self, rewritten: dict, originals: set[str]) -> None:
        self.rewritten = rewritten
        self.originals = originals

    def inputs(self, inputs: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.input(i) for i in inputs)

    def input(self, name: str) -> str:
        for _ in range(len(self.rewritten) + 1):
            node, _, port = name.partition(":")
            if not node.startswith(SCOPE):
                return name
            if counterpart(node) in self.originals:
                return counterpart(node) + (f":{port}" if port else "")
            if node not in self.rewritten or not self.rewritten[node][2]:
                return name
            name = self.rewritten[node][2][0]
        return name


#: Kernels that compute nothing, as good as absent: an ``Identity`` TF left
#: where it removed the node in the other graph (``x / 1`` made an ``Identity``,
#: dropped unless a control edge holds it) passes the same bits on; of equal
#: constants Grappler keeps one, whichever it meets first.
NOTHING = {None, ("Identity", ()), ("Const", ())}


def _same(want, got) -> bool:
    return want is not None and got is not None and want[:2] == got[:2] or \
        {want and want[:2], got and got[:2]} <= NOTHING


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
