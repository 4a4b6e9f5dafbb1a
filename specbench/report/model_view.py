"""The fitted speedup model in a report (`specbench.speedup_model`): prediction against
measurement for every measured configuration (a parity plot with the in-sample and the
held-out error), the predicted speedup over a k x concurrency grid that was mostly not
measured, the fitted parameters, and the points worth measuring next.

Boundary: plots and tables; the model and its numbers come from `specbench.speedup_model`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench import speedup_model as sm
from specbench.errors import RecordsError
from specbench.report import fmt
from specbench.report.inputs import ReportInputs
from specbench.report.plots import PALETTE, SPEEDUP_COLORBAR, Plot, style

N_BOOT = 1000


def evaluation(inputs: ReportInputs, verdict: pd.DataFrame) -> sm.Evaluation | str:
    """The model fitted on the report's records and its error, or why there is none
    (computed once per report)."""
    if "model" in inputs.cache:
        return inputs.cache["model"]
    steps = sm.model_steps(inputs.frame, label="label")
    got: sm.Evaluation | str
    if steps.empty:
        got = "The runs have no per-step records to fit the model on."
    elif not (~steps["is_baseline"].astype(bool)).any():
        got = "These runs have no speculative configuration."
    else:
        measured = sm.measured_points(inputs.frame, inputs.pairs, label="label", n_boot=N_BOOT)
        stats = [s for r in inputs.runs
                 for s in r.config.configuration_stats.values()]
        overhead = sm.overhead_per_step(stats)
        try:
            got = sm.evaluate(steps, measured, overhead_s=overhead,
                              stall=sm.stalls(inputs.frame, overhead))
        except RecordsError as exc:
            got = f"No model: {exc}."
    inputs.cache["model"] = got
    return got


def _err(v: float) -> str:
    return fmt.DASH if fmt.missing(v) else f"{100 * v:.1f}%"


def parity(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("model-parity", "Fitted speedup model: predicted against measured",
                "Each measured speculative configuration: its measured TPOT speedup (median TPOT "
                "of the baseline / of the configuration, prompts paired, whiskers = the "
                "bootstrap CI) against the model's prediction. Filled: the model fitted on every "
                "configuration; hollow: fitted without this configuration's records (held out), "
                "the honest error. The model: per-position acceptance α_i per category, step "
                "cost = verify(B, k) + draft(B, k) fitted on the per-step times, speedup = "
                "(baseline step cost + stall) / (speculative step cost / E_k + stall) over the "
                "batch sizes reached, the stall being the baseline's wait outside its own steps "
                "per token (specbench/speedup_model.py).")
    ev = evaluation(inputs, verdict)
    if isinstance(ev, str):
        plot.note = ev
        return plot
    pts = ev.points.dropna(subset=["measured"])
    if pts.empty:
        plot.note = "No speculative configuration has a measured speedup to compare with."
        return plot
    fig = go.Figure()
    fams = list(dict.fromkeys(pts["family"]))
    for i, fam in enumerate(fams):
        g = pts[pts["family"] == fam]
        color = PALETTE[i % len(PALETTE)]
        err = dict(type="data", symmetric=False, array=(g["measured_hi"] - g["measured"]).tolist(),
                   arrayminus=(g["measured"] - g["measured_lo"]).tolist(), thickness=1, width=3)
        custom = np.stack([g["label"], g["error"].map(_err), g["heldout_error"].map(_err),
                           g["paired_prompts"]], axis=-1)
        fig.add_trace(go.Scatter(
            x=g["predicted"], y=g["measured"], mode="markers", name=f"{fam} (fit on all)",
            marker=dict(color=color, size=10), error_y=err, customdata=custom,
            hovertemplate="%{customdata[0]}<br>measured %{y:.2f}×, predicted %{x:.2f}× "
                          "(error %{customdata[1]}), %{customdata[3]} prompts<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=g["heldout"], y=g["measured"], mode="markers", name=f"{fam} (held out)",
            marker=dict(color=color, size=11, symbol="circle-open", line=dict(width=2)),
            customdata=custom,
            hovertemplate="%{customdata[0]}<br>measured %{y:.2f}×, held-out prediction "
                          "%{x:.2f}× (error %{customdata[2]})<extra></extra>"))
    vals = pd.concat([pts["measured_lo"], pts["measured_hi"], pts["predicted"], pts["heldout"]]).dropna()
    lo, hi = float(vals.min()) * 0.9, float(vals.max()) * 1.1
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="prediction = measurement",
                             line=dict(color="#888", dash="dot"), hoverinfo="skip"))
    fig.update_xaxes(title_text="predicted TPOT speedup (×)", range=[lo, hi])
    fig.update_yaxes(title_text="measured TPOT speedup (×)", range=[lo, hi])
    plot.figure = style(fig, height=460)
    plot.caption += (f" Mean absolute error: {_err(ev.fit_error)} fitted on everything, "
                     f"{_err(ev.heldout_error)} held out ({len(pts)} configurations).")
    rows = [["configuration", "measured", "95% CI", "predicted", "error", "held out", "error"]]
    for r in pts.itertuples():
        rows.append([r.label, fmt.times(r.measured), fmt.ci(r.measured_lo, r.measured_hi),
                     fmt.times(r.predicted), _err(r.error), fmt.times(r.heldout), _err(r.heldout_error)])
    plot.tables = [rows]
    return plot


def _grid(model: sm.SpeedupModel, pts: pd.DataFrame) -> tuple[list[int], list[int]]:
    kmax = max(8, int(pts["k"].max()) if len(pts) else 8)
    measured_c = sorted(set(int(c) for c in model.batch_mix) | set(int(c) for c in pts["concurrency"]))
    top = max(16, 2 * max(measured_c, default=1))
    concs = sorted(set(measured_c) | {c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= top})
    return list(range(1, kmax + 1)), concs


def prediction(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("model-prediction", "Predicted speedup: k × concurrency",
                "The fitted model's TPOT speedup at every k and concurrency, most of them never "
                "measured (boxed cells were; * marks an extrapolation beyond the batch sizes or "
                "k the step costs were fitted on). Below: the fitted parameters and the "
                "unmeasured points closest to break-even, where one more measurement is most "
                "likely to change the decision.")
    ev = evaluation(inputs, verdict)
    if isinstance(ev, str):
        plot.note = ev
        return plot
    model, pts = ev.model, ev.points
    fams = model.families
    if not fams:
        plot.note = "No drafter family has both acceptance and draft-cost data."
        return plot
    weak = model.cost.weak()
    if weak:
        plot.caption = ("⚠ Weak fit: " + "; ".join(weak) + ". Read these predictions as rough, and measure "
                        "before acting on them. " + plot.caption)
    ks, concs = _grid(model, pts)
    fig = make_subplots(rows=1, cols=len(fams), subplot_titles=fams, horizontal_spacing=0.08)
    done = {(r.family, int(r.k), int(r.concurrency)) for r in pts.itertuples()}
    span = np.log(1.1)
    for i, fam in enumerate(fams, start=1):
        z, text, hover = [], [], []
        for c in concs:
            zr, tr, hr = [], [], []
            for k in ks:
                p = model.predict(fam, k, c)
                ext = model.extrapolated(fam, k, c)
                zr.append(float(np.log(p)) if p > 0 else None)
                span = max(span, abs(np.log(p)) if p > 0 else 0)
                tr.append(f"{p:.2f}{'*' if ext else ''}")
                hr.append(f"k={k}, c={c}: predicted {p:.2f}×"
                          + (" (measured)" if (fam, k, c) in done else "")
                          + (" — extrapolated" if ext else ""))
            z.append(zr)
            text.append(tr)
            hover.append(hr)
        fig.add_trace(go.Heatmap(
            x=[f"k={k}" for k in ks], y=[f"c={c}" for c in concs], z=z, text=text,
            texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorscale="RdBu", zmid=0, showscale=(i == len(fams)),
            colorbar=SPEEDUP_COLORBAR), row=1, col=i)
        for (f, k, c) in done:
            if f == fam and k in ks and c in concs:
                fig.add_shape(type="rect", xref=f"x{i if i > 1 else ''}", yref=f"y{i if i > 1 else ''}",
                              x0=ks.index(k) - 0.5, x1=ks.index(k) + 0.5,
                              y0=concs.index(c) - 0.5, y1=concs.index(c) + 0.5,
                              line=dict(color="#111", width=2))
        fig.update_xaxes(title_text="k", row=1, col=i)
        fig.update_yaxes(title_text="concurrency" if i == 1 else None, row=1, col=i)
    for tr in fig.data:
        tr.zmin, tr.zmax = -span, span
    plot.figure = style(fig, height=max(320, 120 + 40 * len(concs)))
    plot.tables = [parameter_rows(model), next_rows(model, pts, ks, concs)]
    return plot


def parameter_rows(model: sm.SpeedupModel) -> list[list[str]]:
    c = model.cost
    rows = [["fitted parameter", "value", "from", "fit"]]
    for name, v in zip(c.form.verify_terms, c.verify_coef):
        rows.append([f"verify {name}", f"{v * 1e3:.3f} ms", f"{c.n_steps:.0f} batched steps, "
                     f"batch sizes up to {c.max_batch}",
                     "constant times: no R²" if fmt.missing(c.r2) else
                     f"R² {c.r2:.3f}" + (f" (weak: below {sm.WEAK_FIT_R2})" if c.weak_r2 else "")])
    for fam, coef in c.draft_coef.items():
        for name, v in zip(c.form.draft_terms, coef):
            rows.append([f"draft {fam}: {name}", f"{v * 1e3:.3f} ms", f"k up to {c.max_k[fam]}", ""])
    rows.append(["per-step overhead", f"{c.overhead_s * 1e3:.3f} ms", "run.json overhead_s / steps", ""])
    for conc, w in sorted(model.stall.items()):
        rows.append([f"stall per output token at concurrency {conc}", f"{w * 1e3:.3f} ms",
                     "baseline requests' decode time outside their steps", ""])
    for fam, acc in model.acceptance.items():
        rows.append([f"α_i {fam} (pooled)", ", ".join(f"{a:.2f}" for a in acc.alpha),
                     "steps at risk: " + ", ".join(str(int(n)) for n in acc.at_risk), ""])
        for cat, a in acc.by_category.items():
            rows.append([f"α_i {fam} · {cat}", ", ".join(f"{x:.2f}" for x in a),
                         f"{100 * acc.weights[cat]:.0f}% of drafting steps", ""])
    return rows


def next_rows(model: sm.SpeedupModel, pts: pd.DataFrame, ks: list[int], concs: list[int]) -> list[list[str]]:
    nxt = sm.next_points(model, pts, ks, concs)
    rows = [["measure next", "predicted", "why"]]
    for r in nxt.itertuples():
        rows.append([f"{r.family} k={r.k} at concurrency {r.concurrency}", f"{r.predicted:.2f}×",
                     "closest to break-even" + (" (extrapolated)" if r.extrapolated else "")])
    return rows


def summary(inputs: ReportInputs, verdict: pd.DataFrame) -> dict[str, Any] | None:
    """The model's headline numbers for the page (None without a model)."""
    ev = evaluation(inputs, verdict)
    if isinstance(ev, str):
        return None
    return {"fit_error": ev.fit_error, "heldout_error": ev.heldout_error, "points": len(ev.points)}
