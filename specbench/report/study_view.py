"""The study section of a report: the search (optimization history, parameter importances,
the Pareto front of a multi-objective study), the k x concurrency speedup heatmap built from
the trials, the trial table, and the recommended profile with the serving configurations
ready to paste, each value next to the trial and run it came from.

- Parameter importances are Optuna's own (`optuna.importance.get_param_importances`) with
  `PedAnovaImportanceEvaluator` (deterministic, no scikit-learn; fANOVA needs it), over the
  complete trials that have every parameter that varies among speculative trials, for the
  primary objective (sign-flipped for maximized objectives: PED-ANOVA ranks parameters by
  their effect on reaching low values).
- The heatmap's numbers are `analysis.summarize` of the trials' own Parquet files (TPOT p50
  of the baseline trial / of the trial, at the same concurrency), with the paired-bootstrap
  interval and the number of prompts paired from the verdict table; infeasible (over the
  memory budget) and failed trials are marked as such.

Boundary: plots and table rows; numbers from the verdict table, the trials and the profile.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.formatting import plain
from specbench.report import fmt
from specbench.report.inputs import ReportInputs, StudyInput
from specbench.report.plots import BASELINE_COLOR, Plot, _PALETTE, _style
from specbench.report.verdict import CONFIDENCE


def run_anchor(run_id: str) -> str:
    return "run-" + re.sub(r"[^A-Za-z0-9_-]+", "_", str(run_id))


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


def _family(method: Any, draft: Any) -> str:
    from specbench.speedup_model import family_of

    return family_of(str(method), draft if isinstance(draft, str) else None)


def _param(t: Any, name: str) -> Any:
    return plain(getattr(t, f"params_{name}", None))


def describe_trial(t: Any) -> str:
    method = _param(t, "method")
    c = _param(t, "concurrency")
    c = int(c) if c is not None else c
    if method is None:
        return "–"
    if method == "none":
        return f"baseline c={c}"
    draft = _param(t, "draft")
    d = f" ({str(draft).rsplit('/', 1)[-1]})" if draft else ""
    return f"{method}{d} k={int(_param(t, 'num_speculative_tokens'))} c={c}"


_TRIAL_DEFAULTS = {"number": None, "state": None, "run_id": None, "run_dir": None, "host": None,
                   "config_id": None, "feasible": True, "constraint": None, "fail_reason": None,
                   "duplicate_of": None, "values_0": np.nan}


def _trials(study: StudyInput) -> pd.DataFrame:
    """The study's trial table with every column this module reads (hand-built tables may
    lack some)."""
    t = study.trials.copy()
    for col, default in _TRIAL_DEFAULTS.items():
        if col not in t:
            t[col] = default
    t["feasible"] = t["feasible"].fillna(True).astype(bool)
    return t


def _measured(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that ran their own measurement (complete or failed), not reuses."""
    dup = trials["duplicate_of"] if "duplicate_of" in trials else pd.Series(None, index=trials.index)
    return trials[dup.isna() & trials["state"].isin(["COMPLETE", "FAIL"])]


# --------------------------------------------------------------------------------------
# The search


def optimization_history(study: StudyInput) -> Plot:
    name = f"study-{slug(study.name)}-history"
    plot = Plot(name, "Optimization history",
                "Every complete trial's objective value in the order the trials ran, and the best "
                "feasible value so far (line). Grey diamonds: the baseline trials; hollow grey: "
                "infeasible (over the memory budget); small: a trial that reused another "
                "trial's measurement.")
    t = _trials(study)
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
                (feas & ~reused & ~base, "trial", dict(color=_PALETTE[0], size=9)),
                (feas & ~reused & base, "baseline trial", dict(color=BASELINE_COLOR, size=9, symbol="diamond")),
                (feas & reused, "reused trial", dict(color=_PALETTE[0], size=5)),
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
    plot.figure = _style(fig, height=260 + 160 * n_obj, top=50 if n_obj > 1 else 40,
                         legend_right=n_obj > 1)
    return plot


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
                           marker_color=_PALETTE[0], text=[f"{v:.2f}" for _, v in items],
                           textposition="auto",
                           hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="importance", range=[0, 1])
    plot.figure = _style(fig, height=max(220, 120 + 40 * len(items)))
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
    t = _measured(_trials(study))
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
                                   (on, "Pareto front", dict(color=_PALETTE[0], size=10), "lines+markers")):
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
    plot.figure = _style(fig, height=420)
    return plot


