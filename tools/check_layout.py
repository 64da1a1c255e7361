"""The layout rules of graphpass's source tree, checked (run in CI by ``.ci/run``).

    python -m tools.check_layout [ROOT]    # one line per problem; exit 1 if any

Rules (ROOT defaults to the repository holding this file):

1. **No import circles** between files in ``graphpass/``, and none between files in
   ``tools/``.
2. **One dependency direction.** Every module of ``graphpass/`` is in one layer,
   lowest first, and imports only from its own layer or below:

   ============ ==========================================================
   ir           ``graphpass.ir.*`` and the leaves every layer may read:
                ``graphpass.errors``, ``graphpass.units``, ``graphpass.installed``
                (which runtimes are installed) and ``graphpass.options*`` (the
                one typed options object: data and validation only)
   op tables    ``graphpass.dialects.*_ops`` (leaves: op kinds, dtypes, OpDef lookups)
   formats,     ``graphpass.formats.*``, ``graphpass.dialects.*`` (one level);
   dialects     a format may import op tables but never a dialect module;
                a dialect may import formats
   runtimes     ``graphpass.runtimes.*``: one model per runtime behind the
                ``RuntimeModel`` protocol (so the IR and the dialects import none)
   analysis     ``graphpass.analysis.*``
   passes       ``graphpass.passes.*``
   inspect      ``graphpass.inspect.*``
   cli          ``graphpass.cli*``, ``graphpass`` (its ``__init__``)
   ============ ==========================================================

   A module in no layer is a problem too: a new file says where it belongs.
3. **No module in graphpass/ over 450 lines**, no exceptions.
4. **Passes are format-blind and runtime-blind**: nothing in ``graphpass/passes/``
   imports tensorflow, onnx or onnxruntime, or a runtime model's own module (the
   analyses and passes reach a runtime through the protocol and the registry:
   ``graphpass.runtimes`` and ``graphpass.runtimes.base`` only), reads the format's own record
   (``graph.format_state``) or ``meta`` keys (``x.meta["key"]``,
   ``x.meta.get("key")``, ...), or spells a TF colocation
   (``"loc:@"``); they ask the ``Dialect`` protocol instead.
5. **No import by string** in ``graphpass/`` (``importlib.import_module``,
   ``__import__``): it hides an edge from rules 1-2. The one exception is the
   composition root, ``graphpass/__init__.py``, whose public names load lazily;
   a lower layer that needs a higher one is handed it (the formats register
   their dialects with the IR there).
6. **Tools in folders that say so**: ``tools.fixtures`` imports neither
   ``tools.bench`` nor a script of ``tools/``; tests never import ``tools.bench``
   nor a ``_private`` name from ``tools``; nothing in ``tools/`` or ``tests/``
   edits ``sys.path`` (pytest's ``pythonpath`` and ``python -m`` do that).

Every import counts: module level, inside functions (a lazy import still ties two
files together) and under ``TYPE_CHECKING``. ``from a.b import c`` is an edge to
``a.b.c`` when that is a module, else to ``a.b``; relative imports are resolved.
This file reads source text only: it imports nothing it checks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 450
RUNTIMES = {"tensorflow", "onnx", "onnxruntime"}
META_METHODS = {"get", "setdefault", "pop"}
#: Layers, lowest first; "formats" and "dialects" share a level (see the docstring).
LEVELS = {"ir": 0, "op tables": 1, "formats": 2, "dialects": 2, "runtimes": 3,
          "analysis": 4, "passes": 5, "inspect": 6, "cli": 7}
#: What the analyses and passes may import of the runtime layer: its protocol.
RUNTIME_PROTOCOL = {"graphpass.runtimes", "graphpass.runtimes.base"}


def modules(root: Path, package: str) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under ``root/package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer(name: str) -> str | None:
    """The layer of a graphpass module (see the docstring's table), or None."""
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in ("ir", "options") or name in ("graphpass.errors", "graphpass.units",
                                             "graphpass.installed"):
        return "ir"
    if top == "dialects":
        return "op tables" if parts[-1].endswith("_ops") else "dialects"
    if top in ("formats", "runtimes", "analysis", "passes", "inspect"):
        return top
    if name == "graphpass" or top.startswith("cli"):
        return "cli"
    return None


def imports(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """``(module, line)`` for every import in ``path`` (module ``name``); a module
    in ``known`` where the import names one, else the imported name as written."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")
                package = package if is_package else package[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in known else base, node.lineno))
    return sorted(set(found), key=lambda item: (item[1], item[0]))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(graph[name]):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def shortest_cycle(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A shortest import path from ``start`` back to itself inside ``members``
    (breadth first), so the message names a circle one can cut."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for other in sorted(graph[name] & members):
                if other == start:
                    path = [name]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if other not in parent:
                    parent[other] = name
                    following.append(other)
        frontier = following
    return [start]


def circle_problems(root: Path, package: str) -> list[str]:
    found = modules(root, package)
    graph = {name: {m for m, _ in imports(path, name, set(found)) if m in found} - {name}
             for name, path in found.items()}
    problems = []
    for component in cycles(graph):
        circle = " -> ".join(shortest_cycle(graph, component[0], set(component)))
        problems.append(f"{package}/: import circle between {len(component)} modules "
                        f"({', '.join(component)}), e.g. {circle}")
    return problems


def layer_problems(root: Path) -> list[str]:
    found = modules(root, "graphpass")
    problems = []
    for name, path in found.items():
        own = layer(name)
        where = path.relative_to(root)
        if own is None:
            problems.append(f"{where}: {name} is in no layer (see tools/check_layout.py)")
            continue
        for target, line in imports(path, name, set(found)):
            if target not in found or target == name:
                continue
            other = layer(target)
            if other is None:
                continue  # reported at its own file
            if LEVELS[other] > LEVELS[own]:
                problems.append(f"{where}:{line}: {name} ({own}) imports {target} ({other}), "
                                f"a higher layer")
            elif own == "formats" and other == "dialects":
                problems.append(f"{where}:{line}: {name} (formats) imports the dialect module "
                                f"{target}; a format may import op tables (*_ops) only")
            elif own in ("analysis", "passes") and other == "runtimes" and \
                    target not in RUNTIME_PROTOCOL:
                problems.append(f"{where}:{line}: {name} ({own}) imports the runtime model "
                                f"{target}; reach a runtime through graphpass.runtimes "
                                f"(the RuntimeModel protocol)")
    return problems


def length_problems(root: Path) -> list[str]:
    problems = []
    for path in modules(root, "graphpass").values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"{path.relative_to(root)}: {lines} lines, over {MAX_LINES}")
    return problems


def _format_lookup(node: ast.AST) -> bool:
    """``x.format_state``, ``x.meta[...]`` / ``meta[...]``, or ``x.meta.get(...)`` and
    its kin."""
    def is_meta(value: ast.AST) -> bool:
        return (isinstance(value, ast.Attribute) and value.attr == "meta") or \
            (isinstance(value, ast.Name) and value.id == "meta")

    if isinstance(node, ast.Attribute) and node.attr == "format_state":
        return True
    if isinstance(node, ast.Subscript):
        return is_meta(node.value)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in META_METHODS and is_meta(node.func.value))


def pass_problems(root: Path) -> list[str]:
    problems = []
    for name, path in modules(root, "graphpass").items():
        if not name.startswith("graphpass.passes"):
            continue
        where = path.relative_to(root)
        for target, line in imports(path, name, set()):
            if target.split(".")[0] in RUNTIMES:
                problems.append(f"{where}:{line}: a pass imports {target}; ask the dialect")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _format_lookup(node):
                problems.append(f"{where}:{node.lineno}: a pass reads the format's record "
                                f"(format_state or meta); ask the dialect")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and "loc:@" in node.value:
                problems.append(f"{where}:{node.lineno}: a pass spells a TF colocation "
                                f"(\"loc:@\"); ask the dialect")
    return problems


def _imports_by_string(node: ast.AST) -> bool:
    """``importlib.import_module(...)`` / ``import_module(...)`` or ``__import__(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def string_import_problems(root: Path) -> list[str]:
    problems = []
    for name, path in modules(root, "graphpass").items():
        if name == "graphpass":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _imports_by_string(node):
                problems.append(f"{path.relative_to(root)}:{node.lineno}: imports a module "
                                f"by string, which the layer rules cannot see; import it, "
                                f"or have a higher layer hand it down")
    return problems


def _edits_sys_path(node: ast.AST) -> bool:
    """``sys.path.insert(...)``/``append``/``extend``, or an assignment to ``sys.path``."""
    def is_sys_path(value: ast.AST) -> bool:
        return isinstance(value, ast.Attribute) and value.attr == "path" and \
            isinstance(value.value, ast.Name) and value.value.id == "sys"

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return is_sys_path(node.func.value)
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) for t in targets)
    return False


def tools_problems(root: Path) -> list[str]:
    found = modules(root, "tools") if (root / "tools").is_dir() else {}
    scripts = {name for name in found if name.count(".") == 1}
    problems = []
    for name, path in found.items():
        if not name.startswith("tools.fixtures"):
            continue
        for target, line in imports(path, name, set(found)):
            if target.startswith("tools.bench") or target in scripts:
                problems.append(f"{path.relative_to(root)}:{line}: the fixture {name} imports "
                                f"{target}; fixtures import fixtures only")
    tests = sorted((root / "tests").rglob("*.py")) if (root / "tests").is_dir() else []
    for path in tests:
        where = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tools"):
                names = [f"{node.module}.{a.name}" for a in node.names]
                if any(n.startswith("tools.bench") for n in [node.module, *names]):
                    problems.append(f"{where}:{node.lineno}: a test imports a benchmark "
                                    f"({node.module}); move what it needs to tools.fixtures")
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private:
                    problems.append(f"{where}:{node.lineno}: a test imports the private "
                                    f"{', '.join(private)} from {node.module}")
            elif isinstance(node, ast.Import) and any(
                    a.name.startswith("tools.bench") for a in node.names):
                problems.append(f"{where}:{node.lineno}: a test imports a benchmark")
    for path in [*found.values(), *tests]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _edits_sys_path(node):
                problems.append(f"{path.relative_to(root)}:{node.lineno}: edits sys.path; "
                                f"run from the repository root instead")
    return problems


def problems(root: Path) -> list[str]:
    return [*circle_problems(root, "graphpass"), *circle_problems(root, "tools"),
            *layer_problems(root), *length_problems(root), *pass_problems(root),
            *string_import_problems(root), *tools_problems(root)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    listed = problems(root)
    for line in listed:
        print(line)
    return 1 if listed else 0


if __name__ == "__main__":
    sys.exit(main())
