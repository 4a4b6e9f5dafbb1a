"""Hostile and heavy clients for `specbench serve`: raw HTTP exchanges, a catalogue of malformed
requests with the answer each must get, and a bounded soak of mixed concurrent traffic that
tallies what the clients received, to compare with the server's /metrics.

Used by tests/serve/test_serve_hostile.py and test_serve_load.py; also runnable against any
running server, printing the tallies:

    python tests/serve/serve_load.py hostile --base-url http://127.0.0.1:8000 --log server.log
    python tests/serve/serve_load.py soak --base-url http://127.0.0.1:8000 --seconds 60
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

# ---- raw exchanges -----------------------------------------------------------------------


@dataclass
class Reply:
    outcome: str  # response | closed (no response) | garbled (not HTTP/1.x) | hang (none in time)
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    seconds: float = 0.0

    def error(self) -> dict:
        """The API's JSON error object ({} when the body is not one)."""
        try:
            err = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            return {}
        return err if isinstance(err, dict) else {}

    def error_message(self) -> str | None:
        msg = self.error().get("message")
        return msg if isinstance(msg, str) and msg else None


def exchange(host: str, port: int, steps: bytes | list[tuple[bytes, float]], wait_s: float = 10.0,
             method: str = "GET") -> Reply:
    """Send `steps` (bytes, or (bytes, pause after) pairs: a slow client) on a new connection
    and read one response; `hang` when none comes within `wait_s` of the last byte sent."""
    if isinstance(steps, bytes):
        steps = [(steps, 0.0)]
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=wait_s) as sock:
        try:
            for data, pause in steps:
                sock.sendall(data)
                if pause:
                    time.sleep(pause)
        except OSError:
            pass  # the server answered (and closed) before it read everything: read the answer
        resp = http.client.HTTPResponse(sock, method=method)
        try:
            resp.begin()
            body = resp.read()
        except TimeoutError:
            return Reply("hang", seconds=time.monotonic() - t0)
        except (http.client.RemoteDisconnected, ConnectionError, http.client.IncompleteRead):
            return Reply("closed", seconds=time.monotonic() - t0)
        except http.client.HTTPException:  # no status line (an HTTP/0.9-style answer), bad headers
            return Reply("garbled", seconds=time.monotonic() - t0)
        return Reply("response", resp.status, {k.lower(): v for k, v in resp.getheaders()}, body,
                     time.monotonic() - t0)


