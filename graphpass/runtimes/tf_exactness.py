"""Exactness asked from TF: does every node of a rewritten step compute, in the
graph TF executes, what its original computes in the original's?

Grappler rewrites a graph by context (how many read a value, which values two
expressions share): ``pow(x, 3)`` becomes ``x * x * x`` with the square shared
with the gradient's ``pow(x, 2)``, an ``Add`` chain becomes an ``AddN`` only where
its inner sums have one reader, a remapper fusion applies only where nothing else
reads the value it absorbs. A copy in the backward pass sits in another context
than its original, and an original whose readers moved to copies in another than
before, so the same node may be compiled into another expression. Floating point
is not associative: another grouping rounds otherwise, one unit in the last
place, and the training step no longer matches bit for bit.

So each value of both executed graphs (Grappler's output under the target's
configuration) is given a number, equal exactly when both compute it the same
way: the kernel, its attributes and the numbers of what it reads, with the
step's inputs and stored values as leaves, constants by value, and the operands
of commutative kernels sorted (``a * b`` and ``b * a`` round alike). A node of the
rewrite whose number differs from the one its original has, while everything it
reads is computed somewhere in the original, is where the two part: a
*difference*, named with the kernels on both sides.

Kernels that move no bits (``Identity``, ``Reshape`` and the like) pass their
input's number on: Grappler removes some of them by context too. The caller says
which node of the rewrite stands for which original (a copy for the node it
copies) and which nodes it added only to order or gate others (they pass their
first input on). A node of a conditional's branch that TF inlined into the step
(``_lower_using_switch_merge``) stands for what its body node stands for.
"""

from __future__ import annotations

import hashlib
import math
import re

from graphpass.formats.tf_io import graph_def_from_graph
from graphpass.installed import TENSORFLOW, installed
from graphpass.ir.graph import Graph
from graphpass.options import RuntimeConfig
from graphpass.runtimes.base import Difference, StandsFor
from graphpass.runtimes.tf_grappler import fetch_nodes
from graphpass.runtimes.tf_grappler_ask import optimize_each

#: Kernels whose result does not depend on the order of their two operands.
COMMUTATIVE = frozenset({"Mul", "AddV2", "Add", "Maximum", "Minimum", "SquaredDifference",
                         "_MklAdd", "_MklAddV2", "_MklMaximum", "_MklSquaredDifference"})
#: Kernels that compute no value a step's numbers depend on: constants (leaves) and
#: what only orders (Grappler turns a folded ``ShapeN`` into a ``NoOp``).
COMPUTES_NOTHING = frozenset({"Const", "NoOp", "ControlTrigger"})
#: Kernels that pass their first input's bits on unchanged.
MOVES_NO_BITS = frozenset({"Identity", "Snapshot", "Reshape", "Squeeze", "ExpandDims",
                           "StopGradient", "PreventGradient", "_MklIdentity"})
#: A node whose outputs each pass an input on: ``(PORTS, values by port)``.
PORTS = "ports"
#: How deep above a node that computes otherwise its causes are looked for among
#: the copies it reads (Grappler's rewrites reach a few kernels).
CAUSE_DEPTH = 6


