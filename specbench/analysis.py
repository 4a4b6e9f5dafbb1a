"""Summaries of records as DataFrames: percentiles, throughput, acceptance, speedup vs the
baseline, paired bootstrap confidence intervals, and a console view of them.

Everything here reads the records columns (`specbench.records.SCHEMA`) and nothing else;
no torch, no models. Definitions:

- Latency percentiles (TTFT, TPOT, E2E, ITL) use successful samples only (no error, finish
  reason not error/cancelled) and numpy's default (linear) interpolation, as vLLM's
  benchmark does.
- Per-user output speed (`output_tps_per_user`) is the mean over requests of
  (output_tokens - 1) / (e2e_s - ttft_s) = 1 / TPOT: the decode speed one user sees once
  streaming starts (GenAI-Perf's "output token throughput per user"). Requests with fewer
  than two output tokens have no value. Requests whose decode time is under
  `MIN_DECODE_S` (1 ms: the answer arrived in one burst, so the gap measures the client's
  read loop, not decoding; a server that buffers its stream does this) are left out too and
  counted in `output_tps_per_user_excluded`, so one burst cannot turn the mean into
  thousands of tokens/s.
- Chunk ITL (`chunk_itl_p50_s`, `chunk_itl_p99_s`): percentiles of the gaps between
  token-carrying arrivals (`chunk_itl_s`), beside the per-token ITL (`itl_p50_s`, zero gaps
  inside a chunk kept).
- Total output throughput (`output_tps`) is the sum of output tokens of successful
  samples over the configuration's wall span, max(finish_s) - min(arrival_s).
- Acceptance rate and mean acceptance length are given request-weighted (mean of the
  per-request values; `_req`) and token-weighted (pooled sums; `_tok`), because long outputs
  otherwise dominate. Token-weighted mean acceptance length = 1 + sum(accepted) /
  sum(num_steps), 1.0 when nothing was drafted.
- Speedups are baseline / speculative for latencies and speculative / baseline for
  throughputs, so > 1 always means the speculative configuration is faster.
- The paired speedup (`paired_bootstrap_speedup`) compares a configuration with its baseline
  prompt by prompt: each prompt's value is the mean over its repeats (`--repeats`), and a
  percentile bootstrap resamples whole prompts (a cluster bootstrap). Its interval therefore
  covers which prompts happened to be measured and, through each prompt's repeats, the
  run-to-run noise of measuring that prompt again. Drift of the machine that hits every
  configuration alike is cancelled by interleaving them (specbench.runner.run_plan), not
  covered by the interval; a drift that hits one configuration only is what `--repeats`
  with interleaving turns into noise the interval sees.
- Whether speculation pays has one definition everywhere (`outcome`): it pays ("win") when
  the whole interval lies above the minimum speedup (1 unless stated), loses when it lies
  below 1, and is "even" otherwise ("unclear" without an interval).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from specbench.errors import RecordsError

GROUP_KEYS = ["config_id", "method", "num_speculative_tokens", "concurrency"]
PERCENTILES = (50, 95, 99)
_LATENCIES = ("ttft", "tpot", "e2e")
_FAILED_REASONS = ("error", "cancelled")
MIN_DECODE_S = 1e-3  # below this a request's decode time is a burst, not a measurable rate


def ok_mask(df: pd.DataFrame) -> pd.Series:
    """Samples that completed: no error message and not finished by error or cancellation."""
    return df["error"].isna() & ~df["finish_reason"].isin(_FAILED_REASONS)


def _pct(values: pd.Series | np.ndarray, q: float) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den and not np.isnan(den) else float("nan")


def _summarize_group(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[ok_mask(g)]
    rate = g["request_rate"].iloc[0]
    row: dict[str, Any] = {
        "is_baseline": bool(g["is_baseline"].iloc[0]),
        "request_rate": float("nan") if pd.isna(rate) else float(rate),
        "n": len(g),
        "errors": int(len(g) - len(ok)),
    }
    for name in _LATENCIES:
        for q in PERCENTILES:
            row[f"{name}_p{q}_s"] = _pct(ok[f"{name}_s"], q)
    itl = np.concatenate([np.asarray(x, dtype=float) for x in ok["itl_s"]]) if len(ok) else np.array([])
    for q in (50, 99):
        row[f"itl_p{q}_s"] = _pct(itl, q)
    chunks = [np.asarray(x, dtype=float) for x in ok["chunk_itl_s"] if x is not None and len(x)]
    chunk_itl = np.concatenate(chunks) if chunks else np.array([])
    for q in (50, 99):
        row[f"chunk_itl_p{q}_s"] = _pct(chunk_itl, q)

    multi = ok[ok["output_tokens"] >= 2]
    decode_s = multi["e2e_s"] - multi["ttft_s"]
    measurable = decode_s >= MIN_DECODE_S
    per_user = (multi["output_tokens"] - 1)[measurable] / decode_s[measurable]
    row["output_tps_per_user"] = float(per_user.mean()) if len(per_user) else float("nan")
    row["output_tps_per_user_excluded"] = int((~measurable & decode_s.notna()).sum())

    wall = float(ok["finish_s"].max() - ok["arrival_s"].min()) if len(ok) else float("nan")
    row["wall_s"] = wall
    row["output_tokens"] = int(ok["output_tokens"].sum())
    row["output_tps"] = _ratio(row["output_tokens"], wall) if wall > 0 else float("nan")
    row["requests_per_s"] = _ratio(len(ok), wall) if wall > 0 else float("nan")

    drafted = int(ok["drafted_tokens"].sum())
    accepted = int(ok["accepted_tokens"].sum())
    steps = int(ok["num_steps"].sum())
    row["drafted_tokens"] = drafted
    row["accepted_tokens"] = accepted
    row["acceptance_rate_tok"] = _ratio(accepted, drafted)
    rates = ok["acceptance_rate"].dropna()
    row["acceptance_rate_req"] = float(rates.mean()) if len(rates) else float("nan")
    row["mean_acceptance_length_tok"] = (
        1.0 + accepted / steps if steps else 1.0 if len(ok) else float("nan"))
    mal = ok["mean_acceptance_length"].dropna()
    row["mean_acceptance_length_req"] = float(mal.mean()) if len(mal) else float("nan")

    match = g["token_match_rate"].dropna()
    row["token_match_rate_mean"] = float(match.mean()) if len(match) else float("nan")
    peak = g["peak_memory_bytes"].dropna()
    row["peak_memory_bytes"] = float(peak.max()) if len(peak) else float("nan")
    return row


SUMMARY_COLUMNS = [
    *GROUP_KEYS, "is_baseline", "request_rate", "n", "errors",
    *(f"{name}_p{q}_s" for name in _LATENCIES for q in PERCENTILES),
    "itl_p50_s", "itl_p99_s", "chunk_itl_p50_s", "chunk_itl_p99_s", "output_tps_per_user",
    "output_tps_per_user_excluded", "wall_s", "output_tokens", "output_tps",
    "requests_per_s", "drafted_tokens", "accepted_tokens", "acceptance_rate_tok",
    "acceptance_rate_req", "mean_acceptance_length_tok", "mean_acceptance_length_req",
    "token_match_rate_mean", "peak_memory_bytes",
]


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (config_id, method, num_speculative_tokens, concurrency), in order of first
    appearance, with `SUMMARY_COLUMNS`. Units are in the names (`_s`, `_bytes`,
    `tps` = output tokens per second); `n` counts samples, `errors` failed ones."""
    rows = []
    for key, g in df.groupby(GROUP_KEYS, sort=False, dropna=False):
        rows.append({**dict(zip(GROUP_KEYS, key)), **_summarize_group(g)})
    out = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    assert not rows or set(rows[0]) == set(SUMMARY_COLUMNS)
    return out