# --------------------------------------------------------------------------------------
# The heatmap from trials


def trial_labels(inputs: ReportInputs) -> dict[str, str]:
    """run id -> the configuration label its samples carry in the report."""
    first = inputs.frame.drop_duplicates("source")
    return dict(zip(first["source"].astype(str), first["label"].astype(str)))


def heatmap_cells(study: StudyInput, inputs: ReportInputs, verdict: pd.DataFrame) -> pd.DataFrame:
    """One row per measured speculative trial: family, k, concurrency, trial, state, feasible,
    speedup (TPOT p50 of its baseline / its own, from the report's summaries), lo, hi, n."""
    labels = trial_labels(inputs)
    v = verdict.set_index("label")
    rows = []
    for t in _measured(_trials(study)).itertuples():
        method = _param(t, "method")
        if method in (None, "none"):
            continue
        row = {"family": _family(method, _param(t, "draft")), "k": int(_param(t, "num_speculative_tokens")),
               "concurrency": int(_param(t, "concurrency")), "trial": int(t.number), "state": t.state,
               "feasible": bool(t.feasible), "reason": t.fail_reason, "run_id": t.run_id,
               "speedup": np.nan, "lo": np.nan, "hi": np.nan, "n": 0, "label": None}
        label = labels.get(str(t.run_id)) if isinstance(t.run_id, str) else None
        if label is not None and label in v.index:
            r = v.loc[label]
            row["label"] = label
            if isinstance(r["baseline_label"], str) and r["baseline_label"] in v.index:
                b = v.loc[r["baseline_label"]]
                if not (fmt.missing(b["tpot_p50_s"]) or fmt.missing(r["tpot_p50_s"])):
                    row["speedup"] = float(b["tpot_p50_s"]) / float(r["tpot_p50_s"])
                row.update(lo=r["tpot_speedup_lo"], hi=r["tpot_speedup_hi"], n=int(r["paired_prompts"]))
        rows.append(row)
    return pd.DataFrame(rows, columns=["family", "k", "concurrency", "trial", "state", "feasible",
                                       "reason", "run_id", "speedup", "lo", "hi", "n", "label"])


