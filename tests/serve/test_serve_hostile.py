"""`specbench serve` against hostile clients: every malformed request of serve_load.cases()
(bad JSON, a lone surrogate, wrong types and ranges for every field, NaN/inf, wrong content
types, bad or missing Content-Length, oversized and chunked bodies, bad paths and methods,
slow clients) gets its HTTP error in the API's JSON shape with a message naming the field or
header, no request leaves a traceback in the server's log, and none hangs: a request that
does not arrive within --read-timeout gets 408, an idle connection is closed."""

from __future__ import annotations


import httpx
import pytest

import serve_load

READ_TIMEOUT_S = 1.0
SERVE_FLAGS = f"--read-timeout {READ_TIMEOUT_S}"  # added to the `server` fixture's command (conftest)
CASES = serve_load.cases(READ_TIMEOUT_S)


def test_the_catalogue_covers_every_category():
    assert len(CASES) >= 100 and len({c.name for c in CASES}) == len(CASES)
    assert {c.category for c in CASES} == {
        "bad JSON", "wrong type", "huge or negative number", "NaN/inf", "unknown field", "content type",
        "missing body", "Content-Length", "oversized body", "path/method", "chunked", "slowloris"}


@pytest.mark.parametrize("case", CASES, ids=[f"{c.category}: {c.name}" for c in CASES])
def test_malformed_request_gets_a_clean_error_and_no_traceback(server, case):
    offset = serve_load.log_size(server.log_path)
    reply = serve_load.run_case("127.0.0.1", server.params["port"], case, READ_TIMEOUT_S)
    verdict = serve_load.judge(case, reply)
    assert verdict == "clean", (verdict, reply.status, reply.body[:300])
    if case.slow:  # answered once the read timeout has passed, not before and not much later
        assert READ_TIMEOUT_S * 0.9 <= reply.seconds <= READ_TIMEOUT_S + 5
    assert httpx.get(server.base_url + "/health").status_code == 200  # the server still answers
    assert not serve_load.traceback_since(server.log_path, offset)


def test_max_tokens_past_the_context_is_refused_as_vllm_does(server):
    url = server.base_url + "/v1/completions"
    prompt = list(range(5, 105))  # 100 tokens in a context of 512: room for 412
    r = httpx.post(url, json={"prompt": prompt, "max_tokens": 413})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens"
    assert err["message"] == ("max_tokens is too large: 413. This model's maximum context length is 512 tokens "
                              "and your request has 100 input tokens (413 > 512 - 100)")
    # exactly the room left is served, in full
    r = httpx.post(url, json={"prompt": prompt, "max_tokens": 412, "ignore_eos": True, "temperature": 0}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 412
    # a default that does not fit (completions' 16) is not the client's doing: it is shortened
    r = httpx.post(url, json={"prompt": list(range(3, 253)) * 2 + [7] * 4, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_seed_out_of_int64_is_refused_naming_seed(server):
    url = server.base_url + "/v1/completions"
    for seed in (2**70, -(2**70), 2**63):
        err = httpx.post(url, json={"prompt": [5], "max_tokens": 1, "seed": seed}).json()["error"]
        assert err["param"] == "seed" and "int64" in err["message"] and str(seed) in err["message"]
    for seed in (2**63 - 1, -(2**63), 0):
        assert httpx.post(url, json={"prompt": [5], "max_tokens": 1, "temperature": 1, "seed": seed}).status_code == 200


def test_a_subnormal_temperature_is_greedy_and_fails_nobody_else(server):
    """logits / 1e-320 overflow to inf and NaN probabilities, which failed the whole batched
    step (every request in it) with a 500; as vLLM, a temperature under 1e-5 is greedy."""
    url = server.base_url + "/v1/completions"
    greedy = httpx.post(url, json={"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0}).json()
    tiny = httpx.post(url, json={"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 1e-320}).json()
    assert tiny["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"]


def test_a_request_split_across_writes_within_the_timeout_is_served(server):
    """The read deadline bounds a request's whole arrival; a client that sends its headers and
    body in pieces inside it is served as usual."""
    raw = serve_load.post({"prompt": [5, 6], "max_tokens": 2, "temperature": 0})
    pause = READ_TIMEOUT_S / 5
    steps = [(raw[i:i + 40], pause) for i in range(0, len(raw), 40)][:4]
    steps.append((raw[len(steps) * 40:], 0.0))
    reply = serve_load.exchange("127.0.0.1", server.params["port"], steps)
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_serve_refuses_a_read_timeout_that_is_not_a_positive_number(tiny_pair, value):
    import cli_harness

    res = cli_harness.specbench("serve", "--target", str(tiny_pair[0]), "--read-timeout", value)
    assert res.code == 2 and "Traceback" not in res.err
    line = res.error_lines[0] if len(res.error_lines) == 1 else ""
    assert line.startswith("error: --read-timeout must be ") and "(0, 10000000]" in line, res.error_lines
