"""The numbers the report states, as plain data: the verdict table (one row per configuration,
grouped by concurrency), one sentence per method on where it stops paying as concurrency
grows, the overall recommendation, and the outlier samples worth a look.

The speedup of a configuration is TPOT-based (per-user decode speed once streaming starts):
median TPOT of the baseline / median TPOT of the configuration, with prompts paired and a
percentile bootstrap confidence interval (`specbench.analysis.paired_bootstrap_speedup`).
A configuration *wins* when the whole interval is above 1, *loses* when it is below 1, and
is *even* otherwise; without an interval (fewer than two prompts shared with the baseline)
the outcome is *unclear* (`analysis.outcome`, the one rule the console and the sweep profile
use too).

Boundary: statistics come from `specbench.analysis`; this module chooses, pairs and words
them. No plotting, no HTML.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench import analysis
from specbench.analysis.paired import block_groups
from specbench.errors import RecordsError
from specbench.report import fmt
from specbench.report.inputs import ReportInputs

CONFIDENCE = 0.95
N_BOOT = 2000

VERDICT_COLUMNS = [
    "label", "series", "source", "method", "num_speculative_tokens", "concurrency",
    "request_rate", "is_baseline", "baseline_label", "n", "errors",
    *(f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in analysis.PERCENTILES),
    "tpot_speedup", "tpot_speedup_lo", "tpot_speedup_hi", "paired_prompts", "paired_blocks",
    "e2e_p50_speedup", "output_tps", "output_tps_speedup",
    "acceptance_rate_tok", "mean_acceptance_length_tok", "token_match_rate_mean",
    "peak_memory_bytes", "memory_delta_bytes", "memory_delta_frac", "outcome",
]


def _tpot_prompts(df: pd.DataFrame) -> set[str]:
    return set(df.loc[analysis.ok_mask(df) & df["tpot_s"].notna(), "prompt_id"])


def verdict_table(inputs: ReportInputs, *, n_boot: int = N_BOOT, seed: int = 0,
                  confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per configuration label (`VERDICT_COLUMNS`), sorted by concurrency, each
    baseline first and then its configurations in run order."""
    df = inputs.frame
    summary = analysis.summarize(df).set_index("config_id")
    first = df.drop_duplicates("label").set_index("label")
    by_label = {lbl: g for lbl, g in df.groupby("label", sort=False)}
    rows = []
    for label in inputs.labels:
        s = summary.loc[label]
        base_label = None if s["is_baseline"] else inputs.pairs.get(label)
        row = {
            "label": label,
            "series": first.loc[label, "series"],
            "source": first.loc[label, "source"],
            "method": s["method"],
            "num_speculative_tokens": int(s["num_speculative_tokens"]),
            "concurrency": int(s["concurrency"]),
            "request_rate": s["request_rate"],
            "is_baseline": bool(s["is_baseline"]),
            "baseline_label": base_label,
            "n": int(s["n"]),
            "errors": int(s["errors"]),
            "output_tps": s["output_tps"],
            "acceptance_rate_tok": s["acceptance_rate_tok"],
            "mean_acceptance_length_tok": s["mean_acceptance_length_tok"],
            "token_match_rate_mean": s["token_match_rate_mean"],
            "peak_memory_bytes": s["peak_memory_bytes"],
        }
        for m in ("ttft", "tpot", "e2e"):
            for q in analysis.PERCENTILES:
                row[f"{m}_p{q}_s"] = s[f"{m}_p{q}_s"]
        nan = float("nan")
        row.update(tpot_speedup=nan, tpot_speedup_lo=nan, tpot_speedup_hi=nan, paired_prompts=0,
                   paired_blocks=None, e2e_p50_speedup=nan, output_tps_speedup=nan, memory_delta_bytes=nan,
                   memory_delta_frac=nan)
        if s["is_baseline"]:
            row["outcome"] = "baseline"
        elif base_label is None:
            row["outcome"] = "no-baseline"
        else:
            b = summary.loc[base_label]
            base_df, spec_df = by_label[base_label], by_label[label]
            shared = _tpot_prompts(base_df) & _tpot_prompts(spec_df)
            row["paired_prompts"] = len(shared)
            groups = block_groups(spec_df, pd.Index(sorted(shared)))
            row["paired_blocks"] = None if groups is None else len(set(groups.tolist()))  # the interval's unit
            try:
                point, lo, hi = analysis.paired_bootstrap_speedup(
                    base_df, spec_df, metric="tpot_s", stat="median", n_boot=n_boot, seed=seed,
                    confidence=confidence)
            except RecordsError:  # fewer than two paired prompts: a point estimate only
                point, lo, hi = analysis.ratio(b["tpot_p50_s"], s["tpot_p50_s"]), nan, nan
            row.update(tpot_speedup=point, tpot_speedup_lo=lo, tpot_speedup_hi=hi,
                       e2e_p50_speedup=analysis.ratio(b["e2e_p50_s"], s["e2e_p50_s"]),
                       output_tps_speedup=analysis.ratio(s["output_tps"], b["output_tps"]),
                       outcome=analysis.outcome(point, lo, hi))
            if not (fmt.missing(s["peak_memory_bytes"]) or fmt.missing(b["peak_memory_bytes"])):
                delta = float(s["peak_memory_bytes"]) - float(b["peak_memory_bytes"])
                row["memory_delta_bytes"] = delta
                row["memory_delta_frac"] = analysis.ratio(delta, b["peak_memory_bytes"])
        rows.append(row)
    out = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    # Baselines first within each concurrency; otherwise keep run order (stable sort).
    out["_order"] = range(len(out))
    out = out.sort_values(["concurrency", "is_baseline", "_order"], ascending=[True, False, True],
                          kind="stable").drop(columns="_order").reset_index(drop=True)
    return out