def trial_heatmap(study: StudyInput, inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    name = f"study-{slug(study.name)}-heatmap"
    plot = Plot(name, "Speedup heatmap from the trials: k × concurrency",
                "TPOT p50 speedup of each trial over the baseline trial at the same concurrency "
                "(summaries of the trials' own Parquet files), its "
                f"{int(CONFIDENCE * 100)}% paired-bootstrap interval and n, the prompts paired. "
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
            if not r.feasible:
                text[a][b] += "<br>infeasible"
                hover[a][b] += "<br>infeasible: over the memory budget"
                bad_x.append(f"k={r.k}")
                bad_y.append(f"c={r.concurrency}")
        fig.add_trace(go.Heatmap(
            x=[f"k={k}" for k in ks], y=[f"c={c}" for c in concs], z=z, text=text,
            texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorscale="RdBu", zmid=0, zmin=-span, zmax=span, showscale=(i == len(fams)),
            colorbar=dict(title="speedup", tickvals=np.log([0.5, 0.8, 1, 1.25, 2]).tolist(),
                          ticktext=["0.5×", "0.8×", "1×", "1.25×", "2×"])), row=1, col=i)
        if bad_x:
            fig.add_trace(go.Scatter(x=bad_x, y=bad_y, mode="markers", name="infeasible",
                                     marker=dict(symbol="x-thin-open", size=40, color="#333",
                                                 line=dict(width=2)),
                                     hoverinfo="skip", showlegend=False), row=1, col=i)
        fig.update_xaxes(title_text="k", row=1, col=i)
        fig.update_yaxes(title_text="concurrency" if i == 1 else None, row=1, col=i)
    plot.figure = _style(fig, height=max(300, 140 + 70 * cells["concurrency"].nunique()))
    return plot


# --------------------------------------------------------------------------------------
# Tables


TRIAL_HEADERS = ["trial", "state", "configuration", "objective", "feasible", "reused", "failure reason",
                 "run"]


def trial_rows(study: StudyInput, inputs: ReportInputs) -> list[dict[str, Any]]:
    present = set(inputs.run_ids)
    rows = []
    names = study.objectives or [f"objective {i}" for i in range(len(study.directions))]
    for t in _trials(study).sort_values("number").itertuples():
        values = ", ".join(f"{n} {getattr(t, f'values_{i}'):.4g}" for i, n in enumerate(names)
                           if not fmt.missing(getattr(t, f"values_{i}", None)))
        feasible = "yes" if t.feasible else (
            f"no: {t.constraint:+.2f} GiB over budget" if not fmt.missing(t.constraint) else "no")
        run = t.run_id if isinstance(t.run_id, str) else None
        rows.append({
            "number": int(t.number), "state": t.state, "config": describe_trial(t),
            "objective": values or "–",
            "feasible": feasible if t.state == "COMPLETE" else "–",
            "reused": f"= trial {int(t.duplicate_of)}" if not fmt.missing(t.duplicate_of) else "",
            "reason": t.fail_reason or "", "run": run,
            "anchor": run_anchor(run) if run and run in present else None,
            "where": None if not run or run in present else (f"on {t.host}" if t.host else "not here"),
        })
    return rows


def _ev_link(ev: dict[str, Any] | None, present: set[str], role: str) -> dict[str, Any] | None:
    if not ev:
        return None
    run = ev.get("run_id")
    return {"role": role, "trial": ev.get("trial"), "run": run,
            "anchor": run_anchor(run) if run in present else None}


def profile_rows(study: StudyInput, inputs: ReportInputs) -> list[dict[str, Any]]:
    """(field, value, evidence) rows of the profile: every value next to its trial and run."""
    prof = study.profile
    if not prof:
        return []
    present = set(inputs.run_ids)
    rows: list[dict[str, Any]] = []
    bands = prof.get("bands") or []
    first = bands[0] if bands else {}
    first_ev = _ev_link(first.get("speculative"), present, "best speculative")
    rows.append({"field": "recommendation", "value": prof.get("recommendation"),
                 "why": "from the bands below", "ev": []})
    cfg = prof.get("speculative_config") or {}
    for key in ("method", "model", "num_speculative_tokens"):
        if key in cfg:
            rows.append({"field": f"speculative_config.{key}", "value": cfg[key],
                         "why": f"best speculative configuration at concurrency "
                                f"{first.get('measured_at_concurrency')}",
                         "ev": [first_ev] if first_ev else []})
    dbbs = prof.get("disable_by_batch_size") or {}
    ev = [e for e in (_ev_link(dbbs.get("last_paying"), present, "last paying"),
                      _ev_link(dbbs.get("first_not_paying"), present, "first not paying")) if e]
    rows.append({"field": "disable_by_batch_size", "value": dbbs.get("value"),
                 "why": dbbs.get("why", ""), "ev": ev})
    for b in bands:
        bs = b["batch_size"]
        what = (f"{b['profile']}" + (f" {b.get('method')} k={b.get('num_speculative_tokens')}"
                                     if b["profile"] == "speculative" else ""))
        ev = [e for e in (_ev_link(b.get("speculative"), present, "speculative"),
                          _ev_link(b.get("baseline"), present, "baseline")) if e]
        rows.append({"field": f"batch size {bs['min']}–{bs['max'] if bs['max'] is not None else '∞'}",
                     "value": what, "why": b.get("why", ""), "ev": ev})
    return rows


def serving_snippets(study: StudyInput) -> dict[str, Any] | None:
    """The paste-ready serving configurations of the study's profile."""
    if not study.profile:
        return None
    import yaml

    from specbench.sweep.serving import serving_profiles, vllm_flag

    try:
        s = serving_profiles(study.profile)
    except (KeyError, TypeError, ValueError) as exc:
        return {"error": f"profile.yaml cannot be turned into serving configurations: {exc}",
                "vllm": None, "vllm_legacy": None, "sglang": None, "rollout": None, "bands": [],
                "notes": []}
    import shlex

    return {
        "error": None,
        "vllm": vllm_flag(s["vllm"]) if s["vllm"] else None,
        "vllm_json": json.dumps(s["vllm"], indent=2) if s["vllm"] else None,
        "vllm_legacy": vllm_flag(s["vllm_legacy"]) if s["vllm_legacy"] else None,
        "sglang": shlex.join(s["sglang"]) if s["sglang"] else None,
        "rollout": yaml.safe_dump(s["rollout"], sort_keys=False, allow_unicode=True, width=100),
        "bands": s["bands"], "notes": s["notes"],
    }


STUDY_PLOTS = (optimization_history, param_importance, pareto_front)
