"""Workload -> `Request`s: chat template, token ids, context limit and per-request sampling.

This is the only place prompts meet a tokenizer. Past here (backends, engine) a request is
token ids plus the rendered text for HTTP backends.

Sampling precedence, lowest to highest:

1. `base` (a SamplingParams: CLI values and SamplingParams defaults),
2. the set's `default_sampling` (e.g. high-entropy: temperature 0.8, top_p 0.95),
3. explicit CLI values (`overrides`, and the `max_new_tokens` argument),
4. the prompt's own fields (regression prompts fix all of them; a user file may carry some).

The most specific source wins, except that what the user typed beats the set's defaults.
When `overrides` is None, the fields of `base` that differ from `SamplingParams()` count as
explicit (so `--temperature 0` on the high-entropy set needs `overrides` to be honoured).

Seeds: a prompt's own seed if it has one, else a stable function of the resolved base seed
(0 when unset) and the prompt id, so the baseline and the speculative run of one prompt sample
with the same seed whatever the order or concurrency.
"""

from __future__ import annotations

import zlib
from dataclasses import fields
from typing import Any, Mapping

from specbench.config import SamplingParams
from specbench.errors import WorkloadError
from specbench.structured import constraint_of, scenario_of
from specbench.types import Request
from specbench.workload.prompt import SAMPLING_FIELDS, Prompt, Workload

_DEFAULTS = SamplingParams()
_PARAM_NAMES = {f.name for f in fields(SamplingParams)}


def request_seed(base_seed: int | None, prompt_id: str) -> int:
    """A 31-bit seed from the run's seed and the prompt id (crc32: stable across processes,
    unlike Python's salted hash())."""
    return zlib.crc32(f"{base_seed or 0}:{prompt_id}".encode("utf-8")) & 0x7FFFFFFF


def resolve_sampling(base: SamplingParams, prompt: Prompt, set_defaults: Mapping[str, Any],
                     overrides: Mapping[str, Any] | None = None) -> SamplingParams:
    """The SamplingParams of one request; see the module docstring for the precedence."""
    if overrides is None:
        overrides = {f: getattr(base, f) for f in SAMPLING_FIELDS
                     if getattr(base, f) != getattr(_DEFAULTS, f)}
    unknown = sorted(set(overrides) - _PARAM_NAMES)
    assert not unknown, f"unknown sampling override(s): {unknown}"
    values: dict[str, Any] = {}
    values.update({k: v for k, v in set_defaults.items() if k not in overrides})
    values.update(overrides)
    values.update({k: v for k, v in prompt.sampling.items() if k != "seed"})
    if "seed" in prompt.sampling:
        values["seed"] = prompt.sampling["seed"]
    else:
        values["seed"] = request_seed(values.get("seed", base.seed), prompt.id)
    return base.with_(**values)


def _flatten(messages: tuple[dict[str, str], ...]) -> str:
    return "\n\n".join(m["content"] for m in messages)


