"""The regression gate's decisions: for each pair of configurations (`comparable.pair_configs`)
and each metric (`catalog`), the baseline's and the current run's value, the change and a
verdict (ok, improved, inconclusive, regression, n/a).

- Timing metrics are noisy, so each is decided with a paired bootstrap over the shared prompt
  ids (`analysis.paired_bootstrap_speedup`, ratio current / baseline of a statistic of the
  per-prompt values). A regression needs both: the point estimate worse than the allowed
  regression, and the confidence interval's better end still worse than `min_effect` (the
  change is real, not noise). Worse than allowed but not significant is "inconclusive" and
  does not fail.
- Deterministic metrics (`acceptance_rate`, `mean_acceptance_length`, `greedy_match`,
  `valid_outputs`, `errors`) repeat exactly on one machine with fixed models and seeds, so they are compared as
  values with a tight tolerance: a drafter change that lowers acceptance is a regression even
  when timing noise hides it. `greedy_match` (greedy outputs identical token for token) is only
  gated when the target model and dtype are the same in both runs.

Change is always the relative change of the metric's value, current / baseline - 1 (absolute
for `greedy_match`, in fraction of prompts, and `errors`, in samples); "worse" takes the
metric's direction into account (a higher TPOT, a lower acceptance rate).

Boundary: records DataFrames and run metadata (`records.read_run`) in, a `Comparison`
(`specbench.compare.result`) out; what must match is `specbench.compare.comparable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from specbench import analysis
from specbench.compare.catalog import DEFAULT_METRICS, GATES, METRICS, Metric
from specbench.compare.comparable import comparable_pairs
from specbench.compare.exact import acceptance, errors, greedy_match, valid_outputs
from specbench.compare.result import Comparison, MetricResult
from specbench.errors import ConfigError, RecordsError
from specbench.formatting import plain


def _with_derived(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    e2e = df["e2e_s"].astype(float)
    df["_output_tps"] = df["output_tokens"].astype(float) / e2e.where(e2e > 0)
    return df


def _timing(metric: Metric, b: pd.DataFrame, c: pd.DataFrame, threshold: float,
            min_effect: float, n_boot: int, seed: int, confidence: float) -> dict[str, Any]:
    col = metric.column
    bv = analysis.per_prompt(b, col)
    cv = analysis.per_prompt(c, col)
    shared = bv.index.intersection(cv.index)
    n = len(shared)
    f = np.median if metric.stat == "median" else np.mean
    base_val = float(f(bv.loc[shared])) if n else float("nan")
    cur_val = float(f(cv.loc[shared])) if n else float("nan")
    out: dict[str, Any] = {"baseline": base_val, "current": cur_val, "n": n}
    try:
        # paired_bootstrap_speedup(x, y) = stat(x) / stat(y) with pairs resampled by prompt (a
        # t-interval over the second run's blocks above concurrency 1):
        # passing (current, baseline) gives the ratio current / baseline and its interval.
        point, lo, hi = analysis.paired_bootstrap_speedup(
            c, b, metric=col, stat=metric.stat, n_boot=n_boot, seed=seed, confidence=confidence)
    except RecordsError:
        return {**out, "verdict": "n/a", "note": f"needs >= 2 prompts with a value in both "
                f"runs, found {n}"}
    if not all(map(np.isfinite, (point, lo, hi))):
        return {**out, "verdict": "n/a", "note": "not finite (zero or missing baseline values)"}
    return _decide(point, lo, hi, metric, threshold, min_effect, out)


INTERVALS = ("prompts", "repeats")
CROSS_RUN_NOTE = (
    "timing intervals {what}: the two runs were measured at different times, so a drift of the "
    "machine between them (other jobs, clocks, thermal state) is not in them and can pass for a "
    "regression; gate a timing change with both configurations in one interleaved run "
    "(docs/ci.md){hint}")


def _repeat_stats(df: pd.DataFrame, metric: Metric) -> np.ndarray:
    """One value per repeat: the metric's statistic over the successful prompts of that
    repeat (each repeat of a run is measured at another time)."""
    ok = df[analysis.ok_mask(df)]
    f = np.median if metric.stat == "median" else np.mean
    return np.array([f(g[metric.column].dropna().to_numpy(dtype=float))
                     for _, g in ok.groupby("repeat") if g[metric.column].notna().any()])


def _timing_repeats(metric: Metric, b: pd.DataFrame, c: pd.DataFrame, threshold: float,
                    min_effect: float, confidence: float) -> dict[str, Any]:
    """current / baseline from the per-repeat statistics of each run (Welch t-interval of
    the difference of mean log statistics): an interval that also covers how much the
    statistic moves between repeats measured at different times."""
    from scipy import stats

    bs, cs = _repeat_stats(b, metric), _repeat_stats(c, metric)
    out: dict[str, Any] = {"baseline": float(np.mean(bs)) if len(bs) else float("nan"),
                           "current": float(np.mean(cs)) if len(cs) else float("nan"),
                           "n": int(min(len(bs), len(cs)))}
    if len(bs) < 2 or len(cs) < 2 or (bs <= 0).any() or (cs <= 0).any():
        return {**out, "verdict": "n/a", "note": f"--interval repeats needs >= 2 repeats with values "
                f"in each run (baseline {len(bs)}, current {len(cs)}): measure with --repeats N"}
    lb, lc = np.log(bs), np.log(cs)
    vb, vc = lb.var(ddof=1) / len(lb), lc.var(ddof=1) / len(lc)
    diff, se = float(lc.mean() - lb.mean()), float(np.sqrt(vb + vc))
    dof = (vb + vc) ** 2 / (vb**2 / (len(lb) - 1) + vc**2 / (len(lc) - 1)) if vb + vc > 0 else 1.0
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * se
    return _decide(np.exp(diff), np.exp(diff - half), np.exp(diff + half), metric, threshold,
                   min_effect, out)


def _decide(point: float, lo: float, hi: float, metric: Metric, threshold: float, min_effect: float,
            out: dict[str, Any]) -> dict[str, Any]:
    change, ci = point - 1.0, (lo - 1.0, hi - 1.0)
    worse = metric.worse(change)
    # the end of the interval most favourable to "no regression"
    worse_low = min(metric.worse(ci[0]), metric.worse(ci[1]))
    worse_high = max(metric.worse(ci[0]), metric.worse(ci[1]))
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


def _own_baseline(df: pd.DataFrame, config: pd.DataFrame) -> pd.DataFrame:
    row = config.iloc[0]
    same = df["is_baseline"] & (df["concurrency"] == row["concurrency"])
    rate = row["request_rate"]
    same &= df["request_rate"].isna() if pd.isna(rate) else (df["request_rate"] == rate)
    return df[same]


def _speedup_change(metric: Metric, bdf: pd.DataFrame, b: pd.DataFrame, cdf: pd.DataFrame,
                    c: pd.DataFrame, threshold: float, min_effect: float,
                    confidence: float) -> dict[str, Any]:
    """How each run's speedup over its own interleaved baseline changed: per prompt, the log
    speedup in the current run minus in the baseline run; a paired t-interval of its mean."""
    from scipy import stats

    from specbench.analysis.sequential import log_ratios

    def per_prompt_log_speedup(df: pd.DataFrame, cfg: pd.DataFrame) -> pd.Series:
        base = analysis.per_prompt(_own_baseline(df, cfg), metric.column)
        spec = analysis.per_prompt(cfg, metric.column)
        shared = base.index.intersection(spec.index)
        return pd.Series(log_ratios(base.loc[shared], spec.loc[shared]), index=shared)

    db, dc = per_prompt_log_speedup(bdf, b), per_prompt_log_speedup(cdf, c)
    shared = db.index.intersection(dc.index)
    e = (dc.loc[shared] - db.loc[shared]).to_numpy(dtype=float)
    e = e[np.isfinite(e)]
    out: dict[str, Any] = {"baseline": float(np.exp(db.mean())) if len(db) else float("nan"),
                           "current": float(np.exp(dc.mean())) if len(dc) else float("nan"), "n": len(e)}
    if len(e) < 2:
        return {**out, "verdict": "n/a", "note": "needs >= 2 prompts measured by the configuration and "
                "its own run's baseline in both runs"}
    half = float(stats.t.ppf(0.5 + confidence / 2, len(e) - 1)) * float(e.std(ddof=1)) / np.sqrt(len(e))
    m = float(e.mean())
    return _decide(np.exp(m), np.exp(m - half), np.exp(m + half), metric, threshold, min_effect, out)


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
    interval: str = "prompts",
) -> Comparison:
    """Compare two runs ((samples, metadata) as `records.read_run` returns them).

    `thresholds` maps metric -> allowed worsening (defaults: `Metric.threshold`);
    `gate` picks which metrics can fail: all, deterministic (timings are reported only) or
    none. The returned `Comparison` has `reasons` when the runs are not comparable, else
    one `MetricResult` per (configuration pair, metric)."""
    metrics = list(metrics)
    _check_settings(metrics, gate, n_boot, confidence, min_effect, interval)
    thr = {m: METRICS[m].threshold for m in metrics} | (thresholds or {})
    (bdf, bmeta), (cdf, cmeta) = baseline, current
    comp = Comparison(
        baseline=_run_info(bdf, bmeta, paths[0]), current=_run_info(cdf, cmeta, paths[1]),
        settings={"metrics": metrics, "thresholds": {m: thr[m] for m in metrics},
                  "min_effect": min_effect, "gate": gate, "n_boot": n_boot, "seed": seed,
                  "confidence": confidence, "allow_config_diff": allow_config_diff,
                  "interval": interval},
    )
    pairs, comp.reasons, comp.differences, comp.unmatched = comparable_pairs(bdf, bmeta, cdf, cmeta,
                                                                              allow_config_diff)
    if comp.reasons:
        return comp
    changed = {d["field"] for d in comp.differences}
    settings = _Settings(thr, min_effect, gate, n_boot, seed, confidence, interval,
                         greedy_ungated=[f for f in ("target", "dtype") if f in changed])
    bdf, cdf = _with_derived(bdf), _with_derived(cdf)
    for bc, cc in pairs:
        comp.results += _compare_pair(bdf, bc, cdf, cc, metrics, settings)
    _timing_verdicts(comp, interval)
    return comp


def _check_settings(metrics: list[str], gate: str, n_boot: int, confidence: float, min_effect: float,
                    interval: str) -> None:
    """The comparison's settings, each checked, or ConfigError naming the flag."""
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
    if interval not in INTERVALS:
        raise ConfigError(f"--interval must be one of {', '.join(INTERVALS)}, got {interval!r}")


