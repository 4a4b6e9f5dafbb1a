"""`specbench serve` under load and clients that leave: 256 connections made at once are all
answered, a client that disconnects (streaming or not) is cancelled and counted as cancelled
with the tokens it was sent, and a bounded soak of mixed traffic keeps answering while its
/metrics equal what the clients received. SPECBENCH_SOAK_S sets the soak's length (default 20 s)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx

import serve_load

SERVE_FLAGS = "--max-concurrency 300"  # added to the `server` fixture's command (conftest)
SOAK_S = float(os.environ.get("SPECBENCH_SOAK_S", "20"))
LONG = {"prompt": [5, 6, 7], "max_tokens": 450, "ignore_eos": True, "temperature": 0}


def delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if k not in ("running", "waiting")}


def test_256_connections_made_at_once_are_all_answered(server):
    """The kernel queues connections the accept loop has not taken yet up to the listen
    backlog and drops the SYNs beyond it (the client retries after 1 s, 3 s, ...). The server
    is stopped while 256 clients connect at once, as a busy one (the engine thread holding the
    GIL) would be: every connection must complete within 2 s, then every request is answered
    and counted in /metrics."""
    n, port = 256, server.params["port"]
    before = serve_load.settle(server.base_url)
    connected, answered, errors = [], [], []
    lock, barrier, resumed = threading.Lock(), threading.Barrier(n + 1), threading.Event()
    raw = serve_load.post({"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})

    def client():
        barrier.wait()
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)  # under the 3 s SYN retry
        except OSError as exc:
            with lock:
                errors.append(repr(exc))
            return
        with lock:
            connected.append(sock)
        resumed.wait()
        try:
            sock.settimeout(60)
            sock.sendall(raw)
            data = b""
            while chunk := sock.recv(1 << 16):
                data += chunk
            with lock:
                answered.append(data.split(b"\r\n", 1)[0])
        except OSError as exc:
            with lock:
                errors.append(repr(exc))
        finally:
            sock.close()

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        barrier.wait()
        deadline = time.monotonic() + 10
        while len(connected) + len(errors) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        pending = len(connected)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    resumed.set()
    for t in threads:
        t.join(timeout=120)
    assert pending == n, f"{pending} of {n} connections completed while the server was busy; {errors[:3]}"
    assert answered == [b"HTTP/1.1 200 OK"] * n and not errors
    after = serve_load.settle(server.base_url)
    assert delta(after, before)["success_length"] == n  # every answer is in /metrics


def test_client_leaving_a_non_streamed_request_cancels_it(server):
    before = serve_load.settle(server.base_url)
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.params["port"])) as sock:
        sock.sendall(serve_load.post(LONG))
        time.sleep(0.1)  # decoding; the whole answer takes several times as long
    after = serve_load.settle(server.base_url)
    d = delta(after, before)
    assert d["cancelled"] == 1 and d["success_length"] == 0 and d["success_stop"] == 0, d
    assert 0 < d["generation_tokens"] < LONG["max_tokens"], d
    # the cancellation is why it ended early: the same request decodes in full when waited for
    r = httpx.post(server.base_url + "/v1/completions", json=LONG, timeout=120)
    assert r.json()["usage"]["completion_tokens"] == LONG["max_tokens"]
    assert time.monotonic() - t0 > 0.1


def test_tokens_streamed_before_a_disconnect_are_counted_at_once_and_the_request_cancelled(server):
    before = serve_load.settle(server.base_url)
    received = 0
    with httpx.stream("POST", server.base_url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()  # held: leaving the loop must not close the stream yet
        for line in lines:
            if line.startswith("data: {"):
                received += len(json.loads(line[6:])["choices"][0]["token_ids"])
                if received >= 5:
                    break
        # still connected and decoding: the tokens it was sent are already in /metrics, as
        # vLLM counts each step's tokens
        live = delta(serve_load.metrics(server.base_url), before)
        assert live["cancelled"] == 0 and live["success_length"] == 0, live
        assert live["generation_tokens"] >= received, (live, received)
    d = delta(serve_load.settle(server.base_url), before)
    assert d["cancelled"] == 1 and d["success_length"] == 0 and d["success_stop"] == 0, d
    assert received <= d["generation_tokens"] < LONG["max_tokens"], (d, received)


def test_soak_of_mixed_traffic_keeps_answering_and_metrics_equal_what_clients_received(server):
    before = serve_load.settle(server.base_url)
    offset = serve_load.log_size(server.log_path)
    tally = serve_load.soak(server.base_url, SOAK_S, clients=16)
    after = serve_load.settle(server.base_url)
    d = delta(after, before)
    assert not tally.failures, tally.failures
    kinds = tally.requests
    assert set(kinds) == set(serve_load.KINDS) and min(kinds.values()) >= 3, kinds  # every kind, several times
    assert tally.health_worst_s < 5.0
    assert tally.bad_answered == kinds["bad"]
    assert tally.usage_tokens == tally.tokens  # each answer's usage equals the token ids it carried
    # the server counted exactly what its clients got: answers by finish reason, the ones
    # that left as cancelled, and the tokens of both
    assert {r: d.get("success_" + r, 0) for r in ("stop", "length")} == {
        r: tally.finished.get(r, 0) for r in ("stop", "length")}, (d, tally.finished)
    assert d["cancelled"] == tally.left == kinds["leave_stream"] + kinds["leave_waiting"], d
    left_tokens = d["generation_tokens"] - tally.tokens  # what the server emitted to clients that left
    assert tally.left_tokens <= left_tokens < tally.left_asked / 2, (left_tokens, tally.left_tokens, tally.left_asked)
    assert not serve_load.traceback_since(server.log_path, offset)
