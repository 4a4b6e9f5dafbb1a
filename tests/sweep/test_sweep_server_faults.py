"""The sweep's launcher under faults: a server that exits during start-up (leaving a worker
behind), one that never becomes healthy, a port someone else holds, one that crashes in the
middle of a trial. Every trial ends failed with a named reason (`server failed: ...`), no
process of the server's group is left, the study goes on to the next trial, and
`--retry-failed` measures the failed configurations again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest

import cli_harness
from specbench.backends import launcher as launcher_module
from specbench.backends.launcher import group_members

PROMPTS = [{"id": f"p{i}", "prompt": f"Count from {i} to {i + 30}, one number per line."} for i in range(6)]


def write_spec(tmp_path: Path, tiny_pair, command: str, *, base_url: str | None = None,
               ready_timeout_s: float = 3, max_new_tokens: int = 8, method: str = "draft_model",
               ignore_eos: bool = False) -> Path:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    spec = tmp_path / "srv.toml"
    spec.write_text(f"""
[study]
storage = {json.dumps(f"sqlite:///{tmp_path}/srv.db")}
out = {json.dumps(str(tmp_path / "study"))}

[models]
target = {json.dumps(str(tiny_pair[0]))}
draft = {json.dumps(str(tiny_pair[1]))}

[workload]
source = {json.dumps(str(prompts))}
warmup = 0

[sampling]
max_new_tokens = {max_new_tokens}
ignore_eos = {json.dumps(ignore_eos)}

[space]
method = {json.dumps(method)}
num_speculative_tokens = 3
concurrency = 2

[objective]
name = "tpot_p50"

[server]
command = {json.dumps(command)}
ready_timeout_s = {ready_timeout_s}
{f"base_url = {json.dumps(base_url)}" if base_url else ""}
""")
    return spec


@pytest.fixture
def processes(monkeypatch) -> list[subprocess.Popen]:
    """Every server process the launcher starts."""
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        proc = real(*args, **kwargs)
        if kwargs.get("start_new_session"):  # the launcher's (subprocess is one module for all)
            started.append(proc)
        return proc

    monkeypatch.setattr(launcher_module.subprocess, "Popen", popen)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return started


def failures(tmp_path: Path) -> list[tuple[int, str, str]]:
    study = optuna.load_study(study_name="srv", storage=f"sqlite:///{tmp_path}/srv.db")
    return [(t.number, t.user_attrs.get("config_key", "?"), t.user_attrs.get("fail_reason", ""))
            for t in study.get_trials() if t.state == optuna.trial.TrialState.FAIL]


def assert_all_failed_by_the_server(tmp_path: Path, out: str, needle: str, trials: int = 2) -> None:
    failed = failures(tmp_path)
    assert len(failed) == trials, (failed, out)  # the study went on after the first failure
    for _, _, reason in failed:
        assert reason.startswith("server failed: ") and needle in reason, (reason, out)
    assert "Traceback" not in out
    runs = tmp_path / "study" / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no empty run directory behind


def assert_groups_gone(processes: list[subprocess.Popen]) -> None:
    assert processes
    for proc in processes:
        assert proc.poll() is not None and group_members(proc.pid) == [], proc.pid


# A server that starts a worker of its own, then exits with code 3 before it serves.
EXITS = ("{python} -c \"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
         "'import time; time.sleep(600)']); time.sleep(0.3); print('no GPU found'); sys.exit(3)\" {port}")
HANGS = "{python} -c \"import time; time.sleep(600)\" {port}"


@pytest.mark.fault("sweep launcher", "server exits during start-up, leaving a worker",
                   sees="trial failed: 'server failed: server exited with code 3 before it was ready'",
                   kept="the study goes on; --retry-failed measures it again")
def test_a_server_that_exits_during_start_up(tiny_pair, tmp_path, processes):
    res = cli_harness.specbench("sweep", write_spec(tmp_path, tiny_pair, EXITS))
    assert_all_failed_by_the_server(tmp_path, res.output, "exited with code 3 before it was ready")
    assert "no GPU found" in failures(tmp_path)[0][2]  # the log's last words are in the reason
    assert_groups_gone(processes)  # the worker it left behind too

    # A rerun leaves the failures settled; --retry-failed measures them again.
    again = cli_harness.specbench("sweep", write_spec(tmp_path, tiny_pair, EXITS))
    assert len(failures(tmp_path)) == 2, again.output
    retried = cli_harness.specbench("sweep", write_spec(tmp_path, tiny_pair, EXITS), "--retry-failed")
    assert "2 failed configuration(s) will be measured again" in retried.output, retried.output
    assert len(failures(tmp_path)) == 4 and len(processes) == 4
    assert_groups_gone(processes)


@pytest.mark.fault("sweep launcher", "server never becomes healthy",
                   sees="trial failed: 'server failed: server not ready after N s'", kept="the study goes on")
def test_a_server_that_never_becomes_healthy(tiny_pair, tmp_path, processes):
    res = cli_harness.specbench("sweep", write_spec(tmp_path, tiny_pair, HANGS, ready_timeout_s=2))
    assert_all_failed_by_the_server(tmp_path, res.output, "not ready after 2 s")
    assert_groups_gone(processes)


@pytest.mark.fault("sweep launcher", "the server's port is already taken",
                   sees="trial failed: 'server failed: port N ... already in use'", kept="no server started")
def test_a_port_already_taken(tiny_pair, tmp_path, processes):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        res = cli_harness.specbench("sweep", write_spec(
            tmp_path, tiny_pair, "{python} -c \"import time; time.sleep(600)\" --port " + str(port),
            base_url=f"http://127.0.0.1:{port}"))
    assert_all_failed_by_the_server(tmp_path, res.output, f"port {port} of 127.0.0.1")
    assert "already in use" in failures(tmp_path)[0][2]
    assert processes == []  # never started against someone else's port


SERVE = ("{python} -m specbench.server --target {target} --dtype float32 --device cpu --port {port} "
         "--log-requests --speculative-config '{speculative_config_json}'")


@pytest.mark.fault("sweep launcher", "server crashes in the middle of a trial",
                   sees="trial failed: 'server failed: exited with code -9 during the trial'",
                   kept="the other trials; the crashed trial's samples so far, marked interrupted")
def test_a_server_that_crashes_mid_trial(tiny_pair, tmp_path, processes):
    spec = write_spec(tmp_path, tiny_pair, SERVE, ready_timeout_s=180, max_new_tokens=200, method="ngram",
                      ignore_eos=True)
    stop = threading.Event()

    def crash_the_second_server() -> None:  # SIGKILL once it has answered a few requests
        while not stop.is_set():
            if len(processes) >= 2 and processes[1].poll() is None:
                logs = list((tmp_path / "study" / "server-logs").glob("*.log"))
                newest = max(logs, key=lambda p: p.stat().st_mtime, default=None)
                if newest is not None and newest.read_text(errors="replace").count("POST /v1/completions") >= 3:
                    os.killpg(processes[1].pid, signal.SIGKILL)
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=crash_the_second_server, daemon=True)
    killer.start()
    try:
        res = cli_harness.specbench("sweep", spec)
    finally:
        stop.set()
    failed = failures(tmp_path)
    assert len(failed) == 1, (failed, res.output)
    assert failed[0][2].startswith("server failed: exited with code -9 during the trial"), failed
    assert "Traceback" not in res.output
    assert_groups_gone(processes)
