"""Per-sample metrics from one `Result`, derived only from its raw timestamps and step events.

Definitions follow vLLM's so numbers line up with production dashboards (see docs/engine.md,
"Timing"):

- TTFT  = first token time - arrival time (arrival = admission to the queue; the send time
  where a client sent the request later, `sent_s`)
- queue = prefill start - arrival time
- E2E   = last token time - arrival time
- TPOT  = (E2E - TTFT) / (output_tokens - 1); undefined (None) below two output tokens
- ITL   = gaps between consecutive token emission times; a verification step that emits
  several tokens at once produces zero gaps, and those are kept (they are what makes
  speculative decoding fast)
- chunk ITL = gaps between consecutive distinct emission times: between streamed chunks that
  carried tokens (an HTTP backend; what `vllm bench serve` reports as ITL), between engine
  steps that emitted tokens (the embedded engine). Tokens of one chunk share a timestamp,
  so the chunks are the runs of equal timestamps
- acceptance rate = accepted draft tokens / drafted tokens (None when nothing was drafted)
- mean acceptance length = 1 + accepted / verification steps that had drafts
  (vLLM's definition: tokens per drafting step; 1.0 for the baseline); both counted by
  `specbench.acceptance.SpecDecodingStats`
- tokens per target pass = output tokens / target forward passes (prefill included), so
  steps that drafted nothing (no n-gram match, speculation disabled by batch size) count
- acceptance a server reported per request without step events (`Result.reported_acceptance`:
  vLLM's `metrics.speculative_decoding`, SGLang's `meta_info`) fills the same totals; the
  per-step accepted / rejection lists only when the server gave per-step arrays (vLLM's
  `detailed` level), and the `step_*` lists stay empty (the server does not say which target
  steps drafted nothing)
- per-step lists (`step_*`): one entry per target step after the prefill, drafting or not:
  the batch size of that pass, the tokens already in context, drafted / accepted / emitted
  tokens, and the step's draft and verify time (shared by every row of the batch)

Boundary: this module turns one (Request, Result) pair into a flat dict whose keys are the
per-sample columns of `specbench.records.SCHEMA`; it knows nothing about files or runs.
Missing values are `None` (null in Parquet, NaN in pandas), never a made-up number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbench.acceptance import SpecDecodingStats
from specbench.structured import check_output
from specbench.types import Request, Result

# The keys `sample_metrics` returns; `specbench.records` checks its schema against these.
METRIC_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "arrival_s",
    "sent_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "itl_s",
    "chunk_itl_s",
    "target_forward_passes",
    "num_steps",
    "drafted_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "tokens_per_target_pass",
    "accepted_per_step",
    "rejection_positions",
    "prefill_time_s",
    "draft_time_s",
    "verify_time_s",
    "step_batch_size",
    "step_context_tokens",
    "step_drafted",
    "step_accepted",
    "step_emitted",
    "step_draft_depth",
    "step_accepted_ranks",
    "step_draft_time_s",
    "step_verify_time_s",
    "peak_memory_bytes",
    "finish_reason",
    "error",
    "output_token_ids",
    "token_match_rate",
    "first_divergence",
    "token_count_delta",
    "client_loop_lag_s",
    "attempts",
    "output_valid",
    "validation_error",
)


def match_fields(output_ids: Sequence[int], reference_ids: Sequence[int]) -> tuple[float, int]:
    """Compare an output with a reference output token by token.

    Returns `(token_match_rate, first_divergence)`:
    - token_match_rate = (positions i < min(len) where both agree) / max(len); a length
      difference therefore counts against the rate. Two empty sequences match fully (1.0).
    - first_divergence = first index where they differ (the shorter length when one is a
      strict prefix of the other); -1 when they are identical.
    """
    out = list(output_ids)
    ref = list(reference_ids)
    longest = max(len(out), len(ref))
    if longest == 0:
        return 1.0, -1
    shortest = min(len(out), len(ref))
    agree = sum(1 for i in range(shortest) if out[i] == ref[i])
    first = next((i for i in range(shortest) if out[i] != ref[i]), None)
    if first is None:
        first = -1 if len(out) == len(ref) else shortest
    return agree / longest, first


def sample_metrics(
    request: Request,
    result: Result,
    *,
    config_start: float | None = None,
    reference_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Metrics for one sample, keyed by the per-sample columns of the records schema.

    `config_start` is the `perf_counter` time the configuration (all requests at one
    concurrency) started; it anchors `arrival_s` / `finish_s` so total throughput can be
    derived from records alone. Without it those two are None.

    `reference_ids` is the output to compare against for losslessness (normally the
    baseline's output for the same prompt); when omitted, `request.expected_ids` is used if the
    prompt has one. Without a reference, token_match_rate and first_divergence are None.

    `result.token_times` holds one emission time per output token.
    """
    # A server's own count (usage.completion_tokens) when the backend has one: the ids of a
    # text-only stream are the client's re-tokenization of the text, which can differ.
    n_out = int(result.extra.get("output_tokens", len(result.output_ids)))
    if reference_ids is None and request.expected_ids is not None:
        reference_ids = request.expected_ids
    match_rate, first_div = match_fields(result.output_ids, reference_ids) if reference_ids is not None \
        else (None, None)
    return {
        "input_tokens": len(request.prompt_ids),
        "output_tokens": n_out,
        **_latencies(result, n_out, config_start),
        "target_forward_passes": result.target_forward_passes,
        **_acceptance(result),
        "tokens_per_target_pass": n_out / result.target_forward_passes if result.target_forward_passes else None,
        "prefill_time_s": result.prefill_time_s,
        "draft_time_s": sum(s.draft_time_s for s in result.steps),
        "verify_time_s": sum(s.verify_time_s for s in result.steps),
        **_step_columns(result),
        "peak_memory_bytes": result.peak_memory_bytes,
        "finish_reason": result.finish_reason,
        "error": result.error,
        "output_token_ids": list(result.output_ids),
        "token_match_rate": match_rate,
        "first_divergence": first_div,
        "token_count_delta": result.extra.get("token_count_delta"),
        "client_loop_lag_s": result.extra.get("loop_lag_s"),
        "attempts": result.extra.get("attempts"),
        **_validity(request, result),
    }


