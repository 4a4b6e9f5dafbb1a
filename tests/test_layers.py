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
                        "interrupts", "memory", "progress", "limits", "lazy", "structured", ""})),
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
    above it. (`importlib.import_module` calls are not followed: specbench.cli registers its
    command modules that way, and specbench.cli.serve imports specbench.cli back only inside
    its entry point, which says so.)"""
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


# Where verdicts are decided, a function says one decision: none over MAX_FUNCTION_LINES lines
# (issue 43 split the four that were 103 to 149 lines).
DECIDING = ("runner.py", "sweep/profile.py", "compare/gate.py", "metrics.py")
MAX_FUNCTION_LINES = 80


def long_functions(name: str, source: str) -> list[str]:
    return [f"{name}:{node.lineno} {node.name} is {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_deciding_a_verdict_is_over_80_lines():
    assert [f for name in DECIDING for f in long_functions(name, (PACKAGE / name).read_text())] == []
    # the check can fail: a function of 81 lines
    long = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert long_functions("m.py", long) == ["m.py:1 f is 81 lines"]
    assert long_functions("m.py", "def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)) == []


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


# ---- function-level imports: lazy on purpose, or at module level ---------------------------------

# Third-party packages slow enough to import that a module keeps them (and what imports them)
# out of its own import: `specbench --help` and the commands that never need them start fast,
# and layers that must not load them (a report never loads torch) do not.
HEAVY = frozenset({"torch", "transformers", "optuna", "pandas", "pyarrow", "plotly", "datasets", "scipy", "numpy",
                   "aiohttp", "httpx", "sqlalchemy", "huggingface_hub"})
REASON = re.compile(r"#\s*\S")  # a comment on the import's line or the line above it


def lazy_exports(source: str) -> dict[str, str]:
    """A package `__init__`'s lazy re-exports (`exports(__name__, {name: module})`)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "exports" and len(node.args) == 2 \
                and isinstance(node.args[1], ast.Dict):
            return {k.value: v.value for k, v in zip(node.args[1].keys, node.args[1].values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def imported_modules(node: ast.AST, module: str, known: set[str], lazy: dict[str, dict[str, str]]) -> set[str]:
    """The specbench modules an import statement loads, a lazily re-exported name resolved to
    the module that defines it (the packages above each aside)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:
        is_pkg = any(k.startswith(module + ".") for k in known)
        parts = module.split(".") if is_pkg else module.split(".")[:-1]
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    out = set()
    for a in node.names:
        full = f"{base}.{a.name}"
        out.add(full if full in known else lazy.get(base, {}).get(a.name, base))
    return {m for m in out if m in known}


def heavy_modules(sources: dict[str, str]) -> dict[str, str]:
    """module -> the heavy package its import loads (through specbench modules imported at
    module level, lazy re-exports resolved), for every module whose import loads one."""
    known = set(sources)
    lazy = {m: lazy_exports(s) for m, s in sources.items()}
    direct: dict[str, str] = {}
    graph: dict[str, set[str]] = {}
    for m, src in sources.items():
        graph[m] = set()
        for node in ast.parse(src).body:
            if _type_checking(node):
                continue
            for n in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                    top = {x.split(".")[0] for x in names if not getattr(n, "level", 0)}
                    if top & HEAVY:
                        direct.setdefault(m, sorted(top & HEAVY)[0])
                    graph[m] |= imported_modules(n, m, known, lazy)
                    for name in names:  # the packages above an imported module run first
                        parts = name.split(".")
                        graph[m] |= {q for i in range(2, len(parts)) if (q := ".".join(parts[:i])) in known}
    heavy = dict(direct)
    changed = True
    while changed:
        changed = False
        for m, deps in graph.items():
            if m not in heavy:
                why = next((f"{heavy[d]} (through {d})" for d in sorted(deps) if d in heavy), None)
                if why:
                    heavy[m] = why
                    changed = True
    return heavy


def unexplained_lazy_imports(sources: dict[str, str]) -> list[str]:
    """Imports of specbench modules inside functions that are neither of a module whose import
    loads a heavy package nor say why with a comment (on the line or the line above)."""
    known = set(sources)
    lazy = {m: lazy_exports(s) for m, s in sources.items()}
    heavy = heavy_modules(sources)
    out = []
    for m, src in sources.items():
        lines = src.splitlines()
        for fn in ast.walk(ast.parse(src)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                targets = imported_modules(node, m, known, lazy)
                if not targets or any(t in heavy for t in targets):
                    continue
                said = REASON.search(lines[node.lineno - 1]) or REASON.match(lines[node.lineno - 2].strip())
                if not said:
                    out.append(f"{m}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return out


def test_every_import_inside_a_function_is_lazy_on_purpose():
    found = unexplained_lazy_imports({m: p.read_text() for m, p in modules().items()})
    assert not found, ("imports inside functions of modules that load nothing heavy: move them to module level, "
                       "or say why they wait on the line above:\n" + "\n".join(found))


@pytest.mark.parametrize("sources, found", [
    # a light module imported in a function: reported
    ({"specbench.a": "def f():\n    from specbench.b import x\n", "specbench.b": "x = 1\n"}, 1),
    # the same, saying why: not reported
    ({"specbench.a": "def f():\n    # b reads the environment when imported\n    from specbench.b import x\n",
      "specbench.b": "x = 1\n"}, 0),
    # a heavy one, directly or through another module or a lazy re-export: not reported
    ({"specbench.a": "def f():\n    from specbench.b import x\n", "specbench.b": "import torch\nx = 1\n"}, 0),
    ({"specbench.a": "def f():\n    from specbench.p import g\n",
      "specbench.p": "from specbench.lazy import exports\n__getattr__, __dir__ = exports(__name__, {'g': 'specbench.p.m'})\n",
      "specbench.p.m": "from specbench.q import y\ndef g(): pass\n", "specbench.q": "import pandas as pd\ny = 1\n"}, 0),
])
def test_the_lazy_import_check_tells_heavy_from_light(sources, found):
    assert len(unexplained_lazy_imports(sources)) == found
