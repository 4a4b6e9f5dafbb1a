"""Regression gate: compare a current run against a baseline run, per configuration, and
say whether it got worse.

The point of the gate is to compare a *change* (target or draft model, engine version,
dtype, k, method), so only the measurement setup has to match; everything else is reported.

- Must match, else "not comparable" (exit 2, naming the difference): the workload (name and
  kind), the prompt ids of every compared configuration, each prompt's sampling
  (temperature, top_p, top_k, seed, max_new_tokens), the run flags that change what is
  generated (ignore_eos, chat_template, truncate; the run seed when request seeds are
  derived from it), and the configurations (config_id = method, k, concurrency, rate).
  `allow_config_diff` compares the configurations present in both runs and pairs the rest
  by (baseline or not, concurrency, request rate) when that is unambiguous, so
  `draft_model-k4-c1` vs `draft_model-k5-c1` (a change of k) can be gated too.
- May differ, reported as information: target and draft models, dtype, device, backend,
  package versions, git revision, host, warm-up.

Metrics come in two kinds:

- timing (`tpot_p50`, `ttft_p50`, `e2e_p50`, `output_tps`, ...): noisy, so each is decided
  with a paired bootstrap over the shared prompt ids (`analysis.paired_bootstrap_speedup`,
  ratio current / baseline of a statistic of the per-prompt values). A regression needs
  both: the point estimate worse than the allowed regression, and the confidence interval's
  better end still worse than `min_effect` (the change is real, not noise). Worse than
  allowed but not significant is "inconclusive" and does not fail.
- deterministic (`acceptance_rate`, `mean_acceptance_length`, `greedy_match`, `errors`):
  with fixed models and seeds these repeat exactly on one machine, so they are compared as
  values with a tight tolerance: a drafter change that lowers acceptance is a regression
  even when timing noise hides it. `greedy_match` (greedy outputs identical token for token)
  is only gated when the target model and dtype are the same in both runs.

Change is always the relative change of the metric's value, current / baseline - 1 (absolute
for `greedy_match`, in fraction of prompts, and `errors`, in samples); "worse" takes the
metric's direction into account (a higher TPOT, a lower acceptance rate).

Boundary: this module reads records DataFrames and run metadata (`records.read_run`) and
returns a `Comparison`; renderers turn it into JSON, JUnit XML, Markdown or a rich table.
Only `specbench.cli.compare` prints and picks the exit code (`Comparison.exit_code`).
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table
from rich.text import Text

from specbench import analysis
from specbench.errors import ConfigError, RecordsError, SpecbenchError


class NotComparableError(SpecbenchError):
    """The two runs measured different things (workload, prompts, sampling, configurations)."""


# --------------------------------------------------------------------------------------
# Metrics


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
    Metric("acceptance_rate", "deterministic", "higher",
           "accepted / drafted tokens, pooled over prompts", ACCEPTANCE_THRESHOLD,
           speculative_only=True),
    Metric("mean_acceptance_length", "deterministic", "higher",
           "1 + accepted tokens / verification steps, pooled over prompts", ACCEPTANCE_THRESHOLD,
           speculative_only=True),
    Metric("greedy_match", "deterministic", "higher",
           "fraction of greedy prompts whose output tokens are identical in both runs", 0.0,
           absolute=True),
    Metric("errors", "deterministic", "lower", "failed samples", 0.0, absolute=True),
]
METRICS: dict[str, Metric] = {m.name: m for m in _METRIC_LIST}
DEFAULT_METRICS: tuple[str, ...] = (
    "tpot_p50", "ttft_p50", "e2e_p50", "output_tps",
    "acceptance_rate", "mean_acceptance_length", "greedy_match", "errors",
)
GATES = ("all", "deterministic", "none")
VERDICTS = ("ok", "improved", "inconclusive", "regression", "n/a")


def parse_metrics(values: list[str] | None) -> list[str]:
    """`-m tpot_p50,e2e_p50 -m errors` -> names in order, duplicates dropped; default set when
    empty. Unknown names raise a ConfigError listing the valid ones."""
    if not values:
        return list(DEFAULT_METRICS)
    out: list[str] = []
    for v in values:
        for name in str(v).split(","):
            name = name.strip()
            if not name:
                continue
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
    for v in values or []:
        for item in str(v).split(","):
            item = item.strip()
            if not item:
                continue
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


# --------------------------------------------------------------------------------------
# Results


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


# --------------------------------------------------------------------------------------
# Comparability


_SAMPLING = ("temperature", "top_p", "top_k", "seed", "max_new_tokens")
_SETUP_FLAGS = ("ignore_eos", "chat_template", "truncate")


def _fmt_ids(ids: list[str], limit: int = 3) -> str:
    ids = sorted(ids)
    shown = ", ".join(ids[:limit])
    return shown + (f", … ({len(ids) - limit} more)" if len(ids) > limit else "")


def _same(a: Any, b: Any) -> bool:
    a_na = a is None or (isinstance(a, float) and math.isnan(a))
    b_na = b is None or (isinstance(b, float) and math.isnan(b))
    if a_na or b_na:
        return a_na and b_na
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _py(v: Any) -> Any:
    """numpy / pandas scalars -> plain Python; NaN -> None."""
    if v is None:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _config_keys(df: pd.DataFrame) -> dict[str, tuple]:
    """config_id -> (is_baseline, concurrency, request_rate), in order of appearance."""
    out: dict[str, tuple] = {}
    for cid, g in df.groupby("config_id", sort=False):
        r = g.iloc[0]
        rate = _py(r["request_rate"])
        out[str(cid)] = (bool(r["is_baseline"]), int(r["concurrency"]), rate)
    return out


def pair_configs(base: dict[str, tuple], cur: dict[str, tuple],
                 allow_diff: bool) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(pairs, only in baseline, only in current). Same ids pair up; with `allow_diff` the
    leftovers pair by (is_baseline, concurrency, rate) when exactly one is left on each side."""
    pairs = [(c, c) for c in base if c in cur]
    left_b = [c for c in base if c not in cur]
    left_c = [c for c in cur if c not in base]
    if allow_diff:
        for key in dict.fromkeys(base[c] for c in left_b):
            bs = [c for c in left_b if base[c] == key]
            cs = [c for c in left_c if cur[c] == key]
            if len(bs) == 1 and len(cs) == 1:
                pairs.append((bs[0], cs[0]))
                left_b.remove(bs[0])
                left_c.remove(cs[0])
    return pairs, left_b, left_c


