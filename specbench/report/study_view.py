"""The study section's figures: the search (optimization history, parameter importances, the
Pareto front of a multi-objective study) and the k x concurrency speedup heatmap built from
the trials. The trial table, the recommended profile and the serving configurations are
`specbench.report.study_tables`.

- Parameter importances are Optuna's own (`optuna.importance.get_param_importances`) with
  `PedAnovaImportanceEvaluator` (deterministic, no scikit-learn; fANOVA needs it), over the
  complete trials that have every parameter that varies among speculative trials, for the
  primary objective (sign-flipped for maximized objectives: PED-ANOVA ranks parameters by
  their effect on reaching low values).
- The heatmap's numbers are `analysis.summarize` of the trials' own Parquet files (TPOT p50
  of the baseline trial / of the trial, at the same concurrency), with the paired-bootstrap
  interval and the number of prompts paired from the verdict table; infeasible (over the
  memory budget) and failed trials are marked as such.

Boundary: plots; numbers from the verdict table, the trials and the profile.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.report import fmt
from specbench.report.inputs import ReportInputs, StudyInput
from specbench.report.plots import BASELINE_COLOR, PALETTE, SPEEDUP_COLORBAR, Plot, style
from specbench.report.study_tables import describe_trial, family, measured, param, slug, trials
from specbench.report.verdict import CONFIDENCE


# --------------------------------------------------------------------------------------
# The search


def optimization_history(study: StudyInput) -> Plot:
    name = f"study-{slug(study.name)}-history"
    plot = Plot(name, "Optimization history",
                "Every complete trial's objective value in the order the trials ran, and the best "
                "feasible value so far (line). Grey diamonds: the baseline trials; hollow grey: "
                "infeasible (over the memory budget); small: a trial that reused another "
                "trial's measurement.")
    t = trials(study)
    done = t[(t["state"] == "COMPLETE") & t["values_0"].notna()]
    if done.empty:
        plot.note = "No trial has completed yet."
        return plot
    n_obj = len(study.directions)
    names = study.objectives or [f"objective {i}" for i in range(n_obj)]
    fig = make_subplots(rows=n_obj, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=names if n_obj > 1 else None)
    for i, direction in enumerate(study.directions):
        col = f"values_{i}"
        g = done.sort_values("number")
        feas = g["feasible"].astype(bool)
        reused = g["duplicate_of"].notna() if "duplicate_of" in g else pd.Series(False, index=g.index)
        desc = [describe_trial(r) for r in g.itertuples()]
        kw = dict(row=i + 1, col=1)
        base = g["params_method"].eq("none") if "params_method" in g else pd.Series(False, index=g.index)
        for mask, label, marker in (
                (feas & ~reused & ~base, "trial", dict(color=PALETTE[0], size=9)),
                (feas & ~reused & base, "baseline trial", dict(color=BASELINE_COLOR, size=9, symbol="diamond")),
                (feas & reused, "reused trial", dict(color=PALETTE[0], size=5)),
                (~feas, "infeasible trial", dict(color=BASELINE_COLOR, size=9, symbol="circle-open"))):
            if not mask.any():
                continue
            fig.add_trace(go.Scatter(
                x=g.loc[mask, "number"], y=g.loc[mask, col], mode="markers", name=label,
                legendgroup=label, showlegend=i == 0, marker=marker,
                customdata=[d for d, m in zip(desc, mask) if m],
                hovertemplate="trial %{x}: %{customdata}<br>%{y:.4g}<extra></extra>"), **kw)
        vals = g[col].where(feas)
        best = vals.cummax() if direction == "maximize" else vals.cummin()
        fig.add_trace(go.Scatter(x=g["number"], y=best, mode="lines", name="best so far",
                                 legendgroup="best", showlegend=i == 0, line=dict(color="#d62728", shape="hv"),
                                 hovertemplate="best after trial %{x}: %{y:.4g}<extra></extra>"), **kw)
        fig.update_yaxes(title_text=names[i] if n_obj == 1 else None, **kw)
    fig.update_xaxes(title_text="trial", row=n_obj, col=1)
    plot.figure = style(fig, height=260 + 160 * n_obj, top=50 if n_obj > 1 else 40,
                         legend_right=n_obj > 1)
    return plot


IMPORTANCE_TRIALS_PER_PARAM = 5  # fewer trials than this per parameter: importances are noise


def importance_params(study: Any) -> list[str]:
    """Parameters that vary among the complete speculative trials."""
    from optuna.trial import TrialState

    spec = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.params.get("method") not in (None, "none")]
    names: list[str] = []
    for t in spec:
        for p in t.params:
            if p not in names:
                names.append(p)
    return [p for p in names if len({repr(t.params.get(p)) for t in spec}) > 1]


def importances(study: StudyInput) -> dict[str, float] | str:
    """Optuna's importances of `importance_params` for the primary objective, or why not."""
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    if study.study is None:
        return "The study itself is not loaded (only its trial table)."
    params = importance_params(study.study)
    if len(params) < 2:
        return ("Fewer than two parameters vary among the speculative trials "
                f"({', '.join(params) or 'none'}): nothing to rank.")
    n = len([t for t in study.study.get_trials(deepcopy=False) if t.values is not None
             and t.params.get("method") not in (None, "none")])
    if n < IMPORTANCE_TRIALS_PER_PARAM * len(params):
        return (f"Not ranked: {n} measured speculative trial(s) for {len(params)} varying parameters; "
                f"an importance needs at least {IMPORTANCE_TRIALS_PER_PARAM} trials per parameter "
                f"({IMPORTANCE_TRIALS_PER_PARAM * len(params)} here) to say more than noise.")
    sign = -1.0 if study.directions[0] == "maximize" else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return get_param_importances(study.study, evaluator=PedAnovaImportanceEvaluator(),
                                         params=params, target=lambda t: sign * t.values[0])
        except (ValueError, RuntimeError, optuna.exceptions.OptunaError) as exc:
            return f"Optuna could not rank the parameters: {exc}"


