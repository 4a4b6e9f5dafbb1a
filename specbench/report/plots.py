"""The report's figures, built with Plotly graph objects from the joined samples frame and the
verdict table. Each builder returns a `Plot`: a figure, or no figure and a note saying why
there is nothing to draw (a plot with no data is never drawn empty).

Acceptance plots pool a configuration over concurrency (its `series`): what the verifier
accepts depends on the drafter, the target and the prompts, not on how many requests share a
batch. Latency and memory plots keep concurrency apart.

`sections()` lists the page's sections and their builders; the per-step plots live in
`specbench.report.cliff`, the fitted model's in `specbench.report.model_view`, a study's in
`specbench.report.study_view`.

Boundary: reads `ReportInputs.frame`, the verdict table and run metadata; no HTML, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from specbench import analysis
from specbench import steps as steps_mod
from specbench.report import fmt
from specbench.report.inputs import ReportInputs
from specbench.report.verdict import CONFIDENCE


@dataclass
class Plot:
    name: str  # unique, used in the element id `plot-<name>`
    title: str
    caption: str
    figure: go.Figure | None = None
    note: str | None = None  # why nothing is drawn (figure is None)
    tables: list[list[list[str]]] | None = None  # tables under the figure (first row: headers)


BASELINE_COLOR = "#555555"
_PALETTE = qualitative.Plotly + qualitative.D3
_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


def series_colors(verdict: pd.DataFrame) -> dict[str, str]:
    """One color per series (a configuration across concurrency), grey for baselines."""
    colors: dict[str, str] = {}
    i = 0
    for r in verdict.drop_duplicates("series").itertuples():
        if r.is_baseline:
            colors[r.series] = BASELINE_COLOR
        else:
            colors[r.series] = _PALETTE[i % len(_PALETTE)]
            i += 1
    return colors


def _style(fig: go.Figure, height: int = 420, top: int = 40, legend_right: bool = False) -> go.Figure:
    """Shared look: the legend in a row above the plot, or (`legend_right`, for figures with
    subplot titles, which a legend above would cover) in a column right of it; `top` leaves
    room above."""
    legend = (dict(orientation="v", yanchor="top", y=1.0, xanchor="left", x=1.02) if legend_right
              else dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))
    fig.update_layout(
        template="plotly_white", height=height, font=dict(family=_FONT, size=12),
        margin=dict(l=60, r=20, t=top, b=50), hovermode="closest", legend=legend,
    )
    return fig


def _spec_ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["is_baseline"] & analysis.ok_mask(frame)]


def _family(series: str) -> str:
    """The series with its k taken out (`draft_model-k4-off8` -> `draft_model-off8`): one line
    per family in the TPOT-vs-k plot, one panel per family in the heatmap."""
    return re.sub(r"-k\d+", "", re.sub(r"-k\d+dyn", "-dynamic_k", series))


_NO_SPEC = "These runs have no speculative configuration."


# --------------------------------------------------------------------------------------
# Speed


def tpot_vs_k(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("tpot-vs-k", "TPOT vs k",
                "Median time per output token against the number of draft tokens per step k, "
                "one line per method and concurrency; k = 0 is the baseline. Whiskers reach "
                "the p95.")
    spec = verdict[~verdict["is_baseline"] & verdict["tpot_p50_s"].notna()]
    if spec.empty:
        plot.note = _NO_SPEC if (~verdict["is_baseline"]).sum() == 0 else "No TPOT values."
        return plot
    base = verdict.set_index("label")
    concs = sorted(spec["concurrency"].unique())
    fig = go.Figure()
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    families = list(dict.fromkeys(_family(s) for s in spec["series"]))
    for (fam, c), rows in spec.assign(family=spec["series"].map(_family)).groupby(
            ["family", "concurrency"], sort=False):
        rows = rows.sort_values("num_speculative_tokens")
        x, y, up = [], [], []
        b_label = rows["baseline_label"].dropna()
        if len(b_label):
            b = base.loc[b_label.iloc[0]]
            x.append(0)
            y.append(b["tpot_p50_s"] * 1e3)
            up.append((b["tpot_p95_s"] - b["tpot_p50_s"]) * 1e3)
        x += rows["num_speculative_tokens"].tolist()
        y += (rows["tpot_p50_s"] * 1e3).tolist()
        up += ((rows["tpot_p95_s"] - rows["tpot_p50_s"]) * 1e3).tolist()
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines+markers", name=f"{fam} · c={c}",
            error_y=dict(type="data", array=up, arrayminus=[0] * len(up), thickness=1, width=3),
            line=dict(color=_PALETTE[concs.index(c) % len(_PALETTE)],
                      dash=dashes[families.index(fam) % len(dashes)]),
            hovertemplate="k=%{x}<br>TPOT p50 %{y:.2f} ms<extra>%{fullData.name}</extra>"))
    fig.update_xaxes(title="k (draft tokens per step; 0 = baseline)", dtick=1)
    fig.update_yaxes(title="TPOT p50 (ms)", rangemode="tozero")
    plot.figure = _style(fig)
    return plot


def speedup_heatmap(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("speedup-heatmap", "Speedup heatmap: k × concurrency",
                "TPOT speedup over the baseline at the same concurrency (baseline / speculative "
                f"median TPOT, prompts paired), its {int(CONFIDENCE * 100)}% bootstrap "
                "confidence interval and n, the number of prompts paired. Blue is faster than "
                "the baseline, red slower.")
    spec = verdict[~verdict["is_baseline"] & verdict["tpot_speedup"].notna()]
    if spec.empty:
        plot.note = _NO_SPEC if (~verdict["is_baseline"]).sum() == 0 else \
            "No speculative configuration has a baseline at the same concurrency."
        return plot
    if inputs.studies and all(rid in inputs.groups for rid in inputs.run_ids):
        plot.note = ("Every run here is a study's trial: the heatmap is drawn from the trials in "
                     "the study section below, with infeasible and failed trials marked.")
        return plot
    spec = spec.assign(family=spec["series"].map(_family))
    families = list(dict.fromkeys(spec["family"]))
    fig = make_subplots(rows=1, cols=len(families), subplot_titles=families,
                        horizontal_spacing=0.08)
    span = max(abs(np.log(spec["tpot_speedup"].clip(lower=1e-3))).max(), np.log(1.1))
    for i, fam in enumerate(families, start=1):
        rows = spec[spec["family"] == fam]
        ks = sorted(rows["num_speculative_tokens"].unique())
        concs = sorted(rows["concurrency"].unique())
        z = [[None] * len(ks) for _ in concs]
        text = [[""] * len(ks) for _ in concs]
        hover = [[""] * len(ks) for _ in concs]
        for r in rows.itertuples():
            a, b = concs.index(r.concurrency), ks.index(r.num_speculative_tokens)
            z[a][b] = float(np.log(r.tpot_speedup))
            ci = ("" if fmt.missing(r.tpot_speedup_lo)
                  else f"<br>[{fmt.ci(r.tpot_speedup_lo, r.tpot_speedup_hi)}]")
            text[a][b] = f"{fmt.times(r.tpot_speedup)}{ci}<br>n={r.paired_prompts}"
            hover[a][b] = (f"{r.label}<br>speedup {fmt.times(r.tpot_speedup)}"
                           f"<br>{int(CONFIDENCE * 100)}% CI "
                           f"{fmt.ci(r.tpot_speedup_lo, r.tpot_speedup_hi)}"
                           f"<br>{r.paired_prompts} prompts paired with the baseline")
        fig.add_trace(go.Heatmap(
            x=[f"k={k}" for k in ks], y=[f"c={c}" for c in concs], z=z, text=text,
            texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorscale="RdBu", zmid=0, zmin=-span, zmax=span, showscale=(i == len(families)),
            colorbar=dict(title="speedup", tickvals=np.log([0.5, 0.8, 1, 1.25, 2]).tolist(),
                          ticktext=["0.5×", "0.8×", "1×", "1.25×", "2×"])), row=1, col=i)
        fig.update_xaxes(title_text="k", row=1, col=i)
        fig.update_yaxes(title_text="concurrency" if i == 1 else None, row=1, col=i)
    plot.figure = _style(fig, height=max(300, 120 + 60 * spec["concurrency"].nunique()))
    return plot


def tail_latency(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("tail-latency", "Tail latency vs the baseline",
                "P95 (top) and P99 (bottom) of TTFT, TPOT and E2E for every configuration, "
                "grouped by concurrency; the grey bar is the baseline.")
    if verdict[[f"{m}_p95_s" for m in ("ttft", "tpot", "e2e")]].isna().all().all():
        plot.note = "No successful sample has latency values."
        return plot
    colors = series_colors(verdict)
    metrics = ("ttft", "tpot", "e2e")
    fig = make_subplots(rows=2, cols=3, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{m.upper()} p{q}" for q in (95, 99) for m in metrics])
    for series, rows in verdict.groupby("series", sort=False):
        x = [f"c={c}" for c in rows["concurrency"]]
        for qi, q in enumerate((95, 99), start=1):
            for mi, m in enumerate(metrics, start=1):
                fig.add_trace(go.Bar(
                    x=x, y=rows[f"{m}_p{q}_s"] * 1e3, name=series, legendgroup=series,
                    showlegend=(qi == 1 and mi == 1), marker_color=colors[series],
                    hovertemplate=f"{series}<br>%{{x}}: %{{y:.2f}} ms<extra>{m.upper()} p{q}</extra>"),
                    row=qi, col=mi)
    fig.update_yaxes(title_text="ms", col=1)
    fig.update_layout(barmode="group")
    plot.figure = _style(fig, height=600, top=50, legend_right=True)
    return plot


def memory(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("memory", "Peak memory by configuration",
                "Highest peak memory of any sample: the CUDA allocator's peak on GPU, the "
                "process's resident-set high-water mark on CPU.")
    if verdict["peak_memory_bytes"].isna().all():
        plot.note = "No sample reported peak memory."
        return plot
    colors = series_colors(verdict)
    fig = go.Figure()
    for series, rows in verdict.groupby("series", sort=False):
        fig.add_trace(go.Bar(
            x=[f"c={c}" for c in rows["concurrency"]], y=rows["peak_memory_bytes"] / 2**20,
            name=series, marker_color=colors[series],
            customdata=[fmt.signed_mib(d) for d in rows["memory_delta_bytes"]],
            hovertemplate=f"{series}<br>%{{x}}: %{{y:,.0f}} MiB (%{{customdata}} vs baseline)"
                          "<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="peak memory (MiB)")
    plot.figure = _style(fig, height=360)
    return plot


# --------------------------------------------------------------------------------------
# Acceptance


def acceptance_length_histogram(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("acceptance-length", "Mean acceptance length per request",
                "How many requests reached each mean acceptance length (tokens per target step "
                "= 1 + accepted / verification steps), per configuration, pooled over "
                "concurrency. A wide or two-humped spread means speculation helps some prompts "
                "far more than others; the per-step distribution is in the next two plots.")
    spec = _spec_ok(inputs.frame)
    spec = spec[spec["num_steps"] > 0]
    if spec.empty:
        plot.note = _NO_SPEC if _spec_ok(inputs.frame).empty else \
            "No verification step proposed draft tokens."
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
    plot.figure = _style(fig, height=360)
    return plot


def survival(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("survival", "Per-position acceptance (survival)",
                "Share of verification steps whose i-th draft token was accepted (acceptance is a "
                "prefix, so this falls with i).")
    spec = _spec_ok(inputs.frame)
    colors = series_colors(verdict)
    fig = go.Figure()
    for series, rows in spec.groupby("series", sort=False):
        curve = analysis.per_position_acceptance(rows)
        if curve.size == 0:
            continue
        fig.add_trace(go.Scatter(x=np.arange(1, curve.size + 1), y=curve, mode="lines+markers",
                                 name=series, line=dict(color=colors.get(series)),
                                 hovertemplate="position %{x}: %{y:.1%}"
                                               f"<extra>{series}</extra>"))
    if not fig.data:
        plot.note = _NO_SPEC if spec.empty else "No verification step proposed draft tokens."
        return plot
    fig.update_xaxes(title_text="draft position i", dtick=1)
    fig.update_yaxes(title_text="P(accepted)", tickformat=".0%", range=[0, 1.05])
    plot.figure = _style(fig, height=380)
    return plot


def rejection_positions(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("rejection-positions", "Where drafts are first rejected",
                "Share of verification steps by the position of the first rejected draft token; "
                "'none' means every draft token was accepted.")
    spec = _spec_ok(inputs.frame)
    colors = series_colors(verdict)
    fig = go.Figure()
    for series, rows in spec.groupby("series", sort=False):
        pos = [np.asarray(x, dtype=int) for x in rows["rejection_positions"] if len(x)]
        if not pos:
            continue
        pos = np.concatenate(pos)
        k = int(rows["num_speculative_tokens"].max())
        cats = [str(i + 1) for i in range(k)] + ["none"]
        counts = np.array([(pos == i).sum() for i in range(k)] + [(pos < 0).sum()])
        fig.add_trace(go.Bar(x=cats, y=counts / max(counts.sum(), 1), name=series,
                             marker_color=colors.get(series), customdata=counts,
                             hovertemplate="position %{x}: %{y:.1%} (%{customdata} steps)"
                                           f"<extra>{series}</extra>"))
    if not fig.data:
        plot.note = _NO_SPEC if spec.empty else "No verification step proposed draft tokens."
        return plot
    kmax = int(spec["num_speculative_tokens"].max())
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="first rejected draft position", type="category",
                     categoryorder="array",
                     categoryarray=[str(i + 1) for i in range(kmax)] + ["none"])
    fig.update_yaxes(title_text="share of steps", tickformat=".0%")
    plot.figure = _style(fig, height=380)
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
    spec = _spec_ok(frame)
    if spec.empty:
        plot.note = _NO_SPEC
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
    plot.figure = _style(fig, height=600, top=50, legend_right=True)
    return plot


# --------------------------------------------------------------------------------------
# Correctness and scheduling


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
    plot.figure = _style(fig, height=max(320, 200 + 40 * len(order)))
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
        stats = (run.meta.get("config") or {}).get("configuration_stats") or {}
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
                             marker_color=_PALETTE[i % len(_PALETTE)],
                             hovertemplate="batch %{x}: %{y:.1%} (%{customdata} steps)"
                                           f"<extra>{lbl}</extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="requests in the batch", dtick=1)
    fig.update_yaxes(title_text="share of steps", tickformat=".0%")
    plot.figure = _style(fig, height=380)
    return plot


# --------------------------------------------------------------------------------------

Builder = Callable[[ReportInputs, pd.DataFrame], Plot]


def sections() -> list[tuple[str, list[Builder]]]:
    """(section, builders), in page order."""
    from specbench.report import cliff, model_view

    return [
        ("Speed", [tpot_vs_k, speedup_heatmap, cliff.by_batch_size, tail_latency, memory]),
        ("Acceptance", [acceptance_length_histogram, survival, rejection_positions, by_category,
                        cliff.by_context, cliff.by_output_position]),
        ("Speedup model", [model_view.parity, model_view.prediction]),
        ("Correctness and scheduling", [regression, batch_sizes]),
    ]