def _unique(df: pd.DataFrame, col: str) -> list[Any]:
    return sorted({_py(v) for v in df[col].unique()}, key=str)


def setup_differences(base_df: pd.DataFrame, base_meta: dict, cur_df: pd.DataFrame,
                      cur_meta: dict, pairs: list[tuple[str, str]]) -> list[str]:
    """Reasons the runs did not measure the same thing (empty when they did)."""
    reasons: list[str] = []
    for col in ("workload", "workload_kind"):
        b, c = _unique(base_df, col), _unique(cur_df, col)
        if b != c:
            show = lambda v: ", ".join(map(repr, v))  # noqa: E731
            reasons.append(f"{col} differs (baseline {show(b)}, current {show(c)})")

    # prompt ids, per compared configuration; identical differences are reported once
    by_diff: dict[tuple, list[str]] = {}
    for bc, cc in pairs:
        b = set(base_df.loc[base_df["config_id"] == bc, "prompt_id"])
        c = set(cur_df.loc[cur_df["config_id"] == cc, "prompt_id"])
        if b != c:
            key = (tuple(sorted(b - c)), tuple(sorted(c - b)))
            by_diff.setdefault(key, []).append(bc if bc == cc else f"{bc} -> {cc}")
    for (only_b, only_c), cfgs in by_diff.items():
        parts = []
        if only_b:
            parts.append(f"{len(only_b)} only in baseline ({_fmt_ids(list(only_b))})")
        if only_c:
            parts.append(f"{len(only_c)} only in current ({_fmt_ids(list(only_c))})")
        reasons.append(f"prompt ids differ in {', '.join(cfgs)}: {'; '.join(parts)}")
    for name, meta in (("baseline", base_meta), ("current", cur_meta)):
        if by_diff and meta.get("status") not in (None, "complete"):
            reasons.append(f"the {name} run is {meta.get('status')} (it did not finish)")

    # sampling of each shared prompt
    b_s = base_df.groupby("prompt_id")[list(_SAMPLING)].first()
    c_s = cur_df.groupby("prompt_id")[list(_SAMPLING)].first()
    shared = b_s.index.intersection(c_s.index)
    for col in _SAMPLING:
        bad = [p for p in shared if not _same(_py(b_s.at[p, col]), _py(c_s.at[p, col]))]
        if bad:
            p = sorted(bad)[0]
            reasons.append(f"sampling differs: {col} on {len(bad)} prompt(s) (e.g. {p}: "
                           f"baseline {_py(b_s.at[p, col])}, current {_py(c_s.at[p, col])})")

    bcfg, ccfg = base_meta.get("config") or {}, cur_meta.get("config") or {}
    flags = list(_SETUP_FLAGS)
    if base_df["seed"].isna().any() or cur_df["seed"].isna().any():
        flags.append("seed")  # request seeds are derived from the run seed and the prompt id
    for key in flags:
        if key in bcfg and key in ccfg and not _same(bcfg[key], ccfg[key]):
            reasons.append(f"run setting {key} differs (baseline {bcfg[key]!r}, "
                           f"current {ccfg[key]!r})")
    return reasons