def post(body: bytes | str | dict, path: str = "/v1/completions", ctype: str | None = "application/json",
         headers: tuple[str, ...] = (), length: int | str | None = None) -> bytes:
    """A raw POST; `length` overrides the Content-Length header ("" leaves it out)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    if length != "":
        lines.append(f"Content-Length: {len(body) if length is None else length}")
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def get(path: str, method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{extra}\r\n".encode("latin-1")


# ---- the hostile catalogue -------------------------------------------------------------------

OK = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


def body(**changes) -> dict:
    return {**OK, **changes}


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    request: bytes | tuple[tuple[bytes, float], ...]
    status: int  # the answer it must get (2xx: accepted on purpose, e.g. unknown fields as vLLM;
    # 0: none, the server closes the connection within the read timeout)
    needle: str = ""  # a word the error message must contain (the field or header it names)
    slow: bool = False  # takes about one read timeout
    method: str = "POST"


def cases(read_timeout_s: float) -> list[Case]:
    """Every malformed request tried, with the status it must get. `read_timeout_s`: the
    server's --read-timeout (the slow clients outlast it)."""
    t = read_timeout_s
    c: list[Case] = []

    def add(name, category, request, status, needle="", slow=False, method="POST"):
        if isinstance(request, list):
            request = tuple(request)
        c.append(Case(name, category, request, status, needle, slow, method))

    # bad JSON
    for name, raw in [("truncated object", '{"prompt": [1, 2'), ("not JSON", "{nope"),
                      ("trailing comma", '{"prompt": [5], }'), ("bare word", "hello")]:
        add(name, "bad JSON", post(raw), 400, "not valid JSON")
    add("invalid UTF-8", "bad JSON", post(b'{"prompt": "\xff\xfe"}'), 400, "not valid JSON")
    add("nested 100000 deep", "bad JSON", post("[" * 100_000 + "]" * 100_000), 400, "nested too deeply")
    for name, raw in [("a string", '"prompt"'), ("an array", "[1, 2]"), ("null", "null")]:
        add(name + " as the body", "bad JSON", post(raw), 400, "JSON object")
    add("lone surrogate in prompt", "bad JSON", post('{"prompt": "a\\ud800b", "max_tokens": 2}'), 400, "prompt")
    add("lone surrogate in a message", "bad JSON",
        post('{"messages": [{"role": "user", "content": "\\udfff"}]}', "/v1/chat/completions"), 400, "messages[0].content")
    add("lone surrogate in a role", "bad JSON",
        post('{"messages": [{"role": "\\ud800", "content": "x"}]}', "/v1/chat/completions"), 400, "messages[0].role")
    add("lone surrogate in model", "bad JSON", post('{"model": "\\ud83d", "prompt": [5]}'), 400, "model")
    add("lone surrogate in a key", "bad JSON", post('{"\\ud800": 1, "prompt": [5]}'), 400, "key")
    # wrong types, field by field
    wrong = [("model", 5), ("prompt", 5), ("prompt", {"a": 1}), ("prompt", [1.5]), ("prompt", [True]),
             ("prompt", [[1, 2], [3]]), ("prompt", []), ("prompt", ""), ("max_tokens", "5"), ("max_tokens", 5.5),
             ("max_tokens", [1]), ("max_completion_tokens", "x"), ("temperature", "hot"), ("temperature", True),
             ("top_p", "x"), ("top_k", 2.5), ("top_k", "1"), ("seed", "s"), ("seed", 1.5), ("n", "2"),
             ("stream", "yes"), ("stream", 1), ("stream_options", "x"), ("stream_options", {"include_usage": "yes"}),
             ("stop_token_ids", "x"), ("stop_token_ids", [1.5]), ("ignore_eos", "no"), ("logprobs", 5),
             ("echo", "x"), ("stop", 5), ("repetition_penalty", "x"), ("min_tokens", [])]
    for name, value in wrong:
        b = {k: v for k, v in body(**{name: value}).items() if not (name == "max_completion_tokens" and k == "max_tokens")}
        add(f"{name}={json.dumps(value)}", "wrong type", post(b), 400, name)
    add("no prompt", "wrong type", post({"max_tokens": 2}), 400, "prompt")
    for name, value in [("messages", "hi"), ("messages", []), ("messages", [5]),
                        ("messages", [{"role": 1, "content": "x"}]), ("messages", [{"role": "user", "content": 5}]),
                        ("messages", [{"role": "user", "content": [{"type": "image_url"}]}])]:
        add(f"{name}={json.dumps(value)}", "wrong type", post({**CHAT, name: value}, "/v1/chat/completions"), 400, name)
    # huge and negative numbers
    for name, value, status in [("max_tokens", 10**9, 400), ("max_tokens", 10**30, 400), ("max_tokens", 0, 400),
                                ("max_tokens", -1, 400), ("max_completion_tokens", 10**9, 400),
                                ("temperature", -1, 400), ("temperature", 10**400, 400), ("top_p", 0, 400),
                                ("top_p", 2, 400), ("top_k", -5, 400), ("seed", 2**70, 400), ("seed", -(2**70), 400),
                                ("seed", 2**63, 400), ("n", 10**9, 400), ("prompt", [10**20], 400), ("prompt", [-1], 400),
                                ("prompt", [1] * 600, 400), ("prompt", "x" * 100_000, 400),
                                # valid edges: answered
                                ("seed", -1, 200), ("seed", 2**63 - 1, 200), ("top_k", -1, 200), ("top_k", 10**20, 200),
                                ("temperature", 1e-320, 200),
                                # past specbench.limits' bound (100: beyond it every token is as likely)
                                ("temperature", 1e308, 400),
                                ("stop_token_ids", [10**30], 200)]:
        b = body(**{name: value})
        if name == "max_completion_tokens":
            b.pop("max_tokens")
        add(f"{name}={value if len(str(value)) < 30 else str(value)[:12] + '...'}", "huge or negative number",
            post(b), status, name if status >= 400 else "")
    # NaN and infinities (Python's json reads them unless told not to)
    for name, lit in [("temperature", "NaN"), ("top_p", "Infinity"), ("max_tokens", "-Infinity"),
                      ("seed", "NaN"), ("temperature", "1e999")]:
        add(f"{name}={lit}", "NaN/inf", post(f'{{"prompt": [5], "{name}": {lit}}}'), 400, lit)
    # unknown fields: ignored, as vLLM ignores them
    add("unknown field", "unknown field", post(body(foo=1)), 200)
    add("misspelt max_token", "unknown field", post(body(max_token=5)), 200)
    add("OpenAI's user field", "unknown field", post(body(user="u1")), 200)
    # content types
    add("text/plain", "content type", post(OK, ctype="text/plain"), 415, "Content-Type")
    add("form-encoded", "content type", post("prompt=x", ctype="application/x-www-form-urlencoded"), 415, "Content-Type")
    add("multipart", "content type", post("--b\r\n\r\nx\r\n--b--", ctype="multipart/form-data; boundary=b"), 415, "Content-Type")
    add("json with charset", "content type", post(OK, ctype="application/json; charset=utf-8"), 200)
    add("no content type", "content type", post(OK, ctype=None), 200)
    # missing, wrong or oversized bodies and lengths
    add("no body, no Content-Length", "missing body", post(b"", length=""), 411, "Content-Length")
    add("empty body", "missing body", post(b""), 400, "JSON object")
    add("Content-Length: abc", "Content-Length", post(OK, length="abc"), 400, "Content-Length")
    add("Content-Length: -5", "Content-Length", post(OK, length="-5"), 400, "Content-Length")
    add("Content-Length: 1e3", "Content-Length", post(OK, length="1e3"), 400, "Content-Length")
    add("two different Content-Lengths", "Content-Length",
        post(json.dumps(OK), headers=("Content-Length: 3",)), 400, "Content-Length")
    add("Content-Length shorter than the body", "Content-Length", post(OK, length=5), 400, "not valid JSON")
    add("Content-Length larger than the body", "Content-Length", post(OK, length=10_000), 408, "Content-Length", slow=True)
    add("Content-Length 10**12", "oversized body", post(b"{}", length=10**12), 413, "Content-Length")
    add("33 MiB body", "oversized body", post(b'{"prompt": "' + b"x" * (33 << 20) + b'"}'), 413, "limit")
    # paths and methods
    add("unknown GET path", "path/method", get("/nope"), 404, "/nope", method="GET")
    add("unknown POST path", "path/method", post(OK, path="/v1/nope"), 404, "/v1/nope")
    add("GET on a POST route", "path/method", get("/v1/completions"), 405, "POST", method="GET")
    add("POST on a GET route", "path/method", post(OK, path="/health"), 405, "GET")
    add("DELETE", "path/method", get("/v1/completions", "DELETE"), 405, "DELETE", method="DELETE")
    add("PUT on an unknown path", "path/method", get("/x", "PUT"), 404, "PUT", method="PUT")
    add("unknown method", "path/method", get("/health", "FROB"), 501, "FROB", method="FROB")
    add("garbage request line", "path/method", b"HELLO\r\n\r\n", 400, "HELLO", method="GET")
    add("HTTP/2.0 request line", "path/method", b"GET /health HTTP/2.0\r\n\r\n", 505, "2.0", method="GET")
    add("NUL in the path", "path/method", get("/%00"), 404, "route", method="GET")
    add("70 kB path", "path/method", get("/" + "a" * 70_000), 414, "URI", method="GET")
    add("200 headers", "path/method", get("/health", extra="".join(f"X-{i}: y\r\n" for i in range(200))), 431,
        "headers", method="GET")
    add("70 kB header line", "path/method", get("/health", extra="X-Big: " + "y" * 70_000 + "\r\n"), 431,
        "too long", method="GET")
    # chunked request bodies (not supported: JSON clients send a Content-Length)
    chunked = ("Transfer-Encoding: chunked",)
    add("valid chunked body", "chunked", post(b"5\r\nhello\r\n0\r\n\r\n", headers=chunked, length=""), 411, "Transfer-Encoding")
    add("broken chunk size", "chunked", post(b"zz\r\nhello\r\n", headers=chunked, length=""), 411, "Transfer-Encoding")
    add("chunked and Content-Length", "chunked", post(b"5\r\nhello\r\n0\r\n\r\n", headers=chunked, length=15), 400,
        "Content-Length")
    # slow clients (slowloris)
    add("headers never finished", "slowloris",
        [(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 0.0)], 408, "headers", slow=True)
    add("request line never finished", "slowloris", [(b"GET /hea", 0.0)], 408, "headers", slow=True, method="GET")
    drip = b"GET /health HTTP/1.1\r\nX-Slow: " + b"y" * 40
    step = t / 10
    add("headers a byte at a time past the timeout", "slowloris",
        [(bytes([ch]), step) for ch in drip], 408, "headers", slow=True, method="GET")
    add("body never sent", "slowloris", [(post(OK, length=300)[:-len(json.dumps(OK))], 0.0)], 408, "body", slow=True)
    add("connection opened, nothing sent", "slowloris", [(b"", 0.0)], 0, slow=True, method="GET")
    return c


