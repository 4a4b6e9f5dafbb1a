"""The search space of a sweep (`Space`: what the sampler may choose) and the configurations
in it. A sweep measures what `specbench run` measures: a `runner.Configuration`, one
`SpeculativeConfig` at one concurrency (closed loop), so a trial carries the type the run
path and the engine use. `configuration` builds one normalized, `config_key` is the string
that dedupes measurements, `Space.from_params` and `Space.params` go between a configuration
and the Optuna params of its trial.

Boundary: plain values; `specbench.sweep.spec` builds the space from the spec's options, the
objective suggests configurations from it. Nothing here imports Optuna.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specbench.config import BASELINE, DRAFTED_METHODS, TREE_METHODS, SpeculativeConfig, tree_nodes
from specbench.runner import Configuration


def configuration(method: str = "none", num_speculative_tokens: int = 0, draft: str | None = None,
                  concurrency: int = 1, topk: int = 1, num_draft_tokens: int | None = None) -> Configuration:
    """The configuration these values name, normalized so that one measurement has one
    spelling: every spelling of the baseline (method none, or k = 0) is `BASELINE`; only the
    drafted methods keep `draft` (the draft model, or eagle3's head directory: n-gram and
    suffix never carry one); a chain (topk 1, or a method that drafts no trees) has topk 1 and
    no num_draft_tokens; a tree carries the num_draft_tokens it comes to (the size asked,
    None: 1 + k * topk, capped by what a tree of depth k holds), so sizes that come to one
    tree are one configuration. A drafted method without its draft is refused
    (`SpeculativeConfig`'s ConfigError)."""
    if method == "none" or num_speculative_tokens == 0:
        return Configuration(BASELINE, concurrency)
    tree: dict[str, Any] = {}
    if method in TREE_METHODS and topk > 1:
        tree = {"topk": topk, "num_draft_tokens": 1 + tree_nodes(num_speculative_tokens, topk, num_draft_tokens)}
    spec = SpeculativeConfig(method=method, num_speculative_tokens=num_speculative_tokens,
                             draft=draft if method in DRAFTED_METHODS else None, **tree)
    return Configuration(spec, concurrency)


def draft_model(config: Configuration) -> str | None:
    """The draft model of a draft_model configuration, the draft as a search dimension; None
    for every other method (a study's one EAGLE-3 head is not an Optuna parameter)."""
    return config.spec.draft if config.spec.method == "draft_model" else None


def config_key(config: Configuration) -> str:
    """Dedupe key: two trials with one key measure the same thing. Stored in studies
    (`config_key`), so it never changes: `method|k{k}|{draft model or -}|c{concurrency}`, and
    for a tree `|t{topk}n{tokens per target pass}` (chains kept their keys when trees came)."""
    sc = config.spec
    tree = f"|t{sc.topk}n{sc.verify_width}" if sc.is_tree else ""
    return f"{sc.method}|k{sc.num_speculative_tokens}|{draft_model(config) or '-'}|c{config.concurrency}{tree}"


@dataclass(frozen=True)
class Space:
    """What the sampler may choose. The baseline (method none) is always a candidate."""

    method: tuple[str, ...]  # speculative methods
    num_speculative_tokens: tuple[int, ...]  # k values (all of them, also for a range)
    k_range: tuple[int, int, int] | None  # (low, high, step) when given as a range
    concurrency: tuple[int, ...]
    draft: tuple[str, ...]  # draft model choices (method draft_model only)
    head: str | None = None  # the EAGLE-3 head's directory (method eagle3 only)
    # draft trees (tree methods only): children per node, and tree sizes (tokens per target
    # pass, SGLang's num_draft_tokens; empty: 1 + k * topk); (1,) and () search chains only
    topk: tuple[int, ...] = (1,)
    num_draft_tokens: tuple[int, ...] = ()

    @property
    def searches_trees(self) -> bool:
        return self.topk != (1,) or bool(self.num_draft_tokens)

    def _trees(self, method: str) -> list[tuple[int, int | None]]:
        if method not in TREE_METHODS or not self.searches_trees:
            return [(1, None)]
        return [(t, n) for t in self.topk for n in ((None,) if t == 1 else (self.num_draft_tokens or (None,)))]

    def configurations(self) -> list[Configuration]:
        """Every distinct configuration, the baseline first at each concurrency (tree sizes
        that come to the same tree are one configuration)."""
        out: dict[str, Configuration] = {}
        for c in self.concurrency:
            base = configuration(concurrency=c)
            out[config_key(base)] = base
            for m in self.method:
                for k in self.num_speculative_tokens:
                    for d in (self.draft if m == "draft_model" else (self.head,) if m == "eagle3" else (None,)):
                        for t, n in self._trees(m):
                            config = configuration(m, k, d, c, t, n)
                            out.setdefault(config_key(config), config)
        return list(out.values())

    def from_params(self, params: Mapping[str, Any]) -> Configuration:
        """The configuration of a trial's Optuna params (as `suggest` draws them or `params`
        writes them); eagle3's head is the study's, not a parameter."""
        method = params.get("method", "none")
        return configuration(method, params.get("num_speculative_tokens", 0),
                             self.head if method == "eagle3" else params.get("draft"),
                             params.get("concurrency", 1), params.get("topk", 1), params.get("num_draft_tokens"))

    def params(self, config: Configuration) -> dict[str, Any]:
        """Optuna params for `enqueue_trial` (only the ones the objective suggests), with the
        tree shape where this space searches trees: a tree's size is the first of this space's
        num_draft_tokens that comes to its tree, a choice of the distribution `suggest` draws
        from (the one `configurations` keeps)."""
        sc = config.spec
        out: dict[str, Any] = {"method": sc.method, "concurrency": config.concurrency}
        if not config.is_baseline:
            out["num_speculative_tokens"] = sc.num_speculative_tokens
        if draft_model(config) is not None:
            out["draft"] = draft_model(config)
        if self.searches_trees and sc.method in TREE_METHODS:
            out["topk"] = sc.topk
            if sc.is_tree and self.num_draft_tokens:
                out["num_draft_tokens"] = self._size_asked(config)
        return out

    def _size_asked(self, config: Configuration) -> int:
        sc = config.spec
        for n in self.num_draft_tokens:
            if 1 + tree_nodes(sc.num_speculative_tokens, sc.topk, n) == sc.verify_width:
                return n
        raise ValueError(f"{config_key(config)} is not in this space: none of num_draft_tokens "
                         f"{list(self.num_draft_tokens)} comes to {sc.verify_width} tokens per target pass")

    def grid(self) -> dict[str, list[Any]]:
        """Optuna GridSampler search space: the speculative configurations (the baseline is
        enqueued)."""
        grid: dict[str, list[Any]] = {"method": list(self.method),
                                      "num_speculative_tokens": list(self.num_speculative_tokens),
                                      "concurrency": list(self.concurrency)}
        if "draft_model" in self.method:
            grid["draft"] = list(self.draft)
        if self.searches_trees and set(self.method) & set(TREE_METHODS):
            grid["topk"] = list(self.topk)
            if self.num_draft_tokens:
                grid["num_draft_tokens"] = list(self.num_draft_tokens)
        return grid

    def describe(self) -> dict[str, Any]:
        """JSON-able description; a study remembers it and refuses a different one."""
        k: Any = list(self.num_speculative_tokens)
        if self.k_range:
            k = {"low": self.k_range[0], "high": self.k_range[1], "step": self.k_range[2]}
        out = {"method": list(self.method), "num_speculative_tokens": k,
               "concurrency": list(self.concurrency), "draft": list(self.draft)}
        if self.head is not None:
            out["head"] = self.head
        if self.searches_trees:  # chain-only spaces describe themselves as before
            out["topk"] = list(self.topk)
            out["num_draft_tokens"] = list(self.num_draft_tokens)
        return out
