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
    {"id": "count", "prompt": "1 2 3 4 5 6 7"},
    {"id": "ask", "prompt": "What is a team?"},
]
COMMAND = ("{python} -m specbench.server --target {target} --dtype float32 --device cpu "
           "--port {port} --speculative-config '{speculative_config_json}'")


def specbench(*args) -> tuple[int, str]:
    res = cli_harness.specbench(*args)
    return res.code, res.output


def write_spec(tmp_path: Path, tiny_pair, command: str, pairing: str | None = None, blocks: int | None = None) -> Path:
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
max_new_tokens = 24
ignore_eos = true

[space]
method = "draft_model"
num_speculative_tokens = 3
concurrency = 2

[objective]
name = "tpot_p50"

[server]
command = {json.dumps(command)}
ready_timeout_s = 120
""" + (f"pairing = {json.dumps(pairing)}\n" if pairing else "") + (f"blocks = {blocks}\n" if blocks else ""))
    return spec


@pytest.fixture
def started(monkeypatch, launches) -> list[tuple[ServerLauncher, object]]:
    """Every (launcher, process) the sweep starts, recorded as it starts."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return launches


def _alive(launched) -> int:
    return sum(1 for _, proc in launched if proc is not None and proc.poll() is None)


@pytest.fixture
def overlap(started, monkeypatch) -> list[int]:
    """For every server the sweep starts, how many of the sweep's servers were still alive
    when it started."""
    from specbench.backends.launcher import ServerLauncher

    seen: list[int] = []
    real_start = ServerLauncher.start

    def start(self):
        seen.append(_alive(started))
        return real_start(self)

    monkeypatch.setattr(ServerLauncher, "start", start)
    return seen


# pairing = "none" (one launch per trial) is what tests/sweep/test_sweep_vllm.py runs
@pytest.mark.parametrize("pairing", ["alternate", "together"])
def test_sweep_launches_servers_per_trial_paired_as_asked_and_stops_them(tiny_pair, tmp_path, overlap,
                                                                         started, pairing):
    # 2 blocks, not the default 4: each block is a server launch (tests/sweep/test_server_switch.py
    # counts the default's five without servers)
    code, out = specbench("sweep", write_spec(tmp_path, tiny_pair, COMMAND, pairing, blocks=2))
    assert code == 0, out

    runs = sorted((tmp_path / "study" / "runs").iterdir())
    assert len(runs) == 2, out
    by_config = {}
    for run in runs:
        df = pd.read_parquet(run / "samples.parquet")
        assert df["error"].isna().all()
        assert (df["backend"] == "openai").all() and (df["concurrency"] == 2).all()
        meta = json.loads((run / RUN_FILE).read_text())
        assert meta["config"]["backend"] == "openai"
        by_config[frozenset(df["config_id"])] = (df, meta)
    spec_id, base_id = "draft_model-k3-c2", "baseline-c2"
    assert frozenset({base_id}) in by_config
    base_df, base_meta = by_config[frozenset({base_id})]
    assert len(base_df) == len(PROMPTS) and "--port" in base_meta["config"]["server"]["command"]
    if pairing == "none":
        df, meta = by_config[frozenset({spec_id})]
        assert "not paired in time" in meta["config"]["sweep"]["pairing"]
    else:
        # the speculative trial measured the baseline beside it, every prompt under both
        df, meta = by_config[frozenset({spec_id, base_id})]
        assert df.groupby("config_id")["prompt_id"].apply(sorted).tolist() == [sorted(p["id"] for p in PROMPTS)] * 2
        launched = meta["config"]["server"]["launches"]
        order = [x["config_id"] for x in launched]
        if pairing == "alternate":  # 2 blocks: A | B B | A, three launches
            assert len(order) == 3 and len(set(order[0::2])) == 1 and set(order[1::2]) == set(order) - {order[0]}, order
            assert "in turn" in meta["config"]["sweep"]["pairing"]
        else:
            assert sorted(order) == sorted([spec_id, base_id]) and "at once" in meta["config"]["sweep"]["pairing"]
        assert all(Path(x["log"]).is_file() and "--port" in x["command"] for x in launched)
        # its recorded speedup comes from its own Parquet
        trial = next(t for t in optuna_trials(tmp_path) if t.user_attrs.get("config_id") == spec_id)
        # every prompt with a TPOT under both (a tiny pair can stream a whole answer in one chunk: TPOT 0)
        timed = df[df["tpot_s"] > 0].groupby("prompt_id")["config_id"].nunique()
        assert trial.user_attrs["paired"]["n"] == int((timed == 2).sum()) >= 2
    spec_rows = df[df["config_id"] == spec_id]
    assert len(spec_rows) == len(PROMPTS) and (spec_rows["drafted_tokens"] > 0).all()  # it really speculated

    # alternate and none: one server at a time; together: the trial's two at once
    assert max(overlap) == (1 if pairing == "together" else 0), overlap
    assert len(started) == {"none": 2, "alternate": 4, "together": 3}[pairing]
    assert len({lau.params["port"] for lau, _ in started}) == len(started)
    # each gone afterwards: process ended, port no longer listening
    for launcher, proc in started:
        assert launcher.proc is None and proc is not None and proc.poll() is not None
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", launcher.params["port"])) != 0


def optuna_trials(tmp_path: Path) -> list:
    import optuna

    return optuna.load_study(study_name="srv", storage=f"sqlite:///{tmp_path}/srv.db").trials


def test_server_pairing_is_checked_before_anything_starts():
    with pytest.raises(ConfigError, match=r"pairing \(--server-pairing\) must be one of alternate, together, none, got .abba."):
        build_spec({"server.command": "x --port {port}", "server.pairing": "abba"})
    with pytest.raises(ConfigError, match=r"together.*two ports.*\{port\}"):
        build_spec({"server.command": "x", "server.base_url": "http://127.0.0.1:8000", "server.pairing": "together"})
    with pytest.raises(ConfigError, match=r"blocks \(--server-blocks\) must be >= 2, got 1"):
        build_spec({"server.command": "x --port {port}", "server.blocks": 1})
    assert build_spec({"server.command": "x --port {port}"}).server.blocks == 4


def test_a_trial_looks_after_every_pair_of_its_own_blocks():
    from specbench.config import SpeculativeConfig
    from specbench.runner import Configuration
    from specbench.sweep.measure import PairedWatch

    spec = build_spec({"server.command": "x --port {port}"})
    config = Configuration(SpeculativeConfig(method="ngram", num_speculative_tokens=2), 2)
    assert PairedWatch(spec, config, 24, blocks=4).points == {12, 24}  # 6-prompt blocks: AB BA, AB BA
    assert PairedWatch(spec, config, 24).points == {4, 8, 12, 16, 20, 24}  # one wave (2) a block


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
    assert len(started) in (2, 3)  # the baseline trial's; trial 1's baseline server, if it went first
    for launcher, proc in started:
        assert launcher.proc is None and proc.poll() is not None
    assert len(list((tmp_path / "study" / "runs").iterdir())) == 1  # the baseline's
