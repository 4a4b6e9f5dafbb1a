"""Where production teams look for their cliff, from the per-step records (`specbench.steps`):
acceptance and decode speed per batch size actually reached (not only per configured
concurrency), acceptance by context length and by output position.

Each plot draws the token-weighted figure as a solid line and the request-weighted one
dashed, the latter only where the two differ by more than 2% somewhere (both weightings are
reported, as in `specbench.analysis`: long outputs otherwise dominate). Acceptance pools a configuration over concurrency
(its series), like the other acceptance plots; speed per batch size compares a series'
steps with the steps of the baselines it is paired with, at the same batch size.

Boundary: plots from the report frame; numbers from `specbench.steps`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench import steps as st
from specbench.report.inputs import ReportInputs
from specbench.report.plots import NO_SPEC, Plot, series_colors, style

_NO_STEPS = ("The runs have no per-step records (runs written before records schema 2, or a "
             "backend that reports no steps).")
_NO_BATCH = "The backend reported no batch size per step (HTTP backends do not)."


def report_steps(inputs: ReportInputs) -> pd.DataFrame:
    """Exploded steps of the report frame, computed once per report."""
    if "steps" not in inputs.cache:
        inputs.cache["steps"] = st.explode(
            inputs.frame, keep=["label", "series", "is_baseline", "num_speculative_tokens",
                                "concurrency", "category"])
    return inputs.cache["steps"]


def _lines(fig: go.Figure, table: pd.DataFrame, x: str, tok: str, req: str, colors: dict,
           row: int | None = None, hover: str = "%{y:.2f}", xfmt=None) -> bool:
    """One solid (token-weighted) line per series, dashed request-weighted where they differ;
    returns whether any request-weighted line was drawn."""
    differ = st.weightings_differ(table, req, tok)
    kw = {"row": row, "col": 1} if row else {}
    for series, g in table.groupby("series", sort=False):
        xs = g[x] if xfmt is None else g[x].map(xfmt)
        custom = np.stack([g["steps"], g["requests"]], axis=-1)
        fig.add_trace(go.Scatter(
            x=xs, y=g[tok], mode="lines+markers", name=series, legendgroup=series,
            showlegend=row in (None, 1), line=dict(color=colors.get(series)), customdata=custom,
            hovertemplate=f"%{{x}}: {hover} token-weighted (%{{customdata[0]}} steps, "
                          f"%{{customdata[1]}} requests)<extra>{series}</extra>"), **kw)
        if differ:
            fig.add_trace(go.Scatter(
                x=xs, y=g[req], mode="lines", name=f"{series} (request-weighted)",
                legendgroup=series, showlegend=False,
                line=dict(color=colors.get(series), dash="dash"),
                hovertemplate=f"%{{x}}: {hover} request-weighted<extra>{series}</extra>"), **kw)
    return differ


def by_batch_size(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("by-batch-size", "Acceptance and decode speed per batch size reached",
                "Top: mean acceptance length (1 + accepted / drafting steps) of the steps that ran "
                "with n requests in the batch, whatever the configured concurrency. Bottom: "
                "decode speedup at that batch size: the paired baselines' step time per output "
                "token / the configuration's (draft + verify time of each step shared by its "
                "rows; prefill and scheduling are not included, so this is where the cliff "
                "comes from, not the end-to-end TPOT).")
    steps = report_steps(inputs)
    spec = steps[~steps["is_baseline"].astype(bool)]
    if steps.empty:
        plot.note = _NO_STEPS
        return plot
    if spec.empty:
        plot.note = NO_SPEC
        return plot
    if spec["batch_size"].isna().all():
        plot.note = _NO_BATCH
        return plot
    steps = steps[steps["batch_size"].notna()]
    if steps["batch_size"].nunique() < 2:
        plot.note = ("Every step ran with the same batch size "
                     f"({int(steps['batch_size'].iloc[0])}): run several --concurrency values to "
                     "see acceptance and speed change with it.")
        return plot
    colors = series_colors(verdict)
    acc = st.acceptance(steps[~steps["is_baseline"].astype(bool)], ["series", "batch_size"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["mean acceptance length", "decode speedup vs the baseline"])
    differ = _lines(fig, acc, "batch_size", "mal_tok", "mal_req", colors, row=1)
    drew = False
    for series, labels in verdict[~verdict["is_baseline"]].groupby("series", sort=False)["label"]:
        spec_labels = list(labels)
        bases = [b for b in verdict.loc[verdict["label"].isin(spec_labels), "baseline_label"].dropna()]
        if not bases:
            continue
        s_rows = steps[steps["label"].isin(spec_labels)]
        b_rows = steps[steps["label"].isin(bases)]
        s = st.time_per_token(s_rows.assign(series=series), ["series", "batch_size"]).set_index("batch_size")
        b = st.time_per_token(b_rows.assign(series=series), ["series", "batch_size"]).set_index("batch_size")
        both = s.index.intersection(b.index)
        if not len(both):
            continue
        ratio = b.loc[both, "s_per_token"] / s.loc[both, "s_per_token"]
        drew = True
        fig.add_trace(go.Scatter(
            x=list(both), y=ratio, mode="lines+markers", name=series, legendgroup=series,
            showlegend=False, line=dict(color=colors.get(series)),
            customdata=np.stack([s.loc[both, "steps"], b.loc[both, "steps"]], axis=-1),
            hovertemplate="batch %{x}: %{y:.2f}× (%{customdata[0]} speculative, "
                          f"%{{customdata[1]}} baseline row-steps)<extra>{series}</extra>"),
            row=2, col=1)
    if drew:
        fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=2, col=1)
    fig.update_xaxes(title_text="requests in the batch", dtick=1, row=2, col=1)
    fig.update_yaxes(title_text="tokens per step", row=1, col=1)
    fig.update_yaxes(title_text="×", row=2, col=1)
    if differ:
        plot.caption += " Dashed: request-weighted (mean of each request's own figure)."
    plot.figure = style(fig, height=560, top=80, legend_right=True)
    return plot


def _acceptance_by_bins(inputs: ReportInputs, verdict: pd.DataFrame, column: str, edges_fn,
                        name: str, title: str, caption: str, xtitle: str) -> Plot:
    plot = Plot(name, title, caption)
    steps = report_steps(inputs)
    spec = steps[~steps["is_baseline"].astype(bool) & (steps["drafted"] > 0)]
    if steps.empty:
        plot.note = _NO_STEPS
        return plot
    if spec.empty:
        plot.note = NO_SPEC if steps["is_baseline"].all() else "No step proposed draft tokens."
        return plot
    edges = edges_fn(spec[column])
    if len(edges) < 3:
        plot.note = f"Every drafting step falls in one {xtitle} bin ({st.bin_labels(edges)[0]})."
        return plot
    spec = spec.assign(bin=st.assign_bins(spec[column], edges))
    acc = st.acceptance(spec, ["series", "bin"])
    acc = acc[acc["steps"] > 0]
    acc["bin"] = acc["bin"].astype(str)
    fig = go.Figure()
    differ = _lines(fig, acc, "bin", "rate_tok", "rate_req", series_colors(verdict),
                    hover="%{y:.1%}")
    fig.update_xaxes(title_text=xtitle, type="category", categoryorder="array",
                     categoryarray=st.bin_labels(edges))
    fig.update_yaxes(title_text="acceptance rate", tickformat=".0%", range=[0, 1.05])
    if differ:
        plot.caption += " Dashed: request-weighted (mean of each request's own rate in the bin)."
    plot.figure = style(fig, height=380)
    return plot


def by_context(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    return _acceptance_by_bins(
        inputs, verdict, "context", st.pow2_bins, "by-context", "Acceptance by context length",
        "Acceptance rate (accepted / drafted tokens) of the drafting steps by the tokens already "
        "in context before the step (prompt + output so far), in power-of-two bins.",
        "tokens in context")


def by_output_position(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    return _acceptance_by_bins(
        inputs, verdict, "output_pos", st.linear_bins, "by-output-position",
        "Acceptance by output position",
        "Acceptance rate of the drafting steps by how many output tokens the request had "
        "emitted before the step (drafts late in an answer often differ from early ones).",
        "output tokens so far")