class TFExactness:
    """The check for TF's executor: Grappler's graph of the original and of each
    rewrite, under the target's oneDNN setting and the other one (a plan must
    compute the same on a machine of either kind; the other is asked in a child
    process, ``tf_grappler``)."""

    def __init__(self, original: Graph, fetches: list[str], config: RuntimeConfig) -> None:
        self.fetches = fetch_nodes(fetches)
        self.settings = (config.onednn, not config.onednn)
        self.configurations = tuple(f"oneDNN {'on' if s else 'off'}" for s in self.settings)
        self.unchecked = ""
        self.executed: dict[bool, object] = {}
        if not installed(TENSORFLOW):
            self.unchecked = "TensorFlow is not installed"
            return
        graph_def = graph_def_from_graph(original)
        try:
            self.executed = dict(zip(self.settings,
                                     optimize_each(graph_def, self.fetches, self.settings)))
        except Exception as exc:  # noqa: BLE001 - any refusal of TF's is reported
            self.unchecked = f"Grappler refused the original: {_first_line(exc)}"

    def differences(self, rewritten: Graph, stands_for: StandsFor) -> list[Difference]:
        if self.unchecked:
            return []
        graph_def = graph_def_from_graph(rewritten)
        stands_for = _through_inlined_branches(stands_for, _inlined_conditionals(graph_def))
        found: dict[str, Difference] = {}
        try:
            answers = optimize_each(graph_def, self.fetches, self.settings)
        except Exception as exc:  # noqa: BLE001 - a rewrite TF refuses is not exact
            return [Difference("", "", f"Grappler refused the rewrite: {_first_line(exc)}",
                               " and ".join(self.configurations), ())]
        for onednn, label, executed in zip(self.settings, self.configurations, answers):
            for difference in differences(self.executed[onednn], executed, stands_for, label):
                found.setdefault(difference.node, difference)
        return list(found.values())


#: Kernels TF's executor lowers to Switch/Merge when marked so, inlining each branch.
CONDITIONALS = frozenset({"If", "StatelessIf"})
#: What TF names a lowered branch's node: ``<If>/then/_<k>/<body node>``.
_INLINED = re.compile(r"(?:then|else)/_\d+/(.+)")


def _inlined_conditionals(graph_def) -> tuple[str, ...]:
    """The conditionals TF lowers and inlines before Grappler, longest name first."""
    lowered = [n.name for n in graph_def.node if n.op in CONDITIONALS
               and n.attr["_lower_using_switch_merge"].b]
    return tuple(sorted(lowered, key=len, reverse=True))


def _through_inlined_branches(stands_for: StandsFor, calls: tuple[str, ...]) -> StandsFor:
    """``stands_for`` of the executed graph: a node TF inlined from a branch of one
    of ``calls`` stands for what the body node of that name stands for."""
    if not calls:
        return stands_for

    def executed(name: str) -> str | None:
        for call in calls:
            if name.startswith(call + "/"):
                body = _INLINED.fullmatch(name[len(call) + 1:])
                if body:
                    return stands_for(body.group(1))
        return stands_for(name)

    return executed


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def differences(original_def, rewritten_def, stands_for: StandsFor,
                configuration: str = "") -> list[Difference]:
    """The first places where ``rewritten_def`` (Grappler's graph of the rewrite)
    computes a value ``original_def`` (Grappler's graph of the original) never
    computes, in the rewrite's node order: every value it reads is one the
    original computes too, its own is not. Names do not count (Grappler moves an
    expression between the names of a chain it regroups). Empty: the rewrite
    computes nothing the original does not, its updates included."""
    numbers: dict[tuple, int] = {}
    before = _Numbering(original_def, lambda name: name, numbers)
    after = _Numbering(rewritten_def, stands_for, numbers)
    # Up to an exact power-of-two factor (``_product``): 0.5 * a * b grouped as
    # (0.5 * a) * b or as (0.5 * b) * a rounds alike.
    computed = {_unscaled(v)[1] for v in before.values()}

    def known(reference: str) -> bool:
        value = _unscaled(after.value(reference))[1]
        return value in computed or value[0] in numbers_of_constants

    numbers_of_constants = {n for key, n in numbers.items() if key[0] == "const"}

    found = []
    for node_def in rewritten_def.node:
        name = node_def.name
        if stands_for(name) is None or node_def.op in MOVES_NO_BITS | COMPUTES_NOTHING or \
                known(name):
            continue
        if all(known(i) for i in after.reads(name)):
            original = stands_for(name)
            found.append(Difference(name, original if original in before.nodes else "",
                                    _reason(after, name, before, original), configuration,
                                    after.copies_by_distance(name, CAUSE_DEPTH)))
    return found


def _reason(after: _Numbering, name: str, before: _Numbering, original: str) -> str:
    mine = after.kernel(name)
    if original not in before.nodes:
        return f"computes a {mine} the original step never computes"
    theirs = before.kernel(original)
    if mine != theirs:
        return f"runs {mine} where its original runs {theirs}"
    return f"computes its {mine} from values the original never combines so " \
        f"(Grappler rewrote it by context)"


