"""Per-step records as DataFrames: where acceptance and speed change with the batch size, the
context length, the output position and the prompt category.

`explode(frame)` turns the per-step list columns of successful samples (`step_batch_size`,
`step_context_tokens`, `step_drafted`, `step_accepted`, `step_emitted`, `step_draft_time_s`,
`step_verify_time_s`; one entry per target step after the prefill) into one row per
(sample, step), with:

- `output_pos`: output tokens already emitted before the step (the first comes from the
  prefill, so it starts at 1), counted from `step_emitted`;
- `context`: tokens in context before the step (`step_context_tokens`; for backends that do
  not report it, input tokens + `output_pos`);
- `share_s`: the row's share of its batched step's time, (draft + verify) / batch size, so
  summing `share_s` over the rows of a batch counts the step once.

Aggregations (`acceptance`, `time_per_token`) give, per group, both weightings the project
reports (as `specbench.analysis` does): token-weighted figures pool the steps (`mal_tok` = 1 + accepted /
drafting steps, `rate_tok` = accepted / drafted), request-weighted ones average each
request's own figure within the group (`mal_req`, `rate_req`), because long outputs otherwise
dominate. Only steps that proposed drafts enter acceptance (vLLM's definition).

Boundary: reads records columns (plus any grouping column of the caller's frame); no plots,
no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from specbench import analysis

STEP_LISTS = {
    "step_batch_size": "batch_size", "step_context_tokens": "context_reported",
    "step_drafted": "drafted", "step_accepted": "accepted", "step_emitted": "emitted",
    "step_draft_time_s": "draft_s", "step_verify_time_s": "verify_s",
}
STEP_COLUMNS = ("sample", "prompt_id", "batch_size", "context", "output_pos", "drafted",
                "accepted", "emitted", "draft_s", "verify_s", "share_s")


def as_array(x: object) -> np.ndarray:
    """A per-step list column's entry as floats (a missing entry: empty)."""
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return np.zeros(0)
    return np.asarray(x, dtype=float)  # null entries (None) become NaN


