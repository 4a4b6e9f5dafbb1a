"""Sweeps across servers: a `[server]` section makes every trial launch its own server
(`specbench serve` here, as vLLM or SGLang would be) for that trial's configuration, measure
through the openai backend, and stop it. A 2-trial grid (baseline + draft_model k=3) on tiny
float32 models leaves 2 run directories with rows, labelled with the trials' configurations,
and no server behind; a template with an unknown placeholder is refused before anything starts.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pandas as pd
import pytest

import cli_harness

from specbench.backends.launcher import ServerLauncher
from specbench.errors import ConfigError
from specbench.records import RUN_FILE
from specbench.sweep.spec import build_spec

PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
]
COMMAND = ("{python} -m specbench.server --target {target} --dtype float32 --device cpu "
           "--port {port} --speculative-config '{speculative_config_json}'")


def specbench(*args) -> tuple[int, str]:
    res = cli_harness.specbench(*args)
    return res.code, res.output


def write_spec(tmp_path: Path, tiny_pair, command: str) -> Path:
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
max_new_tokens = 8

[space]
method = "draft_model"
num_speculative_tokens = 3
concurrency = 2

[objective]
name = "tpot_p50"

[server]
command = {json.dumps(command)}
ready_timeout_s = 120
""")
    return spec


@pytest.fixture
def started(monkeypatch, launches) -> list[tuple[ServerLauncher, object]]:
    """Every (launcher, process) the sweep starts, recorded as it starts."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return launches


def test_sweep_launches_one_server_per_trial_and_stops_it(tiny_pair, tmp_path, started):
    code, out = specbench("sweep", write_spec(tmp_path, tiny_pair, COMMAND))
    assert code == 0, out

    runs = sorted((tmp_path / "study" / "runs").iterdir())
    assert len(runs) == 2, out
    configs = set()
    for run in runs:
        df = pd.read_parquet(run / "samples.parquet")
        assert len(df) == len(PROMPTS) and df["error"].isna().all()
        assert (df["backend"] == "openai").all() and (df["concurrency"] == 2).all()
        configs |= set(df["config_id"])
        meta = json.loads((run / RUN_FILE).read_text())
        assert meta["config"]["backend"] == "openai" and "--port" in meta["config"]["server"]["command"]
    assert configs == {"baseline-c2", "draft_model-k3-c2"}
    spec_rows = pd.concat(pd.read_parquet(r / "samples.parquet") for r in runs)
    spec_rows = spec_rows[spec_rows["config_id"] == "draft_model-k3-c2"]
    assert (spec_rows["drafted_tokens"] > 0).all()  # the launched server really speculated

    # one server per trial, each gone afterwards: process ended, port no longer listening
    assert len(started) == 2 and len({lau.params["port"] for lau, _ in started}) == 2
    for launcher, proc in started:
        assert launcher.proc is None and proc is not None and proc.poll() is not None
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", launcher.params["port"])) != 0


def test_unknown_placeholder_is_refused_before_anything_starts(tiny_pair, tmp_path):
    with pytest.raises(ConfigError, match=r"\{model\}.*known: .*speculative_config_json"):
        build_spec({"server.command": "vllm serve {model} --port {port}"})
    with pytest.raises(ConfigError, match=r"base_url.*\{host\}"):
        build_spec({"server.command": "x {port}", "server.base_url": "http://{host}:{port}"})
    code, out = specbench("sweep", write_spec(tmp_path, tiny_pair, COMMAND.replace("{target}", "{tgt}")))
    assert code != 0 and "{tgt}" in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "study" / "runs").exists()


def test_a_server_that_does_not_run_the_trials_configuration_fails_the_trial_and_is_stopped(
        tiny_pair, tmp_path, started):
    plain = "{python} -m specbench.server --target {target} --dtype float32 --device cpu --port {port}"
    code, out = specbench("sweep", write_spec(tmp_path, tiny_pair, plain))
    assert "trial 1" in out and "failed" in out and "serves baseline" in out.replace("\n", " "), out
    assert len(started) == 2
    for launcher, proc in started:
        assert launcher.proc is None and proc.poll() is not None
    assert len(list((tmp_path / "study" / "runs").iterdir())) == 1  # the baseline's