def run_case(host: str, port: int, case: Case, read_timeout_s: float) -> Reply:
    return exchange(host, port, case.request if isinstance(case.request, bytes) else list(case.request),
                    wait_s=read_timeout_s + 8, method=case.method)


def judge(case: Case, reply: Reply) -> str:
    """clean (the status it must get, with a JSON message naming what is wrong) | wrong
    (another answer) | closed | hang."""
    if case.status == 0:
        return "clean" if reply.outcome == "closed" else reply.outcome
    if reply.outcome != "response":
        return reply.outcome
    if reply.status != case.status:
        return "wrong"
    if case.status >= 400:  # a message, naming the field (in it or as `param`) or the header
        msg = reply.error_message()
        if msg is None or (case.needle.lower() not in msg.lower() and reply.error().get("param") != case.needle):
            return "wrong"
    return "clean"


def log_size(path: Path | None) -> int:
    return path.stat().st_size if path is not None and path.exists() else 0


def traceback_since(path: Path | None, offset: int) -> str:
    """The server log's text after `offset` when it holds a traceback, else ''."""
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return text if "Traceback" in text or "Exception occurred" in text else ""


# ---- the soak -------------------------------------------------------------------------------

BAD_BODIES = [b"{nope", b'{"prompt": "\\ud800"}', b'{"prompt": [5], "temperature": NaN}',
              b'{"prompt": [5], "max_tokens": "many"}', b'{"prompt": [5], "seed": 1180591620717411303424}',
              b'{"prompt": [5], "max_tokens": 1000000000}', b"[]"]
