"""The metrics the regression gate knows, and the flags that pick them and their thresholds.

Metrics come in two kinds:

- timing (`tpot_p50`, `ttft_p50`, `e2e_p50`, `output_tps`, ...): noisy, decided with a paired
  bootstrap over the shared prompt ids (`specbench.compare.gate`);
- deterministic (`acceptance_rate`, `mean_acceptance_length`, `greedy_match`, `valid_outputs`, `errors`):
  with fixed models and seeds these repeat exactly on one machine, so they are compared as
  values with a tight tolerance.

`Metric.threshold` is the default allowed worsening: relative (a fraction of the baseline's
value), or for the absolute metrics in their own unit (`greedy_match` in fraction of prompts,
`errors` in samples).

Boundary: definitions and the parsing of `--metric` / `--max-regression` / `--min-effect`
values; ConfigError names the flag and what would be valid.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specbench.errors import ConfigError


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "timing" (bootstrap-decided) | "deterministic" (value with a tolerance)
    better: str  # "lower" | "higher"
    description: str
    threshold: float  # default allowed worsening: relative, or absolute for absolute metrics
    column: str | None = None  # per-sample column (timing metrics)
    stat: str = "median"  # statistic over per-prompt values (timing metrics)
    absolute: bool = False  # threshold and change in the metric's own unit, not relative
    speculative_only: bool = False  # not defined for the non-speculative baseline

    def worse(self, change: float) -> float:
        """How much worse a change is in this metric's direction (negative: better)."""
        return change if self.better == "lower" else -change


TIMING_THRESHOLD = 0.05
ACCEPTANCE_THRESHOLD = 0.01

_METRIC_LIST = [
    Metric("tpot_p50", "timing", "lower", "median over prompts of TPOT (ms)", TIMING_THRESHOLD,
           column="tpot_s"),
    Metric("ttft_p50", "timing", "lower", "median over prompts of TTFT (ms)", TIMING_THRESHOLD,
           column="ttft_s"),
    Metric("e2e_p50", "timing", "lower", "median over prompts of end-to-end latency (ms)",
           TIMING_THRESHOLD, column="e2e_s"),
    Metric("output_tps", "timing", "higher",
           "mean over prompts of output tokens / E2E (tok/s per request)", TIMING_THRESHOLD,
           column="_output_tps", stat="mean"),
    Metric("tpot_mean", "timing", "lower", "mean over prompts of TPOT (ms)", TIMING_THRESHOLD,
           column="tpot_s", stat="mean"),
    Metric("ttft_mean", "timing", "lower", "mean over prompts of TTFT (ms)", TIMING_THRESHOLD,
           column="ttft_s", stat="mean"),
    Metric("e2e_mean", "timing", "lower", "mean over prompts of end-to-end latency (ms)",
           TIMING_THRESHOLD, column="e2e_s", stat="mean"),
    # drift-free across runs made at different times: each run's speedup is over the baseline
    # it measured interleaved with it, so whatever hit both alike cancels
    Metric("tpot_speedup", "timing", "higher",
           "TPOT speedup over the same run's baseline at the same concurrency (geometric mean over "
           "prompts of baseline / configuration TPOT)", TIMING_THRESHOLD, column="tpot_s",
           speculative_only=True),
    Metric("acceptance_rate", "deterministic", "higher",
           "accepted / drafted tokens, pooled over prompts", ACCEPTANCE_THRESHOLD,
           speculative_only=True),
    Metric("mean_acceptance_length", "deterministic", "higher",
           "1 + accepted tokens / verification steps, pooled over prompts", ACCEPTANCE_THRESHOLD,
           speculative_only=True),
    Metric("greedy_match", "deterministic", "higher",
           "fraction of greedy prompts whose output tokens are identical in both runs", 0.0,
           absolute=True),
    Metric("valid_outputs", "deterministic", "higher",
           "fraction of structured-output prompts (JSON, tool call, regex, choice) whose output is valid",
           0.0, absolute=True),
    Metric("errors", "deterministic", "lower", "failed samples", 0.0, absolute=True),
]
METRICS: dict[str, Metric] = {m.name: m for m in _METRIC_LIST}
DEFAULT_METRICS: tuple[str, ...] = (
    "tpot_p50", "ttft_p50", "e2e_p50", "output_tps",
    "acceptance_rate", "mean_acceptance_length", "greedy_match", "valid_outputs", "errors",
)
GATES = ("all", "deterministic", "none")
VERDICTS = ("ok", "improved", "inconclusive", "regression", "n/a")


