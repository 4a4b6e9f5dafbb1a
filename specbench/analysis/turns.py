"""Speculation by conversation turn (records' `turn`, a `specbench run --turns` replay): later
turns carry the history, the model's own answers included, which is where the draft can copy
what was said before (suffix and n-gram drafts exist for it) and where the context grows.

Boundary: records in, a frame and a rich table out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.table import Table

from specbench.analysis.summary import ok_mask
from specbench.formatting import dash_or, ms


def has_turns(df: pd.DataFrame) -> bool:
    return "turn" in df and bool((df["turn"].fillna(1) > 1).any())


def turn_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, turn) of the replayed conversations, in run order: samples,
    mean prompt tokens (the growing history), acceptance length (token-weighted) and TPOT p50."""
    conv = df[df["turn"].notna()] if "turn" in df else df.iloc[:0]
    rows = []
    for (config_id, turn), g in conv.groupby(["config_id", "turn"], sort=False):
        ok = g[ok_mask(g)]
        steps, accepted = int(ok["num_steps"].sum()), int(ok["accepted_tokens"].sum())
        tpot = ok["tpot_s"].dropna()
        rows.append({"config_id": config_id, "is_baseline": bool(g["is_baseline"].iloc[0]), "turn": int(turn),
                     "n": len(g), "input_tokens": float(g["input_tokens"].mean()),
                     "mean_acceptance_length_tok": 1.0 + accepted / steps if steps else float("nan"),
                     "tpot_p50_s": float(np.median(tpot)) if len(tpot) else float("nan")})
    out = pd.DataFrame(rows, columns=["config_id", "is_baseline", "turn", "n", "input_tokens",
                                      "mean_acceptance_length_tok", "tpot_p50_s"])
    order = {c: i for i, c in enumerate(dict.fromkeys(df["config_id"]))}
    return out.sort_values(["turn", "config_id"], key=lambda col: col.map(order) if col.name == "config_id" else col,
                           kind="stable").reset_index(drop=True)


def rich_turn_table(df: pd.DataFrame) -> Table:
    t = Table(title="By turn (replayed conversations)", title_justify="left")
    t.add_column("turn", justify="right")
    t.add_column("config", overflow="fold")
    for name in ("n", "prompt\ntokens", "accept len\ntok", "TPOT p50\nms"):
        t.add_column(name, justify="right")
    for r in turn_summary(df).itertuples():
        t.add_row(str(r.turn), str(r.config_id), str(r.n), f"{r.input_tokens:.0f}",
                  "–" if r.is_baseline else dash_or(r.mean_acceptance_length_tok, ".2f"), ms(r.tpot_p50_s))
    return t