def _info_fields(meta: dict) -> dict[str, Any]:
    cfg = meta.get("config") or {}
    out = {
        "target": cfg.get("target"),
        "draft": cfg.get("draft"),
        "ngram": cfg.get("ngram") if cfg.get("method") == "ngram" else None,
        "dtype": cfg.get("dtype_resolved", cfg.get("dtype")),
        "device": meta.get("device"),
        "backend": cfg.get("backend"),
        "warmup": cfg.get("warmup"),
        "git_revision": meta.get("git_revision"),
        "hostname": meta.get("hostname"),
    }
    for name, version in sorted((meta.get("versions") or {}).items()):
        out[f"{name} version"] = version
    return out


def info_differences(base_meta: dict, cur_meta: dict) -> list[dict[str, Any]]:
    """What may differ (the change under test, the machine), as {field, baseline, current}."""
    b, c = _info_fields(base_meta), _info_fields(cur_meta)
    return [{"field": k, "baseline": b.get(k), "current": c.get(k)}
            for k in dict.fromkeys([*b, *c]) if not _same(b.get(k), c.get(k))]


# --------------------------------------------------------------------------------------
# Deciding


def _per_prompt(df: pd.DataFrame, column: str) -> pd.Series:
    """Successful samples' values by prompt id (repeats averaged, as analysis pairs them)."""
    ok = df[analysis.ok_mask(df)]
    return ok.groupby("prompt_id")[column].mean().dropna()


