"""The regression gate's deterministic metrics, compared as values (specbench.compare.gate
decides the timing ones): acceptance pooled over the shared prompts, greedy outputs token for
token, structured outputs' validity and failed samples. With fixed models, seeds and hardware
they repeat exactly, so each is a value against a tight tolerance, not an interval.

Boundary: one configuration pair's records in, a verdict dict (`gate.MetricResult`'s fields) out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from specbench import analysis
from specbench.analysis.scenarios import scenario_rank, scenarios
from specbench.compare.catalog import Metric
from specbench.compare.comparable import fmt_ids


def acceptance(metric: Metric, b: pd.DataFrame, c: pd.DataFrame, shared: list[str],
               threshold: float) -> dict[str, Any]:
    """Acceptance pooled over the shared prompts and, where they span more than one scenario
    (free text, JSON, tool calls, ...: records' `scenario`), within each scenario too. Pooling
    hides a scenario's loss behind another's gain (a change to constrained drafting that halves
    acceptance on JSON while free text improves), so a scenario that regressed past the
    threshold makes the verdict a regression, and the note names every scenario's change."""
    out = _pooled_acceptance(metric, b, c, shared, threshold)
    of = dict(zip(b["prompt_id"], scenarios(b)))
    kinds = sorted({of[p] for p in shared if p in of}, key=scenario_rank)
    if len(kinds) < 2 or out["verdict"] == "n/a":
        return out
    parts, lost = [], []
    for kind in kinds:
        r = _pooled_acceptance(metric, b, c, [p for p in shared if of.get(p) == kind], threshold)
        if r.get("baseline") is None or r["verdict"] == "n/a":
            parts.append(f"{kind} n/a")
            continue
        change = f" ({r['change']:+.1%})" if r.get("change") is not None else ""
        parts.append(f"{kind} {r['baseline']:.3g} -> {r['current']:.3g}{change}")
        if r["verdict"] == "regression":
            lost.append(kind)
    note = "by scenario: " + ", ".join(parts)
    if lost:
        note += f"; regressed in {', '.join(lost)}"
        out = {**out, "verdict": "regression"}
    return {**out, "note": "; ".join(filter(None, [out.get("note", ""), note]))}


def _pooled_acceptance(metric: Metric, b: pd.DataFrame, c: pd.DataFrame, shared: list[str],
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
    if base_val == 0.0:  # drafted, none accepted: no relative change to state
        if cur_val == 0.0:
            return {**out, "change": 0.0, "verdict": "ok", "note": "no draft token accepted in either run"}
        return {**out, "verdict": "improved", "note": "the baseline accepted no draft token"}
    change = cur_val / base_val - 1.0
    worse = metric.worse(change)
    verdict = ("regression" if worse > threshold + 1e-12 else
               "improved" if -worse > threshold + 1e-12 else "ok")
    return {**out, "change": change, "verdict": verdict}


def greedy_match(b: pd.DataFrame, c: pd.DataFrame, shared: list[str],
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
    note = f"{len(differ)} differ ({fmt_ids(differ)})" if differ else ""
    return {"baseline": 1.0, "current": frac, "n": len(greedy), "change": change,
            "verdict": verdict, "note": note}


def valid_outputs(b: pd.DataFrame, c: pd.DataFrame, shared: list[str], threshold: float) -> dict[str, Any]:
    """The fraction of shared prompts with a checked structured output (records' output_valid)
    whose output is valid, in each run: gated exactly, as greedy outputs are."""
    def valid(df: pd.DataFrame) -> pd.Series:
        if "output_valid" not in df:
            return pd.Series(dtype=bool)
        checked = df[df["prompt_id"].isin(shared) & df["output_valid"].notna()]
        return checked.groupby("prompt_id")["output_valid"].agg(lambda v: bool(v.astype(bool).all()))

    bv, cv = valid(b), valid(c)
    both = sorted(set(bv.index) & set(cv.index))
    if not both:
        return {"baseline": None, "current": None, "n": 0, "verdict": "n/a", "note": "no structured outputs"}
    base, cur = float(bv[both].mean()), float(cv[both].mean())
    change = cur - base
    verdict = "regression" if -change > threshold + 1e-12 else "improved" if change > 1e-12 else "ok"
    invalid = [p for p in both if not cv[p]]
    return {"baseline": base, "current": cur, "n": len(both), "change": change, "verdict": verdict,
            "note": f"{len(invalid)} invalid ({fmt_ids(invalid)})" if invalid else ""}


def errors(b: pd.DataFrame, c: pd.DataFrame, prompts: set[str], threshold: float) -> dict:
    nb = int((~analysis.ok_mask(b[b["prompt_id"].isin(prompts)])).sum())
    nc = int((~analysis.ok_mask(c[c["prompt_id"].isin(prompts)])).sum())
    change = float(nc - nb)
    verdict = ("regression" if change > threshold else
               "improved" if change < 0 else "ok")
    return {"baseline": float(nb), "current": float(nc), "n": len(prompts), "change": change,
            "verdict": verdict}
