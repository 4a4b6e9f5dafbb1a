"""Acceptance a server reports per request, turned into what the records hold: `specbench
serve`'s per-step `spec_decode` into `StepEvent`s (the embedded backend's acceptance
columns, exactly), vLLM's `metrics.speculative_decoding` and SGLang's `meta_info` counters
into `ReportedAcceptance`. Malformed figures give None (the run falls back to the server-wide
/metrics deltas), never a guess.

Boundary: JSON dicts in, `specbench.types` out.
"""

from __future__ import annotations

from typing import Any

from specbench.types import ReportedAcceptance, StepEvent


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


def specbench_steps(spec: dict) -> list[StepEvent]:
    """`specbench serve`'s `spec_decode` per-step lists as step events (none when the lists
    disagree in length)."""
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
    return steps


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


def per_request(spec: dict, vllm_spec: dict | None,
                meta_info: dict | None) -> tuple[list[StepEvent], ReportedAcceptance | None]:
    """A response's acceptance: step events when `specbench serve` gave them, else vLLM's
    per-request metrics, else SGLang's counters (None: the response carries none)."""
    steps = specbench_steps(spec)
    reported = None
    if not steps and vllm_spec is not None:
        reported = vllm_acceptance(vllm_spec)
    if not steps and reported is None and meta_info is not None:
        reported = sglang_acceptance(meta_info)
    return steps, reported