def _items(values: list[str] | None, flag: str) -> list[str]:
    """The items of repeatable, comma-separated flag values; an empty item (`a,,b`, `,`, '') is
    a one-line error, as for run's list flags: dropping it would compare other than typed."""
    out = []
    for v in values or []:
        items = [item.strip() for item in str(v).split(",")]
        if any(not item for item in items):
            raise ConfigError(f"{flag}: empty item in {str(v)!r} (give comma-separated values, e.g. "
                              f"{flag} {'tpot_p50,ttft_p50' if flag == '--metric' else '5%,errors=1'})")
        out += items
    return out


def parse_metrics(values: list[str] | None) -> list[str]:
    """`-m tpot_p50,e2e_p50 -m errors` -> names in order, duplicates dropped; default set when
    empty. Unknown names raise a ConfigError listing the valid ones."""
    if not values:
        return list(DEFAULT_METRICS)
    out: list[str] = []
    for name in _items(values, "--metric"):
        if name not in METRICS:
            raise ConfigError(f"--metric: unknown metric {name!r}; valid: {', '.join(METRICS)}")
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError(f"--metric: no metric given; valid: {', '.join(METRICS)}")
    return out


_NUMBER = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def parse_fraction(text: str, flag: str) -> float:
    """`5%` or `0.05` -> 0.05. A bare number above 1 is refused as ambiguous (5 = 5% or 500%?)."""
    s = str(text).strip()
    pct = s.endswith("%")
    num = s[:-1].strip() if pct else s
    if not _NUMBER.match(num):
        raise ConfigError(f"{flag}: {text!r} is not a fraction (use e.g. 5% or 0.05)")
    value = float(num) / 100 if pct else float(num)
    if not math.isfinite(value):  # 1e400% overflows to inf: a gate that can never fail
        raise ConfigError(f"{flag}: {text!r} is not a finite fraction (use e.g. 5% or 0.05)")
    if not pct and value > 1:
        raise ConfigError(f"{flag}: {text!r} is ambiguous; write {num}% or {value / 100:g}")
    return value


def parse_thresholds(values: list[str] | None, metrics: list[str]) -> dict[str, float]:
    """Allowed worsening per metric. `5%` / `0.05` sets every selected timing metric;
    `NAME=VALUE` sets one metric (`errors=2` is a count, the others fractions). Later values
    win; named values win over bare ones."""
    out = {m: METRICS[m].threshold for m in metrics}
    bare: float | None = None
    named: dict[str, float] = {}
    for item in _items(values, "--max-regression"):
        if "=" in item:
            name, _, value = item.partition("=")
            name = name.strip()
            if name not in METRICS:
                raise ConfigError(f"--max-regression: unknown metric {name!r}; "
                                  f"valid: {', '.join(METRICS)}")
            if name not in metrics:
                raise ConfigError(f"--max-regression: {name} is not among the compared "
                                  f"metrics ({', '.join(metrics)}); add --metric {name}")
            if name == "errors":
                value = value.strip()
                if not value.isdigit():
                    raise ConfigError(f"--max-regression: errors={value!r} must be a whole "
                                      "number of failed samples")
                named[name] = float(value)
            else:
                named[name] = parse_fraction(value, f"--max-regression {name}")
        else:
            bare = parse_fraction(item, "--max-regression")
    if bare is not None:
        timing = [m for m in metrics if METRICS[m].kind == "timing"]
        if not timing:
            raise ConfigError("--max-regression: a bare value sets the timing metrics and none "
                              "is compared; use METRIC=VALUE, e.g. acceptance_rate=2%")
        out.update({m: bare for m in timing})
    out.update(named)
    return out
