"""`specbench workloads list|show`, run through the real Typer app and the real entry point."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner

from specbench.cli import app, main
from specbench.errors import WorkloadError

runner = CliRunner()
WIDE = {"COLUMNS": "200"}  # rich wraps tables to the terminal width


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The installed `specbench` entry point in-process: errors become exit codes here."""
    monkeypatch.setattr(sys, "argv", ["specbench", *args])
    try:
        main()
        code = 0  # success returns (standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_every_named_set_with_kind_count_and_default_sampling():
    result = runner.invoke(app, ["workloads", "list"], env=WIDE)
    assert result.exit_code == 0, result.output
    for name in ("real", "high-entropy", "regression", "humaneval", "sharegpt", "business"):
        assert name in result.output
    assert "temperature=0.8, top_p=0.95" in result.output
    assert "164" in result.output


def test_show_regression_lists_ids_categories_and_per_prompt_sampling():
    result = runner.invoke(app, ["workloads", "show", "regression"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "regression (regression): 12 prompts" in result.output
    assert "reg-sampled-poem" in result.output and "seed=1234" in result.output


def test_show_real_sample_previews_each_source():
    result = runner.invoke(app, ["workloads", "show", "real", "--num-prompts", "3", "--seed", "1"],
                           env=WIDE)
    assert result.exit_code == 0, result.output
    assert "3 prompts" in result.output
    assert "code-completion" in result.output and "chat" in result.output


def test_show_file_with_prompt_field_truncates_long_prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "long-one", "body": "word " * 100}) + "\n", encoding="utf-8")
    args = ["workloads", "show", str(path), "--prompt-field", "body"]
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 0, result.output
    assert "long-one" in result.output and "…" in result.output
    assert "word " * 30 not in result.output  # first ~80 characters only


def test_show_unknown_name_raises_workload_error_in_the_app():
    result = runner.invoke(app, ["workloads", "show", "nope"])
    assert isinstance(result.exception, WorkloadError)
    assert result.exit_code != 0


def test_entry_point_turns_bad_workload_into_one_line_and_exit_code_2(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "workloads", "show", "nope")
    assert code == 2 and out == ""
    assert err.strip().startswith("error: unknown workload 'nope'; valid:")
    assert len(err.strip().splitlines()) == 1


def test_entry_point_reports_malformed_file_line(monkeypatch, capsys, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\nnot json\n', encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "workloads", "show", str(path))
    assert code == 2 and f"{path}:2: invalid JSON" in err


def test_entry_point_list_exits_0(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "workloads", "list")
    assert code == 0 and "high-entropy" in out


def test_show_rejects_bad_num_prompts(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "workloads", "show", "business", "-n", "0")
    assert code == 2 and "--num-prompts must be >= 1" in err