# --------------------------------------------------------------------------------------
# Words


def _describe(r: pd.Series) -> str:
    ci = (f", {int(CONFIDENCE * 100)}% CI {fmt.ci(r['tpot_speedup_lo'], r['tpot_speedup_hi'])}"
          if not fmt.missing(r["tpot_speedup_lo"]) else "")
    return f"{fmt.times(r['tpot_speedup'])} with {r['series']}{ci}"


def _best(rows: pd.DataFrame) -> pd.Series:
    """The configuration to recommend among `rows`: wins first, then the highest speedup."""
    rank = rows.assign(_win=rows["outcome"].eq("win"),
                       _x=rows["tpot_speedup"].fillna(-np.inf))
    return rank.sort_values(["_win", "_x"], ascending=False, kind="stable").iloc[0]


def method_sentences(verdict: pd.DataFrame) -> dict[str, str]:
    """One sentence per speculative method: does it pay, and from which concurrency on does it
    stop paying. Uses the best configuration of the method at each concurrency."""
    out: dict[str, str] = {}
    spec = verdict[~verdict["is_baseline"]]
    for method, rows in spec.groupby("method", sort=False):
        rows = rows[rows["outcome"] != "no-baseline"]
        if rows.empty:
            out[method] = f"{method}: no baseline at the same concurrency, so no verdict."
            continue
        concs = sorted(rows["concurrency"].unique())
        best = {c: _best(rows[rows["concurrency"] == c]) for c in concs}
        wins = [c for c in concs if best[c]["outcome"] == "win"]
        cmax = concs[-1]
        if len(concs) == 1:
            c = concs[0]
            verb = {"win": "pays", "loss": "does not pay (it is slower)",
                    "even": "makes no clear difference",
                    "unclear": "is unclear (too few prompts)"}[best[c]["outcome"]]
            out[method] = (f"{method} {verb} at concurrency {c}: {_describe(best[c])}; run more "
                           "--concurrency values to see where it stops paying.")
        elif len(wins) == len(concs):
            out[method] = (f"{method} pays at every concurrency measured, up to {cmax}: "
                           f"{_describe(best[concs[0]])} at {concs[0]}, "
                           f"{_describe(best[cmax])} at {cmax}.")
        elif not wins:
            top = max(best.values(), key=lambda r: -np.inf if fmt.missing(r["tpot_speedup"])
                      else r["tpot_speedup"])
            out[method] = (f"{method} does not pay at any concurrency measured: best "
                           f"{_describe(top)} at concurrency {top['concurrency']} (a win needs "
                           "the whole CI above 1×).")
        else:
            last = wins[-1]
            after = [c for c in concs if c > last]
            if after:
                stop = after[0]
                out[method] = (f"{method} pays up to concurrency {last} ({_describe(best[last])}) "
                               f"and stops paying from concurrency {stop} "
                               f"(best {_describe(best[stop])}).")
            else:  # no win at low concurrency but wins higher up
                first = wins[0]
                out[method] = (f"{method} pays from concurrency {first} on "
                               f"({_describe(best[first])}), not below it.")
    return out


