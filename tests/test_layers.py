"""The package's layers (docs/architecture.md): no module imports a higher layer than its own,
at module level or inside a function. Entry points (`__main__` modules) sit above everything.
And no import circle at any level: no module reaches itself again through its imports, at
module level or inside a function (those under `if TYPE_CHECKING:` aside: they never run). A
function-level import only defers a circle to the first call; the layers stay a tree only if
no import closes one. Importing `a.b.c` runs the packages `a` and `a.b` first, so a package
`__init__` that imports its own submodules closes a circle with any of them that imports a
sibling: packages re-export lazily, `specbench.lazy`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specbench"

# low to high; a module's layer is that of its first name below `specbench.`
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"config", "flags", "types", "errors", "arrivals", "formatting", "acceptance", "atomic",
                        "interrupts", "memory", "progress", "limits", "lazy", ""})),
    ("engine", frozenset({"engine"})),
    ("models, workload", frozenset({"models", "workload"})),
    ("backends", frozenset({"backends"})),
    ("metrics, records", frozenset({"metrics", "records"})),
    ("runner, session, plan", frozenset({"runner", "session", "plan"})),
    ("analysis", frozenset({"analysis", "steps", "speedup_model"})),
    ("sweep, compare, report", frozenset({"sweep", "compare", "report"})),
    ("server", frozenset({"server"})),
    ("cli", frozenset({"cli"})),
)


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "specbench" or parts[-1] == "__main__":
        return None  # not ours, or an entry point
    first = parts[1] if len(parts) > 1 else ""
    return next((i for i, (_, tops) in enumerate(LAYERS) if first in tops), -1)


def imported(source: str) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
    return [(m, line) for m, line in out if m.split(".")[0] == "specbench"]


def upward(module: str, source: str) -> list[str]:
    mine = layer_of(module)
    if mine is None:
        return []
    return [f"{module}:{line} imports {target} ({LAYERS[mine][0]} -> {LAYERS[theirs][0]})"
            for target, line in imported(source)
            if (theirs := layer_of(target)) is not None and theirs > mine]


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def runtime_imports(module: str, source: str, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports when it or any of its functions runs: every
    import statement at any depth (except under `if TYPE_CHECKING:`), each with the packages
    above it."""
    is_pkg = module not in known or any(k.startswith(module + ".") for k in known)
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(source)]
    while todo:
        node = todo.pop()
        if _type_checking(node):
            continue
        todo.extend(ast.iter_child_nodes(node))
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_pkg else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            found |= {q for i in range(2, len(parts) + 1) if (q := ".".join(parts[:i])) in known}
    return found - {module}


def circles(sources: dict[str, str]) -> list[list[str]]:
    """The import circles among `sources` (module -> source): strongly connected components
    of the import graph (`runtime_imports`) with more than one module."""
    known = set(sources)
    graph = {m: runtime_imports(m, src, known) for m, src in sources.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    found = circles({m: p.read_text() for m, p in modules().items()})
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("sources, expected", [
    # a package that imports its own submodule, which imports a sibling: a circle through __init__
    ({"specbench.p": "from specbench.p.a import f\n", "specbench.p.a": "from specbench.p.b import g\n",
      "specbench.p.b": "X = 1\n"}, [["specbench.p", "specbench.p.a"]]),
    # two modules importing each other at module level
    ({"specbench.a": "import specbench.b\n", "specbench.b": "from specbench.a import x\n"},
     [["specbench.a", "specbench.b"]]),
    # the same, one side inside a function (or a method, or a nested function): still a circle
    ({"specbench.a": "import specbench.b\n", "specbench.b": "def f():\n    from specbench.a import x\n"},
     [["specbench.a", "specbench.b"]]),
    ({"specbench.a": "def f():\n    import specbench.b\n",
      "specbench.b": "class C:\n    def m(self):\n        def g():\n            from specbench import a\n"},
     [["specbench.a", "specbench.b"]]),
    # one side under TYPE_CHECKING (never run), at module level or in a function: no circle
    ({"specbench.a": "import specbench.b\n",
      "specbench.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specbench.a import x\n"}, []),
    ({"specbench.a": "import specbench.b\n",
      "specbench.b": "def f():\n    if TYPE_CHECKING:\n        from specbench.a import x\n"}, []),
])
def test_the_check_finds_a_circle(sources, expected):
    assert circles(sources) == expected


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if layer_of(m) == -1]
    assert not unplaced, f"add these to LAYERS (and docs/architecture.md): {unplaced}"


def test_no_module_imports_a_higher_layer():
    found = [u for m, p in modules().items() for u in upward(m, p.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module, source, bad", [
    ("specbench.records.files", "def f():\n    from specbench.report import html\n", True),
    ("specbench.engine.engine", "import specbench.cli.run\n", True),
    ("specbench.cli.run", "from specbench.engine import Engine\n", False),
    ("specbench.server.__main__", "from specbench.cli.serve import main\n", False),
])
def test_the_check_finds_an_upward_import(module, source, bad):
    assert bool(upward(module, source)) is bad


MAX_LINES = 400
LONG_REASON = re.compile(r"longer than 400 lines because|lines (in one module )?on purpose", re.IGNORECASE)


def long_without_reason(sources: dict[str, str]) -> list[str]:
    """Modules over MAX_LINES lines whose docstring does not say why they are one module."""
    out = []
    for name, text in sources.items():
        if text.count("\n") > MAX_LINES and not LONG_REASON.search(ast.get_docstring(ast.parse(text)) or ""):
            out.append(name)
    return out


def test_a_module_over_400_lines_says_why_in_its_docstring():
    sources = {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    assert long_without_reason(sources) == []
    # the check can fail: a long module with a docstring that gives no reason
    long = '"""A module."""\n' + "x = 1\n" * (MAX_LINES + 1)
    assert long_without_reason({"m.py": long}) == ["m.py"]
    assert long_without_reason({"m.py": long.replace("A module.", "Longer than 400 lines because x.")}) == []


# The engine core: what runs a step, verifies and samples. The drafters import it, never the
# other way round (engine.engine builds drafters through their factory and is not core).
ENGINE_CORE = ("specbench.engine.tree", "specbench.engine.verify", "specbench.engine.sampling", "specbench.engine.kv",
               "specbench.engine.model", "specbench.engine.fused", "specbench.engine.rows",
               "specbench.engine.static", "specbench.engine.static_lm", "specbench.engine.graphs")


def drafter_imports(module: str, source: str) -> list[str]:
    return [f"{module}:{line} imports {target}" for target, line in imported(source)
            if target.startswith("specbench.engine.drafters")]


def test_the_engine_core_never_imports_the_drafters():
    found = [hit for m, p in modules().items() if m in ENGINE_CORE for hit in drafter_imports(m, p.read_text())]
    assert not found, "\n".join(found)
    assert set(ENGINE_CORE) <= set(modules())
    # the check can fail
    assert drafter_imports("specbench.engine.tree", "from specbench.engine.drafters.base import Proposal\n")
