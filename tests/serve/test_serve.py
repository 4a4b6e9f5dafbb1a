"""`specbench serve` as a subprocess on a free loopback port (started by `ServerLauncher`, as a
sweep would start vLLM), and `specbench run --backend openai` against it: the same prompts give
the same tokens and the same per-request acceptance as the embedded backend (greedy, float32),
/metrics deltas equal the per-request sums, the API answers OpenAI-shaped errors, and a client
that hangs up mid-stream does not wedge the server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

import cli_harness

from specbench.backends.launcher import ServerLauncher
from specbench.backends.openai import parse_prometheus, spec_decode_counters

FAST = ["--warmup", "0", "--max-new-tokens", "12"]
PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "code", "category": "code", "prompt": "def add(a, b):\n    return"},
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def specbench(*args):
    res = cli_harness.specbench(*args)
    assert res.code == 0 and "Traceback" not in res.err, res.output
    return res.out


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


@pytest.fixture(scope="module")
def embedded(tiny_pair, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "embedded"
    specbench("run", "--target", tiny_pair[0], "--draft", tiny_pair[1], "-k", "3", "--no-baseline",
              "--dtype", "float32", "--device", "cpu", "--workload", prompts, "--out", out, *FAST)
    return pd.read_parquet(out / "samples.parquet")


def openai_run(server, tiny_pair, prompts, out, *extra):
    text = specbench("run", "--backend", "openai", "--base-url", server.base_url + "/v1", "--model", "tiny",
                     "--tokenizer", tiny_pair[0], "--workload", prompts, "--out", out, *FAST, *extra)
    return pd.read_parquet(out / "samples.parquet"), json.loads((out / "run.json").read_text()), text


def by_prompt(df) -> dict:
    return {r["prompt_id"]: r for _, r in df.iterrows()}


PER_REQUEST = ["output_token_ids", "accepted_per_step", "rejection_positions"]
SCALARS = ["input_tokens", "output_tokens", "num_steps", "drafted_tokens", "accepted_tokens",
           "target_forward_passes", "finish_reason", "seed", "method", "num_speculative_tokens"]


def test_openai_records_agree_with_the_embedded_backend(server, tiny_pair, prompts, embedded, tmp_path):
    df, run, _ = openai_run(server, tiny_pair, prompts, tmp_path / "oa", "--concurrency", "1,2")
    assert set(df["config_id"]) == {"draft_model-k3-c1", "draft_model-k3-c2"}  # labelled from the card
    assert set(df["backend"]) == {"openai"} and df["error"].isna().all()
    want = by_prompt(embedded)
    for config_id, rows in df.groupby("config_id"):
        got = by_prompt(rows)
        assert got.keys() == want.keys()
        for pid, w in want.items():
            g = got[pid]
            for col in PER_REQUEST:
                assert list(g[col]) == list(w[col]), (config_id, pid, col)
            for col in SCALARS:
                assert g[col] == w[col], (config_id, pid, col)
            assert g["acceptance_rate"] == pytest.approx(w["acceptance_rate"])
            assert len(g["itl_s"]) == g["output_tokens"] - 1 and g["ttft_s"] > 0
            assert g["prefill_time_s"] > 0 and pd.isna(g["peak_memory_bytes"])
        # /metrics deltas of this configuration equal the sums of its per-request figures
        stats = run["config"]["configuration_stats"][config_id]
        assert stats["acceptance_scope"] == "request" and stats["errors"] == 0
        srv = stats["server_spec_decode"]
        assert srv["num_draft_tokens"] == rows["drafted_tokens"].sum()
        assert srv["num_accepted_tokens"] == rows["accepted_tokens"].sum()
        assert srv["num_drafts"] == rows["num_steps"].sum()
        per_pos = [sum(int(a > i) for steps in rows["accepted_per_step"] for a in steps) for i in range(3)]
        assert srv["num_accepted_tokens_per_pos"] == per_pos
        assert {k: v for k, v in stats["request_spec_decode"].items()} == srv
    assert run["config"]["openai"]["token_counting"] == "token_ids"


def test_chat_endpoint_gives_the_same_tokens(server, tiny_pair, prompts, embedded, tmp_path):
    df, run, _ = openai_run(server, tiny_pair, prompts, tmp_path / "chat", "--endpoint", "chat")
    got, want = by_prompt(df), by_prompt(embedded)
    for pid, w in want.items():
        assert list(got[pid]["output_token_ids"]) == list(w["output_token_ids"]), pid
        assert list(got[pid]["accepted_per_step"]) == list(w["accepted_per_step"]), pid
    assert run["config"]["openai"]["endpoint"] == "chat"


def test_health_models_and_metrics(server):
    base = server.base_url
    assert httpx.get(base + "/health").status_code == 200
    card = httpx.get(base + "/v1/models").json()["data"]
    assert [c["id"] for c in card] == ["tiny"] and card[0]["owned_by"] == "specbench"
    assert card[0]["speculative_config"]["method"] == "draft_model"
    assert card[0]["speculative_config"]["num_speculative_tokens"] == 3
    metrics = httpx.get(base + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    counters = spec_decode_counters(parse_prometheus(metrics.text))
    assert counters is not None and len(counters["num_accepted_tokens_per_pos"]) == 3


def test_non_streaming_completion_and_chat(server):
    base = server.base_url
    r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 5,
                                                   "temperature": 0}).json()
    choice = r["choices"][0]
    assert r["object"] == "text_completion" and len(choice["token_ids"]) == 5
    assert r["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert choice["finish_reason"] == "length"
    spec = choice["spec_decode"]
    assert sum(spec["accepted_per_step"]) == spec["accepted"] <= spec["drafted"]
    # streaming the same request gives the same tokens
    ids = []
    with httpx.stream("POST", base + "/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 5,
                                                              "temperature": 0, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                ids += json.loads(line[6:])["choices"][0]["token_ids"]
    assert ids == choice["token_ids"]
    r = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 3, "temperature": 0}).json()
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("body, status, needle", [
    ({"model": "other", "prompt": "x"}, 404, "served: tiny"),
    ({"prompt": "x", "n": 2}, 400, "n must be 1"),
    ({"prompt": [1, 99999]}, 400, "outside the vocabulary"),
    ({"prompt": [1] * 600}, 400, "leaves no room"),
    ({"prompt": "x", "stop": ["\n"]}, 400, "stop_token_ids"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": ["a", "b"]}, 400, "one prompt per request"),
])
def test_bad_requests_get_openai_errors(server, body, status, needle):
    r = httpx.post(server.base_url + "/v1/completions", json=body)
    assert r.status_code == status
    assert needle in r.json()["error"]["message"]


# ---- the peers' dialect ------------------------------------------------------------------


def test_max_completion_tokens_is_honoured_when_max_tokens_is_null(server):
    for path, extra in (("/v1/completions", {"prompt": [5, 6, 7]}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = httpx.post(server.base_url + path, json={**extra, "max_tokens": None, "max_completion_tokens": 5,
                                                     "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, (path, r.text)
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": [5], "max_completion_tokens": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"


@pytest.mark.parametrize("name, neutral, other", [
    ("repetition_penalty", 1.0, 1.2), ("presence_penalty", 0.0, 0.5), ("frequency_penalty", 0, 0.5),
    ("min_p", 0.0, 0.1), ("min_tokens", 0, 4),
])
def test_sampling_fields_the_engine_lacks_are_refused_unless_neutral(server, name, neutral, other):
    body = {"prompt": [5, 6], "max_tokens": 2, "temperature": 0}
    r = httpx.post(server.base_url + "/v1/completions", json={**body, name: other})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name and name in r.json()["error"]["message"]
    assert httpx.post(server.base_url + "/v1/completions", json={**body, name: neutral}).status_code == 200
    assert httpx.post(server.base_url + "/v1/completions", json={**body, name: None}).status_code == 200


def test_metrics_counters_are_typed_as_a_prometheus_parser_reads_them(server):
    """AIPerf (and prometheus_client's parser it uses) types a sample by the TYPE line of its own
    name: counters are written `# TYPE x_total counter` as vLLM's prometheus_client writes them."""
    from prometheus_client.parser import text_string_to_metric_families

    httpx.post(server.base_url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3, "temperature": 0})
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.base_url + "/metrics").text)}
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
                 "vllm:generation_tokens", "vllm:prompt_tokens", "vllm:request_success"):
        f = families[name]
        assert f.type == "counter" and f.samples and all(x.name == name + "_total" for x in f.samples), name
    assert families["vllm:num_requests_running"].type == "gauge"
    assert not [f.name for f in families.values() if f.type == "unknown"]
    assert families["vllm:generation_tokens"].samples[0].value >= 3


