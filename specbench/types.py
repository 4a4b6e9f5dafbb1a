"""The types that travel between layers.

`Request` is what a workload becomes once tokenized (token ids plus the text for HTTP
backends); `Result` is what any backend returns for one request: output ids, raw per-token
timestamps and per-verification-step events. Every latency metric is derived later from these
raw timestamps (specbench.metrics), so all backends are measured the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.config import SamplingParams
from specbench.structured import OutputConstraint


@dataclass(frozen=True)
class Request:
    id: str  # unique within a workload, stable across runs (pairs baseline and speculative)
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    category: str = "default"
    workload: str = "custom"
    kind: str = "real"  # real | high-entropy | regression | custom
    prompt_text: str | None = None  # rendered prompt (after the chat template), for HTTP backends
    messages: tuple[dict[str, str], ...] | None = None  # chat form, for chat-completions backends
    expected_ids: tuple[int, ...] | None = None  # regression prompts: the reference output
    # structured output: the fields as the prompt gave them (HTTP backends send them), the
    # constraint the output must satisfy (the embedded engine decodes under it) and the scenario
    structured: dict[str, Any] | None = None
    constraint: OutputConstraint | None = None
    scenario: str = "free"  # free | json | tools | regex | grammar | choice
    # a replayed conversation (--turns): its id (the first turn's prompt id), this request's
    # turn (1-based) and the user turns still to come
    conversation_id: str | None = None
    turn: int = 1
    later_turns: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepEvent:
    """One target verification step (or one plain decode step for the baseline)."""

    drafted: int  # draft tokens proposed this step (0 for a plain decode step)
    accepted: int  # of those, how many the verifier accepted
    first_rejection: int  # index of the first rejected draft token; -1 when all were accepted
    emitted: int  # tokens emitted by this step (accepted + 1 correction/bonus, clipped at stops)
    draft_time_s: float
    verify_time_s: float
    batch_size: int | None = None  # rows in the target pass of this step (None: not reported)
    context_tokens: int | None = None  # tokens in context (prompt + output) before this step
    # the drafted tree: its depth (a chain's: drafted), and the rank among its siblings of
    # each accepted node, root's child first (a chain's: zeros); None: not reported
    draft_depth: int | None = None
    accepted_ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ReportedAcceptance:
    """Per-request acceptance a server reported in place of step events: vLLM's
    `metrics.speculative_decoding` (`--per-request-spec-decode-metrics`), SGLang's `meta_info`.
    Totals over the verification steps that proposed drafts; the per-step lists only when the
    server gave them (vLLM's `detailed` level), the histogram when it gave one (index j = steps
    that accepted exactly j drafts)."""

    source: str  # where it came from: "vllm" | "sglang"
    num_steps: int  # verification steps that proposed at least one draft token
    drafted: int  # draft tokens proposed over those steps
    accepted: int  # draft tokens accepted over those steps
    accepted_per_step: tuple[int, ...] | None = None
    drafted_per_step: tuple[int, ...] | None = None
    histogram: tuple[int, ...] | None = None


@dataclass
class Result:
    request_id: str
    output_ids: list[int]
    arrival_time: float  # perf_counter when the request was admitted to the queue
    start_time: float  # perf_counter when its prefill began (queue wait = start - arrival)
    token_times: list[float]  # perf_counter at which each output token was emitted
    finish_reason: str  # stop | length | error | cancelled
    steps: list[StepEvent] = field(default_factory=list)
    target_forward_passes: int = 0  # prefill counts as one
    prefill_time_s: float = 0.0
    peak_memory_bytes: int | None = None
    error: str | None = None
    # acceptance a server reported for this request without step events (see ReportedAcceptance)
    reported_acceptance: ReportedAcceptance | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # perf_counter when the request left the client for a server (openai: its body was handed
    # to the socket). Latencies are timed from it when set: the client's own wait before it
    # (a concurrency slot, its send delay) is not the server's, and shows as queue_s instead.
    sent_time: float | None = None
    # the output as text (embedded: decoded, special tokens skipped; openai: as streamed), for
    # checking structured output; None where the backend gives none
    output_text: str | None = None