@dataclass
class Recommendation:
    tone: str  # yes | no | unknown
    headline: str
    details: list[str]


def recommendation(verdict: pd.DataFrame) -> Recommendation:
    """Should speculative decoding be on, and how: the best configuration per concurrency."""
    spec = verdict[(~verdict["is_baseline"]) & (verdict["outcome"] != "no-baseline")]
    if spec.empty:
        if (~verdict["is_baseline"]).any():
            return Recommendation("unknown", "No verdict: no configuration has a baseline at the "
                                  "same concurrency to compare with.", [])
        return Recommendation("unknown", "No verdict: these runs hold only baseline samples.", [])
    details = []
    wins = 0
    for c, rows in spec.groupby("concurrency", sort=True):
        b = _best(rows)
        ci = ("" if fmt.missing(b["tpot_speedup_lo"]) else
              f" ({int(CONFIDENCE * 100)}% CI {fmt.ci(b['tpot_speedup_lo'], b['tpot_speedup_hi'])})")
        if b["outcome"] == "win":
            wins += 1
            mem = ("" if fmt.missing(b["memory_delta_bytes"]) else
                   f"; peak memory {fmt.signed_mib(b['memory_delta_bytes'])}"
                   f" ({fmt.signed_pct(b['memory_delta_frac'])})")
            details.append(f"Concurrency {c}: turn on {b['series']}: "
                           f"{fmt.times(b['tpot_speedup'])} faster per output token{ci}{mem}.")
        else:
            why = {"loss": "slower than the baseline", "even": "no clear difference",
                   "unclear": "too few paired prompts for a confidence interval"}[b["outcome"]]
            details.append(f"Concurrency {c}: leave it off: the best configuration, "
                           f"{b['series']}, gives {fmt.times(b['tpot_speedup'])}{ci}, {why}.")
    n = spec["concurrency"].nunique()
    if wins == n:
        return Recommendation("yes", "Yes: speculative decoding makes decoding faster at every "
                              "concurrency measured.", details)
    if wins:
        return Recommendation("yes", "Yes, where it wins: speculative decoding pays at "
                              f"{wins} of {n} concurrency levels measured.", details)
    return Recommendation("no", "No: no configuration is clearly faster than the baseline at any "
                          "concurrency measured.", details)


# --------------------------------------------------------------------------------------
# Samples worth a look


@dataclass
class Outlier:
    anchor: str
    text: str


def sample_anchor(i: int) -> str:
    return f"sample-{i}"


def outliers(frame: pd.DataFrame, n: int = 5) -> dict[str, list[Outlier]]:
    """Links into the per-sample table: slowest TPOT, slowest TTFT, lowest acceptance rate,
    outputs that differ from the baseline, failed requests. Empty groups are left out."""
    ok = frame[analysis.ok_mask(frame)]
    groups: dict[str, list[Outlier]] = {}

    def add(title: str, rows: pd.DataFrame, text) -> None:
        items = [Outlier(sample_anchor(i), text(r)) for i, r in rows.iterrows()]
        if items:
            groups[title] = items

    add("Slowest TPOT", ok[ok["tpot_s"].notna()].nlargest(n, "tpot_s"),
        lambda r: f"{r['label']} · {r['prompt_id']}: {fmt.ms(r['tpot_s'])} ms")
    add("Slowest TTFT", ok[ok["ttft_s"].notna()].nlargest(n, "ttft_s"),
        lambda r: f"{r['label']} · {r['prompt_id']}: {fmt.ms(r['ttft_s'])} ms")
    spec = ok[~ok["is_baseline"] & ok["acceptance_rate"].notna()]
    add("Lowest acceptance rate", spec.nsmallest(n, "acceptance_rate"),
        lambda r: f"{r['label']} · {r['prompt_id']}: {fmt.pct(r['acceptance_rate'])}")
    diff = frame[frame["token_match_rate"].notna() & (frame["token_match_rate"] < 1.0)]
    add("Output differs from the baseline", diff.nsmallest(n, "token_match_rate"),
        lambda r: (f"{r['label']} · {r['prompt_id']}: match {fmt.pct(r['token_match_rate'])}, "
                   f"first divergence at token {int(r['first_divergence'])}"))
    failed = frame[~analysis.ok_mask(frame)].head(n)
    add("Failed requests", failed,
        lambda r: f"{r['label']} · {r['prompt_id']}: {r['finish_reason']} {r['error'] or ''}".strip())
    return groups