def _has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer: Any, messages: tuple[dict[str, str], ...], prompt_id: str,
                 tools: list[dict[str, Any]] | None = None) -> str:
    try:
        out = tokenizer.apply_chat_template([dict(m) for m in messages], tools=tools,
                                            add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - jinja raises TemplateError for unsupported roles
        if not any(m["role"] == "system" for m in messages):
            raise WorkloadError(f"prompt {prompt_id!r}: the tokenizer's chat template failed "
                                f"({exc}); pass --no-chat-template to send raw text") from None
        # Some templates (Gemma, older Mistral) reject a system turn: fold it into the user's.
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        rest = [dict(m) for m in messages if m["role"] != "system"]
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
        return render_chat(tokenizer, tuple(rest), prompt_id, tools)
    assert isinstance(out, str), type(out)
    return out


def render_prompt(prompt: Prompt, tokenizer: Any, use_chat_template: bool = True
                  ) -> tuple[str, list[int], tuple[dict[str, str], ...] | None]:
    """(prompt text as sent, token ids, chat messages or None)."""
    if use_chat_template:
        messages = prompt.messages or ({"role": "user", "content": prompt.text or ""},)
        if _has_chat_template(tokenizer):
            text = render_chat(tokenizer, messages, prompt.id, prompt.structured.get("tools"))
            # the template already holds any BOS; adding special tokens would double it
            return text, list(tokenizer.encode(text, add_special_tokens=False)), messages
    else:
        messages = None
    text = prompt.text if prompt.text is not None else _flatten(prompt.messages or ())
    return text, list(tokenizer.encode(text, add_special_tokens=True)), messages


def build_requests(workload: Workload, tokenizer: Any, base: SamplingParams, *,
                   use_chat_template: bool = True, max_context: int | None = None,
                   truncate: bool = False, max_new_tokens: int | None = None,
                   overrides: Mapping[str, Any] | None = None, turns: int = 1,
                   tool_call_parser: str = "json") -> tuple[list[Request], int]:
    """Tokenize every prompt of `workload`; returns (requests, skipped_count).

    `use_chat_template`: chat prompts go through the tokenizer's chat template (text prompts as
    one user message); without it, or when the tokenizer has none, raw text is sent.
    `max_context`: prompts longer than `max_context - max_new_tokens` are skipped and counted,
    or with `truncate=True` left-truncated (keeping the end, where the question is).
    `max_new_tokens` is an explicit override like those in `overrides` (CLI values the user
    set); both beat the set's defaults but not a prompt's own fields.
    `turns` > 1: every request opens a conversation of up to that many user turns (its
    prompt's own first turns; `specbench.workload.conversation.next_turn` builds the rest).
    `tool_call_parser`: the form tool calls are constrained to (specbench.structured).
    """
    explicit: dict[str, Any] | None = dict(overrides) if overrides is not None else None
    if max_new_tokens is not None:
        if explicit is None:
            explicit = {f: getattr(base, f) for f in SAMPLING_FIELDS
                        if getattr(base, f) != getattr(_DEFAULTS, f)}
        explicit["max_new_tokens"] = max_new_tokens
    requests: list[Request] = []
    skipped = 0
    broken = next((p.later_error for p in workload.prompts if p.later_error), None) if turns > 1 else None
    if broken:
        raise WorkloadError(broken)
    for prompt in workload.prompts:
        sampling = resolve_sampling(base, prompt, workload.default_sampling, explicit)
        text, ids, messages = render_prompt(prompt, tokenizer, use_chat_template)
        if max_context is not None:
            limit = max_context - sampling.max_new_tokens
            if len(ids) > limit:
                if not truncate or limit < 1:
                    skipped += 1
                    continue
                ids = ids[-limit:]
                # the text and messages no longer match the ids: send the decoded ids
                text = tokenizer.decode(ids, skip_special_tokens=False)
                messages = None
        if not ids:
            skipped += 1
            continue
        requests.append(Request(
            id=prompt.id, prompt_ids=tuple(ids), sampling=sampling, category=prompt.category,
            workload=workload.name, kind=workload.kind, prompt_text=text,
            messages=tuple(dict(m) for m in messages) if messages else None,
            structured=dict(prompt.structured) or None, constraint=constraint_of(prompt.structured, tool_call_parser),
            scenario=scenario_of(prompt.structured),
            conversation_id=prompt.id if turns > 1 else None, later_turns=prompt.later_turns[:turns - 1],
        ))
    if not requests:
        limit_note = (f" longer than max_context - max_new_tokens (max_context={max_context}); "
                      "lower --max-new-tokens or pass --truncate"
                      if max_context is not None else " empty after tokenization")
        raise WorkloadError(f"{workload.name}: all {len(workload.prompts)} prompts are"
                            f"{limit_note}")
    return requests, skipped