KINDS = {"complete": 4, "chat": 2, "stream": 4, "stream_chat": 2, "leave_stream": 2, "leave_waiting": 1, "bad": 2}
LONG = 400  # tokens a leaving client asks for: far more than it stays for


@dataclass
class Tally:
    """What the soak's clients sent and received."""
    requests: Counter = field(default_factory=Counter)  # by kind
    finished: Counter = field(default_factory=Counter)  # answered requests by finish_reason
    tokens: int = 0  # completion tokens of answered requests (token_ids received)
    usage_tokens: int = 0  # the same, from their usage (must agree)
    left: int = 0  # requests whose client disconnected before the end
    left_tokens: int = 0  # tokens those clients had received when they left
    left_asked: int = 0  # tokens those clients had asked for
    bad_answered: int = 0  # malformed bodies answered 400 with a message
    failures: list[str] = field(default_factory=list)
    health_worst_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, what: str) -> None:
        with self.lock:
            if len(self.failures) < 20:
                self.failures.append(what)


def _stream_ids(resp: httpx.Response, leave_after: int | None) -> tuple[list[int], str | None, int | None, bool]:
    """(token ids, finish_reason, usage completion_tokens, left early) of an SSE response."""
    ids: list[int] = []
    finish = usage = None
    for line in resp.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for ch in ev.get("choices") or []:
            ids += ch.get("token_ids") or []
            finish = ch.get("finish_reason") or finish
        if ev.get("usage"):
            usage = ev["usage"]["completion_tokens"]
        if leave_after is not None and len(ids) >= leave_after and finish is None:
            return ids, None, None, True
    return ids, finish, usage, False


