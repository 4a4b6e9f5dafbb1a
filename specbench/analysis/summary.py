"""Summaries of records as DataFrames: one row per configuration with percentiles,
throughput, acceptance, and speedups against the baseline at the same concurrency.

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

Boundary: records frames in, summary frames out.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from specbench.formatting import missing, same


GROUP_KEYS = ["config_id", "method", "num_speculative_tokens", "concurrency"]
PERCENTILES = (50, 95, 99)
_LATENCIES = ("ttft", "tpot", "e2e")
_FAILED_REASONS = ("error", "cancelled")
MIN_DECODE_S = 1e-3  # below this a request's decode time is a burst, not a measurable rate


# What `runner.Configuration.config_id` appends to a configuration's label for its load: the
# concurrency, in an open loop the request rate and a burstiness other than 1, and -trace.
_LOAD_SUFFIX = re.compile(r"-c\d+(-r[0-9.e+-]+(-b[0-9.e+-]+)?)?(-trace)?$")


def series(config_id: str) -> str:
    """A configuration id without its load (`-c4`, `-c4-r2`, `-c4-r2-b0.5`, `-c64-trace`): what drafts and how
    (`ngram-k4`, `eagle3-k3-t4n8`), the same at every concurrency of a run."""
    return _LOAD_SUFFIX.sub("", str(config_id)) or str(config_id)


def ok_mask(df: pd.DataFrame) -> pd.Series:
    """Samples that completed: no error message and not finished by error or cancellation."""
    return df["error"].isna() & ~df["finish_reason"].isin(_FAILED_REASONS)


def _pct(values: pd.Series | np.ndarray, q: float) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def ratio(num: Any, den: Any) -> float:
    """num / den; NaN when either is missing or den is 0."""
    return float(num) / float(den) if not (missing(num) or missing(den)) and den else float("nan")


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
    row["output_tps"] = ratio(row["output_tokens"], wall) if wall > 0 else float("nan")
    row["requests_per_s"] = ratio(len(ok), wall) if wall > 0 else float("nan")

    drafted = int(ok["drafted_tokens"].sum())
    accepted = int(ok["accepted_tokens"].sum())
    steps = int(ok["num_steps"].sum())
    row["drafted_tokens"] = drafted
    row["accepted_tokens"] = accepted
    row["acceptance_rate_tok"] = ratio(accepted, drafted)
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
                     & base["request_rate"].map(lambda r: same(r, s["request_rate"]))]
        out = {k: s[k] for k in GROUP_KEYS}
        if len(match):
            b = match.iloc[0]
            out.update(
                baseline_config_id=b["config_id"],
                tpot_p50_speedup=ratio(b["tpot_p50_s"], s["tpot_p50_s"]),
                e2e_p50_speedup=ratio(b["e2e_p50_s"], s["e2e_p50_s"]),
                output_tps_speedup=ratio(s["output_tps"], b["output_tps"]),
                output_tps_per_user_speedup=ratio(s["output_tps_per_user"], b["output_tps_per_user"]),
            )
        else:
            out.update(baseline_config_id=None, tpot_p50_speedup=np.nan, e2e_p50_speedup=np.nan,
                       output_tps_speedup=np.nan, output_tps_per_user_speedup=np.nan)
        rows.append(out)
    return pd.DataFrame(rows, columns=cols)


def per_prompt(df: pd.DataFrame, metric: str) -> pd.Series:
    """Successful samples' `metric` by prompt id; repeated samples of one prompt are averaged
    so each prompt is one value (one pair, when two runs are paired)."""
    ok = df[ok_mask(df)]
    return ok.groupby("prompt_id")[metric].mean().dropna()


def prompt_blocks(df: pd.DataFrame) -> pd.Series | None:
    """The interleaved block (records' `block`) each prompt of one configuration was measured
    in, by prompt id, where every prompt was measured in exactly one block and some block
    holds more than one prompt: the unit a paired interval must treat as independent
    (`analysis.sequential`). None otherwise: at concurrency 1 (a block per prompt), with
    --repeats (a prompt's repeats lie in different blocks, and the prompt stays the unit), for
    a configuration measured in one block (`--no-interleave`, an unpaired sweep trial: no
    second block to tell a burst from the effect), or for records written before blocks were
    recorded."""
    if "block" not in df.columns:
        return None
    ok = df[ok_mask(df)]
    if not len(ok) or ok["block"].isna().any():
        return None
    blocks = ok.groupby("prompt_id")["block"].agg(["nunique", "first"])
    if (blocks["nunique"] != 1).any() or blocks["first"].nunique() in (1, len(blocks)):
        return None
    return blocks["first"].astype(int)


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
