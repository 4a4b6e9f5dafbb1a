"""The report's correctness and scheduling figures: speculative outputs against the baseline's
(token match rate, first divergence) and the decode batch sizes the engine ran.

Boundary: figures from the report frame, the verdict table and run.json's configuration
stats; no HTML.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.report.inputs import ReportInputs
from specbench.report.plots import PALETTE, Plot, series_colors, style


def regression(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    frame = inputs.frame
    compared = frame[frame["token_match_rate"].notna() & ~frame["is_baseline"]]
    n_reg = int((compared["workload_kind"] == "regression").sum())
    plot = Plot("regression", "Outputs vs the baseline: match rate and first divergence",
                "Speculative outputs compared token by token with the baseline's output for the "
                "same prompt (greedy and regression prompts; "
                f"{n_reg} of the {len(compared)} compared samples are regression prompts). "
                "Left: mean token match rate, with the count of identical outputs. Right: the "
                "output position where each differing sample first diverges (hover for the "
                "prompt). Greedy float32 outputs must be identical; in bf16/fp16 near-ties can "
                "flip, and sampled regression prompts only match in distribution.")
    if compared.empty:
        plot.note = ("No speculative output was compared with a baseline output (match fields "
                     "are recorded for greedy and regression prompts).")
        return plot
    colors = series_colors(verdict)
    order = list(dict.fromkeys(compared["series"]))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6], horizontal_spacing=0.12,
                        subplot_titles=["mean token match rate", "first divergence position"])
    for series, rows in compared.groupby("series", sort=False):
        same = int((rows["first_divergence"] == -1).sum())
        fig.add_trace(go.Bar(x=[series], y=[rows["token_match_rate"].mean()], name=series,
                             marker_color=colors.get(series),
                             text=[f"{same}/{len(rows)} identical"], textposition="inside",
                             hovertemplate="%{y:.1%} of tokens match<extra>%{x}</extra>"),
                      row=1, col=1)
        div = rows[rows["first_divergence"] >= 0]
        if len(div):
            fig.add_trace(go.Scatter(
                x=div["first_divergence"], y=[series] * len(div), mode="markers", name=series,
                marker=dict(color=colors.get(series), size=10, opacity=0.8,
                            line=dict(width=1, color="#fff")),
                customdata=np.stack([div["label"], div["prompt_id"],
                                     div["token_match_rate"]], axis=-1),
                hovertemplate="%{customdata[0]} · %{customdata[1]}<br>first divergence at "
                              "token %{x}, match %{customdata[2]:.1%}<extra></extra>"),
                row=1, col=2)
    if (compared["first_divergence"] >= 0).any():
        top = int(compared["max_new_tokens"].max())
        fig.update_xaxes(title_text="output token index", range=[-0.5, top - 0.5], row=1, col=2)
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=order,
                         row=1, col=2)
    else:
        fig.add_annotation(text="every compared output is identical to the baseline",
                           xref="x2 domain", yref="y2 domain", x=0.5, y=0.5, showarrow=False)
        fig.update_xaxes(visible=False, row=1, col=2)
        fig.update_yaxes(visible=False, row=1, col=2)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=1, col=1)
    fig.update_layout(showlegend=False)
    plot.figure = style(fig, height=max(320, 200 + 40 * len(order)))
    return plot


def batch_sizes(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("batch-sizes", "Decode batch sizes",
                "Share of engine steps that ran n requests at once, per configuration "
                "(from the run's configuration stats). Speculation pays less as batches grow: "
                "the target's forward pass stops being memory-bound.")
    label_of = inputs.frame.drop_duplicates(["source", "run_config_id"]).set_index(
        ["source", "run_config_id"])["label"]
    rows = []
    for run, rid in zip(inputs.runs, inputs.run_ids):
        stats = run.config.configuration_stats
        for config_id, info in stats.items():
            hist = (info or {}).get("batch_sizes") or {}
            if (rid, config_id) not in label_of.index or not hist:
                continue
            for size, count in hist.items():
                rows.append((label_of[(rid, config_id)], int(size), int(count)))
    if not rows:
        plot.note = "The runs record no batch-size statistics (the hf backend, or older runs)."
        return plot
    hist = pd.DataFrame(rows, columns=["label", "size", "steps"])
    if hist["size"].max() <= 1:
        plot.note = "Every engine step ran a single request (concurrency 1)."
        return plot
    fig = go.Figure()
    order = [lbl for lbl in verdict["label"] if lbl in set(hist["label"])]
    for i, lbl in enumerate(order):
        h = hist[hist["label"] == lbl].groupby("size")["steps"].sum()
        fig.add_trace(go.Bar(x=h.index, y=h / h.sum(), name=lbl, customdata=h.to_numpy(),
                             marker_color=PALETTE[i % len(PALETTE)],
                             hovertemplate="batch %{x}: %{y:.1%} (%{customdata} steps)"
                                           f"<extra>{lbl}</extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="requests in the batch", dtick=1)
    fig.update_yaxes(title_text="share of steps", tickformat=".0%")
    plot.figure = style(fig, height=380)
    return plot
