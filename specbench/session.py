"""A measurement session: models loaded once, requests built once, one backend per draft.

`specbench run` measures a fixed list of configurations; `specbench sweep` measures
configurations chosen one at a time by an optimizer, possibly hundreds, in one process. Both
need the same assembly (workload -> tokenized requests, target + draft models -> a backend),
and a sweep must not reload a model per trial. `open_session()` does the assembly once;
`Session.backend_for(draft, method)` loads each draft model (or EAGLE-3 head, method eagle3) the
first time it is asked for and keeps it.

Boundary: this module knows models, workloads and backends, never Optuna or the CLI. It
raises `SpecbenchError`s and prints nothing unless given a `log` callable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.config import EngineConfig, SamplingParams
from specbench.errors import ConfigError
from specbench.types import Request

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_NAMED_PROMPTS = 6  # a named set is sampled down to this many unless told otherwise
DEFAULT_MAX_NEW_TOKENS = 64


def default_num_prompts(workload: str) -> int | None:
    """Named sets are sampled (6 prompts); files and hf: datasets are used whole."""
    return DEFAULT_NAMED_PROMPTS if not Path(workload).suffix and not workload.startswith("hf:") else None


def sampling_base(*, seed: int = 0, ignore_eos: bool = False,
                  overrides: dict[str, Any] | None = None) -> SamplingParams:
    """The base SamplingParams of a run: explicit `overrides` (temperature, top_p, top_k,
    max_new_tokens) on top of SamplingParams' defaults, 64 new tokens unless overridden."""
    overrides = dict(overrides or {})
    base = SamplingParams(seed=seed, ignore_eos=ignore_eos, **overrides)
    if "max_new_tokens" not in overrides:
        base = base.with_(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    return base


@dataclass
class Session:
    """A loaded target, its tokenized requests and lazily loaded drafts with their backends."""

    target: Any  # specbench.models.LoadedModel
    requests: list[Request]
    engine_cfg: EngineConfig
    workload: Any  # specbench.workload.Workload
    skipped: int = 0  # prompts dropped for exceeding the context
    log: Callable[[str], None] | None = None
    _drafts: dict[str, Any] = field(default_factory=dict)
    _heads: dict[str, Any] = field(default_factory=dict)
    _backends: dict[tuple[str | None, str | None], Any] = field(default_factory=dict)

    @property
    def dtype_name(self) -> str:
        return str(self.target.dtype).replace("torch.", "")

    def draft_model(self, draft: str) -> Any:
        """The draft `LoadedModel`, loaded (and checked against the target's tokenizer) once."""
        if draft not in self._drafts:
            from specbench.models.loading import check_same_tokenizer, load_model

            if self.log:
                self.log(f"loading draft [bold]{draft}[/]")
            model = load_model(draft, self.engine_cfg)
            check_same_tokenizer(self.target, model)
            self._drafts[draft] = model
        return self._drafts[draft]

    def eagle3_head(self, path: str) -> Any:
        """The EAGLE-3 head in directory `path`, loaded (and checked against the target) once."""
        if path not in self._heads:
            from specbench.models.eagle3 import load_head

            if self.log:
                self.log(f"loading EAGLE-3 head [bold]{path}[/]")
            self._heads[path] = load_head(path, self.target.model, target_name=self.target.name)
        return self._heads[path]

    def backend_for(self, draft: str | None, method: str = "draft_model") -> Any:
        """The embedded backend for the target with `draft` (None: baseline and n-gram): a
        draft model, or for method eagle3 the directory of an EAGLE-3 head."""
        key = (method if draft is not None else None, draft)
        if key not in self._backends:
            from specbench.backends.embedded import EmbeddedBackend

            pack = self.engine_cfg.pack
            if draft is not None and method == "eagle3":
                backend = EmbeddedBackend(self.target, head=self.eagle3_head(draft), pack=pack)
            else:
                backend = EmbeddedBackend(self.target, self.draft_model(draft) if draft is not None else None,
                                          pack=pack)
            self._backends[key] = backend
        return self._backends[key]

    @property
    def device_name(self) -> str:
        return self.backend_for(None).device_name


def open_session(
    *,
    target: str,
    engine_cfg: EngineConfig,
    workload: str,
    base: SamplingParams,
    overrides: dict[str, Any] | None = None,
    prompt_field: str | None = None,
    num_prompts: int | None = None,
    seed: int = 0,
    chat_template: bool = True,
    truncate: bool = False,
    log: Callable[[str], None] | None = None,
) -> Session:
    """Load the workload and the target, tokenize the requests. Drafts load on first use.

    `num_prompts` None means the default for the kind of workload (`default_num_prompts`).
    The workload is resolved before the model loads, so a bad prompt file fails fast."""
    from specbench.models.loading import load_model
    from specbench.workload import build_requests, load_workload

    wl = load_workload(workload, prompt_field=prompt_field,
                       num_prompts=num_prompts if num_prompts is not None else default_num_prompts(workload),
                       seed=seed)
    t0 = time.perf_counter()
    if log:
        log(f"loading target [bold]{target}[/]")
    tgt = load_model(target, engine_cfg)
    if log:
        log(f"target ready in {time.perf_counter() - t0:.1f} s on {tgt.device} "
            f"({str(tgt.dtype).replace('torch.', '')})")
    requests, skipped = build_requests(wl, tgt.tokenizer, base, use_chat_template=chat_template,
                                       max_context=tgt.max_context, truncate=truncate,
                                       overrides=overrides)
    if not requests:
        raise ConfigError(f"every prompt of {wl.name!r} is longer than the context of "
                          f"{tgt.max_context} tokens (use --truncate to keep them)")
    if skipped and log:
        log(f"[yellow]skipped {skipped} prompt(s) longer than the context of {tgt.max_context} "
            "tokens (use --truncate to keep them)[/]")
    return Session(target=tgt, requests=requests, engine_cfg=engine_cfg, workload=wl,
                   skipped=skipped, log=log)
