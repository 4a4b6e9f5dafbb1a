"""docs/faults.md, the fault matrix, generated from the tests that prove it: every test marked
`@pytest.mark.fault(component, fault, sees=..., kept=...)` is one row (what is injected, what
the user sees, what is kept, and the test). `tests/test_fault_doc.py` fails when the file and
the tests disagree; `python tests/faultdoc.py` writes it again."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "faults.md"

HEADER = """# Fault matrix

What specbench does when something fails under it: per component, the fault a test injects,
what the user sees, and what is kept. Generated from the tests' `@pytest.mark.fault` marks by
`python tests/faultdoc.py` (`tests/test_fault_doc.py` fails when this file and the tests
disagree), so every row is a fault some test injects on every CI run.

"""


def _text(node: ast.expr) -> str:
    value = ast.literal_eval(node)
    if not isinstance(value, str):
        raise ValueError(f"a fault mark's arguments must be strings, got {value!r}")
    return value


def marks() -> list[dict[str, str]]:
    """Every fault mark under tests/, sorted by component then test."""
    rows = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "fault"
                        and ast.unparse(dec.func.value) == "pytest.mark"):
                    if len(dec.args) != 2 or {k.arg for k in dec.keywords} != {"sees", "kept"}:
                        raise ValueError(f"{path.relative_to(TESTS.parent)}::{node.name}: a fault mark is "
                                         "fault(component, fault, sees=..., kept=...)")
                    kw = {k.arg: _text(k.value) for k in dec.keywords}
                    rows.append({"component": _text(dec.args[0]), "fault": _text(dec.args[1]), **kw,
                                 "test": f"{path.relative_to(TESTS.parent)}::{node.name}"})
    return sorted(rows, key=lambda r: (r["component"], r["test"]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    rows = marks()
    out = [HEADER]
    for component in dict.fromkeys(r["component"] for r in rows):
        out.append(f"## {component}\n\n| fault | the user sees | kept | test |\n|---|---|---|---|\n")
        for r in rows:
            if r["component"] == component:
                out.append(f"| {_cell(r['fault'])} | {_cell(r['sees'])} | {_cell(r['kept'])} | `{r['test']}` |\n")
        out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC} ({len(marks())} faults)", file=sys.stderr)