def param_importance(study: StudyInput) -> Plot:
    name = f"study-{slug(study.name)}-importance"
    obj = (study.objectives or ["the objective"])[0]
    plot = Plot(name, "Parameter importances",
                f"How much each parameter decides the primary objective ({obj}) among the "
                "speculative trials: optuna.importance.get_param_importances with the PED-ANOVA "
                "evaluator (normalized to sum to 1).")
    got = importances(study)
    if isinstance(got, str):
        plot.note = got
        return plot
    items = sorted(got.items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[k for k, _ in items], orientation="h",
                           marker_color=PALETTE[0], text=[f"{v:.2f}" for _, v in items],
                           textposition="auto",
                           hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="importance", range=[0, 1])
    plot.figure = style(fig, height=max(220, 120 + 40 * len(items)))
    return plot


def recommended_trials(study: StudyInput) -> set[int]:
    """Trial numbers the profile's speculative_config and bands came from."""
    prof = study.profile or {}
    out: set[int] = set()
    for band in prof.get("bands") or []:
        ev = band.get("speculative") if band.get("profile") == "speculative" else band.get("baseline")
        if ev and ev.get("trial") is not None:
            out.add(int(ev["trial"]))
    return out


def pareto_front(study: StudyInput) -> Plot:
    name = f"study-{slug(study.name)}-pareto"
    plot = Plot(name, "Pareto front",
                "Every feasible measured trial on the first two objectives; the front (no other "
                "trial is better on both, Optuna's study.best_trials) is joined by a line and "
                "the profile's recommended trials are starred.")
    if len(study.directions) < 2:
        plot.note = "A single-objective study has no Pareto front."
        return plot
    if study.study is None:
        plot.note = "The study itself is not loaded."
        return plot
    t = measured(trials(study))
    t = t[(t["state"] == "COMPLETE") & t["feasible"]]
    if t.empty:
        plot.note = "No feasible trial has completed yet."
        return plot
    front = {ft.number for ft in study.study.best_trials}
    rec = recommended_trials(study)
    names = study.objectives
    fig = go.Figure()
    desc = {r.number: describe_trial(r) for r in t.itertuples()}
    rest = t[~t["number"].isin(front)]
    on = t[t["number"].isin(front)].sort_values("values_0")
    for g, label, marker, mode in ((rest, "trial", dict(color="#9aa5b1", size=8), "markers"),
                                   (on, "Pareto front", dict(color=PALETTE[0], size=10), "lines+markers")):
        if g.empty:
            continue
        fig.add_trace(go.Scatter(
            x=g["values_0"], y=g["values_1"], mode=mode, name=label, marker=marker,
            customdata=[f"trial {n}: {desc[n]}" for n in g["number"]],
            hovertemplate="%{customdata}<br>%{x:.4g}, %{y:.4g}<extra></extra>"))
    r = t[t["number"].isin(rec)]
    if len(r):
        fig.add_trace(go.Scatter(
            x=r["values_0"], y=r["values_1"], mode="markers", name="recommended",
            marker=dict(symbol="star", size=18, color="#f2b01e", line=dict(color="#333", width=1)),
            customdata=[f"trial {n}: {desc[n]} (recommended)" for n in r["number"]],
            hovertemplate="%{customdata}<extra></extra>"))
    else:
        plot.caption += " (No profile.yaml next to the study: nothing is starred.)"
    fig.update_xaxes(title_text=f"{names[0]} ({study.directions[0]})")
    fig.update_yaxes(title_text=f"{names[1]} ({study.directions[1]})")
    plot.figure = style(fig, height=420)
    return plot


