"""The search space of a sweep (`Space`: what the sampler may choose) and one point in it
(`Point`: one configuration to measure, with the key that dedupes measurements).

Boundary: plain values; `specbench.sweep.spec` builds the space from the spec's options, the
objective suggests points from it. Nothing here imports Optuna.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from specbench.config import TREE_METHODS, SpeculativeConfig, tree_nodes


@dataclass(frozen=True)
class Point:
    """One configuration to measure. The baseline is method 'none' with k = 0, no draft.
    `draft` is the draft model (draft_model) or the EAGLE-3 head's directory (eagle3).
    `topk` > 1 makes it a draft tree (tree methods only) of `num_draft_tokens` tokens per
    target pass as asked (None: 1 + k * topk); `width` is what that comes to."""

    method: str
    num_speculative_tokens: int
    draft: str | None
    concurrency: int
    topk: int = 1
    num_draft_tokens: int | None = None

    @classmethod
    def of(cls, method: str, num_speculative_tokens: int = 0, draft: str | None = None,
           concurrency: int = 1, topk: int = 1, num_draft_tokens: int | None = None) -> "Point":
        """Normalized: every spelling of the baseline (and of an n-gram point, and of a chain)
        is one point."""
        if method == "none" or num_speculative_tokens == 0:
            return cls("none", 0, None, concurrency)
        if method not in TREE_METHODS or topk <= 1:
            topk, num_draft_tokens = 1, None
        return cls(method, num_speculative_tokens, draft if method in ("draft_model", "eagle3") else None,
                   concurrency, topk, num_draft_tokens)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Point":
        return cls.of(params.get("method", "none"), params.get("num_speculative_tokens", 0),
                      params.get("draft"), params.get("concurrency", 1), params.get("topk", 1),
                      params.get("num_draft_tokens"))

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def width(self) -> int:
        """Tokens one target pass verifies: k + 1 for a chain (0 for the baseline)."""
        if self.is_baseline:
            return 0
        n = self.num_draft_tokens if self.is_tree else None  # a chain has no node budget
        return 1 + tree_nodes(self.num_speculative_tokens, self.topk, n)

    def with_draft(self, draft: str | None) -> "Point":
        return replace(self, draft=draft)

    @property
    def is_baseline(self) -> bool:
        return self.method == "none"

    @property
    def key(self) -> str:
        """Dedupe key: two trials with one key measure the same thing (a study has one EAGLE-3
        head, not an Optuna parameter, so it is not part of the key)."""
        draft = self.draft if self.method == "draft_model" else None
        tree = f"|t{self.topk}n{self.width}" if self.is_tree else ""  # chains keep their old keys
        return f"{self.method}|k{self.num_speculative_tokens}|{draft or '-'}|c{self.concurrency}{tree}"

    @property
    def params(self) -> dict[str, Any]:
        """Optuna params for `enqueue_trial` (only the ones the objective suggests)."""
        out: dict[str, Any] = {"method": self.method, "concurrency": self.concurrency}
        if not self.is_baseline:
            out["num_speculative_tokens"] = self.num_speculative_tokens
        if self.draft is not None and self.method == "draft_model":
            out["draft"] = self.draft
        return out

    def speculative_config(self) -> SpeculativeConfig:
        tree = {"topk": self.topk, "num_draft_tokens": self.width} if self.is_tree else {}
        return SpeculativeConfig(method=self.method, num_speculative_tokens=self.num_speculative_tokens,
                                 draft=self.draft, **tree)


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

    def points(self) -> list[Point]:
        """Every distinct configuration, the baseline first at each concurrency (tree sizes
        that come to the same tree are one point)."""
        out: dict[str, Point] = {}
        for c in self.concurrency:
            base = Point.of("none", concurrency=c)
            out[base.key] = base
            for m in self.method:
                for k in self.num_speculative_tokens:
                    for d in (self.draft if m == "draft_model" else (self.head,) if m == "eagle3" else (None,)):
                        for t, n in self._trees(m):
                            p = Point.of(m, k, d, c, t, n)
                            out.setdefault(p.key, p)
        return list(out.values())

    def params(self, p: Point) -> dict[str, Any]:
        """Optuna params for `enqueue_trial`: the point's, with its tree shape where this space
        searches trees (the objective then suggests them)."""
        out = p.params
        if self.searches_trees and p.method in TREE_METHODS:
            out["topk"] = p.topk
            if p.is_tree and self.num_draft_tokens:
                out["num_draft_tokens"] = p.num_draft_tokens
        return out

    def grid(self) -> dict[str, list[Any]]:
        """Optuna GridSampler search space: the speculative points (the baseline is enqueued)."""
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
