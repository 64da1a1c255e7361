"""Layout checks over graphpass/'s source: no import circles between files, and no
module over 400 lines without a reason in its docstring ("Long because ...").

    python tools/check_layout.py     # prints problems, exit 1 if any

Every import counts, also the ones inside functions (a lazy import still ties
the two files together). ``from graphpass.x import y`` is an edge to
``graphpass.x.y`` when that is a module, else to ``graphpass.x``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "graphpass"
MAX_LINES = 400
REASON = "Long because"


def modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under graphpass/."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The graphpass modules ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
    return found & known


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


def long_modules(found: dict[str, Path]) -> list[str]:
    """Modules over MAX_LINES lines whose docstring gives no reason."""
    problems = []
    for name, path in found.items():
        text = path.read_text()
        lines = text.count("\n")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and REASON not in docstring:
            problems.append(f"{name}: {lines} lines and no '{REASON} ...' in its docstring")
    return problems


def problems() -> list[str]:
    found = modules()
    graph = {name: imports(path, set(found)) - {name} for name, path in found.items()}
    listed = [f"import circle: {' <-> '.join(c)}" for c in cycles(graph)]
    return listed + long_modules(found)


def main() -> int:
    listed = problems()
    for line in listed:
        print(line)
    return 1 if listed else 0


if __name__ == "__main__":
    sys.exit(main())
