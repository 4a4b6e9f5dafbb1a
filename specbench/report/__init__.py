"""`specbench report`: one self-contained HTML file that answers "should we turn speculative
decoding on, and how?" from one or more runs.

- `inputs`: load runs and studies (`study`: Optuna studies written by `specbench sweep`),
  refuse mixed workloads, pair each speculative configuration with its baseline;
- `verdict`: the numbers and sentences the page states (speedup with a bootstrap CI per
  configuration and concurrency, where each method stops paying, outliers);
- `plots`: what every figure shares, `sections`: the page's sections in order; the figures, each with a note
  instead of an empty plot when there is no data: `speed_plots`, `acceptance_plots`,
  `correctness_plots`, `cliff` (per-step: batch size, context, output position), `model_view`
  (the fitted speedup model, `specbench.speedup_model`), `study_view` (the search and the
  trials' heatmap); `study_tables` (trials, profile, serving configurations as rows);
- `html`: Jinja2 templates (`templates/`), plotly.js inlined once, atomic write.

Boundary: reads records (`specbench.records`) and summaries (`specbench.analysis`); never
imports torch, a model or the engine, so a report can be built on any machine.
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.report.html import build_report, default_out, write_report
    from specbench.report.inputs import ReportInputs, RunInput, StudyInput, load_inputs

__getattr__, __dir__ = exports(__name__, {
    "build_report": "specbench.report.html",
    "default_out": "specbench.report.html",
    "write_report": "specbench.report.html",
    "ReportInputs": "specbench.report.inputs",
    "RunInput": "specbench.report.inputs",
    "StudyInput": "specbench.report.inputs",
    "load_inputs": "specbench.report.inputs",
})

__all__ = ["ReportInputs", "RunInput", "StudyInput", "build_report", "default_out",
           "load_inputs", "write_report"]
