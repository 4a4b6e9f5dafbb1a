"""A known-timing OpenAI-compatible streaming server, for measuring HTTP clients (specbench's
own, `vllm bench serve`, AIPerf) against a server whose timing is exact: the test fixture
of the openai backend and the server of `benchmarks/client_fidelity.py`.

Every streamed response follows a `Schedule`: the first content event `ttft_s` after the
request was read, then one event every `itl_s` (plus seeded uniform `jitter_s`), each event
carrying `tokens_per_chunk` tokens; `burst_every`/`burst_size` make every n-th event a burst
of several events written at once. Deadlines are absolute (request read time + offsets), so a
late event never delays the next. Every event's scheduled and actual send time is logged on
`time.perf_counter()`, which on Linux is CLOCK_MONOTONIC and so the same clock in every
process of the host: a client's timestamps and the log compare directly (`log()`, or
GET /_log from another process).

Completions and chat, token ids in the chunks when the request asks for them
(`return_token_ids`, as vLLM) and the schedule allows (`token_ids`), the final usage chunk
(`usage.completion_tokens`, the server's count) when `stream_options.include_usage`.

Faults, one per schedule, for a fault-injection matrix reusing this one server:
`status` (429/500/503 with an optional `retry_after`), `drop_after` (the connection is cut
after n events), `stall_after`/`stall_s` (a pause mid-stream), `malformed_after` (an event
that is not JSON), `split_utf8` (every event written in two pieces cut inside a multi-byte
character). `Schedule.for_request` (a hook) picks the schedule per request (index, body).

Implementation: one asyncio `Protocol` per connection, HTTP/1.1 keep-alive with chunked
responses, sends as `loop.call_at` timers writing each event (built when due, from a template) straight
to the transport (no coroutine per event; one pending timer per stream, each event arming the next,
so a request's arrival does no per-event work), so one process sustains hundreds of streams.
A request is stamped as read when its bytes arrive and handled in the loop's next round, so a
wave of requests arriving together is stamped before any of them is handled.
Binds 127.0.0.1. Boundary: stdlib only; no specbench imports. Longer than 400 lines because
the schedule, its faults and the protocol that sends them on time are one self-contained file
that tests and benchmarks start as a script.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

MODEL = "known-timing"
# Token i's text: "a" merges under BPE tokenizers that know "aa" (re-tokenizing gives fewer
# tokens than were sent); "é" is two UTF-8 bytes (what `split_utf8` cuts in half).
TEXTS = {"word": " tok", "a": "a", "utf8": "é"}


@dataclass(frozen=True)
class Schedule:
    ttft_s: float = 0.050
    itl_s: float = 0.020
    tokens_per_chunk: int = 1
    jitter_s: float = 0.0  # each event's deadline moved by uniform(0, jitter_s), seeded
    burst_every: int = 0  # every n-th event is a burst of `burst_size` events at once
    burst_size: int = 1
    token_ids: bool = True  # put token_ids in the chunks when the request asks
    text: str = "word"  # key of TEXTS
    usage: bool = True
    seed: int = 0
    # faults
    status: int = 200
    retry_after: float | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    stall_s: float = 0.0
    malformed_after: int | None = None
    split_utf8: bool = False
    no_finish: bool = False  # the stream ends with [DONE] but no event carries a finish_reason
    no_data_prefix_after: int | None = None  # that event is written without its "data: " field name

    def offsets(self, events: int, index: int) -> list[float]:
        """Seconds after the request was read at which each event is due."""
        rng = random.Random(self.seed * 1_000_003 + index)
        out, base = [], self.ttft_s
        i = 0
        while i < events:
            n = self.burst_size if self.burst_every and i and i % self.burst_every == 0 else 1
            t = base + (rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)
            if self.stall_after is not None and i >= self.stall_after:
                t += self.stall_s
            out.extend([t] * min(n, events - i))
            i += n
            base += self.itl_s
        return out

    @staticmethod
    def for_request(schedule: "Schedule", index: int, body: dict) -> "Schedule":
        """The schedule of request `index` (0-based, in arrival order); replace to vary it."""
        return schedule


@dataclass
class Stream:
    """One request as the server saw it: perf_counter times."""

    index: int
    path: str
    read: float  # the request was fully read
    tokens: int = 0  # asked for (max_tokens), also of a request refused with an error status
    status: int = 200
    scheduled: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)  # just before the event's bytes were written
    counts: list[int] = field(default_factory=list)  # tokens per event
    fault: str | None = None
    prompt: Any = None


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Conn(asyncio.Protocol):
    def __init__(self, server: "KnownTimingServer"):
        self.server, self.buf, self.transport, self.busy = server, b"", None, False
        self.timers: list[asyncio.TimerHandle] = []  # the stream's next event (one pending timer)
        self.arrived = 0.0
        self.parse_due = False

    def connection_made(self, transport):
        self.transport = transport
        self.server.conns.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc):
        for t in self.timers:
            t.cancel()
        self.transport = None
        self.server.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        # The request is read when its last bytes arrive. Handling waits for the loop's next
        # round, so when a wave of requests is ready at once every one is stamped before any
        # is handled: otherwise the 64th of 64 requests read in one round was stamped after
        # the 63 handled before it (about 0.3 ms each), and that server-side queueing read as
        # TTFT error of whichever client sent the wave.
        self.arrived = time.perf_counter()
        self.buf += data
        if not self.parse_due:
            self.parse_due = True
            asyncio.get_running_loop().call_soon(self._parse_due)

    def _parse_due(self) -> None:
        self.parse_due = False
        self._parse()

    def _parse(self) -> None:
        while not self.busy and self.transport is not None:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            lines = self.buf[:head_end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4: head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            self.server._handle(self, method, path, body)

    def reply(self, status: int, body: bytes, ctype: str = "application/json", extra: str = "") -> None:
        reason = {200: "OK", 404: "Not Found", 400: "Bad Request", 429: "Too Many Requests",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Error")
        self.transport.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                             f"Content-Length: {len(body)}\r\n{extra}\r\n".encode() + body)

    def done(self) -> None:
        self.busy = False
        self.timers.clear()
        if self.buf:
            self._parse()


@dataclass(frozen=True)
class FaultMix:
    """Faults at random, seeded per request index (a soak's mix): each request independently
    gets at most one, with these probabilities; `for_request` is the hook to pass the server."""

    drop: float = 0.0  # the connection cut after `drop_after` events
    status_429: float = 0.0  # HTTP 429 with Retry-After `retry_after`
    stall: float = 0.0  # a pause of `stall_s` after `stall_after` events
    drop_after: int = 3
    retry_after: float = 0.05
    stall_after: int = 5
    stall_s: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("drop", "status_429", "stall"):
            p = getattr(self, name)
            if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if self.drop + self.status_429 + self.stall > 1.0:
            raise ValueError("drop + status_429 + stall must be at most 1")

    def pick(self, index: int) -> str | None:
        """The fault of request `index` (None: none), the same on every run with this seed."""
        u = random.Random(self.seed * 1_000_003 + index).random()
        for name in ("drop", "status_429", "stall"):
            p = getattr(self, name)
            if u < p:
                return name
            u -= p
        return None

    def for_request(self, schedule: Schedule, index: int, body: dict) -> Schedule:
        fault = self.pick(index)
        if fault == "drop":
            return replace(schedule, drop_after=self.drop_after)
        if fault == "status_429":
            return replace(schedule, status=429, retry_after=self.retry_after)
        if fault == "stall":
            return replace(schedule, stall_after=self.stall_after, stall_s=self.stall_s)
        return schedule


class KnownTimingServer:
    """The server; `start()` runs it in a daemon thread (tests), `serve_forever()` in this
    process (the benchmark's subprocess). `log()` is every request seen so far."""

    def __init__(self, schedule: Schedule | None = None, *, port: int = 0, host: str = "127.0.0.1",
                 models: tuple[str, ...] = (MODEL,), for_request: Callable | None = None):
        self.schedule = schedule or Schedule()
        self.for_request = for_request or Schedule.for_request
        self.host, self.port, self.models = host, port, models
        self.streams: list[Stream] = []
        self.conns: set[_Conn] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # ---- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _open(self) -> None:
        self.loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(4096)
        self.port = sock.getsockname()[1]
        self._server = await self.loop.create_server(lambda: _Conn(self), sock=sock)

    def start(self) -> "KnownTimingServer":
        def main():
            async def go():
                self._stop = asyncio.Event()
                await self._open()
                self._ready.set()
                await self._stop.wait()
                self._server.close()
            asyncio.run(go())
        self._thread = threading.Thread(target=main, daemon=True, name="known-timing-server")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the known-timing server did not start")
        return self

    def kill(self) -> None:
        """Die as a crashed server does: every connection cut mid-stream, the port closed;
        `start()` on a new server with the same port brings it back."""
        def cut():
            for conn in list(self.conns):
                if conn.transport is not None:
                    conn.transport.abort()
            self._stop.set()
        if self._thread is not None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(cut)
            self._thread.join(5)

    def close(self) -> None:
        """Stop the thread started by `start()`."""
        if self._thread is not None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5)

    def serve_forever(self) -> None:
        async def go():
            await self._open()
            await self._server.serve_forever()
        asyncio.run(go())

    def log(self) -> list[dict]:
        return [asdict(s) for s in list(self.streams)]

    def reset(self) -> None:
        self.streams = []

    # ---- requests -----------------------------------------------------------------------

    def _handle(self, conn: _Conn, method: str, path: str, raw: bytes) -> None:
        read = conn.arrived
        path = path.split("?")[0]
        if method == "GET" and path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "known-timing", "max_model_len": 1 << 20}
                    for m in self.models]
            return conn.reply(200, json.dumps({"object": "list", "data": data}).encode())
        if method == "GET" and path == "/_log":
            return conn.reply(200, json.dumps(self.log()).encode())
        if method == "POST" and path == "/_reset":
            self.reset()
            return conn.reply(200, b"{}")
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return conn.reply(404, b'{"error": {"message": "not found"}}')
        try:
            body = json.loads(raw)
        except ValueError:
            return conn.reply(400, b'{"error": {"message": "body is not JSON"}}')
        index = len(self.streams)
        sched = self.for_request(self.schedule, index, body)
        st = Stream(index, path, read, prompt=body.get("prompt", body.get("messages")),
                    tokens=max(int(body.get("max_tokens") or body.get("max_completion_tokens") or 16), 0))
        self.streams.append(st)
        if sched.status != 200:
            st.status, st.fault = sched.status, f"status {sched.status}"
            extra = f"Retry-After: {sched.retry_after:g}\r\n" if sched.retry_after is not None else ""
            return conn.reply(sched.status, json.dumps({"error": {"message": f"injected HTTP {sched.status}"}}).encode(),
                              extra=extra)
        conn.busy = True
        self._stream(conn, st, sched, body)

    def _stream(self, conn: _Conn, st: Stream, sched: Schedule, body: dict) -> None:
        chat = st.path.endswith("chat/completions")
        n_tokens = st.tokens
        per = max(sched.tokens_per_chunk, 1)
        counts = [min(per, n_tokens - i) for i in range(0, n_tokens, per)]
        want_ids = sched.token_ids and bool(body.get("return_token_ids"))
        text = TEXTS.get(sched.text, sched.text)
        obj = "chat.completion.chunk" if chat else "text_completion"
        rid = f"kt-{st.index}"
        total = len(counts)
        head = json.dumps({"id": rid, "object": obj, "model": self.models[0]}, separators=(",", ":"))[:-1]
        pieces: dict[int, str] = {}

        def event(k: int) -> bytes:
            """Event k, built when it is sent (a request's arrival does no per-event work)."""
            if sched.malformed_after is not None and k == sched.malformed_after:
                return b"data: {not json\n\n"
            if sched.no_data_prefix_after is not None and k == sched.no_data_prefix_after:
                return f'{head},"choices":[{{"index":0,"text":"?","finish_reason":null}}]}}\n\n'.encode()
            n = counts[k]
            piece = pieces.get(n) or pieces.setdefault(n, json.dumps(text * n))
            content = f'"delta":{{"content":{piece}}}' if chat else f'"text":{piece}'
            ids = (f',"token_ids":[{",".join(map(str, range(100 + k * per, 100 + k * per + n)))}]'
                   if want_ids else "")
            fin = '"length"' if k == total - 1 and not sched.no_finish else "null"
            return f'data: {head},"choices":[{{"index":0,{content}{ids},"finish_reason":{fin}}}]}}\n\n'.encode()

        tail = b""
        if sched.usage and (body.get("stream_options") or {}).get("include_usage"):
            tail += _sse({"id": rid, "object": obj, "model": self.models[0], "choices": [],
                          "usage": {"prompt_tokens": 1, "completion_tokens": n_tokens,
                                    "total_tokens": n_tokens + 1}})
        tail += b"data: [DONE]\n\n"
        conn.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        offsets = sched.offsets(total, st.index)
        st.scheduled = [st.read + o for o in offsets]
        loop = self.loop
        # Events due at the same instant (bursts, jitter ties) go out in one write.
        groups: list[tuple[float, list[int]]] = []
        for k, t in enumerate(st.scheduled):
            if groups and groups[-1][0] == t:
                groups[-1][1].append(k)
            else:
                groups.append((t, [k]))

        def fire(g: int) -> None:
            tr = conn.transport
            if tr is None:
                return
            ks = groups[g][1]
            if g + 1 < len(groups):  # the next event's timer, before this one's work
                conn.timers[:] = [loop.call_at(groups[g + 1][0] + shift, fire, g + 1)]
            if sched.drop_after is not None and ks[0] >= sched.drop_after:
                st.fault = f"dropped after {sched.drop_after} events"
                tr.abort()
                return
            last = ks[-1] == total - 1
            data = b"".join(event(k) for k in ks) + (tail if last else b"")
            now = time.perf_counter()  # before the write: no client can read the bytes earlier
            lead = next((i for i, b in enumerate(data) if b >= 0xC0), None) if sched.split_utf8 else None
            if lead is not None:  # two HTTP chunks, the cut inside a multi-byte character
                tr.write(_chunked(data[:lead + 1]))
                data = data[lead + 1:]
            tr.write(_chunked(data) + (b"0\r\n\r\n" if last else b""))
            for k in ks:
                st.sent.append(now)
                st.counts.append(counts[k])
            if last:
                conn.done()

        if not total:
            conn.transport.write(_chunked(tail) + b"0\r\n\r\n")
            conn.done()
            return
        # loop.call_at takes the loop's clock (time.monotonic); deadlines are on perf_counter.
        shift = loop.time() - time.perf_counter()
        # One pending timer per stream, each event arming the next: arming all of a stream's
        # events when its request arrived cost about 0.3 ms per request (128 heap pushes).
        conn.timers = [loop.call_at(groups[0][0] + shift, fire, 0)]


def main(argv: list[str] | None = None) -> None:
    """`python -m specbench.backends.openai.known_timing --port P --schedule JSON`: serve
    until killed; prints `ready <url>` once listening (single process)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--schedule", default="{}", help="Schedule fields as JSON")
    ap.add_argument("--faults", default=None, help="FaultMix fields as JSON: faults at random, seeded")
    args = ap.parse_args(argv)
    try:
        sched = replace(Schedule(), **json.loads(args.schedule))
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--schedule: {exc} (fields: {', '.join(Schedule.__dataclass_fields__)})")
    try:
        mix = FaultMix(**json.loads(args.faults)) if args.faults else None
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--faults: {exc} (fields: {', '.join(FaultMix.__dataclass_fields__)})")
    srv = KnownTimingServer(sched, port=args.port, for_request=mix.for_request if mix else None)

    async def go():
        await srv._open()
        print(f"ready {srv.url}", flush=True)
        await srv._server.serve_forever()
    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
