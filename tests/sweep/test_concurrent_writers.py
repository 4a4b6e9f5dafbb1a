"""Two writers of one output at once (issue: runs never clobber each other): a `specbench run`
holds its --out from before its first write to its end, so a second run on the same --out
(with or without --overwrite) is refused in one line naming the directory and the holder's
pid, and the first one's samples are all there; a sweep of another study into a study's
directory is refused the same way, while workers of one study share it
(tests/sweep/test_sweep_workers.py).

The first writer is frozen (SIGSTOP) once it holds its lock, so the second always meets a
live holder, however slow the machine."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cli_harness import specbench
from specbench.records.lock import LOCK_FILE
from workerkit import ENV, finish, start, sweep_args, write_prompts

PROMPTS = [{"id": f"p{i}", "prompt": text} for i, text in enumerate(["Say hello.", "abc abc abc", "1, 2, 3,"])]


def held_by(proc, directory: Path, timeout: float = 120) -> None:
    """Wait until `proc` holds the lock on `directory`, then freeze it there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.pid in json.loads((directory / LOCK_FILE).read_text())["pids"]:
                os.kill(proc.pid, signal.SIGSTOP)
                return
        except (OSError, ValueError, KeyError):
            pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"{directory} never locked by pid {proc.pid}")


def run_args(tiny_pair, prompts: Path, out: Path) -> list[str]:
    return ["run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--method", "draft_model",
            "-k", "2", "--workload", str(prompts), "--dtype", "float32", "--device", "cpu", "--warmup", "0",
            "--max-new-tokens", "8", "--out", str(out)]


@pytest.mark.fault("records", "two runs on one --out at once", sees="the second: one line naming --out and the "
                   "holder's pid", kept="every sample of the first")
def test_a_second_run_on_a_running_out_is_refused_and_the_first_loses_nothing(tiny_pair, tmp_path, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    prompts = write_prompts(tmp_path, PROMPTS)
    out = tmp_path / "run"
    first = start([sys.executable, "-m", "specbench", *run_args(tiny_pair, prompts, out)], tmp_path)
    try:
        held_by(first, out)
        for extra in ([], ["--overwrite"]):
            res = specbench(*run_args(tiny_pair, prompts, out), *extra)
            res.refusal(f"--out {out} is being written by another process (pid {first.pid})")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    (code, o, e), = finish([first])
    assert code == 0, o + e
    df = pd.read_parquet(out / "samples.parquet")
    assert len(df) == 2 * len(PROMPTS)  # baseline and draft_model, every prompt: nothing lost
    assert not (out / LOCK_FILE).exists()
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


@pytest.mark.fault("sweep", "a sweep of another study on a study's --out at once", sees="one line naming --out, "
                   "the holder's pid and study", kept="the first study's trials and runs")
def test_a_sweep_of_another_study_into_a_running_study_directory_is_refused(tiny_pair, tmp_path):
    prompts = write_prompts(tmp_path)
    out = tmp_path / "study"
    common = ["--max-new-tokens", "6", "--method", "draft_model", "-k", "2", "--concurrency", "1",
              "--n-trials", "1"]
    first = start(sweep_args(tiny_pair, prompts, f"sqlite:///{tmp_path / 'one.db'}", out, *common, study="one"),
                  tmp_path)
    try:
        held_by(first, out)
        second = start(sweep_args(tiny_pair, prompts, f"sqlite:///{tmp_path / 'two.db'}", out, *common,
                                  study="two"), tmp_path)
        (code, o, e), = finish([second])
        assert code == 2, o + e
        assert "Traceback" not in o + e
        message = " ".join(e.split())
        assert f"--out {out} is being written by another process (pid {first.pid}, study one)" in message, message
        assert not (tmp_path / "two.db").exists()  # refused before it opened its study
    finally:
        os.kill(first.pid, signal.SIGCONT)
    (code, o, e), = finish([first])
    assert code == 0, o + e
    runs = list((out / "runs").iterdir())
    assert len(runs) == 1 and len(pd.read_parquet(runs[0] / "samples.parquet")) > 0