def _run_info(df: pd.DataFrame, meta: dict, path: str) -> dict[str, Any]:
    run_id = meta.get("run_id") or (plain(df["run_id"].iloc[0]) if len(df) else None)
    return {"path": path, "run_id": run_id, "created_at": meta.get("created_at"), "status": meta.get("status")}


@dataclass
class _Settings:
    """What every metric of a comparison is judged with."""

    thresholds: dict[str, float]
    min_effect: float
    gate: str
    n_boot: int
    seed: int
    confidence: float
    interval: str
    greedy_ungated: list[str]  # run differences that make greedy outputs differ by design


def _compare_pair(bdf: pd.DataFrame, bc: str, cdf: pd.DataFrame, cc: str, metrics: list[str],
                  st: _Settings) -> list[MetricResult]:
    """One `MetricResult` per metric that applies to this configuration pair, each gated or not."""
    b = bdf[bdf["config_id"] == bc]
    c = cdf[cdf["config_id"] == cc]
    label = bc if bc == cc else f"{bc} -> {cc}"
    speculative = not (bool(b["is_baseline"].iloc[0]) and bool(c["is_baseline"].iloc[0]))
    shared_ok = sorted(set(b.loc[analysis.ok_mask(b), "prompt_id"]) & set(c.loc[analysis.ok_mask(c), "prompt_id"]))
    out = []
    for name in metrics:
        m = METRICS[name]
        if m.speculative_only and not speculative:
            continue
        r = _judge(name, m, bdf, b, cdf, c, shared_ok, st)
        gated = st.gate == "all" or (st.gate == "deterministic" and m.kind == "deterministic")
        note = r.get("note", "")
        if name == "greedy_match" and st.greedy_ungated:
            gated = False
            note = "; ".join(filter(None, [note, f"not gated: {' and '.join(st.greedy_ungated)} differ"]))
        out.append(MetricResult(
            config=label, baseline_config=bc, current_config=cc, metric=name, kind=m.kind,
            better=m.better, baseline=plain(r.get("baseline")), current=plain(r.get("current")),
            change=plain(r.get("change")), ci_low=plain(r.get("ci_low")),
            ci_high=plain(r.get("ci_high")), threshold=st.thresholds[name], verdict=r["verdict"],
            gated=gated, n=int(r.get("n", 0)), note=note))
    return out


