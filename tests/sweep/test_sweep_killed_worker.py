"""A sweep worker killed with SIGKILL: its trial, failed as stale by the next worker, carries a
named `fail_reason` ("worker lost: ..."), is queued again exactly once and measured by that
worker; the killed trial's run directory, if it got samples, reads back as `killed`; a writer
killed before its first sample leaves no directory at all."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from specbench.records import read_run
from specbench.sweep.storage import open_storage
from workerkit import finish, start, sweep_args, write_prompts

PROMPTS = [{"id": f"p{i}", "prompt": f"Item {i}: abc abc abc abc abc"} for i in range(6)]
# one configuration besides the baseline; trials long enough (6 x 200 tokens) for a kill inside
ARGS = ["--max-new-tokens", "200", "--ignore-eos", "--method", "ngram", "-k", "3", "--concurrency", "1",
        "--sampler", "grid", "--batch", "trial", "--heartbeat-interval", "1", "--grace-period", "3", "--objective", "tpot_p50"]


@pytest.mark.fault("sweep worker", "SIGKILL of a worker mid-trial",
                   sees="trial failed: 'worker lost: no heartbeat for 3 s ...'; run directory status killed",
                   kept="the study: the configuration is queued once and measured by the next worker")
def test_a_killed_workers_trial_is_named_retried_once_and_measured(tiny_pair, tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    prompts = write_prompts(tmp_path, PROMPTS)
    victim = start(sweep_args(tiny_pair, prompts, url, tmp_path / "study", *ARGS), tmp_path)
    deadline = time.monotonic() + 240
    study = None
    while time.monotonic() < deadline:  # until the victim is inside its second (speculative) trial
        assert victim.poll() is None, victim.stderr.read()[-2000:]
        try:
            study = study or optuna.load_study(study_name="shared", storage=open_storage(url))
        except KeyError:
            time.sleep(0.2)
            continue
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        runs = tmp_path / "study" / "runs"
        if running and running[0].number == 1 and runs.is_dir() and len(list(runs.iterdir())) == 2:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the worker never got inside its second trial")
    victim.send_signal(signal.SIGKILL)
    victim.wait(30)
    time.sleep(4)  # past the grace period

    (rc, out, err), = finish([start(sweep_args(tiny_pair, prompts, url, tmp_path / "study", *ARGS), tmp_path)])
    assert rc == 0 and "Traceback" not in out + err, err
    study = optuna.load_study(study_name="shared", storage=open_storage(url))
    trials = study.get_trials(deepcopy=False)
    lost = [t for t in trials if t.state == TrialState.FAIL]
    assert len(lost) == 1 and lost[0].number == 1, [(t.number, t.state, t.user_attrs) for t in trials]
    assert lost[0].user_attrs["fail_reason"].startswith("worker lost: no heartbeat for 3 s"), lost[0].user_attrs
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == lost[0].number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE  # queued once, measured
    assert "fail_reason" not in retries[0].user_attrs  # the retry starts clean
    key = lost[0].user_attrs["config_key"]
    measured = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("config_key") == key]
    assert len(measured) == 1
    # The killed trial's directory holds what it measured, read back as killed; no empty one.
    for run in (tmp_path / "study" / "runs").iterdir():
        df, meta = read_run(run)
        assert len(df) > 0
        if run.name == lost[0].user_attrs.get("run_id") or meta.get("status") == "killed":
            assert meta["status"] == "killed"


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from specbench.records import RunMetadata, RunWriter
RunWriter(Path(sys.argv[1]), RunMetadata.collect("r", {}))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.fault("records", "SIGKILL before the first sample", sees="nothing", kept="no empty run directory")
def test_a_writer_killed_before_its_first_sample_leaves_no_directory(tmp_path):
    run = tmp_path / "runs" / "t0001"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(run)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (tmp_path / "runs").is_dir() and not run.exists()

