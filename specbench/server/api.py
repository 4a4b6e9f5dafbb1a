"""The routes of `specbench serve` and the server that joins them: GET /health, GET /v1/models
(and /models), GET /metrics (Prometheus text, vLLM's names for the spec-decode counters), POST
/v1/completions and /v1/chat/completions (server-sent events with `stream: true`, one JSON
body otherwise). HEAD and OPTIONS are answered like any HTTP server (405 + Allow for a wrong
method). `stream_options.include_usage` adds a final usage chunk,
`stream_options.continuous_usage_stats` cumulative usage on every chunk, as vLLM.

Design: the stdlib's ThreadingHTTPServer (one thread per connection, no dependency) in front
of one `EngineWorker` thread. At most `max_concurrency` requests are admitted (running +
waiting); the rest get HTTP 429. A client that goes away is cancelled at the next step
(counted in `specbench:request_cancelled`, with the tokens it was sent counted in
`vllm:generation_tokens`), whether it streams or waits for one answer: a handler waiting for
its request's next event checks every `_DISCONNECT_POLL_S` that its client is still there.

Boundary: routes and the stream of one request; request validation is
`specbench.server.requests`, response shapes `specbench.server.responses`, the connection's
plumbing `specbench.server.connection`.
"""

from __future__ import annotations

import queue
import secrets
import socket
import socketserver
import time
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from specbench.config import SpeculativeConfig
from specbench.server import responses
from specbench.server.connection import READ_TIMEOUT_S, JsonHandler
from specbench.server.exposition import metrics_text
from specbench.server.requests import ApiError, RequestParser
from specbench.server.text import Detokenizer, SharedTokenizer
from specbench.server.worker import EngineWorker, Job

# Connections the kernel completes and queues while the accept loop is busy (the engine thread
# holds the GIL most of the time). Python's default of 5 made clients that connect at once
# (the `openai` package with 40-64 of them) see connection errors; the kernel caps the value
# at net.core.somaxconn (4096 by default since Linux 5.4).
LISTEN_BACKLOG = 1024
# How often a handler waiting for its request's next event checks that its client is still
# there (a client that disconnects from a non-streamed request is cancelled within this).
_DISCONNECT_POLL_S = 0.05
ROUTES = {"/health": ("GET",), "/v1/models": ("GET",), "/models": ("GET",), "/metrics": ("GET",),
          "/v1/completions": ("POST",), "/v1/chat/completions": ("POST",)}


class SpecbenchServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections never block shutdown
    request_queue_size = LISTEN_BACKLOG  # listen() backlog

    def __init__(self, host: str, port: int, *, engine: Any, tokenizer: Any, spec: SpeculativeConfig,
                 model_name: str, model_root: str, max_context: int, vocab_size: int,
                 max_concurrency: int = 64, max_num_seqs: int | None = None, verbose: bool = False,
                 read_timeout_s: float = READ_TIMEOUT_S):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.tokenizer = SharedTokenizer(tokenizer)
        self.spec, self.model_name = spec, model_name
        self.verbose, self.read_timeout_s = verbose, read_timeout_s
        self.parser = RequestParser(self.tokenizer, model_name, max_context, vocab_size)
        self.card = responses.model_card(model_name, int(time.time()), model_root, max_context, spec)
        self.worker = EngineWorker(engine, spec, max_concurrency, max_num_seqs)
        try:
            super().__init__((host, port), _Handler)
        except BaseException:
            self.worker.close()
            raise

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a DNS lookup that can stall): skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], OSError):  # a client that went away mid-request
            return
        super().handle_error(request, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.worker.close()


class _Handler(JsonHandler):
    server: SpecbenchServer
    _checked = 0.0  # when _next_event last looked for a disconnect

    def _next_event(self, job: Job) -> tuple | None:
        """The job's next event, or None (and the job cancelled) once its client has gone
        away: a client that leaves while nothing is written to it (a non-streamed answer, a
        stream waiting for admission) must not keep its request decoding."""
        while True:
            now = time.monotonic()
            if now - self._checked >= _DISCONNECT_POLL_S:  # events may come at every step: check anyway
                self._checked = now
                if self._client_gone():
                    job.cancelled.set()
                    self.close_connection = True
                    return None
            try:
                return job.events.get(timeout=_DISCONNECT_POLL_S)
            except queue.Empty:
                pass

    # ---- routes ---------------------------------------------------------------------------

    def _allowed(self, path: str) -> str:
        methods = ROUTES[path]
        return ", ".join([*methods, *(["HEAD"] if "GET" in methods else []), "OPTIONS"])

    def _wrong_method(self, path: str) -> bool:
        """405 with an Allow header when `path` exists but not for this method."""
        if path in ROUTES and self.command not in ROUTES[path] and not (
                self.command == "HEAD" and "GET" in ROUTES[path]):
            self._error(405, f"method {self.command} not allowed for {path}; allowed: {self._allowed(path)}",
                        "MethodNotAllowed", headers={"Allow": self._allowed(path)})
            return True
        return False

    def do_HEAD(self) -> None:  # noqa: N802
        self.head_only = True
        try:
            self.do_GET()
        finally:
            self.head_only = False

    def do_OPTIONS(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        if self.path == "*":  # the server as a whole
            self._send(204, b"", None, {"Allow": "GET, HEAD, POST, OPTIONS"})
        elif path in ROUTES:
            self._send(204, b"", None, {"Allow": self._allowed(path)})
        else:
            self._error(404, f"no route {path}", "NotFoundError")

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path.rstrip("/")
        if self._wrong_method(path):
            return
        if path == "/health":
            self._send(200, b"", "text/plain")
        elif path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [self.server.card]})
        elif path == "/metrics":
            text = metrics_text(self.server.worker.snapshot(), self.server.model_name,
                                self.server.spec.speculative)
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no route GET {path}", "NotFoundError")

    def do_PUT(self) -> None:  # noqa: N802 - no route takes PUT, DELETE or PATCH
        path = urlsplit(self.path).path.rstrip("/")
        self.body_pending = bool(self.headers.get("Content-Length") or self.headers.get("Transfer-Encoding"))
        if not self._wrong_method(path):
            self._error(404, f"no route {self.command} {path}", "NotFoundError")

    do_DELETE = do_PATCH = do_PUT

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        routes = {"/v1/completions": False, "/v1/chat/completions": True}
        self.body_pending = bool(self.headers.get("Content-Length") or self.headers.get("Transfer-Encoding"))
        if self._wrong_method(path):
            return
        if path not in routes:
            self._error(404, f"no route POST {path}", "NotFoundError")
            return
        chat = routes[path]
        try:
            req = self.server.parser.parse(self._read_body(), chat)
        except ApiError as e:
            self._error(e.status, e.message, e.type, e.param)
            return
        job = Job(req.prompt_ids, req.sampling)
        if not self.server.worker.submit(job):
            self._error(429, f"server busy: {self.server.worker.max_concurrency} requests admitted "
                        "(--max-concurrency)", "RateLimitError", headers={"Retry-After": "1"})
            return
        meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", "created": int(time.time()),
                "model": self.server.model_name}
        try:
            if req.stream:
                self._stream(job, chat, req.usage, meta)
            else:
                self._complete(job, chat, meta)
        except OSError:  # the client went away: stop decoding for it
            job.cancelled.set()
            self.close_connection = True

    def _stream(self, job: Job, chat: bool, usage_mode: str, meta: dict[str, Any]) -> None:
        ev = self._next_event(job)
        if ev is None:
            return
        if ev[0] == "error":
            self._error(ev[1], ev[2])
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = {**meta, "object": "chat.completion.chunk" if chat else "text_completion"}
        if chat:
            self._event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "logprobs": None, "finish_reason": None}]})
        detok = Detokenizer(self.server.tokenizer)
        n_in, n_out = len(job.prompt_ids), 0
        while True:
            if ev[0] == "tokens":
                n_out += len(ev[1])
                chunk = {**head, "choices": [responses.choice(chat, detok.add(ev[1]), ev[1], None)]}
                if usage_mode == "continuous":  # cumulative, as vLLM's continuous_usage_stats
                    chunk["usage"] = responses.usage(n_in, n_out)
                self._event(chunk)
            elif ev[0] == "done":
                g = ev[1]
                final = responses.choice(chat, detok.flush(), [], g.finish_reason)
                final["spec_decode"] = responses.spec_payload(g)
                self._event({**head, "choices": [final]})
                if usage_mode != "none":  # vLLM's per-request metrics ride on this chunk too
                    usage = responses.usage(len(job.prompt_ids), len(g.output_ids))
                    self._event({**head, "choices": [], "usage": usage, **self._vllm_metrics(g)})
                break
            else:  # an error after the stream started (vLLM sends an error event too)
                self._event({"error": {"message": ev[2], "type": "InternalServerError", "code": ev[1]}})
                break
            ev = self._next_event(job)
            if ev is None:
                return
        self._event(b"[DONE]")
        self._write_chunk(b"")

    def _complete(self, job: Job, chat: bool, meta: dict[str, Any]) -> None:
        while (ev := self._next_event(job)) is not None and ev[0] == "tokens":
            pass
        if ev is None:  # the client went away: cancelled, nothing to answer
            return
        if ev[0] == "error":
            self._error(ev[1], ev[2])
            return
        g = ev[1]
        text = self.server.tokenizer.decode(list(g.output_ids))
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(token_ids=list(g.output_ids), logprobs=None, finish_reason=g.finish_reason,
                      spec_decode=responses.spec_payload(g))
        n_in, n_out = len(job.prompt_ids), len(g.output_ids)
        self._json(200, {**meta, "object": "chat.completion" if chat else "text_completion",
                         "choices": [choice],
                         "usage": responses.usage(n_in, n_out),
                         **self._vllm_metrics(g)})

    def _vllm_metrics(self, g: Any) -> dict[str, Any]:
        """`{"metrics": {"speculative_decoding": ...}}` as vLLM adds it, when speculating."""
        spec = self.server.spec
        if not spec.speculative:
            return {}
        return {"metrics": {"speculative_decoding": responses.vllm_spec_metrics(g, spec.num_speculative_tokens)}}


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
