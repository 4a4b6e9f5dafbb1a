"""What a comparison found: one `MetricResult` per (configuration pair, metric), gathered in a
`Comparison` that knows its outcome and exit code (0 no regression, 1 regression, 2 not
comparable). Renderers (`specbench.compare.render`) turn it into text.

Boundary: plain data and the rules that derive the outcome from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.errors import SpecbenchError


class NotComparableError(SpecbenchError):
    """The two runs measured different things (workload, prompts, sampling, configurations)."""


@dataclass
class MetricResult:
    config: str  # label: the config_id, or "base_id -> current_id" for a pair of different ids
    baseline_config: str
    current_config: str
    metric: str
    kind: str
    better: str
    baseline: float | None
    current: float | None
    change: float | None  # current / baseline - 1 (absolute metrics: current - baseline)
    ci_low: float | None  # confidence interval of `change` (timing metrics only)
    ci_high: float | None
    threshold: float
    verdict: str  # one of VERDICTS
    gated: bool  # whether a "regression" verdict fails the comparison
    n: int  # prompts compared
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.gated and self.verdict == "regression"


@dataclass
class Comparison:
    baseline: dict[str, Any]  # path, run_id, created_at, status
    current: dict[str, Any]
    settings: dict[str, Any]
    reasons: list[str] = field(default_factory=list)  # why not comparable; empty = comparable
    differences: list[dict[str, Any]] = field(default_factory=list)  # allowed, for information
    unmatched: list[str] = field(default_factory=list)  # configurations compared with nothing
    results: list[MetricResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the intervals do and do not cover

    @property
    def comparable(self) -> bool:
        return not self.reasons

    @property
    def failures(self) -> list[MetricResult]:
        return [r for r in self.results if r.failed]

    @property
    def exit_code(self) -> int:
        """0 no regression, 1 regression, 2 not comparable."""
        return 2 if self.reasons else 1 if self.failures else 0

    @property
    def outcome(self) -> str:
        return {0: "pass", 1: "regression", 2: "not comparable"}[self.exit_code]

    def summary(self) -> str:
        """One line: the outcome and what caused it."""
        if self.reasons:
            return "not comparable: " + "; ".join(self.reasons)
        ungated = sum(1 for r in self.results if not r.gated)
        extra = f", {ungated} reported without gating" if ungated else ""
        if self.failures:
            what = ", ".join(f"{r.metric} on {r.config}" for r in self.failures)
            return f"regression: {len(self.failures)} of {len(self.results)} checks failed ({what})"
        return f"no regression ({len(self.results)} checks{extra})"