class _Numbering:
    """Value numbers of one executed graph: each output is (the number of its
    node's computation, the port), equal across two graphs exactly when both
    compute it the same way."""

    def __init__(self, graph_def, stands_for: StandsFor, numbers: dict[tuple, int]) -> None:
        self.nodes = {n.name: n for n in graph_def.node}
        self.stands_for = stands_for
        self.numbers = numbers
        #: node -> its computation's number, or the value it passes on (a tuple).
        self.computed: dict[str, int | tuple] = {}
        self._readers: dict[str, list[str]] | None = None
        for node_def in graph_def.node:
            self._compute(node_def.name)

    def values(self) -> set[tuple]:
        """Every value the graph computes or reads."""
        return {self.value(r) for name in self.nodes for r in [name, *self.reads(name)]}

    def reads(self, name: str) -> list[str]:
        return [i for i in self.nodes[name].input if not i.startswith("^")]

    def copies_by_distance(self, name: str, depth: int) -> tuple[tuple[str, ...], ...]:
        """The originals of the copies that may have made ``name`` compute otherwise,
        one tuple per distance at which there are any, nearest first: itself alone
        for a copy; else the copies within ``depth`` edges either way. A value a
        copy reads too has a reader more, and Grappler groups a product or a sum by
        how many read its parts, so the cause may sit beside the node (a gradient
        regrouped because the value it multiplies is read otherwise)."""
        original = self.stands_for(name)
        if original is not None and original != name:
            return ((original,),)
        found, layer, seen, named = [], [name], {name}, set()
        for _ in range(depth):
            layer = [n for n in (_split(i)[0] for node in layer
                                 for i in [*self.reads(node), *self.readers(node)])
                     if n in self.nodes and n not in seen]
            seen.update(layer)
            copied = tuple(dict.fromkeys(o for n, o in zip(layer, map(self.stands_for, layer))
                                         if o is not None and o != n and o not in named))
            named.update(copied)
            found += [copied] if copied else []
        return tuple(found)

    def readers(self, name: str) -> list[str]:
        if self._readers is None:
            self._readers = {}
            for node in self.nodes:
                for reference in self.reads(node):
                    self._readers.setdefault(_split(reference)[0], []).append(node)
        return self._readers.get(name, [])

    def kernel(self, name: str) -> str:
        node_def = self.nodes[name]
        fused = [s.decode() for s in node_def.attr["fused_ops"].list.s] \
            if "fused_ops" in node_def.attr else []
        return f"{node_def.op}[{', '.join(fused)}]" if fused else node_def.op

    def value(self, reference: str) -> tuple:
        """The value ``node`` or ``node:port`` stands for."""
        name, _ = _split(reference)
        if name in self.nodes:
            self._compute(name)
        return self._known(reference)

    def _known(self, reference: str) -> tuple:
        """The value as numbered so far: a loop's back edge (a value read before it
        is numbered) stands for itself, by the name of what it stands for."""
        name, port = _split(reference)
        if name not in self.nodes:
            return ("leaf", name, port)
        if name not in self.computed:
            return ("back", self.stands_for(name) or name, port)
        number = self.computed[name]
        if isinstance(number, tuple) and number[0] == PORTS:
            return number[1][int(port)]
        if isinstance(number, tuple):
            return number
        return (number, port)

    def _compute(self, name: str) -> None:
        stack = [name]
        while stack:  # depth first without recursion: graphs are deep
            current = stack[-1]
            if current in self.computed:
                stack.pop()
                continue
            pending = [n for n in (_split(i)[0] for i in self.reads(current))
                       if n in self.nodes and n not in self.computed and n not in stack]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self.computed[current] = self._number(current)

    def _number(self, name: str) -> int | tuple:
        node_def = self.nodes[name]
        reads = self.reads(name)
        original = self.stands_for(name)
        if reads and node_def.op in MOVES_NO_BITS:
            return self._known(reads[0])
        if node_def.op == "IdentityN":  # output k is input k
            return (PORTS, tuple(self._known(i) for i in reads))
        if reads and original is None:  # an ordering node: what it orders, not its signal
            ordered = [r for r in reads if self.stands_for(_split(r)[0]) is not None]
            return self._known((ordered or reads)[0])
        if not reads:
            key = ("const", _attrs_digest(node_def)) if node_def.op == "Const" \
                else ("leaf", original or name)
            if node_def.op == "Const" and _power_of_two(node_def) is not None:
                return (SCALED, _power_of_two(node_def), ONE)
        elif node_def.op in SCALING and len(reads) == 2:
            return self._product(node_def, *(self._known(i) for i in reads))
        else:
            operands = [self._known(i) for i in reads]
            if node_def.op in COMMUTATIVE or node_def.op == "AddN":
                operands.sort(key=repr)
            key = (node_def.op, _attrs_digest(node_def), tuple(operands))
        return self.numbers.setdefault(key, len(self.numbers))

    def _product(self, node_def, left: tuple, right: tuple) -> tuple:
        """A product (or a quotient by a constant power of two) as its power-of-two
        factor and the rest: scaling by 2^k is exact in any grouping, so Grappler
        moving GELU's 0.5 from one operand to another changes no bit (short of
        overflow and subnormals, which the original risks alike)."""
        (left_scale, left_rest), (right_scale, right_rest) = _unscaled(left), _unscaled(right)
        if node_def.op in DIVIDING:
            if right_rest != ONE:
                return self._plain(node_def, left, right)
            scale, rest = left_scale / right_scale, left_rest
        else:
            scale = left_scale * right_scale
            if ONE in (left_rest, right_rest):
                rest = right_rest if left_rest == ONE else left_rest
            else:
                rest = (self._plain(node_def, *sorted((left_rest, right_rest), key=repr)), "0")
        return rest if scale == 1.0 else (SCALED, scale, rest)

    def _plain(self, node_def, *operands: tuple) -> int:
        key = (node_def.op, _attrs_digest(node_def), operands)
        return self.numbers.setdefault(key, len(self.numbers))