def test_per_request_metrics_in_vllms_shape_agree_with_spec_decode(server):
    from specbench.backends.openai import vllm_acceptance

    body = {"prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0}
    r = httpx.post(server.base_url + "/v1/completions", json=body).json()
    own, vllm = r["choices"][0]["spec_decode"], r["metrics"]["speculative_decoding"]
    drafted = [d for d in own["drafted_per_step"] if d > 0]
    assert vllm["num_spec_steps"] == own["num_drafts"] == len(drafted) > 0
    assert vllm["num_draft_tokens"] == own["drafted"] and vllm["num_accepted_draft_tokens"] == own["accepted"]
    assert vllm["per_step_drafted"] == drafted and vllm["num_spec_tokens"] == 3
    assert sum(vllm["acceptance_histogram"]) == vllm["num_spec_steps"] and len(vllm["acceptance_histogram"]) == 4
    assert vllm["mean_acceptance_length"] == pytest.approx(1 + own["accepted"] / own["num_drafts"])
    assert vllm_acceptance(vllm).accepted_per_step == tuple(vllm["per_step_accepted"])
    # streamed: on the usage chunk, as vLLM sends it (only when usage is asked for)
    events = []
    with httpx.stream("POST", server.base_url + "/v1/completions",
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    usage = [e for e in events if e.get("usage")]
    assert len(usage) == 1 and usage[0]["metrics"]["speculative_decoding"] == vllm
    assert all("metrics" not in e for e in events if not e.get("usage"))


def test_continuous_usage_stats_give_cumulative_usage_on_every_chunk(server):
    body = {"prompt": [5, 6, 7], "max_tokens": 7, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    seen = 0
    token_events = [e for e in events if e["choices"] and e["choices"][0]["token_ids"]]
    for e in token_events:
        seen += len(e["choices"][0]["token_ids"])
        assert e["usage"] == {"prompt_tokens": 3, "completion_tokens": seen, "total_tokens": 3 + seen}
    assert seen == 7 and events[-1]["usage"]["completion_tokens"] == 7


def test_head_and_options_are_answered_as_http_servers_do(server):
    base = server.base_url
    head = httpx.head(base + "/metrics")
    assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
    assert head.headers["content-type"].startswith("text/plain")
    assert httpx.head(base + "/health").status_code == 200
    opt = httpx.options(base + "/v1/completions")
    assert opt.status_code == 204 and opt.headers["allow"] == "POST, OPTIONS"
    assert httpx.options(base + "/v1/models").headers["allow"] == "GET, HEAD, OPTIONS"
    assert httpx.options(base + "/nope").status_code == 404
    wrong = httpx.get(base + "/v1/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST, OPTIONS"
    assert httpx.post(base + "/health").status_code == 405
    assert httpx.head(base + "/nope").status_code == 404


def test_invalid_json_and_unknown_route(server):
    r = httpx.post(server.base_url + "/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert httpx.get(server.base_url + "/v2/x").status_code == 404


def test_client_hanging_up_mid_stream_does_not_wedge_the_server(server):
    base = server.base_url
    with httpx.stream("POST", base + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 400, "temperature": 0,
                                                              "ignore_eos": True, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                break  # leave after the first chunk
    r = httpx.post(base + "/v1/completions", json={"prompt": [4, 5], "max_tokens": 3, "temperature": 0}, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
    deadline = time.time() + 30
    while time.time() < deadline:
        m = parse_prometheus(httpx.get(base + "/metrics").text)
        if m["vllm:num_requests_running"][0][1] == 0 and m["vllm:num_requests_waiting"][0][1] == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the abandoned request is still running")


# ---- launched from a server command template ----------------------------------------------


def test_launched_ngram_server_serves_its_configuration_and_stops(tiny_pair, prompts, tmp_path):
    template = ("{python} -m specbench.server --target {target} --dtype float32 --device cpu --port {port} "
                "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": {k}}'")
    launcher = ServerLauncher(template, {"python": sys.executable, "target": tiny_pair[0], "k": 2},
                              ready_timeout_s=180, env=ENV, log_path=tmp_path / "server.log")
    with launcher:
        card = httpx.get(launcher.base_url + "/v1/models").json()["data"][0]
        assert card["id"] == str(tiny_pair[0])  # served under --target as given, as vLLM does
        assert card["speculative_config"]["method"] == "ngram"
        assert card["speculative_config"]["num_speculative_tokens"] == 2
        # no --model, no --tokenizer: the only served model is a local path, so its tokenizer loads;
        # open loop at 20 requests/s
        specbench("run", "--backend", "openai", "--base-url", launcher.base_url, "--workload", prompts,
                  "--request-rate", "20", "--concurrency", "2", "--out", tmp_path / "r", *FAST)
        df = pd.read_parquet(tmp_path / "r" / "samples.parquet")
        assert set(df["config_id"]) == {"ngram-k2-c2-r20"} and df["error"].isna().all()
        assert (df["request_rate"] == 20).all() and df["arrival_s"].nunique() == 3 and (df["arrival_s"] >= 0).all()
        proc = launcher.proc
    assert proc.poll() is not None and launcher.proc is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(launcher.base_url + "/health")


def test_serve_refuses_a_busy_port_before_loading_models(tiny_pair):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        started = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "specbench.server", "--target", str(tiny_pair[0]),
                              "--port", str(port)], capture_output=True, text=True, env=ENV, timeout=120)
    assert res.returncode == 2, res.stderr
    assert f"--port {port}: cannot listen" in res.stderr and "Traceback" not in res.stderr
    assert "loading target" not in res.stderr
    assert time.perf_counter() - started < 60
