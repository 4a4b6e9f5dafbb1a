"""The search space of a sweep (`Space`: what the sampler may choose) and one point in it
(`Point`: one configuration to measure, with the key that dedupes measurements).

Boundary: plain values; `specbench.sweep.spec` builds the space from the spec's options, the
objective suggests points from it. Nothing here imports Optuna.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbench.config import SpeculativeConfig


@dataclass(frozen=True)
class Point:
    """One configuration to measure. The baseline is method 'none' with k = 0, no draft.
    `draft` is the draft model (draft_model) or the EAGLE-3 head's directory (eagle3)."""

    method: str
    num_speculative_tokens: int
    draft: str | None
    concurrency: int

    @classmethod
    def of(cls, method: str, num_speculative_tokens: int = 0, draft: str | None = None,
           concurrency: int = 1) -> "Point":
        """Normalized: every spelling of the baseline (and of an n-gram point) is one point."""
        if method == "none" or num_speculative_tokens == 0:
            return cls("none", 0, None, concurrency)
        return cls(method, num_speculative_tokens, draft if method in ("draft_model", "eagle3") else None,
                   concurrency)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Point":
        return cls.of(params.get("method", "none"), params.get("num_speculative_tokens", 0),
                      params.get("draft"), params.get("concurrency", 1))

    @property
    def is_baseline(self) -> bool:
        return self.method == "none"

    @property
    def key(self) -> str:
        """Dedupe key: two trials with one key measure the same thing (a study has one EAGLE-3
        head, not an Optuna parameter, so it is not part of the key)."""
        draft = self.draft if self.method == "draft_model" else None
        return f"{self.method}|k{self.num_speculative_tokens}|{draft or '-'}|c{self.concurrency}"

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
        return SpeculativeConfig(method=self.method, num_speculative_tokens=self.num_speculative_tokens,
                                 draft=self.draft)


@dataclass(frozen=True)
class Space:
    """What the sampler may choose. The baseline (method none) is always a candidate."""

    method: tuple[str, ...]  # speculative methods
    num_speculative_tokens: tuple[int, ...]  # k values (all of them, also for a range)
    k_range: tuple[int, int, int] | None  # (low, high, step) when given as a range
    concurrency: tuple[int, ...]
    draft: tuple[str, ...]  # draft model choices (method draft_model only)
    head: str | None = None  # the EAGLE-3 head's directory (method eagle3 only)

    def points(self) -> list[Point]:
        """Every distinct configuration, the baseline first at each concurrency."""
        out: list[Point] = []
        for c in self.concurrency:
            out.append(Point.of("none", concurrency=c))
            for m in self.method:
                for k in self.num_speculative_tokens:
                    for d in (self.draft if m == "draft_model" else (self.head,) if m == "eagle3" else (None,)):
                        out.append(Point.of(m, k, d, c))
        return out

    def grid(self) -> dict[str, list[Any]]:
        """Optuna GridSampler search space: the speculative points (the baseline is enqueued)."""
        grid: dict[str, list[Any]] = {"method": list(self.method),
                                      "num_speculative_tokens": list(self.num_speculative_tokens),
                                      "concurrency": list(self.concurrency)}
        if "draft_model" in self.method:
            grid["draft"] = list(self.draft)
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
        return out
