"""Speculation by scenario: free text, JSON, tool calls, regex, grammar, choice (records'
`scenario`, specbench.structured). Structured output is where drafts and the verified output
part ways (the draft does not see the grammar the target is held to, or drafts under it) and
where fixed keys make n-gram and suffix drafts shine, so a run that mixes scenarios reports
each on its own: samples, how many outputs were valid, acceptance length and the TPOT speedup
against the baseline's samples of the same scenario at the same load.

Boundary: records in, a frame and a rich table out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.table import Table

from specbench.analysis.summary import ok_mask, ratio
from specbench.formatting import dash_or, ms, same
from specbench.structured import SCENARIOS

COLUMNS = ["scenario", "config_id", "is_baseline", "concurrency", "n", "checked", "valid",
           "mean_acceptance_length_tok", "tpot_p50_s", "tpot_p50_speedup"]


def scenarios(df: pd.DataFrame) -> pd.Series:
    """Each sample's scenario ("free" where the records predate it)."""
    return df["scenario"].fillna("free") if "scenario" in df else pd.Series("free", index=df.index)


def scenario_rank(scenario: str) -> int:
    """Where a scenario sorts: `specbench.structured.SCENARIOS`' order, unknown ones last."""
    return SCENARIOS.index(scenario) if scenario in SCENARIOS else len(SCENARIOS)


def _group(g: pd.DataFrame) -> dict:
    ok = g[ok_mask(g)]
    checked = g["output_valid"].dropna() if "output_valid" in g else pd.Series(dtype=bool)
    steps, accepted = int(ok["num_steps"].sum()), int(ok["accepted_tokens"].sum())
    tpot = ok["tpot_s"].dropna()
    return {"n": len(g), "checked": len(checked), "valid": int(checked.astype(bool).sum()),
            "mean_acceptance_length_tok": 1.0 + accepted / steps if steps else float("nan"),
            "tpot_p50_s": float(np.median(tpot)) if len(tpot) else float("nan")}


def scenario_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, configuration), scenarios in `specbench.structured.SCENARIOS`
    order and configurations in the run's: samples, outputs checked and valid, acceptance length, TPOT p50
    and its speedup against the baseline's samples of that scenario at the same concurrency
    and request rate (NaN without one)."""
    df = df.assign(scenario=scenarios(df))
    order = {c: i for i, c in enumerate(dict.fromkeys(df["config_id"]))}
    rows = []
    groups = df.groupby(["scenario", "config_id"], sort=False)
    for (scenario, config_id), g in sorted(groups, key=lambda kv: (scenario_rank(kv[0][0]), order[kv[0][1]])):
        rows.append({"scenario": scenario, "config_id": config_id, "is_baseline": bool(g["is_baseline"].iloc[0]),
                     "concurrency": int(g["concurrency"].iloc[0]), "request_rate": g["request_rate"].iloc[0],
                     **_group(g)})
    out = pd.DataFrame(rows, columns=COLUMNS[:-1] + ["request_rate"])
    speedup = []
    for _, r in out.iterrows():
        base = out[(out["scenario"] == r["scenario"]) & out["is_baseline"] & (out["concurrency"] == r["concurrency"])
                   & out["request_rate"].map(lambda x: same(x, r["request_rate"]))]
        speedup.append(ratio(base["tpot_p50_s"].iloc[0], r["tpot_p50_s"]) if len(base) else float("nan"))
    out["tpot_p50_speedup"] = speedup
    return out[COLUMNS]


def has_scenarios(df: pd.DataFrame) -> bool:
    """Whether a run holds anything but free prompts (else the per-scenario view says nothing)."""
    return bool((scenarios(df) != "free").any())


def rich_scenario_table(df: pd.DataFrame) -> Table:
    """The console's per-scenario table of `scenario_summary`."""
    t = Table(title="By scenario (structured output)", title_justify="left")
    for name in ("scenario", "config"):
        t.add_column(name, overflow="fold")
    for name in ("n", "valid", "accept len\ntok", "TPOT p50\nms", "speedup\nTPOT"):
        t.add_column(name, justify="right")
    for _, r in scenario_summary(df).iterrows():
        valid = f"{r['valid']}/{r['checked']}" if r["checked"] else "–"
        t.add_row(str(r["scenario"]), str(r["config_id"]), str(r["n"]), valid,
                  "–" if r["is_baseline"] else dash_or(r["mean_acceptance_length_tok"], ".2f"),
                  ms(r["tpot_p50_s"]), "1.00" if r["is_baseline"] else dash_or(r["tpot_p50_speedup"], ".2f"))
    return t


def invalid_lines(df: pd.DataFrame) -> list[str]:
    """One line per configuration with invalid structured outputs: how many, and the first error."""
    if "output_valid" not in df:
        return []
    bad = df[df["output_valid"].eq(False)]
    lines = []
    for config_id, g in bad.groupby("config_id", sort=False):
        first = g.iloc[0]
        lines.append(f"[yellow]{config_id}: {len(g)} structured output(s) not valid; first: prompt "
                     f"{first['prompt_id']!r} ({first['scenario']}): {first['validation_error']}[/]")
    return lines
