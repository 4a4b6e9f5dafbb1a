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

Where vLLM has a shape for the same thing, it speaks vLLM's dialect so peers' clients (the
`openai` package, AIPerf, GuideLLM, `vllm bench serve`) read it: when speculating, the final
usage chunk (streams with `stream_options.include_usage`) and every non-streamed response
carry `metrics.speculative_decoding` as vLLM's `--per-request-spec-decode-metrics detailed`
does; /metrics names counters in `# HELP` / `# TYPE` with their `_total` suffix as
prometheus_client writes vLLM's; `max_completion_tokens` stands in for a missing or null
`max_tokens`; `stream_options.continuous_usage_stats` puts cumulative usage on every chunk;
sampling fields the engine does not implement (penalties, min_p, min_tokens,
logit_bias, ...) are refused with HTTP 400 naming the field unless they hold their neutral
value; HEAD and OPTIONS are answered like any HTTP server (405 + Allow for a wrong method).

Design: the stdlib's ThreadingHTTPServer (one thread per connection, no dependency) in front
of one engine worker thread that owns the models and runs the embedded engine's continuous
batch: requests join in arrival order after their own prefill (at most `max_num_seqs`
decoding at once), every step verifies all of them in one target pass, and each step's
tokens stream to their clients as they are emitted. At most `max_concurrency` requests are
admitted (running + waiting); the rest get HTTP 429. A client that goes away is cancelled at
the next step (counted in `specbench:request_cancelled`, with the tokens it was sent counted in
`vllm:generation_tokens`), whether it streams or waits for one answer. Greedy outputs equal
the embedded backend's; a sampled request's tokens depend only on its seed.

Hostile or broken clients get an HTTP error in the same JSON shape rather than a dropped
connection or a stuck handler: the listen backlog holds `LISTEN_BACKLOG` connections made at
once; a request must arrive within `--read-timeout` of its first byte (408 otherwise: a
Content-Length larger than the body, headers sent a byte at a time) and an idle connection is
closed after as long; malformed headers and bodies (invalid JSON, NaN, a lone surrogate, a
wrong type or range for any field, a wrong Content-Type) and values past the model's context
(`max_tokens`, refused as vLLM refuses it) get a 4xx naming the header or field.

Boundary: JSON/HTTP and the tokenizer here; token ids in and out of the engine. It never
prints; `specbench.cli.serve` runs it. `python -m specbench.server` is `specbench serve`.
"""

from __future__ import annotations

import io
import json
import math
import queue
import re
import secrets
import select
import socket
import socketserver
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.errors import ConfigError

MAX_BODY_BYTES = 32 << 20
# Connections the kernel completes and queues while the accept loop is busy (the engine thread
# holds the GIL most of the time). Python's default of 5 made clients that connect at once
# (the `openai` package with 40-64 of them) see connection errors; the kernel caps the value
# at net.core.somaxconn (4096 by default since Linux 5.4).
LISTEN_BACKLOG = 1024
# A request's line, headers and body must arrive within this many seconds of its first byte
# (--read-timeout); an idle keep-alive connection closes after as long without a new request.
READ_TIMEOUT_S = 30.0
# How often a handler waiting for its request's next event checks that its client is still
# there (a client that disconnects from a non-streamed request is cancelled within this).
_DISCONNECT_POLL_S = 0.05
_INT64 = (-(2**63), 2**63 - 1)  # seeds: torch.Generator's range, as vLLM validates `seed`
_SAMPLING_EPS = 1e-5  # as vLLM: a smaller temperature is greedy (logits / 1e-320 overflow to inf)
_UNSUPPORTED = ("echo", "best_of", "suffix", "tools", "logit_bias", "response_format", "top_logprobs")
# Sampling fields of vLLM's API the engine's one sampling function does not implement; their
# neutral value changes nothing and is accepted (clients send defaults), any other is refused:
# silently ignoring a penalty would measure a different distribution than the one asked for.
_NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                     "min_p": 0.0, "min_tokens": 0}
ROUTES = {"/health": ("GET",), "/v1/models": ("GET",), "/models": ("GET",), "/metrics": ("GET",),
          "/v1/completions": ("POST",), "/v1/chat/completions": ("POST",)}


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


class RequestTimeout(Exception):
    """A request whose line, headers or body did not arrive within the read timeout."""


class _TimedSocketIO(socket.SocketIO):
    """A connection's reads under one deadline per request: waiting for a request's first
    byte is an idle keep-alive wait (`limit_s`, then http.server closes the connection
    quietly); from that byte on, the rest of the request must arrive within `limit_s`, however
    slowly it trickles in (a Content-Length larger than the body, headers sent a byte at a
    time): RequestTimeout, answered 408, instead of a handler blocked forever."""

    def __init__(self, sock: socket.socket, limit_s: float):
        super().__init__(sock, "rb")
        self.limit_s = limit_s
        self.deadline: float | None = None  # None: between requests

    def readinto(self, b: Any) -> int | None:
        if self.deadline is None:
            self._sock.settimeout(self.limit_s)
            n = super().readinto(b)  # TimeoutError: an idle connection, closed quietly
            if n:
                self.deadline = time.monotonic() + self.limit_s
            return n
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RequestTimeout
        self._sock.settimeout(left)
        try:
            return super().readinto(b)
        except TimeoutError:
            raise RequestTimeout from None


def _lone_surrogate(body: Any) -> str | None:
    """Where (`messages[0].content`) the parsed body holds a string that is not valid Unicode:
    a lone surrogate from an escape such as \\ud800, which JSON allows and no tokenizer or
    UTF-8 writer accepts. None when every key and string is valid."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, str):
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError:
                return path or "the body"
        elif isinstance(obj, dict):
            for k, v in obj.items():
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    return f"a key of {path or 'the body'}"
                stack.append((f"{path}.{k}" if path else k, v))
        elif isinstance(obj, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(obj))))
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; send a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a double; send a finite number")
    return value


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}", param=name)
    return value


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name} must be a number, got {value!r}", param=name)
    try:
        return float(value)
    except OverflowError:  # an integer literal past a double's range
        raise ApiError(400, f"{name} must be a finite number, got an integer of {len(str(value))} digits",
                       param=name) from None


