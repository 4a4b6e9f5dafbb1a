"""Paired speedups with a bootstrap confidence interval, and the one rule for whether
speculation pays.

- The paired speedup (`paired_bootstrap_speedup`) compares a configuration with its baseline
  prompt by prompt: each prompt's value is the mean over its repeats (`--repeats`), and a
  percentile bootstrap resamples whole prompts (a cluster bootstrap). Its interval therefore
  covers which prompts happened to be measured and, through each prompt's repeats, the
  run-to-run noise of measuring that prompt again. Drift of the machine that hits every
  configuration alike is cancelled by interleaving them (specbench.runner.run_plan), not
  covered by the interval; a drift that hits one configuration only is what `--repeats`
  with interleaving turns into noise the interval sees.
- Above concurrency 1 the prompts of one block run together, under one configuration and then
  the other, so a burst of load during one of them moves the whole block's ratios at once:
  the interval then counts blocks (the records' `block`, `summary.prompt_blocks`): the
  cluster-robust (CR1) t-interval of the per-prompt log ratios over blocks, G - 1 degrees of
  freedom, around the point, as the sweep's (`analysis.sequential`). A bootstrap of a handful
  of blocks would understate it: with 2 blocks it can only mix the two, and called a run
  "pays" whenever both leaned the same way. With `--repeats` a prompt's repeats lie in
  different blocks and the prompt stays the unit.
- Whether speculation pays has one definition everywhere (`outcome`): it pays ("win") when
  the whole interval lies above the minimum speedup (1 unless stated), loses when it lies
  below 1, and is "even" otherwise ("unclear" without an interval).

Boundary: records frames in, numbers and verdict frames out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from specbench.analysis.summary import GROUP_KEYS, per_prompt, prompt_blocks, ratio, speedups, summarize
from specbench.errors import RecordsError


_STATS: dict[str, Callable[..., Any]] = {"median": np.median, "mean": np.mean}


def paired_bootstrap_speedup(
    df_base: pd.DataFrame,
    df_spec: pd.DataFrame,
    metric: str = "tpot_s",
    stat: str = "median",
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Speedup stat(base) / stat(spec) of a latency `metric` (lower is better, so > 1 means
    the speculative run is faster), with a percentile bootstrap confidence interval.

    Samples are paired by prompt_id: only prompts with a successful value in both frames are
    used, and each bootstrap replicate resamples whole pairs, so prompt difficulty cancels;
    where the speculative frame's prompts ran in blocks of several (`prompt_blocks`), the
    interval is the cluster-robust t-interval over blocks instead (module docstring).
    Returns (point, lo, hi).
    """
    if stat not in _STATS:
        raise ValueError(f"stat must be one of {', '.join(_STATS)}, got {stat!r}")
    f = _STATS[stat]
    base = per_prompt(df_base, metric)
    spec = per_prompt(df_spec, metric)
    shared = base.index.intersection(spec.index)
    if len(shared) < 2:
        raise RecordsError(
            f"paired bootstrap needs at least 2 prompts with a {metric} value in both runs; "
            f"found {len(shared)} shared prompt id(s)"
        )
    b = base.loc[shared].to_numpy(dtype=float)
    s = spec.loc[shared].to_numpy(dtype=float)
    point = ratio(f(b), f(s))
    rng = np.random.default_rng(seed)
    groups = block_groups(df_spec, shared)
    if groups is not None:
        return (point, *_block_interval(b, s, groups, point, confidence))
    ratios = _prompt_bootstrap(b, s, f, n_boot, rng)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.nanquantile(ratios, [alpha, 1.0 - alpha])
    return point, float(lo), float(hi)


def block_groups(df_spec: pd.DataFrame, shared: pd.Index) -> np.ndarray | None:
    """The block of each of the `shared` prompts where blocks, not prompts, are the unit of
    the paired interval (`summary.prompt_blocks`: two blocks or more, some holding several of
    them); None where prompts are."""
    blocks = prompt_blocks(df_spec)
    groups = None if blocks is None else blocks.reindex(shared)
    if groups is None or groups.isna().any() or groups.nunique() in (1, len(shared)):
        return None
    return groups.to_numpy()


def _prompt_bootstrap(b: np.ndarray, s: np.ndarray, f: Callable[..., Any], n_boot: int,
                      rng: np.random.Generator) -> np.ndarray:
    n = len(b)
    ratios = np.empty(n_boot)
    chunk = max(1, 2_000_000 // n)  # bounded memory for large prompt sets
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[start:stop] = f(b[idx], axis=1) / f(s[idx], axis=1)
    return ratios


def _block_interval(b: np.ndarray, s: np.ndarray, groups: np.ndarray, point: float,
                    confidence: float) -> tuple[float, float]:
    """The CR1 t-interval over blocks of the per-prompt log ratios, around `point`."""
    from specbench.analysis.sequential import half_width

    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(b / s)
    keep = np.isfinite(d)
    d, groups = d[keep], groups[keep]
    if len(np.unique(groups)) < 2 or not (np.isfinite(point) and point > 0):
        return float("nan"), float("nan")
    half = half_width(d, groups, 1.0 - confidence)
    return point * float(np.exp(-half)), point * float(np.exp(half))


def outcome(point: float, lo: float, hi: float, min_speedup: float = 1.0) -> str:
    """win | loss | even | unclear for a speedup with its confidence interval: a win needs
    the whole interval above `min_speedup`, a loss the whole interval below 1."""
    values = (point, lo, hi, min_speedup)
    if any(v is None or not np.isfinite(float(v)) for v in values):
        return "unclear"
    if lo > min_speedup:
        return "win"
    if hi < 1.0:
        return "loss"
    return "even"


VERDICT_KEYS = GROUP_KEYS + ["baseline_config_id", "tpot_speedup", "tpot_speedup_lo", "tpot_speedup_hi",
                             "paired_prompts", "paired_blocks", "outcome"]


def speedup_verdicts(df: pd.DataFrame, *, min_speedup: float = 1.0, n_boot: int = 2000, seed: int = 0,
                     confidence: float = 0.95) -> pd.DataFrame:
    """For each speculative configuration of a run, the paired TPOT speedup over the baseline
    at the same concurrency and request rate, its interval and its `outcome` (`VERDICT_KEYS`)."""
    summary = summarize(df)
    sp = speedups(summary)
    by_config = {cid: g for cid, g in df.groupby("config_id", sort=False)}
    rows = []
    for _, r in sp.iterrows():
        out = {k: r[k] for k in GROUP_KEYS + ["baseline_config_id"]}
        point = lo = hi = float("nan")
        pairs, blocks = 0, None
        if r["baseline_config_id"] is not None and not pd.isna(r["baseline_config_id"]):
            base, spec = by_config[r["baseline_config_id"]], by_config[r["config_id"]]
            shared = per_prompt(base, "tpot_s").index.intersection(per_prompt(spec, "tpot_s").index)
            pairs = len(shared)
            groups = block_groups(spec, shared)
            blocks = None if groups is None else len(np.unique(groups))  # the interval's unit
            try:
                point, lo, hi = paired_bootstrap_speedup(base, spec, "tpot_s", "median", n_boot, seed, confidence)
            except RecordsError:
                point = r["tpot_p50_speedup"]
        out.update(tpot_speedup=point, tpot_speedup_lo=lo, tpot_speedup_hi=hi, paired_prompts=pairs,
                   paired_blocks=blocks, outcome=outcome(point, lo, hi, min_speedup))
        rows.append(out)
    return pd.DataFrame(rows, columns=VERDICT_KEYS)