def _validity(request: Request, result: Result) -> dict[str, Any]:
    """Whether a structured output is what its prompt asked for (specbench.structured): null
    for a free prompt, a grammar (checked only by the decoder that enforced it), a failed
    request, or a backend that gave no text."""
    c = request.constraint
    if c is None or c.kind == "grammar" or result.error is not None or result.output_text is None:
        return {"output_valid": None, "validation_error": None}
    error = check_output(c, result.output_text)
    if error is not None and result.finish_reason == "length":
        error += " (the output was cut at max_new_tokens)"
    return {"output_valid": error is None, "validation_error": error}


def _latencies(result: Result, n_out: int, config_start: float | None) -> dict[str, Any]:
    """TTFT, TPOT and E2E from when the request was sent (its arrival where it was not sent
    later), the gaps between tokens and between chunks (tokens that arrived together are one
    chunk), the queueing time, and arrival / finish on the configuration's clock."""
    times = list(result.token_times)
    arrival = result.arrival_time
    sent = result.sent_time if result.sent_time is not None else arrival
    went = result.sent_time if result.sent_time is not None else result.start_time  # out of the queue
    ttft = times[0] - sent if times else None
    e2e = times[-1] - sent if times else None
    chunk_times = [t for i, t in enumerate(times) if i == 0 or t != times[i - 1]]
    return {
        "arrival_s": arrival - config_start if config_start is not None else None,
        "sent_s": went - config_start if config_start is not None else None,
        "finish_s": times[-1] - config_start if config_start is not None and times else None,
        "ttft_s": ttft,
        "tpot_s": (e2e - ttft) / (n_out - 1) if (times and n_out >= 2) else None,
        "e2e_s": e2e,
        "queue_s": went - arrival,
        "itl_s": [b - a for a, b in zip(times, times[1:])],
        "chunk_itl_s": [b - a for a, b in zip(chunk_times, chunk_times[1:])],
    }


def _acceptance(result: Result) -> dict[str, Any]:
    """Acceptance from the sample's own steps, or, where it has none, from what the server
    reported for it. Only steps that proposed drafts are verification steps in vLLM's sense;
    plain decode steps (baseline, or an n-gram lookup that found nothing) do not enter them."""
    draft_steps = [s for s in result.steps if s.drafted > 0]
    stats = SpecDecodingStats().observe_steps(draft_steps)
    accepted_per_step = [s.accepted for s in draft_steps]
    rejection_positions = [s.first_rejection for s in draft_steps]
    reported = result.reported_acceptance
    if not draft_steps and reported is not None:
        stats = SpecDecodingStats()
        stats.add_totals(reported.num_steps, reported.drafted, reported.accepted)
        per_acc, per_draft = reported.accepted_per_step, reported.drafted_per_step
        if per_acc is not None and per_draft is not None and len(per_acc) == len(per_draft):
            accepted_per_step = list(per_acc)
            rejection_positions = [-1 if a >= d else a for a, d in zip(per_acc, per_draft)]
    return {
        "num_steps": stats.num_drafts,
        "drafted_tokens": stats.num_draft_tokens,
        "accepted_tokens": stats.num_accepted_tokens,
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length if stats.num_drafts else 1.0,
        "accepted_per_step": accepted_per_step,
        "rejection_positions": rejection_positions,
    }


def _step_columns(result: Result) -> dict[str, list]:
    """One list per step column, one entry per engine step of the sample."""
    steps = result.steps
    return {
        "step_batch_size": [s.batch_size for s in steps],
        "step_context_tokens": [s.context_tokens for s in steps],
        "step_drafted": [s.drafted for s in steps],
        "step_accepted": [s.accepted for s in steps],
        "step_emitted": [s.emitted for s in steps],
        "step_draft_depth": [s.draft_depth for s in steps],
        "step_accepted_ranks": [None if s.accepted_ranks is None else list(s.accepted_ranks) for s in steps],
        "step_draft_time_s": [s.draft_time_s for s in steps],
        "step_verify_time_s": [s.verify_time_s for s in steps],
    }


SLO_NAMES = ("ttft", "tpot", "e2el")  # vLLM's --goodput keys, bounds in ms


def meets_slo(row: Mapping[str, Any], slos_ms: Mapping[str, float] | None) -> bool | None:
    """Whether one sample (a records row) meets every SLO, as `vllm bench serve --goodput`
    counts it: each of TTFT, TPOT (0 for a single output token) and E2E latency at most its
    bound; a failed request never does. None without SLOs."""
    if not slos_ms:
        return None
    if row.get("finish_reason") == "error" or row.get("ttft_s") is None:
        return False
    values = {"ttft": row["ttft_s"], "tpot": row.get("tpot_s") or 0.0, "e2el": row.get("e2e_s")}
    return all(values[k] is not None and values[k] <= ms / 1e3 for k, ms in slos_ms.items())
