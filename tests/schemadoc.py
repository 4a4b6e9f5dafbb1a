"""docs/records.md's schema table, generated from `specbench.records.SCHEMA` (column, type, unit,
description: `records.column_docs()`). The table sits between two marker lines; the prose around
it is written by hand. `tests/test_schema_doc.py` fails when the table and the schema disagree;
`python tests/schemadoc.py` writes it again."""

from __future__ import annotations

import sys
from pathlib import Path

from specbench.records import column_docs

DOC = Path(__file__).resolve().parent.parent / "docs" / "records.md"
BEGIN = "<!-- schema table: written by python tests/schemadoc.py from specbench/records/schema.py -->"
END = "<!-- end of schema table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    rows = ["| column | type | unit | description |", "|---|---|---|---|"]
    for name, type_, unit, description in column_docs():
        rows.append(f"| `{name}` | {_cell(type_)} | {_cell(unit)} | {_cell(description)} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` (the doc) with the part between the markers replaced by the current table."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{DOC.name} must hold the two marker lines once each, in order:\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}{END}{tail}"


if __name__ == "__main__":
    DOC.write_text(render(DOC.read_text()))
    print(f"wrote the schema table of {DOC} ({len(column_docs())} columns)", file=sys.stderr)
