"""The report's speed figures: TPOT against k, the speedup heatmap over k x concurrency (with
the paired-bootstrap interval per cell), tail latency against the baseline and peak memory.
Latency and memory keep concurrency apart.

Boundary: figures from the verdict table (`specbench.report.verdict`); no HTML.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.report import fmt
from specbench.report.inputs import ReportInputs
from specbench.report.plots import NO_SPEC, PALETTE, SPEEDUP_COLORBAR, Plot, series_colors, series_family, style
from specbench.report.verdict import CONFIDENCE


def tpot_vs_k(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("tpot-vs-k", "TPOT vs k",
                "Median time per output token against the number of draft tokens per step k, "
                "one line per method and concurrency; k = 0 is the baseline. Whiskers reach "
                "the p95.")
    spec = verdict[~verdict["is_baseline"] & verdict["tpot_p50_s"].notna()]
    if spec.empty:
        plot.note = NO_SPEC if (~verdict["is_baseline"]).sum() == 0 else "No TPOT values."
        return plot
    base = verdict.set_index("label")
    concs = sorted(spec["concurrency"].unique())
    fig = go.Figure()
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    families = list(dict.fromkeys(series_family(s) for s in spec["series"]))
    for (fam, c), rows in spec.assign(family=spec["series"].map(series_family)).groupby(
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
            line=dict(color=PALETTE[concs.index(c) % len(PALETTE)],
                      dash=dashes[families.index(fam) % len(dashes)]),
            hovertemplate="k=%{x}<br>TPOT p50 %{y:.2f} ms<extra>%{fullData.name}</extra>"))
    fig.update_xaxes(title="k (draft tokens per step; 0 = baseline)", dtick=1)
    fig.update_yaxes(title="TPOT p50 (ms)", rangemode="tozero")
    plot.figure = style(fig)
    return plot


def speedup_heatmap(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot:
    plot = Plot("speedup-heatmap", "Speedup heatmap: k × concurrency",
                "TPOT speedup over the baseline at the same concurrency (baseline / speculative "
                f"median TPOT, prompts paired), its {int(CONFIDENCE * 100)}% bootstrap "
                "confidence interval and n, the number of prompts paired (above concurrency 1 in "
                "that many blocks, the interval's unit: a block's prompts ran together, so a burst "
                "of load moves them alike). Blue is faster than the baseline, red slower.")
    spec = verdict[~verdict["is_baseline"] & verdict["tpot_speedup"].notna()]
    if spec.empty:
        plot.note = NO_SPEC if (~verdict["is_baseline"]).sum() == 0 else \
            "No speculative configuration has a baseline at the same concurrency."
        return plot
    if inputs.studies and all(rid in inputs.groups for rid in inputs.run_ids):
        plot.note = ("Every run here is a study's trial: the heatmap is drawn from the trials in "
                     "the study section below, with infeasible and failed trials marked.")
        return plot
    spec = spec.assign(family=spec["series"].map(series_family))
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
            blocks = "" if fmt.missing(r.paired_blocks) else f" in {int(r.paired_blocks)} blocks"
            text[a][b] = f"{fmt.times(r.tpot_speedup)}{ci}<br>n={r.paired_prompts}{blocks}"
            hover[a][b] = (f"{r.label}<br>speedup {fmt.times(r.tpot_speedup)}"
                           f"<br>{int(CONFIDENCE * 100)}% CI "
                           f"{fmt.ci(r.tpot_speedup_lo, r.tpot_speedup_hi)}"
                           f"<br>{r.paired_prompts} prompts paired with the baseline{blocks}")
        fig.add_trace(go.Heatmap(
            x=[f"k={k}" for k in ks], y=[f"c={c}" for c in concs], z=z, text=text,
            texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            colorscale="RdBu", zmid=0, zmin=-span, zmax=span, showscale=(i == len(families)),
            colorbar=SPEEDUP_COLORBAR), row=1, col=i)
        fig.update_xaxes(title_text="k", row=1, col=i)
        fig.update_yaxes(title_text="concurrency" if i == 1 else None, row=1, col=i)
    plot.figure = style(fig, height=max(300, 120 + 60 * spec["concurrency"].nunique()))
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
    plot.figure = style(fig, height=600, top=50, legend_right=True)
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
    plot.figure = style(fig, height=360)
    return plot
