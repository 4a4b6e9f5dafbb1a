"""The OpenAI-compatible backend: benchmark a vLLM, SGLang or `specbench serve` server over
HTTP, streaming, with asyncio + aiohttp (the probes before the run with httpx).

Speculation happens on the server, so a configuration here is a label for what the server
runs (`label`: its /v1/models card says so for `specbench serve`; vLLM's /metrics reveal k).
Per request the backend records when each streamed chunk arrived and how many tokens it
carried: a chunk of n tokens gives n equal timestamps, so TTFT, ITL, TPOT and E2E come out of
`specbench.metrics` exactly as for the embedded engine (`tokens`). Token counts and ids come
from the stream's `token_ids` (vLLM's `return_token_ids`, `specbench serve`), else from
logprobs (`token_id:N` with vLLM's `return_tokens_as_token_ids`), else from the target's
tokenizer applied to the text (adjusted to the server's usage count). Which of these a server
gives is found out once, by a short probe request, before the run starts.

Acceptance, per request where the server says it, else server-wide (`reported`, `stats`):
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
server-wide counters remain (vLLM's `vllm:spec_decode_*` on /metrics, `prometheus`): the
deltas go to the configuration stats with `acceptance_scope: "server"` and the per-sample
acceptance columns stay empty. Deltas count every request the server handled meanwhile, so
nothing else should use the server during a run. The deltas are kept beside per-request
figures too, so the two can be compared (they count the same verification steps on vLLM).

Server faults (timeouts, 429/5xx, dropped streams, malformed events: `sse`) become
per-sample `finish_reason="error"` results, retried only when asked. What makes a run
pointless (an unreachable URL, something that is not an OpenAI server, an unknown model, a
missing API key) raises `ConfigError`/`BackendError` from `connect()` / `prepare()`, before the
first sample.

The lifecycle (`client.OpenAIBackend`), in this order: `connect()` -> `server_spec()` ->
`prepare()` -> `run()`.

Modules: `client` (the backend), `sse` (one streamed response), `tokens` (ids and times from
chunks), `lag` (the client's own event-loop lag, per request), `known_timing` (a server of
exact, logged timing, to measure clients against), `reported` (per-request acceptance a server reports), `prometheus` (/metrics
counters), `stats` (the configuration's run.json entry and console lines), `label` (the
served speculative configuration).

Boundary: HTTP in, `Result`s out. No weights are ever loaded; the tokenizer is the caller's
(`load_tokenizer`, via `specbench.models.tokenizer`).
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.backends.openai.client import ENDPOINTS, PROBE_TIMEOUT_S, OpenAIBackend, load_tokenizer
    from specbench.backends.openai.lag import lag_lines
    from specbench.backends.openai.prometheus import counter_deltas, parse_prometheus, spec_decode_counters
    from specbench.backends.openai.reported import sglang_acceptance, vllm_acceptance
    from specbench.backends.openai.sse import error_message
    from specbench.backends.openai.stats import acceptance_lines, request_acceptance
    from specbench.models.tokenizer import TokenizerOnly

__getattr__, __dir__ = exports(__name__, {
    "ENDPOINTS": "specbench.backends.openai.client",
    "PROBE_TIMEOUT_S": "specbench.backends.openai.client",
    "OpenAIBackend": "specbench.backends.openai.client",
    "load_tokenizer": "specbench.backends.openai.client",
    "lag_lines": "specbench.backends.openai.lag",
    "counter_deltas": "specbench.backends.openai.prometheus",
    "parse_prometheus": "specbench.backends.openai.prometheus",
    "spec_decode_counters": "specbench.backends.openai.prometheus",
    "sglang_acceptance": "specbench.backends.openai.reported",
    "vllm_acceptance": "specbench.backends.openai.reported",
    "error_message": "specbench.backends.openai.sse",
    "acceptance_lines": "specbench.backends.openai.stats",
    "request_acceptance": "specbench.backends.openai.stats",
    "TokenizerOnly": "specbench.models.tokenizer",
})

__all__ = ["ENDPOINTS", "PROBE_TIMEOUT_S", "OpenAIBackend", "TokenizerOnly", "acceptance_lines",
           "counter_deltas", "error_message", "lag_lines", "load_tokenizer", "parse_prometheus", "request_acceptance",
           "sglang_acceptance", "spec_decode_counters", "vllm_acceptance"]