def _same_rate(a: Any, b: Any) -> bool:
    a_na, b_na = pd.isna(a), pd.isna(b)
    return (a_na and b_na) or (not a_na and not b_na and float(a) == float(b))


def speedups(summary: pd.DataFrame) -> pd.DataFrame:
    """For each speculative row of `summary`, ratios against the baseline row
    (`is_baseline`) at the same concurrency and request rate; > 1 = faster.

    Columns: config_id, method, num_speculative_tokens, concurrency, baseline_config_id,
    tpot_p50_speedup, e2e_p50_speedup (baseline / speculative), output_tps_speedup,
    output_tps_per_user_speedup (speculative / baseline). NaN where no baseline matches.
    """
    cols = GROUP_KEYS + ["baseline_config_id", "tpot_p50_speedup", "e2e_p50_speedup",
                         "output_tps_speedup", "output_tps_per_user_speedup"]
    base = summary[summary["is_baseline"]]
    rows = []
    for _, s in summary[~summary["is_baseline"]].iterrows():
        match = base[(base["concurrency"] == s["concurrency"])
                     & base["request_rate"].map(lambda r: _same_rate(r, s["request_rate"]))]
        out = {k: s[k] for k in GROUP_KEYS}
        if len(match):
            b = match.iloc[0]
            out.update(
                baseline_config_id=b["config_id"],
                tpot_p50_speedup=_ratio(b["tpot_p50_s"], s["tpot_p50_s"]),
                e2e_p50_speedup=_ratio(b["e2e_p50_s"], s["e2e_p50_s"]),
                output_tps_speedup=_ratio(s["output_tps"], b["output_tps"]),
                output_tps_per_user_speedup=_ratio(s["output_tps_per_user"], b["output_tps_per_user"]),
            )
        else:
            out.update(baseline_config_id=None, tpot_p50_speedup=np.nan, e2e_p50_speedup=np.nan,
                       output_tps_speedup=np.nan, output_tps_per_user_speedup=np.nan)
        rows.append(out)
    return pd.DataFrame(rows, columns=cols)


