"""docs/records.md's schema table is `records.SCHEMA` (see tests/schemadoc.py)."""

import pytest

import schemadoc
from specbench.records import COLUMNS


def test_the_schema_table_in_docs_is_generated_from_the_schema():
    text = schemadoc.DOC.read_text()
    assert text == schemadoc.render(text), "docs/records.md's schema table is stale: run python tests/schemadoc.py"
    for name in COLUMNS:
        assert f"| `{name}` |" in text, name


def test_the_table_follows_the_schema_and_keeps_the_prose_around_it():
    doc = f"# Records\n\nbefore\n\n{schemadoc.BEGIN}\n| stale |\n{schemadoc.END}\n\nafter\n"
    out = schemadoc.render(doc)
    assert out.startswith("# Records\n\nbefore\n\n") and out.endswith(f"{schemadoc.END}\n\nafter\n")
    assert "| stale |" not in out
    assert "| `ttft_s` | float64? | s | Time to first token in s" in out
    assert "| `finish_reason` | string |  | Why generation ended: stop \\| length" in out
    with pytest.raises(ValueError, match="marker lines"):
        schemadoc.render("# Records\n\nno table\n")
