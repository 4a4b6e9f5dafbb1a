"""The report's figures: what every builder shares. Each builder takes the joined samples frame
(`ReportInputs`) and the verdict table and returns a `Plot`: a figure, or no figure and a
note saying why there is nothing to draw (a plot with no data is never drawn empty).

The builders live in speed (`speed_plots`), acceptance (`acceptance_plots`), the per-step
plots (`cliff`), draft trees (`tree_plots`), the fitted model (`model_view`), correctness and
scheduling (`correctness_plots`), and a study's in `study_view`; `specbench.report.sections`
puts them in page order. A new plot is a builder in one of those modules and an entry there.

Boundary: Plotly figures from the report frame, the verdict table and run metadata; no HTML,
no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from specbench import analysis
from specbench.report.inputs import ReportInputs


@dataclass
class Plot:
    name: str  # unique, used in the element id `plot-<name>`
    title: str
    caption: str
    figure: go.Figure | None = None
    note: str | None = None  # why nothing is drawn (figure is None)
    tables: list[list[list[str]]] | None = None  # tables under the figure (first row: headers)


BASELINE_COLOR = "#555555"
PALETTE = qualitative.Plotly + qualitative.D3
_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


def series_colors(verdict: pd.DataFrame) -> dict[str, str]:
    """One color per series (a configuration across concurrency), grey for baselines."""
    colors: dict[str, str] = {}
    i = 0
    for r in verdict.drop_duplicates("series").itertuples():
        if r.is_baseline:
            colors[r.series] = BASELINE_COLOR
        else:
            colors[r.series] = PALETTE[i % len(PALETTE)]
            i += 1
    return colors


def style(fig: go.Figure, height: int = 420, top: int = 40, legend_right: bool = False) -> go.Figure:
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


def spec_ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["is_baseline"] & analysis.ok_mask(frame)]


def series_family(series: str) -> str:
    """The series with its k taken out (`draft_model-k4-off8` -> `draft_model-off8`): one line
    per family in the TPOT-vs-k plot, one panel per family in the heatmap."""
    return re.sub(r"-k\d+", "", re.sub(r"-k\d+dyn", "-dynamic_k", series))


NO_SPEC = "These runs have no speculative configuration."


# The colour scale of every speedup heatmap: log speedup, ticks at these ratios.
SPEEDUP_COLORBAR = dict(title="speedup", tickvals=np.log([0.5, 0.8, 1, 1.25, 2]).tolist(),
                        ticktext=["0.5×", "0.8×", "1×", "1.25×", "2×"])


Builder = Callable[[ReportInputs, pd.DataFrame], "Plot | None"]  # None: the plot does not apply here