def _judge(name: str, m: Metric, bdf: pd.DataFrame, b: pd.DataFrame, cdf: pd.DataFrame, c: pd.DataFrame,
           shared_ok: list[str], st: _Settings) -> dict[str, Any]:
    """One metric of one configuration pair, by the test its kind takes."""
    thr = st.thresholds[name]
    if name == "tpot_speedup":
        return _speedup_change(m, bdf, b, cdf, c, thr, st.min_effect, st.confidence)
    if m.kind == "timing" and st.interval == "repeats":
        return _timing_repeats(m, b, c, thr, st.min_effect, st.confidence)
    if m.kind == "timing":
        return _timing(m, b, c, thr, st.min_effect, st.n_boot, st.seed, st.confidence)
    if name in ("acceptance_rate", "mean_acceptance_length"):
        return acceptance(m, b, c, shared_ok, thr)
    if name == "greedy_match":
        return greedy_match(b, c, shared_ok, thr)
    if name == "valid_outputs":
        return valid_outputs(b, c, shared_ok, thr)
    return errors(b, c, set(b["prompt_id"]), thr)


def _timing_verdicts(comp: Comparison, interval: str) -> None:
    """What the timing verdicts can claim: a repeats gate with no repeats to gate on refuses
    the comparison; otherwise a note says what the intervals cover across two runs."""
    timed = [r for r in comp.results if r.kind == "timing" and r.metric != "tpot_speedup" and r.gated]
    if interval == "repeats" and timed and all(r.verdict == "n/a" for r in timed):
        # a gate on timings with no timing it can gate would pass whatever the runs say
        comp.reasons.append(f"--interval repeats gates {', '.join(dict.fromkeys(r.metric for r in timed))} "
                            f"from each run's repeats, but no configuration has them ({timed[0].note}); "
                            "measure both runs with --repeats N (N >= 3), or use --interval prompts")
        comp.results = []
        return
    if any(r.kind == "timing" and r.metric != "tpot_speedup" for r in comp.results):
        if interval == "prompts":
            comp.notes.append(CROSS_RUN_NOTE.format(
                what="resample prompts (count blocks above concurrency 1) and cover prompt-to-prompt noise only",
                hint="; across runs, gate -m tpot_speedup (each run's speedup over its own interleaved "
                     "baseline, which such drift does not move), or measure both runs with --repeats N "
                     "(N >= 3) and compare with --interval repeats"))
        else:
            comp.notes.append(CROSS_RUN_NOTE.format(
                what="come from the spread between repeats within each run, which covers drift "
                     "inside a run but not necessarily between the two", hint=""))
