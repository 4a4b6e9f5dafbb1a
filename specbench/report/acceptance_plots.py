"""The report's acceptance figures: mean acceptance length per request, per-position acceptance
(survival), where drafts are first rejected, and acceptance and speedup by prompt category.
They pool a configuration over concurrency (its `series`): what the verifier accepts depends
on the drafter, the target and the prompts, not on how many requests share a batch.

Boundary: figures from the report frame and the verdict table; numbers from
`specbench.analysis` and `specbench.steps`; no HTML.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench import analysis
from specbench import steps as steps_mod
from specbench.report.inputs import ReportInputs
from specbench.report.plots import NO_SPEC, Plot, series_colors, spec_ok, style

_NO_DRAFTS = "No verification step proposed draft tokens."


def acceptance_length_histogram(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("acceptance-length", "Mean acceptance length per request",
                "How many requests reached each mean acceptance length (tokens per target step "
                "= 1 + accepted / verification steps), per configuration, pooled over "
                "concurrency. A wide or two-humped spread means speculation helps some prompts "
                "far more than others; the per-step distribution is in the next two plots.")
    spec = spec_ok(inputs.frame)
    spec = spec[spec["num_steps"] > 0]
    if spec.empty:
        plot.note = NO_SPEC if spec_ok(inputs.frame).empty else _NO_DRAFTS
        return plot
    colors = series_colors(verdict)
    fig = go.Figure()
    kmax = int(spec["num_speculative_tokens"].max())
    for series, rows in spec.groupby("series", sort=False):
        fig.add_trace(go.Histogram(
            x=rows["mean_acceptance_length"], name=series, marker_color=colors.get(series),
            xbins=dict(start=1.0, end=kmax + 1.0 + 1e-9, size=0.25),
            hovertemplate="%{x}: %{y} request(s)" f"<extra>{series}</extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="mean acceptance length (tokens per target step)",
                     range=[1.0, kmax + 1.0])
    fig.update_yaxes(title_text="requests")
    plot.figure = style(fig, height=360)
    return plot


def _per_series(inputs: ReportInputs, verdict: pd.DataFrame,
                trace: Callable[[str, pd.DataFrame, str | None], Any]) -> tuple[go.Figure, str | None]:
    """A figure with one trace per speculative series (`trace(series, rows, colour)`, None
    for a series with nothing to draw), and the note to show instead when none was drawn."""
    spec = spec_ok(inputs.frame)
    colors = series_colors(verdict)
    fig = go.Figure()
    for series, rows in spec.groupby("series", sort=False):
        t = trace(series, rows, colors.get(series))
        if t is not None:
            fig.add_trace(t)
    return fig, None if fig.data else (NO_SPEC if spec.empty else _NO_DRAFTS)


def survival(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("survival", "Per-position acceptance (survival)",
                "Share of verification steps whose i-th draft token was accepted (acceptance is a "
                "prefix, so this falls with i).")

    def trace(series: str, rows: pd.DataFrame, color: str | None) -> Any:
        curve = analysis.per_position_acceptance(rows)
        if curve.size == 0:
            return None
        return go.Scatter(x=np.arange(1, curve.size + 1), y=curve, mode="lines+markers",
                          name=series, line=dict(color=color),
                          hovertemplate="position %{x}: %{y:.1%}" f"<extra>{series}</extra>")

    fig, plot.note = _per_series(inputs, verdict, trace)
    if plot.note:
        return plot
    fig.update_xaxes(title_text="draft position i", dtick=1)
    fig.update_yaxes(title_text="P(accepted)", tickformat=".0%", range=[0, 1.05])
    plot.figure = style(fig, height=380)
    return plot


def rejection_positions(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("rejection-positions", "Where drafts are first rejected",
                "Share of verification steps by the position of the first rejected draft token; "
                "'none' means every draft token was accepted.")

    def trace(series: str, rows: pd.DataFrame, color: str | None) -> Any:
        pos = [np.asarray(x, dtype=int) for x in rows["rejection_positions"] if len(x)]
        if not pos:
            return None
        pos = np.concatenate(pos)
        k = int(rows["num_speculative_tokens"].max())
        cats = [str(i + 1) for i in range(k)] + ["none"]
        counts = np.array([(pos == i).sum() for i in range(k)] + [(pos < 0).sum()])
        return go.Bar(x=cats, y=counts / max(counts.sum(), 1), name=series, marker_color=color,
                      customdata=counts,
                      hovertemplate="position %{x}: %{y:.1%} (%{customdata} steps)" f"<extra>{series}</extra>")

    fig, plot.note = _per_series(inputs, verdict, trace)
    if plot.note:
        return plot
    kmax = int(spec_ok(inputs.frame)["num_speculative_tokens"].max())
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="first rejected draft position", type="category",
                     categoryorder="array",
                     categoryarray=[str(i + 1) for i in range(kmax)] + ["none"])
    fig.update_yaxes(title_text="share of steps", tickformat=".0%")
    plot.figure = style(fig, height=380)
    return plot


def _category_keys(frame: pd.DataFrame) -> pd.Series:
    if frame["workload"].nunique() > 1:
        return frame["workload"].astype(str) + " (" + frame["workload_kind"].astype(str) + ") / " \
            + frame["category"].astype(str)
    return frame["category"].astype(str)


def by_category(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("by-category", "Acceptance and speedup by category and prompt set",
                "Top: acceptance rate per prompt category (token-weighted: accepted / drafted "
                "tokens), pooled over concurrency. Bottom: TPOT speedup per category at the lowest concurrency "
                "measured (median baseline TPOT / median speculative TPOT over the category's "
                "paired prompts).")
    frame = inputs.frame.assign(_cat=_category_keys(inputs.frame))
    c0 = verdict.loc[~verdict["is_baseline"], "concurrency"].min()
    cats = list(dict.fromkeys(frame["_cat"]))
    if len(cats) < 2:
        plot.note = (f"Every sample is in one category ({cats[0]}) of one prompt set; the "
                     "verdict table already shows it." if cats else "No samples.")
        return plot
    spec = spec_ok(frame)
    if spec.empty:
        plot.note = NO_SPEC
        return plot
    colors = series_colors(verdict)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["acceptance rate", f"TPOT speedup at concurrency {c0}"])
    rates = {}
    for series, rows in spec.groupby("series", sort=False):
        g = rows.groupby("_cat")[["accepted_tokens", "drafted_tokens"]].sum().reindex(cats)
        tok = g["accepted_tokens"] / g["drafted_tokens"].where(g["drafted_tokens"] > 0)
        req = rows.groupby("_cat")["acceptance_rate"].mean().reindex(cats)
        rates[series] = (tok, req)
    both = pd.concat([pd.DataFrame({"tok": t, "req": r}) for t, r in rates.values()])
    differ = steps_mod.weightings_differ(both, "req", "tok")
    for series, (tok, req) in rates.items():
        fig.add_trace(go.Bar(x=cats, y=tok, name=series, legendgroup=series,
                             marker_color=colors.get(series),
                             hovertemplate="%{x}: %{y:.1%} token-weighted" f"<extra>{series}</extra>"),
                      row=1, col=1)
        if differ:
            fig.add_trace(go.Bar(x=cats, y=req, name=f"{series} (request-weighted)",
                                 legendgroup=series, showlegend=False,
                                 marker=dict(color=colors.get(series), pattern_shape="/",
                                             opacity=0.6),
                                 hovertemplate="%{x}: %{y:.1%} request-weighted"
                                               f"<extra>{series}</extra>"), row=1, col=1)
    if differ:
        plot.caption += (" Hatched bars: request-weighted acceptance rate (mean of each "
                         "request's own rate), where it differs from the token-weighted one.")
    ok = frame[analysis.ok_mask(frame) & frame["tpot_s"].notna()]
    pairs = verdict[(~verdict["is_baseline"]) & (verdict["concurrency"] == c0)
                    & verdict["baseline_label"].notna()]
    drew_speedup = False
    top = 1.0
    for r in pairs.itertuples():
        b = ok[ok["label"] == r.baseline_label].groupby("prompt_id").agg(
            tpot=("tpot_s", "mean"), cat=("_cat", "first"))
        s = ok[ok["label"] == r.label].groupby("prompt_id")["tpot_s"].mean()
        joined = b.join(s.rename("spec"), how="inner")
        ys = []
        for cat in cats:
            j = joined[joined["cat"] == cat]
            ys.append(float(j["tpot"].median() / j["spec"].median()) if len(j) else None)
        if all(v is None for v in ys):
            continue
        drew_speedup = True
        top = max([top] + [v for v in ys if v is not None])
        fig.add_trace(go.Bar(x=cats, y=ys, name=r.series, legendgroup=r.series, showlegend=False,
                             marker_color=colors.get(r.series),
                             hovertemplate="%{x}: %{y:.2f}×" f"<extra>{r.label}</extra>"),
                      row=2, col=1)
    if drew_speedup:
        fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=2, col=1)
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="×", range=[0, top * 1.15], row=2, col=1)
    fig.update_layout(barmode="group")
    plot.figure = style(fig, height=600, top=50, legend_right=True)
    return plot