def _with_derived(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    e2e = df["e2e_s"].astype(float)
    df["_output_tps"] = df["output_tokens"].astype(float) / e2e.where(e2e > 0)
    return df


def _worse(change: float, better: str) -> float:
    return change if better == "lower" else -change


def _timing(metric: Metric, b: pd.DataFrame, c: pd.DataFrame, threshold: float,
            min_effect: float, n_boot: int, seed: int, confidence: float) -> dict[str, Any]:
    col = metric.column
    bv = _per_prompt(b, col)
    cv = _per_prompt(c, col)
    shared = bv.index.intersection(cv.index)
    n = len(shared)
    f = np.median if metric.stat == "median" else np.mean
    base_val = float(f(bv.loc[shared])) if n else float("nan")
    cur_val = float(f(cv.loc[shared])) if n else float("nan")
    out: dict[str, Any] = {"baseline": base_val, "current": cur_val, "n": n}
    try:
        # paired_bootstrap_speedup(x, y) = stat(x) / stat(y) with pairs resampled by prompt:
        # passing (current, baseline) gives the ratio current / baseline and its interval.
        point, lo, hi = analysis.paired_bootstrap_speedup(
            c, b, metric=col, stat=metric.stat, n_boot=n_boot, seed=seed, confidence=confidence)
    except RecordsError:
        return {**out, "verdict": "n/a", "note": f"needs >= 2 prompts with a value in both "
                f"runs, found {n}"}
    if not all(map(np.isfinite, (point, lo, hi))):
        return {**out, "verdict": "n/a", "note": "not finite (zero or missing baseline values)"}
    change, ci = point - 1.0, (lo - 1.0, hi - 1.0)
    worse = _worse(change, metric.better)
    # the end of the interval most favourable to "no regression"
    worse_low = min(_worse(ci[0], metric.better), _worse(ci[1], metric.better))
    worse_high = max(_worse(ci[0], metric.better), _worse(ci[1], metric.better))
    if worse > threshold and worse_low > min_effect:
        verdict, note = "regression", ""
    elif worse > threshold:
        verdict = "inconclusive"
        note = (f"not significant: at the CI's better end {worse_low * 100:+.1f}% worse, "
                f"under the {min_effect * 100:g}% min effect")
    elif -worse > threshold and -worse_high > min_effect:
        verdict, note = "improved", ""
    else:
        verdict, note = "ok", ""
    return {**out, "change": change, "ci_low": ci[0], "ci_high": ci[1], "verdict": verdict,
            "note": note}


def _acceptance(metric: Metric, b: pd.DataFrame, c: pd.DataFrame, shared: list[str],
                threshold: float) -> dict[str, Any]:
    col = {"acceptance_rate": "acceptance_rate_tok",
           "mean_acceptance_length": "mean_acceptance_length_tok"}[metric.name]
    if not shared:
        return {"baseline": None, "current": None, "n": 0, "verdict": "n/a",
                "note": "no prompt succeeded in both runs"}
    # one configuration each, so summarize() gives one row: pooled (token-weighted) figures
    bs = analysis.summarize(b[b["prompt_id"].isin(shared)]).iloc[0]
    cs = analysis.summarize(c[c["prompt_id"].isin(shared)]).iloc[0]
    base_val, cur_val = float(bs[col]), float(cs[col])
    out: dict[str, Any] = {"baseline": base_val, "current": cur_val, "n": len(shared)}
    if bs["drafted_tokens"] == 0 or not np.isfinite(base_val):
        return {**out, "verdict": "n/a", "note": "nothing was drafted in the baseline"}
    if not np.isfinite(cur_val):
        cur_val = 0.0 if metric.name == "acceptance_rate" else 1.0  # drafted nothing at all
        out["current"] = cur_val
    change = cur_val / base_val - 1.0
    worse = _worse(change, metric.better)
    verdict = ("regression" if worse > threshold + 1e-12 else
               "improved" if -worse > threshold + 1e-12 else "ok")
    return {**out, "change": change, "verdict": verdict}


def _greedy_match(b: pd.DataFrame, c: pd.DataFrame, shared: list[str],
                  threshold: float) -> dict[str, Any]:
    temps = b.groupby("prompt_id")["temperature"].first()
    greedy = [p for p in shared if temps.get(p) == 0]
    if not greedy:
        return {"baseline": None, "current": None, "n": 0, "verdict": "n/a",
                "note": "no greedy prompts"}
    bo = b.groupby("prompt_id")["output_token_ids"].first()
    co = c.groupby("prompt_id")["output_token_ids"].first()
    differ = [p for p in greedy if list(bo[p]) != list(co[p])]
    frac = 1.0 - len(differ) / len(greedy)
    change = frac - 1.0
    verdict = "regression" if -change > threshold + 1e-12 else "ok"
    note = f"{len(differ)} differ ({_fmt_ids(differ)})" if differ else ""
    return {"baseline": 1.0, "current": frac, "n": len(greedy), "change": change,
            "verdict": verdict, "note": note}


def _errors(b: pd.DataFrame, c: pd.DataFrame, prompts: set[str], threshold: float) -> dict:
    nb = int((~analysis.ok_mask(b[b["prompt_id"].isin(prompts)])).sum())
    nc = int((~analysis.ok_mask(c[c["prompt_id"].isin(prompts)])).sum())
    change = float(nc - nb)
    verdict = ("regression" if change > threshold else
               "improved" if change < 0 else "ok")
    return {"baseline": float(nb), "current": float(nc), "n": len(prompts), "change": change,
            "verdict": verdict}


def compare_runs(
    baseline: tuple[pd.DataFrame, dict],
    current: tuple[pd.DataFrame, dict],
    *,
    metrics: list[str] | tuple[str, ...] = DEFAULT_METRICS,
    thresholds: dict[str, float] | None = None,
    min_effect: float = 0.01,
    gate: str = "all",
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    allow_config_diff: bool = False,
    paths: tuple[str, str] = ("", ""),
) -> Comparison:
    """Compare two runs ((samples, metadata) as `records.read_run` returns them).

    `thresholds` maps metric -> allowed worsening (defaults: `Metric.threshold`);
    `gate` picks which metrics can fail: all, deterministic (timings are reported only) or
    none. The returned `Comparison` has `reasons` when the runs are not comparable, else
    one `MetricResult` per (configuration pair, metric)."""
    metrics = list(metrics)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ConfigError(f"--metric: unknown metric {unknown[0]!r}; valid: {', '.join(METRICS)}")
    if gate not in GATES:
        raise ConfigError(f"--gate must be one of {', '.join(GATES)}, got {gate!r}")
    if n_boot < 100:
        raise ConfigError(f"--n-boot must be >= 100 bootstrap resamples, got {n_boot}")
    if not 0.5 <= confidence < 1:
        raise ConfigError(f"--confidence must be in [0.5, 1), got {confidence}")
    if min_effect < 0:
        raise ConfigError(f"--min-effect must be >= 0, got {min_effect}")
    thr = {m: METRICS[m].threshold for m in metrics} | (thresholds or {})

    (bdf, bmeta), (cdf, cmeta) = baseline, current
    def run_info(df: pd.DataFrame, meta: dict, path: str) -> dict[str, Any]:
        run_id = meta.get("run_id") or (_py(df["run_id"].iloc[0]) if len(df) else None)
        return {"path": path, "run_id": run_id, "created_at": meta.get("created_at"),
                "status": meta.get("status")}

    comp = Comparison(
        baseline=run_info(bdf, bmeta, paths[0]), current=run_info(cdf, cmeta, paths[1]),
        settings={"metrics": metrics, "thresholds": {m: thr[m] for m in metrics},
                  "min_effect": min_effect, "gate": gate, "n_boot": n_boot, "seed": seed,
                  "confidence": confidence, "allow_config_diff": allow_config_diff},
    )
    for name, df in (("baseline", bdf), ("current", cdf)):
        if not len(df):
            comp.reasons.append(f"the {name} run has no samples")
    if comp.reasons:
        return comp
    comp.differences = info_differences(bmeta, cmeta)

    bkeys, ckeys = _config_keys(bdf), _config_keys(cdf)
    pairs, only_b, only_c = pair_configs(bkeys, ckeys, allow_config_diff)
    if not pairs:
        comp.reasons.append(f"no configuration in common (baseline: {', '.join(bkeys)}; "
                            f"current: {', '.join(ckeys)})")
    elif (only_b or only_c) and not allow_config_diff:
        parts = ([f"only in baseline: {', '.join(only_b)}"] if only_b else []) + \
                ([f"only in current: {', '.join(only_c)}"] if only_c else [])
        comp.reasons.append(f"configurations differ ({'; '.join(parts)}); pass "
                            "--allow-config-diff to compare the ones in common and pair the "
                            "rest by concurrency")
    comp.unmatched = [f"{c} (baseline only)" for c in only_b] + \
                     [f"{c} (current only)" for c in only_c]
    comp.reasons += setup_differences(bdf, bmeta, cdf, cmeta, pairs)
    if comp.reasons:
        return comp

    changed = {d["field"] for d in comp.differences}
    greedy_ungated = [f for f in ("target", "dtype") if f in changed]
    bdf, cdf = _with_derived(bdf), _with_derived(cdf)
    for bc, cc in pairs:
        b = bdf[bdf["config_id"] == bc]
        c = cdf[cdf["config_id"] == cc]
        label = bc if bc == cc else f"{bc} -> {cc}"
        speculative = not (bool(b["is_baseline"].iloc[0]) and bool(c["is_baseline"].iloc[0]))
        ok_b = set(b.loc[analysis.ok_mask(b), "prompt_id"])
        ok_c = set(c.loc[analysis.ok_mask(c), "prompt_id"])
        shared_ok = sorted(ok_b & ok_c)
        for name in metrics:
            m = METRICS[name]
            if m.speculative_only and not speculative:
                continue
            if m.kind == "timing":
                r = _timing(m, b, c, thr[name], min_effect, n_boot, seed, confidence)
            elif name in ("acceptance_rate", "mean_acceptance_length"):
                r = _acceptance(m, b, c, shared_ok, thr[name])
            elif name == "greedy_match":
                r = _greedy_match(b, c, shared_ok, thr[name])
            else:
                r = _errors(b, c, set(b["prompt_id"]), thr[name])
            gated = gate == "all" or (gate == "deterministic" and m.kind == "deterministic")
            note = r.get("note", "")
            if name == "greedy_match" and greedy_ungated:
                gated = False
                note = "; ".join(filter(None, [note, f"not gated: {' and '.join(greedy_ungated)} "
                                                     "differ"]))
            comp.results.append(MetricResult(
                config=label, baseline_config=bc, current_config=cc, metric=name, kind=m.kind,
                better=m.better, baseline=_py(r.get("baseline")), current=_py(r.get("current")),
                change=_py(r.get("change")), ci_low=_py(r.get("ci_low")),
                ci_high=_py(r.get("ci_high")), threshold=thr[name], verdict=r["verdict"],
                gated=gated, n=int(r.get("n", 0)), note=note))
    return comp


# --------------------------------------------------------------------------------------
# Rendering


def format_value(metric: str, value: float | None, n: int = 0) -> str:
    if value is None:
        return "–"
    m = METRICS[metric]
    if m.column in ("tpot_s", "ttft_s", "e2e_s"):
        ms = value * 1e3
        return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"
    if metric == "output_tps":
        return f"{value:.1f} tok/s"
    if metric == "greedy_match":
        return f"{round(value * n)}/{n}" if n else f"{value:.2f}"
    if metric == "errors":
        return f"{value:.0f}"
    return f"{value:.3f}"


def format_change(r: MetricResult) -> str:
    if r.change is None:
        return "–"
    if r.metric == "errors":
        return f"{r.change:+.0f}"
    if r.metric == "greedy_match":
        return f"{r.change * 100:+.1f} pp"
    return f"{r.change * 100:+.1f}%"


def format_ci(r: MetricResult) -> str:
    if r.ci_low is None or r.ci_high is None:
        return "–"
    return f"[{r.ci_low * 100:+.1f}%, {r.ci_high * 100:+.1f}%]"


def format_threshold(r: MetricResult) -> str:
    if r.metric == "errors":
        return f"{r.threshold:.0f}"
    if r.metric == "greedy_match":
        return f"{r.threshold * 100:g} pp"
    return f"{r.threshold * 100:g}%"


def format_verdict(r: MetricResult) -> str:
    v = r.verdict
    if v in ("regression", "inconclusive") and not r.gated:
        return f"{v} (not gated)"
    return v


def _ci_title(c: Comparison) -> str:
    return f"{c.settings['confidence']:.0%} CI"


def to_dict(c: Comparison) -> dict[str, Any]:
    """A JSON-ready dict of the comparison (NaN -> null)."""
    return {
        "outcome": c.outcome,
        "exit_code": c.exit_code,
        "comparable": c.comparable,
        "summary": c.summary(),
        "baseline": c.baseline,
        "current": c.current,
        "settings": c.settings,
        "reasons": c.reasons,
        "differences": c.differences,
        "unmatched_configurations": c.unmatched,
        "results": [{**asdict(r), "failed": r.failed} for r in c.results],
    }


def to_json(c: Comparison) -> str:
    return json.dumps(to_dict(c), indent=2, default=str) + "\n"


def to_junit(c: Comparison) -> str:
    """JUnit XML: one test case per (configuration, metric); a gated regression is a failure,
    a metric that could not be computed is skipped, runs that are not comparable are one
    errored test case."""
    suites = ET.Element("testsuites", name="specbench compare")
    suite = ET.SubElement(suites, "testsuite", name="specbench.compare")
    failures = errors = skipped = 0
    if not c.comparable:
        case = ET.SubElement(suite, "testcase", classname="specbench.compare", name="comparable")
        err = ET.SubElement(case, "error", message=c.summary(), type="NotComparable")
        err.text = "\n".join(c.reasons)
        errors += 1
    for r in c.results:
        case = ET.SubElement(suite, "testcase", classname=f"specbench.compare.{r.config}",
                             name=r.metric)
        detail = (f"{r.metric} on {r.config}: baseline {format_value(r.metric, r.baseline, r.n)}, "
                  f"current {format_value(r.metric, r.current, r.n)}, change {format_change(r)}, "
                  f"{_ci_title(c)} {format_ci(r)}, allowed {format_threshold(r)}, "
                  f"verdict {format_verdict(r)}, n {r.n}" + (f" ({r.note})" if r.note else ""))
        if r.failed:
            fail = ET.SubElement(case, "failure", message=detail, type="Regression")
            fail.text = detail
            failures += 1
        elif r.verdict == "n/a":
            ET.SubElement(case, "skipped", message=detail)
            skipped += 1
        ET.SubElement(case, "system-out").text = detail
    n = len(suite.findall("testcase"))
    for el in (suites, suite):
        el.set("tests", str(n))
        el.set("failures", str(failures))
        el.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(c: Comparison) -> str:
    """A Markdown report for a pull-request comment: outcome, a table, what differs."""
    icon = {"pass": "✅", "regression": "❌", "not comparable": "⚠️"}[c.outcome]
    s = c.settings
    lines = [f"### specbench compare: {icon} {c.outcome}", "",
             f"Baseline `{c.baseline.get('run_id')}` → current `{c.current.get('run_id')}`. "
             f"Gate: {s['gate']}; timings by paired bootstrap over prompts "
             f"({s['n_boot']} resamples, {s['confidence']:.0%} CI, min effect "
             f"{s['min_effect'] * 100:g}%).", ""]
    if c.reasons:
        lines.append("**Not comparable:**")
        lines += [f"- {_md(r)}" for r in c.reasons]
        lines.append("")
    if c.results:
        lines += [f"| config | metric | baseline | current | change | {_ci_title(c)} | allowed | "
                  "verdict |", "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in c.results:
            verdict = format_verdict(r)
            if r.failed:
                verdict = f"**{verdict}**"
            if r.note:
                verdict += f" ({_md(r.note)})"
            lines.append(f"| {_md(r.config)} | {r.metric} | "
                         f"{format_value(r.metric, r.baseline, r.n)} | "
                         f"{format_value(r.metric, r.current, r.n)} | {format_change(r)} | "
                         f"{format_ci(r)} | {format_threshold(r)} | {verdict} |")
        lines.append("")
    if c.differences:
        lines.append("**What differs** (allowed; reported for information):")
        lines += [f"- {_md(d['field'])}: `{_md(d['baseline'])}` → `{_md(d['current'])}`"
                  for d in c.differences]
        lines.append("")
    if c.unmatched:
        lines.append(f"**Not compared:** {_md(', '.join(c.unmatched))}")
        lines.append("")
    lines.append(_md(c.summary()))
    return "\n".join(lines) + "\n"


_STYLE = {"regression": "bold red", "inconclusive": "yellow", "improved": "green",
          "n/a": "dim", "ok": ""}


def rich_table(c: Comparison) -> Table:
    """Console view: config (once per group), metric, baseline, current, change, CI, allowed,
    verdict."""
    from rich import box

    t = Table(title=f"specbench compare: {c.baseline.get('run_id')} -> {c.current.get('run_id')}",
              title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("config", overflow="fold")
    t.add_column("metric", no_wrap=True)
    for name in ("baseline", "current", "change", _ci_title(c), "allowed"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("verdict", overflow="fold")
    for i, r in enumerate(c.results):
        first = i == 0 or c.results[i - 1].config != r.config
        last = i == len(c.results) - 1 or c.results[i + 1].config != r.config
        style = _STYLE[r.verdict] if r.gated or r.verdict != "regression" else "yellow"
        verdict = format_verdict(r) + (f" ({r.note})" if r.note else "")
        # Text, not markup strings: ids, notes and intervals may contain brackets
        cells = [r.config if first else "", r.metric, format_value(r.metric, r.baseline, r.n),
                 format_value(r.metric, r.current, r.n), format_change(r), format_ci(r),
                 format_threshold(r)]
        t.add_row(*map(Text, cells), Text(verdict, style=style), end_section=last)
    return t


RENDERERS = {"json": to_json, "junit": to_junit, "markdown": to_markdown}
SUFFIX_FORMATS = {".json": "json", ".xml": "junit", ".md": "markdown", ".markdown": "markdown"}