# --------------------------------------------------------------------------------------
# The heatmap from trials


def trial_labels(inputs: ReportInputs) -> dict[str, str]:
    """run id -> the configuration label its samples carry in the report."""
    first = inputs.frame.drop_duplicates("source")
    return dict(zip(first["source"].astype(str), first["label"].astype(str)))


def heatmap_cells(study: StudyInput, inputs: ReportInputs, verdict: pd.DataFrame) -> pd.DataFrame:
    """One row per measured speculative trial: family, k, concurrency, trial, state, feasible,
    speedup, lo, hi, n, paired, inconsistent. A paired trial (it measured its baseline
    interleaved with it) shows the sweep's own paired speedup and interval, the numbers its
    profile decided on; a trial measured alone shows TPOT p50 of the baseline trial / its own
    (the report's summaries) with the paired-bootstrap interval."""
    labels = trial_labels(inputs)
    v = verdict.set_index("label")
    rows = []
    for t in measured(trials(study)).itertuples():
        method = param(t, "method")
        if method in (None, "none"):
            continue
        row = {"family": family(method, param(t, "draft")), "k": int(param(t, "num_speculative_tokens")),
               "concurrency": int(param(t, "concurrency")), "trial": int(t.number), "state": t.state,
               "feasible": bool(t.feasible), "reason": t.fail_reason, "run_id": t.run_id,
               "speedup": np.nan, "lo": np.nan, "hi": np.nan, "n": 0, "label": None, "paired": False}
        label = labels.get(str(t.run_id)) if isinstance(t.run_id, str) else None
        paired = getattr(t, "paired", None)
        row["inconsistent"] = getattr(t, "inconsistent", None)
        if isinstance(paired, dict) and paired.get("point") is not None:  # the sweep's own verdict
            row.update(label=label, speedup=float(paired["point"]), n=int(paired.get("n") or 0),
                       lo=np.nan if paired.get("lo") is None else float(paired["lo"]),
                       hi=np.nan if paired.get("hi") is None else float(paired["hi"]), paired=True)
        elif label is not None and label in v.index:
            r = v.loc[label]
            row["label"] = label
            if isinstance(r["baseline_label"], str) and r["baseline_label"] in v.index:
                b = v.loc[r["baseline_label"]]
                if not (fmt.missing(b["tpot_p50_s"]) or fmt.missing(r["tpot_p50_s"])):
                    row["speedup"] = float(b["tpot_p50_s"]) / float(r["tpot_p50_s"])
                row.update(lo=r["tpot_speedup_lo"], hi=r["tpot_speedup_hi"], n=int(r["paired_prompts"]))
        rows.append(row)
    return pd.DataFrame(rows, columns=["family", "k", "concurrency", "trial", "state", "feasible",
                                       "reason", "run_id", "speedup", "lo", "hi", "n", "label", "paired",
                                       "inconsistent"])


