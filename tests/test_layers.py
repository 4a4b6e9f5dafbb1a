"""The package's layers (docs/architecture.md): no module imports a higher layer than its own,
at module level or inside a function. Entry points (`__main__` modules) sit above everything."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specbench"

# low to high; a module's layer is that of its first name below `specbench.`
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"config", "types", "errors", "arrivals", "formatting", "acceptance", "atomic",
                        "interrupts", "memory", "progress", "limits", ""})),
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
