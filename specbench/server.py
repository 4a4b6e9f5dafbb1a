"""`specbench serve`: the embedded engine behind an OpenAI-compatible HTTP API.

Routes: GET /health, GET /v1/models, GET /metrics (Prometheus text, vLLM's names for the
spec-decode counters), POST /v1/completions and /v1/chat/completions (server-sent events
with `stream: true`, one JSON body otherwise).

What it adds to the OpenAI shapes, so `specbench run --backend openai` records exactly what
the embedded backend records:
- every choice carries `token_ids` (the tokens that chunk emitted; vLLM's `return_token_ids`);
- the choice that carries `finish_reason` carries `spec_decode`: drafted / accepted totals
  and per-step lists, forward passes and prefill time of that request;
- the model card carries `speculative_config` (vLLM's JSON shape) and `max_model_len`.

Design: the stdlib's ThreadingHTTPServer (one thread per connection, no dependency) in front
of one engine worker thread that owns the models and runs the embedded engine's continuous
batch: requests join in arrival order after their own prefill (at most `max_num_seqs`
decoding at once), every step verifies all of them in one target pass, and each step's
tokens stream to their clients as they are emitted. At most `max_concurrency` requests are
admitted (running + waiting); the rest get HTTP 429. A client that goes away is cancelled at
the next step. Greedy outputs equal the embedded backend's; a sampled request's tokens depend
only on its seed.

Boundary: JSON/HTTP and the tokenizer here; token ids in and out of the engine. It never
prints; `specbench.cli.serve` runs it. `python -m specbench.server` is `specbench serve`.
"""

from __future__ import annotations

import json
import queue
import secrets
import socket
import socketserver
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.errors import ConfigError

MAX_BODY_BYTES = 32 << 20
_UNSUPPORTED = ("echo", "best_of", "suffix", "tools", "logit_bias", "response_format", "top_logprobs")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


@dataclass
class Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)


def spec_payload(g: Any) -> dict[str, Any]:
    """Per-request speculative figures for the final chunk (all steps, drafted or not)."""
    s = g.steps
    return {
        "drafted": sum(x.drafted for x in s), "accepted": sum(x.accepted for x in s),
        "num_drafts": sum(1 for x in s if x.drafted > 0),
        "drafted_per_step": [x.drafted for x in s], "accepted_per_step": [x.accepted for x in s],
        "emitted_per_step": [x.emitted for x in s],
        "batch_size_per_step": [x.batch_size for x in s],
        "context_tokens_per_step": [x.context_tokens for x in s],
        "draft_time_s_per_step": [round(x.draft_time_s, 7) for x in s],
        "verify_time_s_per_step": [round(x.verify_time_s, 7) for x in s],
        "target_forward_passes": g.target_forward_passes, "prefill_time_s": g.prefill_time_s,
    }


def _internal_error(exc: BaseException) -> tuple:
    oom = type(exc).__name__ == "OutOfMemoryError"
    return ("error", 503 if oom else 500,
            f"{'out of memory' if oom else 'internal error'}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}")