def _flag(name: str, value: Any) -> bool:
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", param=name.split(".")[0])
    return bool(value)


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


def vllm_spec_metrics(g: Any, num_spec_tokens: int) -> dict[str, Any]:
    """The request's acceptance in vLLM's per-request shape (`metrics.speculative_decoding`
    of `--per-request-spec-decode-metrics detailed`): over the steps that drafted, the
    histogram of accepted drafts (index j = steps that accepted exactly j), the totals and the
    ordered per-step arrays. Mean acceptance length includes the bonus token."""
    steps = [x for x in g.steps if x.drafted > 0]
    width = max([num_spec_tokens, *(x.drafted for x in steps)])
    hist = [0] * (width + 1)
    for x in steps:
        hist[x.accepted] += 1
    accepted, drafted = sum(x.accepted for x in steps), sum(x.drafted for x in steps)
    return {"mean_acceptance_length": 1.0 + accepted / len(steps) if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": hist, "num_spec_steps": len(steps),
            "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
            "num_spec_tokens": num_spec_tokens,
            "per_step_accepted": [x.accepted for x in steps], "per_step_drafted": [x.drafted for x in steps]}


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
        if job.cancelled.is_set():  # its client went away while it waited: nothing decoded
            with self._lock:
                self.counters["cancelled"] += 1
            self._release()
            return
        def on_tokens(ids: list[int], t: float, job: Job = job) -> None:
            # Counted as emitted, as vLLM counts each step's tokens: /metrics shows a running or
            # abandoned request's tokens at once, not when it ends.
            with self._lock:
                self.counters["generation_tokens"] += len(ids)
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
        with self._lock:
            self.counters["prompt_tokens"] += len(job.prompt_ids)  # prefilled
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
            # As vLLM's prometheus_client writes format 0.0.4: a counter's HELP and TYPE lines
            # name it with its `_total` suffix, like its samples (parsers such as AIPerf's
            # type each sample by the TYPE line of the same name).
            full = name + ("_total" if kind == "counter" else "")
            out.append(f"# HELP {full} {help_}")
            out.append(f"# TYPE {full} {kind}")
            out.extend(f"{full}{{{labels}}} {float(v)}" for labels, v in samples)

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
    request_queue_size = LISTEN_BACKLOG  # listen() backlog

    def __init__(self, host: str, port: int, *, engine: Any, tokenizer: Any, spec: SpeculativeConfig,
                 model_name: str, model_root: str, max_context: int, vocab_size: int,
                 max_concurrency: int = 64, max_num_seqs: int | None = None, verbose: bool = False,
                 read_timeout_s: float = READ_TIMEOUT_S):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.tokenizer, self.spec, self.model_name = tokenizer, spec, model_name
        self.model_root, self.max_context, self.vocab_size = model_root, max_context, vocab_size
        self.verbose, self.read_timeout_s = verbose, read_timeout_s
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
            for i, m in enumerate(msgs):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise ApiError(400, f"messages[{i}] needs a role (a string) and content", param="messages")
                content = m.get("content")
                if isinstance(content, list):  # content parts: only text is supported
                    if any(not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str)
                           for p in content):
                        raise ApiError(400, f"messages[{i}].content: only text content parts "
                                       '({"type": "text", "text": "..."}) are supported', param="messages")
                    content = "".join(p["text"] for p in content)
                if not isinstance(content, str):
                    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                                   param="messages")
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

    def parse(self, body: Any, chat: bool) -> tuple[Job, bool, str]:
        """(job, stream, usage) for a request body; ApiError for anything invalid. `usage`:
        "none", "final" (stream_options.include_usage: a usage chunk at the end) or
        "continuous" (also continuous_usage_stats: cumulative usage on every chunk, as vLLM).
        Fields it does not know are ignored, as vLLM ignores them."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        bad = _lone_surrogate(body)
        if bad is not None:
            raise ApiError(400, f"{bad} is not valid Unicode (a lone surrogate such as \\ud800); send UTF-8 text",
                           param=re.split(r"[.\[]", bad)[0] if not bad.startswith(("a key", "the body")) else None)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ApiError(400, f"model must be a string, got {model!r}", param="model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; served: {self.model_name}",
                           "NotFoundError", "model")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or n != 1):
            raise ApiError(400, "n must be 1", param="n")
        for name in _UNSUPPORTED:
            if body.get(name):
                raise ApiError(400, f"{name} is not supported by specbench serve", param=name)
        if body.get("logprobs") not in (None, False):
            raise ApiError(400, "logprobs are not supported by specbench serve (token ids are in "
                           "every chunk's token_ids)", param="logprobs")
        if body.get("stop"):
            raise ApiError(400, "stop strings are not supported; use stop_token_ids", param="stop")
        for name, neutral in _NEUTRAL_SAMPLING.items():
            value = body.get(name)
            if value is None:
                continue
            if _number(name, value) != neutral:
                raise ApiError(400, f"{name} is not supported by specbench serve (its engine samples with "
                               f"temperature, top_p and top_k only); omit it or send {neutral!r}", param=name)
        stream, ignore_eos = _flag("stream", body.get("stream")), _flag("ignore_eos", body.get("ignore_eos"))
        opts = body.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise ApiError(400, f"stream_options must be an object, got {opts!r}", param="stream_options")
        opts = opts or {}
        usage = "none"
        if _flag("stream_options.include_usage", opts.get("include_usage")):
            continuous = _flag("stream_options.continuous_usage_stats", opts.get("continuous_usage_stats"))
            usage = "continuous" if continuous else "final"
        ids = self.prompt_ids(body, chat)
        room = self.max_context - len(ids)
        if room < 1:
            raise ApiError(400, f"prompt of {len(ids)} tokens leaves no room in a context of {self.max_context}",
                           param="prompt")
        limit_name = "max_tokens"
        max_tokens = body.get("max_tokens")
        if max_tokens is None and body.get("max_completion_tokens") is not None:
            # the newer OpenAI name; clients send both, with max_tokens null
            limit_name, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
        if max_tokens is None:  # the OpenAI defaults: the rest of the context (chat), 16 (completions)
            max_tokens = room if chat else min(16, room)
        else:
            max_tokens = _integer(limit_name, max_tokens)
            if max_tokens < 1:
                raise ApiError(400, f"{limit_name} must be >= 1, got {max_tokens}", param=limit_name)
            if max_tokens > room:  # refused, as vLLM refuses it, rather than silently shortened
                raise ApiError(400, f"{limit_name} is too large: {max_tokens}. This model's maximum context length "
                               f"is {self.max_context} tokens and your request has {len(ids)} input tokens "
                               f"({max_tokens} > {self.max_context} - {len(ids)})", param=limit_name)
        temperature = 1.0 if body.get("temperature") is None else _number("temperature", body["temperature"])
        if temperature < 0:
            raise ApiError(400, f"temperature must be >= 0 (0 = greedy), got {temperature:g}", param="temperature")
        if temperature < _SAMPLING_EPS:
            temperature = 0.0
        top_p = 1.0 if body.get("top_p") is None else _number("top_p", body["top_p"])
        if not 0.0 < top_p <= 1.0:
            raise ApiError(400, f"top_p must be in (0, 1], got {top_p:g}", param="top_p")
        top_k = 0 if body.get("top_k") is None else _integer("top_k", body["top_k"])
        if top_k < -1:
            raise ApiError(400, f"top_k must be -1 or 0 (off) or >= 1, got {top_k}", param="top_k")
        seed = body.get("seed")
        if seed is not None and not _INT64[0] <= _integer("seed", seed) <= _INT64[1]:
            raise ApiError(400, f"seed must be an integer in [-2**63, 2**63 - 1] (int64), got {seed}", param="seed")
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
            raise ApiError(400, "stop_token_ids must be a list of token ids", param="stop_token_ids")
        try:
            sampling = SamplingParams(
                temperature=temperature, top_p=top_p, top_k=max(top_k, 0),  # vLLM: -1 = off
                seed=secrets.randbelow(2**31) if seed is None else seed,
                max_new_tokens=max_tokens, stop_token_ids=tuple(stop_ids), ignore_eos=ignore_eos)
        except ConfigError as exc:  # checked above; a rule SamplingParams adds still answers 400
            raise ApiError(400, str(exc)) from None
        return Job(ids, sampling), stream, usage


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked transfer encoding
    disable_nagle_algorithm = True  # small SSE chunks must leave at once
    server_version = "specbench"
    server: SpecbenchServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    # ---- plumbing -------------------------------------------------------------------------

    head_only = False  # answering HEAD: headers as for GET, no body
    _checked = 0.0  # when _next_event last looked for a disconnect
    body_pending = False  # a refused request's body may still be on its way (see _linger)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced: the same socket, read under the request's deadline
        self._io = _TimedSocketIO(self.connection, self.server.read_timeout_s)
        self.rfile = io.BufferedReader(self._io)

    def handle_one_request(self) -> None:
        self._io.deadline = None
        self.body_pending = False
        self.request_version, self.requestline, self.command = self.protocol_version, "", ""
        try:
            super().handle_one_request()
        except RequestTimeout:
            self.connection.settimeout(self.server.read_timeout_s)
            try:
                self._error(408, f"the request's line and headers did not arrive within "
                            f"{self.server.read_timeout_s:g} s (--read-timeout)", "RequestTimeoutError")
            except OSError:
                pass
        if self.body_pending and self.close_connection:
            self._linger()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        # Headers read: from here on the socket's timeout bounds writes (a client that reads
        # nothing for that long is dropped); reading a body re-arms the request's deadline.
        self.connection.settimeout(self.server.read_timeout_s)
        return ok

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long or too many,
        an unknown method) in the API's JSON error shape."""
        status = HTTPStatus(code)
        text = message or status.phrase
        if explain and explain not in text:
            text = f"{text}: {explain}"
        self.body_pending = True  # whatever followed the headers was not read
        if not self.request_version.startswith("HTTP/1."):  # answer with a status line, not as HTTP/0.9
            self.request_version = "HTTP/1.1"
        self._error(code, text, status.phrase.title().replace(" ", "").replace("-", "") + "Error")

    def _linger(self) -> None:
        """Drain what is left of a refused request before closing: closing a socket with unread
        bytes sends a TCP reset, which can destroy the error response before the client reads
        it (a 413 for a body the client is still sending). Bounded in time and bytes."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.5)
            end, left = time.monotonic() + 2.0, 2 * MAX_BODY_BYTES
            while left > 0 and time.monotonic() < end:
                chunk = self.connection.recv(1 << 16)
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _read_body(self) -> Any:
        """The request's JSON body; ApiError names the header or what is wrong with the JSON.
        Chunked request bodies are refused (411): JSON clients send a Content-Length."""
        self.body_pending = True
        if self.headers.get("Transfer-Encoding") is not None:
            if self.headers.get("Content-Length") is not None:
                raise ApiError(400, "Transfer-Encoding and Content-Length together are ambiguous; "
                               "send the body with a Content-Length only")
            raise ApiError(411, "a Content-Length header is required (request bodies with "
                           "Transfer-Encoding, such as chunked, are not supported)", "LengthRequiredError")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            self.body_pending = False
            raise ApiError(411, "a Content-Length header is required", "LengthRequiredError")
        if len({v.strip() for v in lengths}) != 1 or not re.fullmatch(r"[0-9]{1,20}", lengths[0].strip()):
            raise ApiError(400, "the Content-Length header must be one non-negative integer, got "
                           + ", ".join(repr(v) for v in lengths))
        length = int(lengths[0])
        if length > MAX_BODY_BYTES:
            raise ApiError(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES} "
                           "(Content-Length)", "RequestTooLargeError")
        try:
            raw = self.rfile.read(length)
        except RequestTimeout:
            self.body_pending = False
            raise ApiError(408, f"the body did not arrive within {self.server.read_timeout_s:g} s "
                           f"(Content-Length: {length}; --read-timeout)", "RequestTimeoutError") from None
        self.body_pending = False
        self.connection.settimeout(self.server.read_timeout_s)  # now: the timeout of writes
        if len(raw) < length:  # the client closed its side early
            raise ApiError(400, f"the body ended after {len(raw)} of {length} bytes (Content-Length)")
        ctype = self.headers.get("Content-Type")
        media = (ctype or "application/json").split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiError(415, f"the Content-Type header must be application/json, got {ctype!r}",
                           "UnsupportedMediaTypeError")
        try:
            return json.loads(raw or b"null", parse_constant=_no_constant, parse_float=_finite)
        except RecursionError:
            raise ApiError(400, "the body is not valid JSON (nested too deeply)") from None
        except ValueError as exc:
            raise ApiError(400, f"the body is not valid JSON ({exc})") from None

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (EOF or a reset), without consuming
        anything it may have sent."""
        poller = select.poll()  # not select(): descriptors beyond 1024 are common here
        poller.register(self.connection, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

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

    def _send(self, status: int, body: bytes, ctype: str | None, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        if ctype is not None:
            self.send_header("Content-Type", ctype)
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not self.head_only and status != 204:
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
            self._json(200, {"object": "list", "data": [self.server.card()]})
        elif path == "/metrics":
            self._send(200, self.server.worker.metrics_text(self.server.model_name).encode(),
                       "text/plain; version=0.0.4; charset=utf-8")
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
            job, stream, usage = self.server.parse(self._read_body(), chat)
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
                self._stream(job, chat, usage, meta)
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
        detok = Detokenizer(self.server.tokenizer, self.server.tok_lock)
        n_in, n_out = len(job.prompt_ids), 0
        while True:
            if ev[0] == "tokens":
                n_out += len(ev[1])
                chunk = {**head, "choices": [self._choice(chat, detok.add(ev[1]), ev[1], None)]}
                if usage_mode == "continuous":  # cumulative, as vLLM's continuous_usage_stats
                    chunk["usage"] = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
                self._event(chunk)
            elif ev[0] == "done":
                g = ev[1]
                final = self._choice(chat, detok.flush(), [], g.finish_reason)
                final["spec_decode"] = spec_payload(g)
                self._event({**head, "choices": [final]})
                if usage_mode != "none":  # vLLM's per-request metrics ride on this chunk too
                    usage = {"prompt_tokens": len(job.prompt_ids), "completion_tokens": len(g.output_ids),
                             "total_tokens": len(job.prompt_ids) + len(g.output_ids)}
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
                         "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
                         **self._vllm_metrics(g)})

    def _vllm_metrics(self, g: Any) -> dict[str, Any]:
        """`{"metrics": {"speculative_decoding": ...}}` as vLLM adds it, when speculating."""
        spec = self.server.spec
        if not spec.speculative:
            return {}
        return {"metrics": {"speculative_decoding": vllm_spec_metrics(g, spec.num_speculative_tokens)}}


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
