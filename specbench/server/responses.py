"""The JSON `specbench serve` answers with: OpenAI's shapes plus what makes `specbench run
--backend openai` record exactly what the embedded backend records:

- every choice carries `token_ids` (the tokens that chunk emitted; vLLM's `return_token_ids`);
- the choice that carries `finish_reason` carries `spec_decode`: drafted / accepted totals and
  per-step lists, forward passes and prefill time of that request (`spec_payload`);
- when speculating, the final usage chunk and every non-streamed response carry
  `metrics.speculative_decoding` as vLLM's `--per-request-spec-decode-metrics detailed` does
  (`vllm_spec_metrics`);
- the model card carries `speculative_config` (vLLM's JSON shape) and `max_model_len`.

Boundary: dicts from a finished generation and the served configuration; no HTTP.
"""

from __future__ import annotations

from typing import Any

from specbench.acceptance import SpecDecodingStats
from specbench.config import SUFFIX_KNOBS, SpeculativeConfig


def spec_payload(g: Any) -> dict[str, Any]:
    """Per-request speculative figures for the final chunk (all steps, drafted or not)."""
    s = g.steps
    stats = SpecDecodingStats().observe_steps(s)
    return {
        "drafted": stats.num_draft_tokens, "accepted": stats.num_accepted_tokens,
        "num_drafts": stats.num_drafts,
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
    stats = SpecDecodingStats.new(num_spec_tokens).observe_steps(steps)
    return {"mean_acceptance_length": stats.mean_acceptance_length if steps else 1.0,
            "draft_acceptance_rate": stats.acceptance_rate if stats.num_draft_tokens else 0.0,
            "acceptance_histogram": stats.acceptance_histogram, "num_spec_steps": stats.num_drafts,
            "num_accepted_draft_tokens": stats.num_accepted_tokens, "num_draft_tokens": stats.num_draft_tokens,
            "num_spec_tokens": num_spec_tokens,
            "per_step_accepted": [x.accepted for x in steps], "per_step_drafted": [x.drafted for x in steps]}


def speculative_config(spec: SpeculativeConfig) -> dict[str, Any] | None:
    """The served configuration in vLLM's `--speculative-config` JSON shape (None: none)."""
    if not spec.speculative:
        return None
    cfg: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method == "draft_model":
        cfg["model"] = spec.draft
        cfg["draft_confidence_threshold"] = spec.draft_confidence_threshold
    elif spec.method in ("eagle3", "medusa"):
        cfg["model"] = spec.draft
    elif spec.method == "suffix":
        cfg.update({k: getattr(spec, k) for k in SUFFIX_KNOBS})
    else:
        cfg.update(prompt_lookup_min=spec.ngram_min, prompt_lookup_max=spec.ngram_max)
    if spec.disable_by_batch_size is not None:
        cfg["disable_by_batch_size"] = spec.disable_by_batch_size
    if spec.dynamic_k:
        cfg["dynamic_k"] = True
    if spec.token_tree is not None:  # vLLM's form: num_speculative_tokens counts the tree's nodes
        cfg["num_speculative_tokens"] = len(spec.token_tree)
        cfg["speculative_token_tree"] = str([tuple(p) for p in spec.token_tree])
    elif spec.is_tree or spec.num_draft_tokens is not None:
        cfg.update(topk=spec.topk, num_draft_tokens=spec.verify_width)
    return cfg


def model_card(model_name: str, created: int, model_root: str, max_context: int,
               spec: SpeculativeConfig) -> dict[str, Any]:
    return {"id": model_name, "object": "model", "created": created, "owned_by": "specbench",
            "root": model_root, "parent": None, "max_model_len": max_context,
            "speculative_config": speculative_config(spec)}


def choice(chat: bool, text: str | None, ids: list[int], finish: str | None) -> dict[str, Any]:
    """One streamed choice: a chat delta or a completion's text, with its token ids."""
    c: dict[str, Any] = {"index": 0}
    if chat:
        c["delta"] = {"content": text}
    else:
        c["text"] = text
    c.update(token_ids=ids, logprobs=None, finish_reason=finish)
    return c


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
