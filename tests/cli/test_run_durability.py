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


@pytest.mark.fault("run", "SIGKILL mid-configuration", sees="status killed; read_run recovers the journal",
                   kept="every completed sample")
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


# Runs `specbench run` with the backend's completion callback watched: after the callback
# returned for the KILL_AT-th sample whose baseline has not completed yet (a speculative
# sample that completed inside a wave, before its pair), the process SIGKILLs itself. Every
# completion is appended to LOG (one line, flushed) before the kill, so the test knows exactly
# which samples had completed.
KILL_HOOK = """
import os, signal, sys
import specbench.backends.embedded as embedded
log = open(os.environ["SPECBENCH_TEST_LOG"], "a", buffering=1)
kill_at = int(os.environ["SPECBENCH_TEST_KILL_AT"])
done, unpaired = set(), [0]
original = embedded.EmbeddedBackend.run
def run(self, requests, spec, **kw):
    callback = kw.get("on_results")
    if callback is None:
        return original(self, requests, spec, **kw)
    def watched(pairs):
        callback(pairs)
        for request, result in pairs:
            log.write(f"{spec.short} {request.id}\\n")
            if spec.speculative and ("baseline", request.id) not in done:
                unpaired[0] += 1
            done.add((spec.short, request.id))
        if unpaired[0] >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return original(self, requests, spec, **{**kw, "on_results": watched})
embedded.EmbeddedBackend.run = run
sys.argv = ["specbench", *sys.argv[1:]]
from specbench.cli import main
main()
"""


@pytest.mark.fault("run", "SIGKILL inside a wave, before the baseline pair completed",
                   sees="status killed; read_run recovers the journal",
                   kept="every completed sample, paired with its baseline where it ran")
@pytest.mark.parametrize("concurrency", [1, 4])
def test_sigkill_inside_a_wave_keeps_samples_waiting_for_their_baseline(tiny_pair, prompts_file, tmp_path,
                                                                        concurrency):
    out, log = tmp_path / "killed", tmp_path / "completed.log"
    hook = tmp_path / "kill_hook.py"
    hook.write_text(KILL_HOOK)
    env = {**ENV, "SPECBENCH_TEST_LOG": str(log), "SPECBENCH_TEST_KILL_AT": "3"}
    proc = subprocess.run(
        [sys.executable, str(hook), "run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
         "-k", "2", "--workload", str(prompts_file), "--num-prompts", "24", *SLOW,
         "--concurrency", str(concurrency), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    completed = [tuple(line.split()) for line in log.read_text().splitlines()]
    spec_label = next(label for label, _ in completed if label != "baseline")
    waiting = [pid for label, pid in completed
               if label == spec_label and ("baseline", pid) not in completed]
    assert waiting  # the kill came while speculative samples waited for their pair
    df, meta = read_run(out)
    assert meta["status"] == "killed"
    journaled = sorted(zip(df["config_id"].str.split("-c").str[0], df["prompt_id"]))
    assert journaled == sorted(completed)  # every completed sample, none twice
    speculative = df[~df["is_baseline"]].set_index("prompt_id")
    # Greedy: a sample whose baseline also completed is paired on read; one still waiting
    # for its baseline is kept, unpaired.
    paired = [pid for label, pid in completed if label == spec_label and ("baseline", pid) in completed]
    assert speculative.loc[paired, "token_match_rate"].notna().all()
    assert speculative.loc[waiting, "token_match_rate"].isna().all()


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
