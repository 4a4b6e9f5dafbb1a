"""The report's figures of production-shaped traffic: acceptance length and TPOT speedup by
scenario (free, JSON, tool calls, regex, grammar, choice) with the valid outputs below, and
acceptance by turn of replayed conversations. The numbers are `specbench.analysis.scenarios`'
and `specbench.analysis.turns`' (the console's tables).

Boundary: figures from the report frame; no HTML.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specbench.analysis.scenarios import has_scenarios, scenario_summary
from specbench.analysis.turns import has_turns, turn_summary
from specbench.formatting import dash_or, ms
from specbench.report.inputs import ReportInputs
from specbench.report.plots import Plot, series_colors, style


def by_scenario(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot | None:
    """None where every sample is a free prompt: the figure is left out of the report."""
    if not has_scenarios(inputs.frame):
        return None
    plot = Plot("by-scenario", "Structured output: acceptance, speedup and validity by scenario",
                "Top: mean acceptance length (1 + accepted / verification steps, token-weighted) per "
                "scenario. Bottom: TPOT speedup against the baseline's samples of the same scenario at "
                "the same load (median TPOT ratio). The table counts outputs that parse and satisfy "
                "their schema, tool signature, regex or choices (records' output_valid). Structured "
                "output is where the draft and the verified output part ways, and where fixed keys "
                "favour n-gram and suffix drafts.")
    frame = inputs.frame
    table = scenario_summary(frame)
    colors = series_colors(verdict)
    series_of = dict(zip(frame["config_id"], frame["series"]))
    scenarios = list(dict.fromkeys(table["scenario"]))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=["acceptance length", "TPOT speedup"])
    for config_id, rows in table[~table["is_baseline"]].groupby("config_id", sort=False):
        rows = rows.set_index("scenario").reindex(scenarios)
        color = colors.get(series_of.get(config_id, ""))
        fig.add_trace(go.Bar(x=scenarios, y=rows["mean_acceptance_length_tok"], name=str(config_id),
                             legendgroup=str(config_id), marker_color=color,
                             hovertemplate="%{x}: %{y:.2f} tokens per step" f"<extra>{config_id}</extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=scenarios, y=rows["tpot_p50_speedup"], name=str(config_id), showlegend=False,
                             legendgroup=str(config_id), marker_color=color,
                             hovertemplate="%{x}: %{y:.2f}×" f"<extra>{config_id}</extra>"), row=2, col=1)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=2, col=1)
    fig.update_yaxes(title_text="×", row=2, col=1)
    fig.update_layout(barmode="group")
    plot.figure = style(fig, height=560, top=50, legend_right=True)
    plot.tables = [[["scenario", "configuration", "samples", "valid", "accept len", "TPOT p50", "speedup"]] + [
        [str(r.scenario), str(r.config_id), str(r.n), f"{r.valid}/{r.checked}" if r.checked else "–",
         "–" if r.is_baseline else dash_or(r.mean_acceptance_length_tok, ".2f"), ms(r.tpot_p50_s),
         "1.00" if r.is_baseline else dash_or(r.tpot_p50_speedup, ".2f")]
        for r in table.itertuples()]]
    return plot


def by_turn(inputs: ReportInputs, verdict: pd.DataFrame) -> Plot | None:
    """None without replayed conversations (`--turns`): the figure is left out."""
    if not has_turns(inputs.frame):
        return None
    plot = Plot("by-turn", "Replayed conversations: acceptance and prompt length by turn",
                "Mean acceptance length (token-weighted) per turn of the replayed conversations, each turn sent "
                "with the history and the configuration's own earlier answers; the table adds the mean prompt "
                "tokens (the growing history) and TPOT p50.")
    table = turn_summary(inputs.frame)
    colors = series_colors(verdict)
    series_of = dict(zip(inputs.frame["config_id"], inputs.frame["series"]))
    fig = go.Figure()
    for config_id, rows in table[~table["is_baseline"]].groupby("config_id", sort=False):
        fig.add_trace(go.Scatter(x=rows["turn"], y=rows["mean_acceptance_length_tok"], mode="lines+markers",
                                 name=str(config_id), line_color=colors.get(series_of.get(config_id, "")),
                                 hovertemplate="turn %{x}: %{y:.2f} tokens per step" f"<extra>{config_id}</extra>"))
    fig.update_xaxes(title_text="turn", dtick=1)
    fig.update_yaxes(title_text="acceptance length")
    plot.figure = style(fig, height=380)
    plot.tables = [[["turn", "configuration", "samples", "prompt tokens", "accept len", "TPOT p50"]] + [
        [str(r.turn), str(r.config_id), str(r.n), f"{r.input_tokens:.0f}",
         "–" if r.is_baseline else dash_or(r.mean_acceptance_length_tok, ".2f"), ms(r.tpot_p50_s)]
        for r in table.itertuples()]]
    return plot