class EngineWorker:
    """Owns the engine and its one continuous batch: admits requests in arrival order (at most
    `max_num_seqs` decoding at once, the rest wait), runs one batched step for all of them at
    a time, streams each step's tokens to its request, and keeps vLLM-named counters."""

    def __init__(self, engine: Any, spec: SpeculativeConfig, max_concurrency: int, max_num_seqs: int | None = None):
        self.engine, self.spec, self.max_concurrency = engine, spec, max_concurrency
        self.max_num_seqs = max_num_seqs or max_concurrency
        self.batch = engine.batch(spec)
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.admitted = 0  # running + waiting
        self.running = 0
        k = spec.num_speculative_tokens if spec.speculative else 0
        self.counters: dict[str, Any] = {
            "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "per_pos": [0] * k,
            "prompt_tokens": 0, "generation_tokens": 0, "success": {"stop": 0, "length": 0},
            "cancelled": 0, "steps": 0, "step_rows": 0,
        }
        self._thread = threading.Thread(target=self._loop, name="specbench-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> bool:
        with self._lock:
            if self.admitted >= self.max_concurrency:
                return False
            self.admitted += 1
        self._queue.put(job)
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _release(self) -> None:
        with self._lock:
            self.admitted -= 1

    def _loop(self) -> None:
        waiting: deque[Job] = deque()
        while True:
            try:  # block only when there is nothing to decode
                job = self._queue.get(block=not (self.batch.rows or waiting))
                while True:
                    if job is None:
                        return
                    waiting.append(job)
                    job = self._queue.get_nowait()
            except queue.Empty:
                pass
            for r in self.batch.rows:
                if r.tag.cancelled.is_set():
                    self.batch.cancel(r.tag)
            while waiting and len(self.batch.rows) < self.max_num_seqs:
                self._admit(waiting.popleft())
            if self.batch.rows:
                self._step()
            with self._lock:
                self.running = len(self.batch.rows)

    def _admit(self, job: Job) -> None:
        if job.cancelled.is_set():
            self._release()
            return
        def on_tokens(ids: list[int], t: float, job: Job = job) -> None:
            job.events.put(("tokens", list(ids)))
        try:
            g = self.batch.admit(job.prompt_ids, job.sampling, on_tokens=on_tokens, tag=job)
        except ValueError as exc:  # e.g. a prompt that leaves no room in the context
            job.events.put(("error", 400, str(exc)))
            self._release()
            return
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
            job.events.put(_internal_error(exc))
            self._release()
            return
        if g is not None:
            self._finished(job, g)

    def _step(self) -> None:
        rows = len(self.batch.rows)
        try:
            finished = self.batch.step()
        except Exception as exc:  # noqa: BLE001 - a failed batched step fails every row in it
            event = _internal_error(exc)
            for r in self.batch.rows:
                r.tag.events.put(event)
                self._release()
            self.batch = self.engine.batch(self.spec)
            return
        with self._lock:
            self.counters["steps"] += 1
            self.counters["step_rows"] += rows
        for g in finished:
            self._finished(g.tag, g)

    def _finished(self, job: Job, g: Any) -> None:
        with self._lock:
            c = self.counters
            for s in g.steps:
                if s.drafted > 0:
                    c["num_drafts"] += 1
                    c["num_draft_tokens"] += s.drafted
                    c["num_accepted_tokens"] += s.accepted
                    for i in range(min(s.accepted, len(c["per_pos"]))):
                        c["per_pos"][i] += 1
            c["prompt_tokens"] += len(job.prompt_ids)
            c["generation_tokens"] += len(g.output_ids)  # cancelled requests' tokens were produced too
            if g.finish_reason == "cancelled":
                c["cancelled"] += 1
            else:
                c["success"][g.finish_reason] = c["success"].get(g.finish_reason, 0) + 1
        self._release()
        job.events.put(("done", g))


    def metrics_text(self, model_name: str) -> str:
        """Prometheus text format 0.0.4; counters under vLLM's names."""
        lab = 'model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        with self._lock:
            c = json.loads(json.dumps(self.counters))
            running, waiting = self.running, max(self.admitted - self.running, 0)
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            out.extend(f"{name}{suffix}{{{labels}}} {float(v)}" for labels, v in samples)

        metric("vllm:num_requests_running", "gauge", "Requests being decoded.", [(lab, running)])
        metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be decoded.", [(lab, waiting)])
        metric("specbench:engine_steps", "counter", "Batched engine steps (one target pass each).",
               [(lab, c["steps"])])
        metric("specbench:engine_step_rows", "counter",
               "Rows decoded, summed over steps (divided by engine_steps: the mean running batch size).",
               [(lab, c["step_rows"])])
        metric("specbench:request_cancelled", "counter", "Requests whose client went away.",
               [(lab, c["cancelled"])])
        metric("vllm:prompt_tokens", "counter", "Prefill tokens processed.", [(lab, c["prompt_tokens"])])
        metric("vllm:generation_tokens", "counter", "Generation tokens processed.", [(lab, c["generation_tokens"])])
        metric("vllm:request_success", "counter", "Successfully processed requests.",
               [(f'{lab},finished_reason="{r}"', n) for r, n in sorted(c["success"].items())])
        if self.spec.speculative:  # as vLLM: the spec-decode series exist only when speculating
            metric("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.",
                   [(lab, c["num_drafts"])])
            metric("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.",
                   [(lab, c["num_draft_tokens"])])
            metric("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
                   [(lab, c["num_accepted_tokens"])])
            metric("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                   "Accepted tokens per draft position.",
                   [(f'{lab},position="{i}"', n) for i, n in enumerate(c["per_pos"])])
        return "\n".join(out) + "\n"


class Detokenizer:
    """Incremental detokenization (the prefix-offset scheme of vLLM/TGI): text is released
    only once it no longer ends in an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: Any, lock: threading.Lock):
        self.tok, self.lock = tokenizer, lock
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def _decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(before):]
        return ""

    def flush(self) -> str:
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(before):] if len(text) > len(before) else ""


class SpecbenchServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections never block shutdown

    def __init__(self, host: str, port: int, *, engine: Any, tokenizer: Any, spec: SpeculativeConfig,
                 model_name: str, model_root: str, max_context: int, vocab_size: int,
                 max_concurrency: int = 64, max_num_seqs: int | None = None, verbose: bool = False):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.tokenizer, self.spec, self.model_name = tokenizer, spec, model_name
        self.model_root, self.max_context, self.vocab_size = model_root, max_context, vocab_size
        self.verbose = verbose
        self.tok_lock = threading.Lock()  # HF fast tokenizers are not safe to share across threads
        self.created = int(time.time())
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

    def card(self) -> dict[str, Any]:
        spec = self.spec
        cfg = None
        if spec.speculative:
            cfg = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
            if spec.method == "draft_model":
                cfg["model"] = spec.draft
                cfg["draft_confidence_threshold"] = spec.draft_confidence_threshold
            elif spec.method == "eagle3":
                cfg["model"] = spec.draft
            else:
                cfg.update(prompt_lookup_min=spec.ngram_min, prompt_lookup_max=spec.ngram_max)
            if spec.disable_by_batch_size is not None:
                cfg["disable_by_batch_size"] = spec.disable_by_batch_size
            if spec.dynamic_k:
                cfg["dynamic_k"] = True
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "specbench",
                "root": self.model_root, "parent": None, "max_model_len": self.max_context,
                "speculative_config": cfg}

    # ---- request parsing ----------------------------------------------------------------

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self.tok_lock:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ApiError(400, "messages must be a non-empty list", param="messages")
            clean = []
            for m in msgs:
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise ApiError(400, "each message needs a role and content", param="messages")
                content = m.get("content")
                if isinstance(content, list):  # content parts: only text is supported
                    if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                        raise ApiError(400, "only text content parts are supported", param="messages")
                    content = "".join(str(p.get("text", "")) for p in content)
                if not isinstance(content, str):
                    raise ApiError(400, "message content must be a string", param="messages")
                clean.append({"role": m["role"], "content": content})
            if not getattr(self.tokenizer, "chat_template", None):
                raise ApiError(400, "the model has no chat template; use /v1/completions")
            with self.tok_lock:
                text = self.tokenizer.apply_chat_template(clean, add_generation_prompt=True, tokenize=False)
            return self._encode(text, add_special_tokens=False)  # the template holds any BOS
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self._encode(prompt, add_special_tokens=True)
        elif isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            ids = list(prompt)
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ApiError(400, f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                               param="prompt")
        else:
            raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request)",
                           param="prompt")
        if not ids:
            raise ApiError(400, "empty prompt", param="prompt")
        return ids

    def parse(self, body: Any, chat: bool) -> tuple[Job, bool, bool]:
        """(job, stream, include_usage) for a request body; ApiError for anything invalid."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; served: {self.model_name}",
                           "NotFoundError", "model")
        if body.get("n", 1) not in (1, None):
            raise ApiError(400, "n must be 1", param="n")
        for name in _UNSUPPORTED:
            if body.get(name):
                raise ApiError(400, f"{name} is not supported by specbench serve", param=name)
        if body.get("logprobs") not in (None, False):
            raise ApiError(400, "logprobs are not supported by specbench serve (token ids are in "
                           "every chunk's token_ids)", param="logprobs")
        if body.get("stop"):
            raise ApiError(400, "stop strings are not supported; use stop_token_ids", param="stop")
        ids = self.prompt_ids(body, chat)
        room = self.max_context - len(ids)
        if room < 1:
            raise ApiError(400, f"prompt of {len(ids)} tokens leaves no room in a context of {self.max_context}",
                           param="prompt")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = room if chat else 16  # the OpenAI defaults
        num = (int, float)
        checks = [("max_tokens", max_tokens, int), ("temperature", body.get("temperature", 1.0), num),
                  ("top_p", body.get("top_p", 1.0), num), ("top_k", body.get("top_k", 0), int),
                  ("seed", body.get("seed"), int)]
        for name, value, typ in checks:
            if value is not None and (isinstance(value, bool) or not isinstance(value, typ)):
                raise ApiError(400, f"{name} must be a number, got {value!r}", param=name)
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(i, int) for i in stop_ids):
            raise ApiError(400, "stop_token_ids must be a list of token ids", param="stop_token_ids")
        seed = body.get("seed")
        try:
            sampling = SamplingParams(
                temperature=float(1.0 if body.get("temperature") is None else body["temperature"]),
                top_p=float(1.0 if body.get("top_p") is None else body["top_p"]),
                top_k=max(int(body.get("top_k") or 0), 0),  # vLLM: -1 = off
                seed=secrets.randbelow(2**31) if seed is None else seed,
                max_new_tokens=min(max_tokens, room), stop_token_ids=tuple(stop_ids),
                ignore_eos=bool(body.get("ignore_eos", False)))
        except ConfigError as exc:
            msg = str(exc)
            for flag, name in (("--temperature", "temperature"), ("--top-p", "top_p"), ("--top-k", "top_k"),
                               ("--max-new-tokens", "max_tokens")):
                msg = msg.replace(flag, name)
            raise ApiError(400, msg) from None
        opts = body.get("stream_options") or {}
        return Job(ids, sampling), bool(body.get("stream")), bool(isinstance(opts, dict) and opts.get("include_usage"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked transfer encoding
    disable_nagle_algorithm = True  # small SSE chunks must leave at once
    server_version = "specbench"
    server: SpecbenchServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    # ---- plumbing -------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def _error(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None,
               headers: dict[str, str] | None = None) -> None:
        self.close_connection = True  # the body may be unread: do not reuse the connection
        self._json(status, {"error": {"message": message, "type": type_, "param": param, "code": status}}, headers)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n")

    def _event(self, obj: Any) -> None:
        self._write_chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    # ---- routes ---------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/health":
            self._send(200, b"", "text/plain")
        elif path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [self.server.card()]})
        elif path == "/metrics":
            self._send(200, self.server.worker.metrics_text(self.server.model_name).encode(),
                       "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no route GET {path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        routes = {"/v1/completions": False, "/v1/chat/completions": True}
        if path not in routes:
            self._error(404, f"no route POST {path}", "NotFoundError")
            return
        chat = routes[path]
        try:
            length = int(self.headers.get("Content-Length") or -1)
            if length < 0:
                raise ApiError(411, "a Content-Length header is required")
            if length > MAX_BODY_BYTES:
                raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes")
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except ValueError as exc:
                raise ApiError(400, f"the body is not valid JSON ({exc})") from None
            job, stream, include_usage = self.server.parse(body, chat)
        except ApiError as e:
            self._error(e.status, e.message, e.type, e.param)
            return
        if not self.server.worker.submit(job):
            self._error(429, f"server busy: {self.server.worker.max_concurrency} requests admitted "
                        "(--max-concurrency)", "RateLimitError", headers={"Retry-After": "1"})
            return
        meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", "created": int(time.time()),
                "model": self.server.model_name}
        try:
            if stream:
                self._stream(job, chat, include_usage, meta)
            else:
                self._complete(job, chat, meta)
        except OSError:  # the client went away: stop decoding for it
            job.cancelled.set()
            self.close_connection = True

    def _choice(self, chat: bool, text: str | None, ids: list[int], finish: str | None,
                role: bool = False) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0}
        if chat:
            c["delta"] = {"role": "assistant", "content": ""} if role else {"content": text}
        else:
            c["text"] = text
        c.update(token_ids=ids, logprobs=None, finish_reason=finish)
        return c

    def _stream(self, job: Job, chat: bool, include_usage: bool, meta: dict[str, Any]) -> None:
        ev = job.events.get()
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
        detok = Detokenizer(self.server.tokenizer, self.server.tok_lock)
        while True:
            if ev[0] == "tokens":
                self._event({**head, "choices": [self._choice(chat, detok.add(ev[1]), ev[1], None)]})
            elif ev[0] == "done":
                g = ev[1]
                final = self._choice(chat, detok.flush(), [], g.finish_reason)
                final["spec_decode"] = spec_payload(g)
                self._event({**head, "choices": [final]})
                if include_usage:
                    self._event({**head, "choices": [], "usage": {
                        "prompt_tokens": len(job.prompt_ids), "completion_tokens": len(g.output_ids),
                        "total_tokens": len(job.prompt_ids) + len(g.output_ids)}})
                break
            else:  # an error after the stream started (vLLM sends an error event too)
                self._event({"error": {"message": ev[2], "type": "InternalServerError", "code": ev[1]}})
                break
            ev = job.events.get()
        self._event(b"[DONE]")
        self._write_chunk(b"")

    def _complete(self, job: Job, chat: bool, meta: dict[str, Any]) -> None:
        while (ev := job.events.get())[0] == "tokens":
            pass
        if ev[0] == "error":
            self._error(ev[1], ev[2])
            return
        g = ev[1]
        with self.server.tok_lock:
            text = self.server.tokenizer.decode(g.output_ids, skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(token_ids=list(g.output_ids), logprobs=None, finish_reason=g.finish_reason,
                      spec_decode=spec_payload(g))
        n_in, n_out = len(job.prompt_ids), len(g.output_ids)
        self._json(200, {**meta, "object": "chat.completion" if chat else "text_completion",
                         "choices": [choice],
                         "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


if __name__ == "__main__":  # python -m specbench.server == specbench serve
    from specbench.cli.serve import main

    main()
