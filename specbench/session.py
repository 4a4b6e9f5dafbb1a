"""Assembly of a measurement: prompts -> tokenized requests, loaded models -> backends.

`specbench run` measures a fixed list of configurations, `specbench sweep` configurations an
optimizer picks one at a time (possibly hundreds, in one process) and `specbench serve` one
configuration behind an HTTP API; all of them need the same assembly, and a sweep must not
reload a model per trial. Here it is, once:

- `load_prompts` resolves a workload (named sets sampled to `DEFAULT_NAMED_PROMPTS`);
- `tokenize` turns it into `Request`s for a tokenizer, and owns the warning about prompts
  skipped for exceeding the context;
- `open_session()` loads the target and tokenizes; `Session.draft_model` / `eagle3_head` / `medusa_heads` load
  each draft (or EAGLE-3 head) the first time it is asked for and keep it; the backend factory
  `Session.backend_for` (embedded) / `Session.hf_backend` (the transformers reference) builds
  each backend once. A server backend needs no session: only its tokenizer is loaded
  (`specbench.backends.openai.load_tokenizer`), then `tokenize`;
- `open_engine()` loads a target and its drafter into the `Engine` that `specbench serve`
  puts behind its API.

Boundary: this module knows models, workloads and backends, never Optuna, records or the
CLI. It raises `SpecbenchError`s and prints nothing unless given a `log` callable (which gets
rich markup).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from specbench.config import (
    DEFAULT_DRAFT,  # noqa: F401 - the sweep spec reads the run defaults from here
    DEFAULT_EAGLE3_HEAD,  # noqa: F401
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_NAMED_PROMPTS,
    DEFAULT_TARGET,  # noqa: F401
    DRAFTED_METHODS,
    HEAD_METHODS,
    EngineConfig,
    SamplingParams,
)
from specbench.types import Request
from specbench.workload import load_workload
from specbench.workload import build_requests

Log = Callable[[str], None]


def default_num_prompts(workload: str) -> int | None:
    """Named sets are sampled (6 prompts); files and hf: datasets are used whole."""
    return DEFAULT_NAMED_PROMPTS if not Path(workload).suffix and not workload.startswith("hf:") else None


def sampling_base(*, seed: int = 0, ignore_eos: bool = False,
                  overrides: Mapping[str, Any] | None = None) -> SamplingParams:
    """The base SamplingParams of a run: explicit `overrides` (temperature, top_p, top_k,
    max_new_tokens) on top of SamplingParams' defaults, 64 new tokens unless overridden."""
    overrides = dict(overrides or {})
    base = SamplingParams(seed=seed, ignore_eos=ignore_eos, **overrides)
    if "max_new_tokens" not in overrides:
        base = base.with_(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    return base


def load_prompts(workload: str, *, prompt_field: str | None = None, num_prompts: int | None = None,
                 seed: int = 0) -> Any:
    """The `specbench.workload.Workload` named by `workload`; `num_prompts` None means the
    default for its kind (`default_num_prompts`), a seeded sample of a named set."""
    return load_workload(workload, prompt_field=prompt_field,
                         num_prompts=num_prompts if num_prompts is not None else default_num_prompts(workload),
                         seed=seed)


def tokenize(workload: Any, tokenizer: Any, base: SamplingParams, *, max_context: int | None,
             overrides: Mapping[str, Any] | None = None, chat_template: bool = True, truncate: bool = False,
             log: Log | None = None, turns: int = 1, tool_call_parser: str = "json") -> tuple[list[Request], int]:
    """(requests, skipped): the prompts of `workload` as requests for `tokenizer`; prompts
    longer than `max_context` are left out (and said so) unless `truncate`. A workload of
    which nothing fits is a WorkloadError naming the flags that help. `turns` > 1: each opens
    a conversation of up to that many turns (--turns)."""
    requests, skipped = build_requests(workload, tokenizer, base, use_chat_template=chat_template,
                                       max_context=max_context, truncate=truncate, overrides=overrides, turns=turns,
                                       tool_call_parser=tool_call_parser)
    if skipped and log:
        log(f"[yellow]skipped {skipped} prompt(s) longer than the context of {max_context} tokens "
            f"(use --truncate to keep them){_categories_lost(workload, requests)}[/]")
    return requests, skipped


def _categories_lost(workload: Any, requests: Sequence[Request]) -> str:
    """Which categories the skipped prompts came from, and which of them left the run
    altogether (a per-category summary would silently lack them)."""
    from collections import Counter

    before = Counter(p.category for p in workload.prompts)
    after = Counter(r.category for r in requests)
    if len(before) < 2:
        return ""
    lost = {c: n - after.get(c, 0) for c, n in before.items() if n > after.get(c, 0)}
    gone = [c for c in lost if not after.get(c)]
    parts = [f"{c} {k} of {before[c]}" for c, k in sorted(lost.items())]
    text = f"; from categories {', '.join(parts)}"
    if gone:
        text += f"; {len(gone)} of {len(before)} categories gone from the run: {', '.join(sorted(gone))}"
    return text


@dataclass
class Session:
    """A loaded target, its tokenized requests and lazily loaded drafts with their backends."""

    target: Any  # specbench.models.LoadedModel
    requests: list[Request]
    engine_cfg: EngineConfig
    workload: Any  # specbench.workload.Workload (None when serving)
    skipped: int = 0  # prompts dropped for exceeding the context
    log: Log | None = None
    _drafts: dict[str, Any] = field(default_factory=dict)
    _heads: dict[str, Any] = field(default_factory=dict)
    _backends: dict[tuple[str, str | None, str | None], Any] = field(default_factory=dict)

    @property
    def dtype_name(self) -> str:
        return str(self.target.dtype).replace("torch.", "")

    def draft_model(self, draft: str) -> Any:
        """The draft `LoadedModel`, loaded (and checked against the target's tokenizer) once."""
        if draft not in self._drafts:
            from specbench.models.loading import check_same_tokenizer, load_model

            if self.log:
                self.log(f"loading draft [bold]{escape(draft)}[/]")
            model = load_model(draft, self.engine_cfg)
            check_same_tokenizer(self.target, model)
            self._drafts[draft] = model
        return self._drafts[draft]

    def eagle3_head(self, path: str) -> Any:
        """The EAGLE-3 head in directory `path`, loaded (and checked against the target) once."""
        if path not in self._heads:
            from specbench.models.eagle3 import load_head

            if self.log:
                self.log(f"loading EAGLE-3 head [bold]{escape(str(path))}[/]")
            self._heads[path] = load_head(path, self.target.model, target_name=self.target.name)
        return self._heads[path]

    def medusa_heads(self, path: str) -> Any:
        """The Medusa heads in directory `path`, loaded (and checked against the target) once."""
        key = f"medusa:{path}"
        if key not in self._heads:
            from specbench.models.medusa import load_heads

            if self.log:
                self.log(f"loading Medusa heads [bold]{escape(str(path))}[/]")
            self._heads[key] = load_heads(path, self.target.model, target_name=self.target.name)
        return self._heads[key]

    def head(self, path: str, method: str) -> Any:
        """The head module a head method (eagle3, medusa) drafts with, from directory `path`."""
        return self.medusa_heads(path) if method == "medusa" else self.eagle3_head(path)

    def drafter(self, draft: str, method: str) -> Any:
        """What drafts for `method` from `draft`: the EAGLE-3 head (eagle3), the Medusa heads
        (medusa) or the draft model."""
        return self.head(draft, method) if method in HEAD_METHODS else self.draft_model(draft)

    def backend_for(self, draft: str | None, method: str = "draft_model", specs: Sequence[Any] = ()) -> Any:
        """The embedded backend for the target with `draft` (None: baseline and n-gram): a
        draft model, or for method eagle3 the directory of an EAGLE-3 head. `specs`: the
        configurations it will run, which decide whether --capture auto takes the static step."""
        from specbench.backends.embedded import EmbeddedBackend, static_reason

        drafter = None
        if draft is not None:
            drafter = self.drafter(draft, method)
        why = static_reason(self.target, drafter if method == "draft_model" else None, specs,
                            head=drafter if method in HEAD_METHODS else None)
        if not why and not specs and self.engine_cfg.capture == "auto":
            why = "the configurations this engine will run were not given"  # a sweep's: each trial its own
        if not why and any(r.constraint is not None for r in self.requests):
            from specbench.engine.static import CONSTRAINED
            why = CONSTRAINED
        static, why = self.engine_cfg.static_mode(self.device_type, why)
        key = ("embedded", method if draft is not None else None, draft, static)
        if key not in self._backends:
            pack = self.engine_cfg.pack
            if draft is not None and method in HEAD_METHODS:
                backend = EmbeddedBackend(self.target, head=drafter, pack=pack, static=static, static_why=why)
            else:
                backend = EmbeddedBackend(self.target, drafter, pack=pack, static=static, static_why=why)
            self._backends[key] = backend
        return self._backends[key]

    def hf_backend(self, draft: str | None) -> Any:
        """transformers' generate() on the target with the draft model `draft` (None: baseline
        and n-gram), the reference the embedded engine is measured against."""
        key = ("hf", None, draft)
        if key not in self._backends:
            from specbench.backends.hf import HFBackend

            self._backends[key] = HFBackend(self.target, self.draft_model(draft) if draft is not None else None)
        return self._backends[key]

    @property
    def device_type(self) -> str:
        """Where the target's weights are: cpu or cuda."""
        return next(self.target.model.parameters()).device.type

    @property
    def device_name(self) -> str:
        return self.backend_for(None).device_name


def load_target(target: str, engine_cfg: EngineConfig, log: Log | None = None) -> Session:
    """A session holding only the loaded target (no prompts yet): what `specbench serve` needs."""
    from specbench.models.loading import load_model

    if log:
        log(f"loading target [bold]{escape(target)}[/]")
    return Session(target=load_model(target, engine_cfg), requests=[], engine_cfg=engine_cfg, workload=None,
                   log=log)


def open_engine(target: str, spec: Any, engine_cfg: EngineConfig, log: Log | None = None) -> tuple[Any, Any]:
    """(target `LoadedModel`, `Engine`) speculating as `spec` (a `SpeculativeConfig`), with its
    draft model or EAGLE-3 head loaded and checked: what `specbench serve` puts behind its API."""
    from specbench.backends.embedded import make_engine, static_reason

    session = load_target(target, engine_cfg, log)
    drafting = spec.draft if spec.speculative and spec.method in DRAFTED_METHODS else None
    drafter = session.drafter(drafting, spec.method) if drafting is not None else None
    if spec.method == "medusa" and drafter is not None:
        from specbench.models.medusa import check_depth

        check_depth(drafter, [spec], drafting)
    draft_model = drafter if spec.method == "draft_model" else None
    static, _ = engine_cfg.static_mode(session.device_type, static_reason(
        session.target, draft_model, [spec], head=drafter if spec.method in HEAD_METHODS else None))
    engine = make_engine(session.target, draft_model, head=drafter if spec.method in HEAD_METHODS else None,
                         pack=engine_cfg.pack, static=static)
    return session.target, engine


def open_session(
    *,
    target: str,
    engine_cfg: EngineConfig,
    workload: Any,
    base: SamplingParams,
    overrides: Mapping[str, Any] | None = None,
    prompt_field: str | None = None,
    num_prompts: int | None = None,
    seed: int = 0,
    chat_template: bool = True,
    truncate: bool = False,
    log: Log | None = None,
    preload: Sequence[tuple[str, str]] = (),
    requests: bool = True,
    turns: int = 1,
    tool_call_parser: str = "json",
) -> Session:
    """Load the workload and the target, tokenize the requests. Drafts load on first use,
    except the (method, draft) pairs in `preload`, loaded with the target.

    `workload` is a workload spec (see `load_prompts`, with `prompt_field`, `num_prompts` and
    `seed`) or a `Workload` already loaded. A spec is resolved before the model loads, so a
    bad prompt file fails fast."""
    from specbench.models.loading import resolve_device

    wl = workload if not isinstance(workload, str) else load_prompts(
        workload, prompt_field=prompt_field, num_prompts=num_prompts, seed=seed)
    resolve_device(engine_cfg)  # a device that cannot be had fails before any weights are fetched
    t0 = time.perf_counter()
    session = load_target(target, engine_cfg, log)
    for method, draft in preload:
        session.drafter(draft, method)
    tgt = session.target
    if log:
        log(f"{'models' if preload else 'target'} ready in {time.perf_counter() - t0:.1f} s on {tgt.device} "
            f"({session.dtype_name})")
    session.workload = wl
    if requests:  # (a replayed trace builds its own requests from the workload's text)
        session.requests, session.skipped = tokenize(wl, tgt.tokenizer, base, max_context=tgt.max_context,
                                                     overrides=overrides, chat_template=chat_template,
                                                     truncate=truncate, log=log, turns=turns,
                                                     tool_call_parser=tool_call_parser)
    return session
