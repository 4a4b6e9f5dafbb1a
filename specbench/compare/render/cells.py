"""The cells every renderer of a comparison shows, formatted once: a metric's value in its unit
(milliseconds, tok/s, identical/compared prompts, samples), the change (relative %, points for
`greedy_match`, a count for `errors`), the confidence interval, the allowed worsening and the
verdict (marked "not gated" when it cannot fail the comparison).

Boundary: `MetricResult` fields in, strings out.
"""

from __future__ import annotations

from specbench.compare.catalog import METRICS
from specbench.compare.result import Comparison, MetricResult
from specbench.formatting import DASH, ms


def format_value(metric: str, value: float | None, n: int = 0) -> str:
    if value is None:
        return DASH
    m = METRICS[metric]
    if m.column in ("tpot_s", "ttft_s", "e2e_s"):
        return f"{ms(value)} ms"
    if metric == "output_tps":
        return f"{value:.1f} tok/s"
    if metric == "greedy_match":
        return f"{round(value * n)}/{n}" if n else f"{value:.2f}"
    if metric == "errors":
        return f"{value:.0f}"
    return f"{value:.3f}"


def _amount(metric: str, x: float, spec: str, count_spec: str) -> str:
    """A change or an allowed worsening in the metric's terms: samples for `errors`,
    percentage points for `greedy_match`, percent of the baseline's value otherwise."""
    if metric == "errors":
        return format(x, count_spec)
    return format(x * 100, spec) + (" pp" if metric == "greedy_match" else "%")


def format_change(r: MetricResult) -> str:
    return DASH if r.change is None else _amount(r.metric, r.change, "+.1f", "+.0f")


def format_ci(r: MetricResult) -> str:
    if r.ci_low is None or r.ci_high is None:
        return DASH
    return f"[{r.ci_low * 100:+.1f}%, {r.ci_high * 100:+.1f}%]"


def format_threshold(r: MetricResult) -> str:
    return _amount(r.metric, r.threshold, "g", ".0f")


def format_verdict(r: MetricResult) -> str:
    v = r.verdict
    if v in ("regression", "inconclusive") and not r.gated:
        return f"{v} (not gated)"
    return v


def ci_title(c: Comparison) -> str:
    return f"{c.settings['confidence']:.0%} CI"