def trial_heatmap(study: StudyInput, inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    name = f"study-{slug(study.name)}-heatmap"
    plot = Plot(name, "Speedup heatmap from the trials: k × concurrency",
                "TPOT speedup of each trial over the baseline it measured interleaved with it "
                "(geometric mean of the per-prompt ratios from the trial's own Parquet, with the "
                "sweep's group-sequential 95% interval and n, the prompts paired); a trial measured "
                "alone (server sweeps): TPOT p50 over the baseline trial at the same concurrency "
                f"with the {int(CONFIDENCE * 100)}% paired-bootstrap interval. "
                "⚠ inconsistent: a speedup above tokens per target pass, never recommended; "
                "✕: infeasible (peak memory over the study's budget), never recommended; "
                "'failed': the trial's reason is in the trial table.")
    cells = heatmap_cells(study, inputs, verdict)
    if cells.empty:
        plot.note = "The study has no measured speculative trial."
        return plot
    fams = list(dict.fromkeys(cells["family"]))
    fig = make_subplots(rows=1, cols=len(fams), subplot_titles=fams, horizontal_spacing=0.08)
    ok = cells["speedup"].dropna()
    span = max(float(np.abs(np.log(ok.clip(lower=1e-3))).max()) if len(ok) else 0.0, np.log(1.1))
    for i, fam in enumerate(fams, start=1):
        g = cells[cells["family"] == fam]
        ks, concs = sorted(g["k"].unique()), sorted(g["concurrency"].unique())
        z = [[None] * len(ks) for _ in concs]
        text = [[""] * len(ks) for _ in concs]
        hover = [[""] * len(ks) for _ in concs]
        bad_x, bad_y = [], []
        for r in g.itertuples():
            a, b = concs.index(r.concurrency), ks.index(r.k)
            if r.state != "COMPLETE":
                text[a][b] = f"failed<br>#{r.trial}"
                hover[a][b] = f"trial {r.trial} failed: {r.reason}"
                continue
            if fmt.missing(r.speedup):
                text[a][b] = f"#{r.trial}<br>run not here"
                hover[a][b] = f"trial {r.trial}: its run {r.run_id} is not in this report"
                continue
            z[a][b] = float(np.log(r.speedup))
            ci = "" if fmt.missing(r.lo) else f"<br>[{fmt.ci(r.lo, r.hi)}]"
            text[a][b] = f"{fmt.times(r.speedup)}{ci}<br>n={r.n} · #{r.trial}"
            hover[a][b] = (f"trial {r.trial}: {r.label}<br>speedup {fmt.times(r.speedup)}, "
                           f"{int(CONFIDENCE * 100)}% CI {fmt.ci(r.lo, r.hi)}, {r.n} prompts")
            if isinstance(r.inconsistent, str):
                text[a][b] += "<br>⚠ inconsistent"
                hover[a][b] += f"<br>{r.inconsistent}; never recommended"
            if not r.feasible:
                text[a][b] += "<br>infeasible"
                hover[a][b] += "<br>infeasible: over the memory budget"
                bad_x.append(f"k={r.k}")
                bad_y.append(f"c={r.concurrency}")
        fig.add_trace(go.Heatmap(
            x=[f"k={k}" for k in ks], y=[f"c={c}" for c in concs], z=z, text=text,
            texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorscale="RdBu", zmid=0, zmin=-span, zmax=span, showscale=(i == len(fams)),
            colorbar=SPEEDUP_COLORBAR), row=1, col=i)
        if bad_x:
            fig.add_trace(go.Scatter(x=bad_x, y=bad_y, mode="markers", name="infeasible",
                                     marker=dict(symbol="x-thin-open", size=40, color="#333",
                                                 line=dict(width=2)),
                                     hoverinfo="skip", showlegend=False), row=1, col=i)
        fig.update_xaxes(title_text="k", row=1, col=i)
        fig.update_yaxes(title_text="concurrency" if i == 1 else None, row=1, col=i)
    plot.figure = style(fig, height=max(300, 140 + 70 * cells["concurrency"].nunique()))
    return plot


STUDY_PLOTS = (optimization_history, param_importance, pareto_front)
