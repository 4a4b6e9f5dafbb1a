"""The value types of a prompt set and the validation of per-prompt sampling fields.

A `Workload` is text, not tokens: it knows nothing about a model or tokenizer. Turning it
into `specbench.types.Request`s (chat template, token ids, length limits, seeds) is
`specbench.workload.requests`. Every loader (named sets, user files, `hf:` datasets) ends in
these types, and every loader validates sampling fields with `parse_sampling`, so a bad value
fails at load time with the file and row in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from specbench import limits
from specbench.errors import WorkloadError

KINDS = ("real", "high-entropy", "regression", "custom")

# Per-prompt (and per-set) sampling fields a prompt source may carry; the names and meanings
# are those of `specbench.config.SamplingParams`.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "max_new_tokens")


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set.

    A prompt has `text` (completion style), `messages` (chat form) or both; HumanEval has both:
    the raw code stub as `text` and an instruction-wrapped stub as `messages`.
    `build_requests` uses `messages` when a chat template is applied (else `text` wrapped as
    one user message) and `text` for raw prompts (else the messages' contents, flattened).

    `sampling` holds only the fields this prompt fixes (subset of `SAMPLING_FIELDS`). It is a
    plain dict so prompts pickle; treat it as read-only. Prompts are therefore not hashable;
    key them by `id`, which is unique within a workload and stable across runs.
    """

    id: str
    category: str
    text: str | None = None  # raw prompt text (completion style)
    messages: tuple[dict[str, str], ...] | None = None  # [{"role": "user", "content": ...}]
    sampling: dict[str, Any] = field(default_factory=dict)  # per-prompt overrides
    # structured output (specbench.structured.FIELDS present, checked): response_format, tools,
    # tool_choice, structured_outputs; {} for a free prompt
    structured: dict[str, Any] = field(default_factory=dict)
    # a conversation's later user turns, in order (the dataset's answers are not kept: a
    # replay sends the model's own, `specbench run --turns`)
    later_turns: tuple[str, ...] = ()
    later_error: str | None = None  # why the later turns stop short (a replay of them is refused)

    def __post_init__(self) -> None:
        assert self.text is not None or self.messages, f"prompt {self.id!r} has no text"
        if self.messages is not None and not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))

    @property
    def display_text(self) -> str:
        """The user's words: `text`, else the last user message (for tables and logs)."""
        if self.text is not None:
            return self.text
        users = [m["content"] for m in self.messages if m.get("role") == "user"]
        return users[-1] if users else self.messages[-1]["content"]


@dataclass(frozen=True)
class Workload:
    name: str  # "real", "high-entropy", "regression", "humaneval", ..., a file path or hf:NAME
    kind: str  # real | high-entropy | regression | custom
    prompts: tuple[Prompt, ...]
    # Set-level sampling defaults (e.g. high-entropy: temperature 0.8, top_p 0.95). They beat
    # SamplingParams defaults but lose to explicit CLI flags and to per-prompt fields.
    default_sampling: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


@dataclass(frozen=True)
class WorkloadInfo:
    """One row of `list_workloads()`: a named set, without loading its prompts."""

    name: str
    kind: str
    description: str
    count: int | None  # prompts in the set as shipped (None: source not installed)
    source: str  # where the prompts come from (file or package)
    default_sampling: dict[str, Any] = field(default_factory=dict)


def _number(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise WorkloadError(f"{where}: field {name!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise WorkloadError(f"{where}: field {name!r} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise WorkloadError(f"{where}: field {name!r} must be a finite number, got {value!r}")
    return number


def _integer(value: Any, name: str, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # exact, however large (the bound is checked after)
    number = _number(value, name, where)
    if number != int(number):
        raise WorkloadError(f"{where}: field {name!r} must be an integer, got {value!r}")
    return int(number)


def is_missing(value: Any) -> bool:
    # CSV gives "" for an empty cell, Parquet and JSON null None. A NaN is a value someone
    # wrote (JSON's NaN, a float cell): refused where a number is expected, never "not given".
    return value is None or value == ""


def parse_sampling(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The sampling fields present in `row` (top level or under a `sampling` object),
    converted and range-checked. `where` (e.g. `file.jsonl:3`) prefixes every error."""
    source: dict[str, Any] = {}
    nested = row.get("sampling")
    if isinstance(nested, Mapping):
        source.update(nested)
    elif not is_missing(nested):
        raise WorkloadError(f"{where}: field 'sampling' must be an object with keys "
                            f"{', '.join(SAMPLING_FIELDS)}, got {nested!r}")
    source.update({k: row[k] for k in SAMPLING_FIELDS if k in row})
    unknown = sorted(set(source) - set(SAMPLING_FIELDS))
    if unknown:
        raise WorkloadError(f"{where}: unknown sampling field(s) {', '.join(unknown)}; "
                            f"valid: {', '.join(SAMPLING_FIELDS)}")
    out: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        value = source.get(name)
        if is_missing(value):
            continue
        number = _integer(value, name, where) if name in ("top_k", "seed", "max_new_tokens") else _number(value, name, where)
        out[name] = limits.check(name, number, where=f"{where}: ", label=f"field {name!r}", error=WorkloadError)
    return out
