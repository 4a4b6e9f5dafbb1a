"""What a trial keeps of its run: the run's summary as stored in the trial (JSON: NaN saved as
null), the headline figures shown flat on the trial, and speedups against the baseline trial.

Every number is `specbench.analysis` of the run's Parquet: `stored_summary` is
`analysis.summarize` of the samples, `speedups_vs` is `analysis.speedups` of two stored
summaries. Boundary: pure functions of frames and dicts; nothing here knows Optuna.
"""

from __future__ import annotations

import math
from typing import Any
from specbench import analysis

# Headline figures stored flat on each trial (optuna-dashboard shows flat numbers as sortable
# columns): user attr name (units in the name) -> (summary column, scale, decimals)
HEADLINE = {
    "tpot_p50_ms": ("tpot_p50_s", 1e3, 3), "tpot_p95_ms": ("tpot_p95_s", 1e3, 3),
    "ttft_p50_ms": ("ttft_p50_s", 1e3, 3), "e2e_p50_s": ("e2e_p50_s", 1.0, 4),
    "output_tok_per_s": ("output_tps", 1.0, 2),
    "output_tok_per_s_per_user": ("output_tps_per_user", 1.0, 2),
    "acceptance_rate_pct": ("acceptance_rate_tok", 100.0, 2),
    "tokens_per_step": ("mean_acceptance_length_tok", 1.0, 3),
    "peak_memory_gib": ("peak_memory_bytes", 1 / 2**30, 3),
}
# speedup vs the baseline at the same concurrency: user attr name -> `speedups_vs` key
SPEEDUP_ATTRS = {"speedup_tpot_p50_x": "tpot_p50_speedup",
                 "speedup_output_tok_per_s_x": "output_tps_speedup"}
_SPEEDUPS = ("tpot_p50_speedup", "e2e_p50_speedup", "output_tps_speedup", "output_tps_per_user_speedup")


def jsonable(v: Any) -> Any:
    """A plain Python value for JSON: numpy scalars unwrapped, NaN and infinities as None."""
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """The HEADLINE figures of a stored summary (absent when undefined, e.g. no drafts)."""
    out = {}
    for name, (column, scale, decimals) in HEADLINE.items():
        v = summary.get(column)
        if v is not None and math.isfinite(v):
            out[name] = round(float(v) * scale, decimals)
    return out


def stored_summary(samples: Any, config_id: str | None = None) -> dict[str, Any]:
    """`analysis.summarize` of one configuration of a run's samples (`config_id`; the only
    one when None), as a trial stores it."""
    if config_id is not None:
        samples = samples[samples["config_id"] == config_id]
    row = analysis.summarize(samples).iloc[0]
    return {k: jsonable(row[k]) for k in analysis.SUMMARY_COLUMNS}


def summary_frame(summaries: list[dict[str, Any]]):
    """Stored summaries (NaN saved as null) back into an `analysis.summarize`-shaped frame."""
    import numpy as np
    import pandas as pd

    from specbench.analysis import SUMMARY_COLUMNS

    rows = [{k: (np.nan if v is None else v) for k, v in s.items()} for s in summaries]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def speedups_vs(baseline: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """`analysis.speedups` of one configuration against its baseline (stored summaries)."""
    sp = analysis.speedups(summary_frame([baseline, summary]))
    if not len(sp):
        return {}
    row = sp.iloc[0]
    return {k: jsonable(row[k]) for k in _SPEEDUPS}