def _client(base: str, deadline: float, rng: random.Random, tally: Tally) -> None:
    u = urlsplit(base)
    kinds, weights = zip(*KINDS.items())
    with httpx.Client(timeout=120, trust_env=False) as client:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            with tally.lock:
                tally.requests[kind] += 1
            prompt = [rng.randrange(3, 250) for _ in range(rng.randrange(1, 24))]
            sampling = {"temperature": rng.choice([0, 0, 0.8]), "seed": rng.randrange(2**31),
                        "max_tokens": rng.randrange(1, 32)}
            try:
                if kind == "bad":
                    reply = exchange(u.hostname, u.port, post(rng.choice(BAD_BODIES)), wait_s=30)
                    if reply.status == 400 and reply.error_message():
                        with tally.lock:
                            tally.bad_answered += 1
                    else:
                        tally.fail(f"malformed body answered {reply.outcome} {reply.status}")
                elif kind == "leave_waiting":
                    # a non-streamed request whose client hangs up before the answer
                    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
                        s.sendall(post({"prompt": prompt, "max_tokens": LONG, "ignore_eos": True, "temperature": 0}))
                        time.sleep(rng.uniform(0.005, 0.03))
                    with tally.lock:
                        tally.left += 1
                        tally.left_asked += LONG
                elif kind in ("stream", "stream_chat", "leave_stream"):
                    leave = kind == "leave_stream"
                    chat = kind == "stream_chat"
                    req = ({"messages": [{"role": "user", "content": "x" * len(prompt)}]} if chat else {"prompt": prompt})
                    req.update(sampling, stream=True, stream_options={"include_usage": True})
                    if leave:
                        req.update(max_tokens=LONG, ignore_eos=True)
                    path = "/v1/chat/completions" if chat else "/v1/completions"
                    with client.stream("POST", base + path, json=req) as resp:
                        if resp.status_code != 200:
                            tally.fail(f"{kind}: HTTP {resp.status_code}")
                            continue
                        ids, finish, usage, left = _stream_ids(resp, rng.randrange(1, 6) if leave else None)
                    with tally.lock:
                        if left:
                            tally.left += 1
                            tally.left_tokens += len(ids)
                            tally.left_asked += LONG
                        else:
                            tally.finished[finish] += 1
                            tally.tokens += len(ids)
                            tally.usage_tokens += usage if usage is not None else -10**9
                else:
                    chat = kind == "chat"
                    req = ({"messages": [{"role": "user", "content": "y" * len(prompt)}]} if chat else {"prompt": prompt})
                    req.update(sampling)
                    r = client.post(base + ("/v1/chat/completions" if chat else "/v1/completions"), json=req)
                    if r.status_code != 200:
                        tally.fail(f"{kind}: HTTP {r.status_code} {r.text[:200]}")
                        continue
                    choice = r.json()["choices"][0]
                    with tally.lock:
                        tally.finished[choice["finish_reason"]] += 1
                        tally.tokens += len(choice["token_ids"])
                        tally.usage_tokens += r.json()["usage"]["completion_tokens"]
            except (httpx.HTTPError, OSError) as exc:
                tally.fail(f"{kind}: {type(exc).__name__}: {exc}")


