"""docs/faults.md is what the fault-marked tests prove (see tests/faultdoc.py)."""

import textwrap

import pytest

import faultdoc


def test_the_fault_matrix_in_docs_is_generated_from_the_tests():
    assert faultdoc.DOC.read_text() == faultdoc.render(), "docs/faults.md is stale: run python tests/faultdoc.py"
    assert len(faultdoc.marks()) >= 10


def test_a_fault_mark_without_what_the_user_sees_is_refused(tmp_path, monkeypatch):
    (tmp_path / "test_x.py").write_text(textwrap.dedent('''
        import pytest
        @pytest.mark.fault("run", "a fault", kept="x")
        def test_a(): pass
    '''))
    monkeypatch.setattr(faultdoc, "TESTS", tmp_path)
    with pytest.raises(ValueError, match="fault\\(component, fault, sees=..., kept=...\\)"):
        faultdoc.marks()
    # and the doc comes out of the marks: a new mark is a new row
    (tmp_path / "test_x.py").write_text(textwrap.dedent('''
        import pytest
        @pytest.mark.fault("run", "a | fault", sees="one line", kept="x")
        def test_a(): pass
    '''))
    assert "| a \\| fault | one line | x | `" in faultdoc.render()