_STATS: dict[str, Callable[..., Any]] = {"median": np.median, "mean": np.mean}


def _per_prompt(df: pd.DataFrame, metric: str) -> pd.Series:
    ok = df[ok_mask(df)]
    # Repeated samples of one prompt are averaged so each prompt is one pair.
    return ok.groupby("prompt_id")[metric].mean().dropna()


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
    used, and each bootstrap replicate resamples whole pairs, so prompt difficulty cancels.
    Returns (point, lo, hi).
    """
    if stat not in _STATS:
        raise ValueError(f"stat must be one of {', '.join(_STATS)}, got {stat!r}")
    f = _STATS[stat]
    base = _per_prompt(df_base, metric)
    spec = _per_prompt(df_spec, metric)
    shared = base.index.intersection(spec.index)
    if len(shared) < 2:
        raise RecordsError(
            f"paired bootstrap needs at least 2 prompts with a {metric} value in both runs; "
            f"found {len(shared)} shared prompt id(s)"
        )
    b = base.loc[shared].to_numpy(dtype=float)
    s = spec.loc[shared].to_numpy(dtype=float)
    point = _ratio(f(b), f(s))
    rng = np.random.default_rng(seed)
    n = len(shared)
    ratios = np.empty(n_boot)
    chunk = max(1, 2_000_000 // n)  # bounded memory for large prompt sets
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[start:stop] = f(b[idx], axis=1) / f(s[idx], axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.nanquantile(ratios, [alpha, 1.0 - alpha])
    return point, float(lo), float(hi)


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
                             "paired_prompts", "outcome"]


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
        pairs = 0
        if r["baseline_config_id"] is not None and not pd.isna(r["baseline_config_id"]):
            base, spec = by_config[r["baseline_config_id"]], by_config[r["config_id"]]
            pairs = len(_per_prompt(base, "tpot_s").index.intersection(_per_prompt(spec, "tpot_s").index))
            try:
                point, lo, hi = paired_bootstrap_speedup(base, spec, "tpot_s", "median", n_boot, seed, confidence)
            except RecordsError:
                point = r["tpot_p50_speedup"]
        out.update(tpot_speedup=point, tpot_speedup_lo=lo, tpot_speedup_hi=hi, paired_prompts=pairs,
                   outcome=outcome(point, lo, hi, min_speedup))
        rows.append(out)
    return pd.DataFrame(rows, columns=VERDICT_KEYS)


def per_position_acceptance(df: pd.DataFrame, k: int | None = None) -> np.ndarray:
    """acceptance[i] = verification steps whose i-th draft token was accepted / steps,
    pooled over all rows of `df` (pass one configuration). Length `k`, by default the largest
    `num_speculative_tokens` in `df`; empty when no step proposed drafts."""
    per_step = [np.asarray(x, dtype=int) for x in df["accepted_per_step"] if len(x)]
    if k is None:
        k = int(df["num_speculative_tokens"].max()) if len(df) else 0
    if not per_step or k <= 0:
        return np.zeros(0)
    accepted = np.concatenate(per_step)
    positions = np.arange(k)
    # Acceptance is a prefix: a step that accepted a tokens accepted positions 0..a-1.
    return (accepted[:, None] > positions[None, :]).sum(axis=0) / len(accepted)


# --------------------------------------------------------------------------------------
# Console view


def _ms(seconds: float) -> str:
    """Milliseconds with about three significant digits: 1234, 123, 12.3, 1.23."""
    if pd.isna(seconds):
        return "–"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def _ms3(row: pd.Series, name: str) -> str:
    return " / ".join(_ms(row[f"{name}_p{q}_s"]) for q in PERCENTILES)


def _num(v: Any, fmt: str) -> str:
    return "–" if v is None or pd.isna(v) else format(v, fmt)


def acceptance_cells(row: pd.Series, stats: dict[str, Any] | None) -> tuple[str, str, str]:
    """(accept rate, accept length, scope) as the console shows them for one summary row.

    Per-request figures (records' acceptance columns: the embedded engine, `specbench serve`,
    vLLM with --per-request-spec-decode-metrics) read "tok / req" with scope `request`;
    without them, the server's /metrics deltas for the configuration (`stats`, the run's
    configuration_stats entry) with scope `server`. Nothing measured reads "–", never a
    baseline-looking 1.00; baselines draft nothing and read "–" too."""
    if row["is_baseline"]:
        return "–", "–", "–"
    if row["drafted_tokens"] and row["drafted_tokens"] > 0:
        return (f"{_num(row['acceptance_rate_tok'], '.2f')} / {_num(row['acceptance_rate_req'], '.2f')}",
                f"{_num(row['mean_acceptance_length_tok'], '.2f')} / "
                f"{_num(row['mean_acceptance_length_req'], '.2f')}", "request")
    srv = (stats or {}).get("server_spec_decode") or {}
    if srv.get("num_drafts"):
        return (_num(srv.get("acceptance_rate"), ".3f"), _num(srv.get("mean_acceptance_length"), ".2f"),
                "server")
    return "–", "–", "none"


def rich_summary_table(summary: pd.DataFrame, speedups: pd.DataFrame,
                       configuration_stats: dict[str, dict] | None = None) -> Table:
    """Console view of `summary` and `speedups`: a latency table above a throughput and
    speculation table, wrapped in one borderless grid so each stays under 120 columns.
    `configuration_stats` (run.json's, by config_id) supplies server-wide acceptance where
    the records hold none (see `acceptance_cells`)."""
    latency = Table(title="Latency (ms: p50 / p95 / p99)", title_justify="left")
    latency.add_column("config", overflow="fold")
    latency.add_column("conc", justify="right")
    latency.add_column("n", justify="right")
    latency.add_column("err", justify="right")
    latency.add_column("TTFT", justify="right")
    latency.add_column("TPOT", justify="right")
    latency.add_column("E2E", justify="right")

    spec = Table(title="Throughput and speculation", title_justify="left")
    spec.add_column("config", overflow="fold")
    spec.add_column("conc", justify="right")
    spec.add_column("tok/s\nper user", justify="right")
    spec.add_column("tok/s\ntotal", justify="right")
    spec.add_column("accept rate\ntok / req", justify="right")
    spec.add_column("accept len\ntok / req", justify="right")
    spec.add_column("accept\nscope")
    spec.add_column("speedup\nTPOT", justify="right")
    spec.add_column("speedup\ntok/s", justify="right")
    spec.add_column("peak\nMiB", justify="right")

    sp = speedups.set_index("config_id") if len(speedups) else None
    for _, r in summary.iterrows():
        latency.add_row(str(r["config_id"]), str(r["concurrency"]), str(r["n"]),
                        str(r["errors"]), _ms3(r, "ttft"), _ms3(r, "tpot"), _ms3(r, "e2e"))
        if r["is_baseline"]:
            tpot_x = tps_x = "1.00"
        elif sp is not None and r["config_id"] in sp.index:
            x = sp.loc[r["config_id"]]
            if isinstance(x, pd.DataFrame):  # same config_id at several concurrencies
                x = x[x["concurrency"] == r["concurrency"]].iloc[0]
            tpot_x, tps_x = _num(x["tpot_p50_speedup"], ".2f"), _num(x["output_tps_speedup"], ".2f")
        else:
            tpot_x = tps_x = "–"
        peak = r["peak_memory_bytes"]
        per_user = _num(r["output_tps_per_user"], ".1f")
        excluded = r.get("output_tps_per_user_excluded")
        if excluded is not None and not pd.isna(excluded) and int(excluded):
            per_user += f" ({int(excluded)} burst)"
        rate, length, scope = acceptance_cells(r, (configuration_stats or {}).get(str(r["config_id"])))
        spec.add_row(
            str(r["config_id"]),
            str(r["concurrency"]),
            per_user,
            _num(r["output_tps"], ".1f"),
            rate,
            length,
            scope,
            tpot_x,
            tps_x,
            _num(peak / 2**20 if not pd.isna(peak) else peak, ".0f"),
        )

    grid = Table.grid(padding=(1, 0))
    grid.add_column()
    grid.add_row(latency)
    grid.add_row(spec)
    return grid


def burst_lines(summary: pd.DataFrame) -> list[str]:
    """One line per configuration with requests left out of tok/s per user (decode < 1 ms)."""
    lines = []
    for _, r in summary.iterrows():
        k = r.get("output_tps_per_user_excluded")
        if k is not None and not pd.isna(k) and int(k):
            lines.append(f"{r['config_id']}: {int(k)} of {int(r['n'] - r['errors'])} request(s) left out of "
                         f"tok/s per user: their answer arrived in one burst (decode time under "
                         f"{MIN_DECODE_S * 1e3:g} ms), so no per-user rate can be measured")
    return lines


def where_speculation_pays(verdicts: pd.DataFrame) -> list[str]:
    """One sentence per speculative method and k (from `speedup_verdicts`): at which
    concurrency levels it pays (the paired TPOT speedup's whole interval above the minimum),
    and from which level on it stops."""
    lines = []
    for (method, k), grp in verdicts.groupby(["method", "num_speculative_tokens"], sort=True):
        grp = grp.sort_values("concurrency")
        levels = [(int(c), o, p, lo, hi) for c, o, p, lo, hi in zip(
            grp["concurrency"], grp["outcome"], grp["tpot_speedup"], grp["tpot_speedup_lo"], grp["tpot_speedup_hi"])]
        pays = [c for c, o, *_ in levels if o == "win"]
        after = [c for c, o, *_ in levels if o != "win" and pays and c > max(pays)]
        if levels and len(pays) == len(levels):
            verdict = "pays at every concurrency measured"
        elif not pays:
            verdict = "does not pay at any concurrency measured"
        elif after:
            verdict = f"pays up to concurrency {max(pays)} and stops paying from {min(after)}"
        else:
            verdict = f"pays at concurrency {', '.join(map(str, pays))} only"

        def level(c, o, p, lo, hi):
            word = {"win": "pays", "loss": "loses", "even": "even", "unclear": "unclear"}[o]
            ci = f" [{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
            return f"c{c} {p:.2f}x{ci} {word}" if np.isfinite(p) else f"c{c} no baseline"

        detail = ", ".join(level(*x) for x in levels)
        lines.append(f"{method} k={int(k)}: {verdict} (TPOT speedup vs baseline, 95% CI: {detail})")
    return lines
