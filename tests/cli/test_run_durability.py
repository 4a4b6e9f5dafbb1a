"""Nothing lost: a `specbench run` killed with SIGKILL mid-configuration keeps every sample
that had completed (its journal), SIGTERM stops it like Ctrl-C (exit 143, status
`interrupted`, records written), an unwritable --out is refused in one line before any model
loads, and an interrupt before the first sample says what the directory really holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_harness import specbench
from specbench import records
from specbench.records import read_run

PROMPTS = [{"id": f"p{i:02d}", "prompt": f"Item {i}: write a short note about number {i}."} for i in range(40)]
SLOW = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "48", "--ignore-eos"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def start_run(tiny_pair, prompts_file, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specbench", "run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
         "-k", "2", "--workload", str(prompts_file), *SLOW, "--out", str(out)],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_samples(proc: subprocess.Popen, out: Path, n: int, timeout: float = 120) -> int:
    """Journal rows once at least n samples are durable (or fail if the run ends first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        table, _ = records.files._read_journal(out / records.JOURNAL_FILE) if (out / records.JOURNAL_FILE).exists() else (None, None)
        if table is not None and table.num_rows >= n:
            return table.num_rows
        time.sleep(0.05)
    pytest.fail("the run produced no samples in time")


def test_sigkill_mid_configuration_keeps_every_completed_sample(tiny_pair, prompts_file, tmp_path):
    out = tmp_path / "killed"
    proc = start_run(tiny_pair, prompts_file, out)
    seen = wait_for_samples(proc, out, 12)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    # No configuration had finished (they alternate request by request), so before the
    # journal nothing at all survived.
    assert not (out / records.SAMPLES_FILE).exists()
    df, meta = read_run(out)
    assert seen <= len(df) < 2 * len(PROMPTS)
    assert meta["status"] == "killed" and meta["recovered_from_journal"] == len(df)
    counts = df["config_id"].value_counts()
    assert abs(counts["baseline-c1"] - counts["draft_model-k2-c1"]) <= 2
    # The report reads the recovered run like any other.
    res = specbench("report", str(out), "--out", str(tmp_path / "r.html"))
    assert res.code == 0, res.output
    assert (tmp_path / "r.html").stat().st_size > 0


def test_sigterm_stops_like_ctrl_c(tiny_pair, prompts_file, tmp_path):
    out = tmp_path / "terminated"
    proc = start_run(tiny_pair, prompts_file, out)
    wait_for_samples(proc, out, 3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "interrupted (SIGTERM)" in err
    meta = json.loads((out / records.RUN_FILE).read_text())
    assert meta["status"] == "interrupted" and meta["config"]["interrupted_by"] == "SIGTERM"
    df, _ = read_run(out)
    assert len(df) >= 3
    assert not (out / records.JOURNAL_FILE).exists()


def test_unwritable_out_is_refused_before_models_load(tiny_pair, prompts_file):
    res = specbench("run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--workload",
                    str(prompts_file), *SLOW, "--out", "/proc/specbench-run")
    assert res.code == 2 and "Traceback" not in res.output
    assert res.error_lines == [l for l in res.err.strip().splitlines() if l.startswith("error:")]
    assert "/proc/specbench-run" in res.err and "cannot write there" in res.err
    assert "loading target" not in res.err


def test_interrupt_before_the_first_sample_says_the_previous_run_is_still_there(
        tiny_pair, prompts_file, tmp_path, monkeypatch):
    out = tmp_path / "again"
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "ngram", "-k", "2", "--workload",
                    str(prompts_file), "--num-prompts", "3", "--dtype", "float32", "--device", "cpu",
                    "--warmup", "0", "--max-new-tokens", "4", "--out", str(out))
    assert res.code == 0, res.output
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    from specbench.backends.embedded import EmbeddedBackend

    def interrupted(self, requests, spec, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(EmbeddedBackend, "run", interrupted)
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "ngram", "-k", "2", "--workload",
                    str(prompts_file), "--num-prompts", "3", "--dtype", "float32", "--device", "cpu",
                    "--warmup", "0", "--max-new-tokens", "4", "--out", str(out), "--overwrite")
    assert res.code == 130
    text = " ".join(res.err.split())
    assert "before any sample completed" in text and "still holds the previous run (6 samples)" in text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
