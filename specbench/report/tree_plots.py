"""The report's draft-tree figures: where a tree's accepted path ends (acceptance by depth) and
which branches it takes (acceptance by branch rank), and the TPOT speedup against the tokens
one target pass verifies, per concurrency (a tree verifies more tokens per pass than a chain of
its depth, so the concurrency cliff, where extra verified tokens stop being free, comes sooner
as the tree grows).

Boundary: figures from the report frame and the verdict table; no HTML.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.report.inputs import ReportInputs
from specbench.report.plots import NO_SPEC, Plot, series_colors, spec_ok, style


def _topk(frame: pd.DataFrame) -> pd.Series:
    """topk per row; runs recorded before trees (no column, or nulls) drafted chains."""
    if "topk" not in frame:
        return pd.Series(1, index=frame.index)
    return frame["topk"].fillna(1).astype(int)


def _width(frame: pd.DataFrame) -> pd.Series:
    """Tokens one target pass verifies: `num_draft_tokens` as recorded, else k + 1."""
    chain = frame["num_speculative_tokens"].astype(int) + 1
    if "num_draft_tokens" not in frame:
        return chain
    return frame["num_draft_tokens"].fillna(chain).astype(int)


def depth_and_rank(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(survival by depth, share by rank) over the drafting steps of `rows`: survival[d - 1]
    is the share of steps whose accepted path reached depth d; share[r] the share of
    accepted nodes that were their parent's rank-r child (0 = the drafter's best)."""
    accepted, ranks = [], []
    for acc, drafted, rk in zip(rows["step_accepted"], rows["step_drafted"],
                                rows.get("step_accepted_ranks", pd.Series([None] * len(rows)))):
        for i, d in enumerate(drafted if drafted is not None else ()):
            if d <= 0:
                continue
            accepted.append(int(acc[i]))
            if rk is not None and i < len(rk) and rk[i] is not None:
                ranks.extend(int(x) for x in rk[i])
    if not accepted:
        return np.array([]), np.array([])
    acc = np.asarray(accepted)
    depth = max(int(acc.max()), 1)
    survival = np.array([(acc >= d).mean() for d in range(1, depth + 1)])
    share = np.bincount(np.asarray(ranks, dtype=int)) / len(ranks) if ranks else np.array([])
    return survival, share


def _has_trees(inputs: ReportInputs) -> bool:
    return bool((_topk(inputs.frame) > 1).any())


def tree_acceptance(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot | None:
    """None where no tree was measured: the section is left out of a report of chains."""
    if not _has_trees(inputs):
        return None
    plot = Plot("tree-acceptance", "Draft trees: acceptance by depth and by branch rank",
                "Left: share of verification steps whose accepted path reached each depth of the "
                "draft tree (a chain's per-position acceptance). Right: of the accepted nodes, the "
                "share that were their parent's best child (rank 0), second best (rank 1), ...: "
                "weight beyond rank 0 is what the tree adds over a chain of the same depth. Pooled "
                "over concurrency.")
    spec = spec_ok(inputs.frame)
    if spec.empty:
        plot.note = NO_SPEC
        return plot
    trees = spec[_topk(spec) > 1]
    if trees.empty:
        plot.note = "Every draft-tree request failed."
        return plot
    colors = series_colors(verdict)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["accepted path reaches depth d",
                                                        "accepted nodes by branch rank"])
    for series, rows in trees.groupby("series", sort=False):
        survival, share = depth_and_rank(rows)
        if survival.size == 0:
            continue
        c = colors.get(series)
        fig.add_trace(go.Scatter(x=np.arange(1, survival.size + 1), y=survival, mode="lines+markers",
                                 name=series, legendgroup=series, line=dict(color=c),
                                 hovertemplate="depth %{x}: %{y:.1%}" f"<extra>{series}</extra>"), row=1, col=1)
        if share.size:
            fig.add_trace(go.Bar(x=[str(r) for r in range(share.size)], y=share, name=series,
                                 legendgroup=series, showlegend=False, marker_color=c,
                                 hovertemplate="rank %{x}: %{y:.1%}" f"<extra>{series}</extra>"), row=1, col=2)
    if not fig.data:
        plot.note = "No tree verification step proposed draft tokens."
        return plot
    fig.update_xaxes(title_text="depth d", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="share of steps", tickformat=".0%", range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="branch rank", type="category", row=1, col=2)
    fig.update_yaxes(title_text="share of accepted nodes", tickformat=".0%", row=1, col=2)
    fig.update_layout(barmode="group")
    plot.figure = style(fig, height=380, top=50, legend_right=True)
    return plot


def speedup_by_tree_size(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot | None:
    """None where no tree was measured (TPOT against k is in the Speed section)."""
    if not _has_trees(inputs):
        return None
    plot = Plot("tree-size", "TPOT speedup by tokens verified per target pass",
                "Each configuration's paired TPOT speedup (median baseline TPOT / its TPOT) against "
                "the tokens one target pass verifies: k + 1 for a chain (circles), the tree's size "
                "for a tree (diamonds), one line per concurrency. As concurrency grows, verifying "
                "more tokens per pass stops being free, and the best size moves left.")
    frame = spec_ok(inputs.frame)
    if frame.empty:
        plot.note = NO_SPEC
        return plot
    shape = pd.DataFrame({"label": frame["label"], "width": _width(frame), "tree": _topk(frame) > 1})
    shape = shape.groupby("label").first()
    v = verdict[~verdict["is_baseline"] & verdict["tpot_speedup"].notna()].join(shape, on="label")
    v = v[v["width"].notna()]
    if v.empty:
        plot.note = "No configuration has a paired TPOT speedup (no baseline on the same prompts)."
        return plot
    fig = go.Figure()
    for c, rows in v.sort_values("width").groupby("concurrency", sort=True):
        fig.add_trace(go.Scatter(
            x=rows["width"], y=rows["tpot_speedup"], mode="lines+markers", name=f"concurrency {c}",
            marker=dict(symbol=["diamond" if t else "circle" for t in rows["tree"]], size=9),
            customdata=rows["label"],
            hovertemplate="%{customdata}: %{x} tokens per pass, %{y:.2f}×<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    fig.update_xaxes(title_text="tokens verified per target pass (k + 1, or the tree's size)", dtick=1)
    fig.update_yaxes(title_text="TPOT speedup ×")
    plot.figure = style(fig, height=380)
    return plot