def explode(frame: pd.DataFrame, keep: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (successful sample, step): `STEP_COLUMNS` plus the sample's `keep` columns.
    `sample` is the sample's index in `frame`. Empty (with those columns) when no sample has
    per-step records (schema-1 runs, failed requests)."""
    ok = frame[analysis.ok_mask(frame)]
    cols = list(dict.fromkeys([*keep, "prompt_id"]))
    lists = {name: [as_array(x) for x in ok[col]] if col in ok else [np.zeros(0)] * len(ok)
             for col, name in STEP_LISTS.items()}
    n = np.array([len(x) for x in lists["drafted"]], dtype=int)
    for name, arrays in lists.items():  # a backend may leave a list out: pad with NaN
        lists[name] = [a if len(a) == m else np.full(m, np.nan) for a, m in zip(arrays, n)]
    out: dict[str, np.ndarray] = {"sample": np.repeat(ok.index.to_numpy(), n)}
    for c in cols:
        out[c] = np.repeat(ok[c].to_numpy(), n)
    total = int(n.sum())
    for name, arrays in lists.items():
        out[name] = np.concatenate(arrays) if total else np.zeros(0)
    emitted = out["emitted"]
    # Output tokens before each step: 1 (the prefill's token) + what earlier steps emitted.
    pos = np.zeros(total)
    start = 0
    for m in n:
        e = np.nan_to_num(emitted[start:start + m])
        pos[start:start + m] = 1 + np.concatenate([[0.0], np.cumsum(e)[:-1]]) if m else e
        start += m
    out["output_pos"] = pos
    inputs = np.repeat(ok["input_tokens"].to_numpy(dtype=float), n)
    ctx = out.pop("context_reported")
    out["context"] = np.where(np.isnan(ctx), inputs + pos, ctx)
    step_s = np.nan_to_num(out["draft_s"]) + np.nan_to_num(out["verify_s"])
    b = out["batch_size"]
    out["share_s"] = np.where(np.isnan(b) | (b <= 0), np.nan, step_s / np.where(b > 0, b, 1))
    df = pd.DataFrame(out)
    return df[[*STEP_COLUMNS, *[c for c in cols if c not in STEP_COLUMNS]]]


def acceptance(steps: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Acceptance per group of drafting steps: `steps` (drafting steps), `requests`,
    `drafted`, `accepted`, `mal_tok`, `mal_req`, `rate_tok`, `rate_req` (see the module
    docstring). Groups without a drafting step are left out."""
    by = list(by)
    cols = [*by, "steps", "requests", "drafted", "accepted", "mal_tok", "mal_req", "rate_tok",
            "rate_req"]
    d = steps[steps["drafted"] > 0]
    if d.empty:
        return pd.DataFrame(columns=cols)
    per_req = d.groupby([*by, "sample"], sort=True, dropna=False).agg(
        n=("drafted", "size"), drafted=("drafted", "sum"), accepted=("accepted", "sum"))
    per_req["mal"] = 1.0 + per_req["accepted"] / per_req["n"]
    per_req["rate"] = per_req["accepted"] / per_req["drafted"]
    g = per_req.groupby(level=list(range(len(by))), sort=True, dropna=False)
    out = g.agg(steps=("n", "sum"), requests=("n", "size"), drafted=("drafted", "sum"),
                accepted=("accepted", "sum"), mal_req=("mal", "mean"), rate_req=("rate", "mean"))
    out["mal_tok"] = 1.0 + out["accepted"] / out["steps"]
    out["rate_tok"] = out["accepted"] / out["drafted"]
    return out.reset_index()[cols]


def time_per_token(steps: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Decode step time per output token per group: `s_per_token` = sum of each row's share
    of its step's draft + verify time / tokens those steps emitted (prefill and scheduling
    are not in it), with `steps` (row-steps) and `requests`. Rows of backends that report no
    batch size are left out."""
    by = list(by)
    d = steps[steps["share_s"].notna() & steps["emitted"].notna()]
    cols = [*by, "steps", "requests", "s_per_token"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(by, sort=True, dropna=False).agg(
        steps=("share_s", "size"), requests=("sample", "nunique"), share=("share_s", "sum"),
        emitted=("emitted", "sum"))
    g["s_per_token"] = g["share"] / g["emitted"].where(g["emitted"] > 0)
    return g.reset_index()[cols]


def pow2_bins(values: pd.Series | np.ndarray, max_bins: int = 12) -> np.ndarray:
    """Bin edges for token counts (context length): powers of two, from the one at or below
    the smallest value to the first above the largest; every second (third, ...) power when
    that would give more than `max_bins` bins."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return np.array([1.0, 2.0])
    lo = int(np.floor(np.log2(max(v.min(), 1.0))))
    hi = int(np.floor(np.log2(max(v.max(), 1.0)))) + 1  # 2**hi > max
    step = 1
    while -(-(hi - lo) // step) > max_bins:
        step += 1
    exps = list(range(lo, hi, step))
    exps.append(exps[-1] + step)
    return 2.0 ** np.array(exps, dtype=float)


def linear_bins(values: pd.Series | np.ndarray, max_bins: int = 16) -> np.ndarray:
    """Equal-width bin edges with a power-of-two width (output positions)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return np.array([0.0, 1.0])
    lo, hi = np.floor(v.min()), v.max()
    width = 2 ** max(0, int(np.ceil(np.log2(max((hi - lo + 1) / max_bins, 1)))))
    return np.arange(lo, hi + width + 1, width, dtype=float)


def bin_labels(edges: np.ndarray) -> list[str]:
    """'a–b' for the integer range [a, b) of each bin (or 'a' for a one-token bin)."""
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        a_i, b_i = int(np.ceil(a)), int(np.ceil(b)) - 1
        out.append(str(a_i) if b_i <= a_i else f"{a_i}–{b_i}")
    return out


def assign_bins(values: pd.Series, edges: np.ndarray) -> pd.Series:
    """The bin label of each value ([a, b) bins; the last bin includes its right edge)."""
    labels = bin_labels(edges)
    idx = np.clip(np.searchsorted(edges, values.to_numpy(dtype=float), side="right") - 1,
                  0, len(labels) - 1)
    return pd.Series(pd.Categorical([labels[i] for i in idx], categories=labels, ordered=True),
                     index=values.index)


def weightings_differ(table: pd.DataFrame, a: str, b: str, rel: float = 0.02) -> bool:
    """Whether request- and token-weighted columns differ by more than `rel` anywhere."""
    x, y = table[a].astype(float), table[b].astype(float)
    both = x.notna() & y.notna()
    if not both.any():
        return False
    return bool((abs(x[both] - y[both]) > rel * abs(y[both]).clip(lower=1e-12)).any())