#: Kernels that multiply (or divide by) their second operand, whose power-of-two
#: factors the numbering carries apart (``_Numbering._product``).
SCALING = frozenset({"Mul", "_MklMul", "RealDiv", "Div"})
DIVIDING = frozenset({"RealDiv", "Div"})
#: A value as a power-of-two factor and the rest: ``(SCALED, factor, rest)``; ``ONE``
#: is the rest of a constant that is only a factor.
SCALED, ONE = "scaled", ("one",)


def _unscaled(value: tuple) -> tuple[float, tuple]:
    return (value[1], value[2]) if value[0] == SCALED else (1.0, value)


def _power_of_two(node_def) -> float | None:
    """The value of a one-element floating-point constant that is ±2^k, else None."""
    from tensorflow.python.framework import tensor_util

    tensor = node_def.attr["value"].tensor if "value" in node_def.attr else None
    if tensor is None or tensor.dtype not in FLOATS:
        return None
    try:
        array = tensor_util.MakeNdarray(tensor)
    except (ValueError, TypeError):
        return None
    if array.size != 1:
        return None
    value = float(array.reshape(()))
    return value if value != 0 and math.isfinite(value) and \
        math.frexp(abs(value))[0] == 0.5 else None


#: TF's floating-point DataType enums (half, float, double, bfloat16).
FLOATS = frozenset({19, 1, 2, 14})


def _split(reference: str) -> tuple[str, str]:
    name, _, port = reference.rpartition(":")
    return (name, port) if name and port.isdigit() else (reference, "0")


def _attrs_digest(node_def) -> str:
    """What a node's attributes compute with, not TF's bookkeeping (``_``-prefixed)."""
    digest = hashlib.sha256()
    for key in sorted(node_def.attr):
        if not key.startswith("_"):
            digest.update(key.encode() + node_def.attr[key].SerializeToString(deterministic=True))
    return digest.hexdigest()[:16]