def _health(base: str, stop: threading.Event, tally: Tally) -> None:
    with httpx.Client(timeout=30, trust_env=False) as client:
        while not stop.wait(0.5):
            t0 = time.monotonic()
            try:
                ok = client.get(base + "/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            took = time.monotonic() - t0
            tally.health_worst_s = max(tally.health_worst_s, took)
            if not ok:
                tally.fail("/health did not answer")


def soak(base: str, seconds: float, clients: int = 16, seed: int = 0) -> Tally:
    """`clients` threads sending mixed traffic for `seconds`, plus a /health probe."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    stop = threading.Event()
    threads = [threading.Thread(target=_client, args=(base, deadline, random.Random(seed * 1000 + i), tally))
               for i in range(clients)]
    probe = threading.Thread(target=_health, args=(base, stop, tally))
    probe.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    probe.join()
    return tally


def metrics(base: str) -> dict[str, float]:
    """The server's counters that the soak compares, by name."""
    from specbench.backends.openai import parse_prometheus

    m = parse_prometheus(httpx.get(base + "/metrics", trust_env=False).text)
    out = {"generation_tokens": m["vllm:generation_tokens_total"][0][1],
           "cancelled": m["specbench:request_cancelled_total"][0][1],
           "running": m["vllm:num_requests_running"][0][1], "waiting": m["vllm:num_requests_waiting"][0][1]}
    for labels, v in m.get("vllm:request_success_total", []):
        out["success_" + labels["finished_reason"]] = v
    return out


def settle(base: str, timeout_s: float = 60.0) -> dict[str, float]:
    """/metrics once nothing runs or waits (cancelled requests end at the next step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(base)
        if (m["running"] == 0 and m["waiting"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["hostile", "soak"])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--log", type=Path, help="the server's log (hostile: tracebacks are looked for there)")
    ap.add_argument("--read-timeout", type=float, default=30.0, help="the server's --read-timeout")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    u = urlsplit(args.base_url)
    if args.what == "hostile":
        verdicts: Counter = Counter()
        tracebacks = 0
        for case in cases(args.read_timeout):
            offset = log_size(args.log)
            reply = run_case(u.hostname, u.port, case, args.read_timeout)
            time.sleep(0.05)
            tb = bool(traceback_since(args.log, offset))
            tracebacks += tb
            verdict = judge(case, reply)
            verdicts[verdict] += 1
            print(f"{verdict:6} {'TRACEBACK ' if tb else ''}{case.category:24} {case.name:45} "
                  f"want {case.status} got {reply.status} {(reply.error_message() or '')[:90]!r}")
        print(f"tried {sum(verdicts.values())}: {dict(verdicts)}; tracebacks in the log: {tracebacks}")
    else:
        before = settle(args.base_url)
        t0 = time.monotonic()
        tally = soak(args.base_url, args.seconds, args.clients)
        after = settle(args.base_url)
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        produced_left = delta["generation_tokens"] - tally.tokens
        print(f"soak {time.monotonic() - t0:.0f} s, {args.clients} clients: requests {dict(tally.requests)}")
        print(f"answered by finish reason {dict(tally.finished)}; /metrics request_success "
              f"{ {k[8:]: v for k, v in delta.items() if k.startswith('success_')} }")
        print(f"left early {tally.left}; /metrics cancelled {delta['cancelled']:.0f}")
        print(f"tokens answered {tally.tokens} (usage {tally.usage_tokens}); /metrics generation tokens "
              f"{delta['generation_tokens']:.0f}: {produced_left:.0f} for the requests left early "
              f"(they had received {tally.left_tokens}, asked for {tally.left_asked})")
        print(f"malformed bodies answered 400: {tally.bad_answered}; worst /health {tally.health_worst_s:.2f} s; "
              f"failures: {tally.failures or 'none'}")


if __name__ == "__main__":
    main()
