"""Regression gate: compare a current run against a baseline run, per configuration, and say
whether it got worse (`specbench compare`).

The point of the gate is to compare a *change* (target or draft model, engine version, dtype,
k, method), so only the measurement setup has to match; everything else is reported.

- `catalog`: the metrics (timing ones decided by a paired bootstrap, deterministic ones as
  values with a tight tolerance) and the parsing of their flags;
- `comparable`: what must match for two runs to be compared, and what may differ;
- `gate`: `compare_runs`, a verdict per (configuration, metric);
- `result`: `MetricResult`, `Comparison` (outcome, exit code 0 / 1 / 2);
- `render`: one renderer per output format (JSON, JUnit XML, Markdown, a rich table).

Boundary: records DataFrames and run metadata in (`records.read_run`), a `Comparison` and its
renderings out. Only `specbench.cli.compare` prints and picks the exit code
(`Comparison.exit_code`).
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.compare.catalog import (ACCEPTANCE_THRESHOLD, DEFAULT_METRICS, GATES, METRICS, TIMING_THRESHOLD,
                                           VERDICTS, Metric, parse_fraction, parse_metrics, parse_thresholds)
    from specbench.compare.comparable import info_differences, pair_configs, setup_differences
    from specbench.compare.gate import INTERVALS, compare_runs
    from specbench.compare.render import (RENDERERS, SUFFIX_FORMATS, format_change, format_ci, format_threshold,
                                          format_value, format_verdict, rich_table, to_dict, to_json, to_junit,
                                          to_markdown)
    from specbench.compare.result import Comparison, MetricResult, NotComparableError

__getattr__, __dir__ = exports(__name__, {
    "ACCEPTANCE_THRESHOLD": "specbench.compare.catalog",
    "DEFAULT_METRICS": "specbench.compare.catalog",
    "GATES": "specbench.compare.catalog",
    "METRICS": "specbench.compare.catalog",
    "TIMING_THRESHOLD": "specbench.compare.catalog",
    "VERDICTS": "specbench.compare.catalog",
    "Metric": "specbench.compare.catalog",
    "parse_fraction": "specbench.compare.catalog",
    "parse_metrics": "specbench.compare.catalog",
    "parse_thresholds": "specbench.compare.catalog",
    "info_differences": "specbench.compare.comparable",
    "pair_configs": "specbench.compare.comparable",
    "setup_differences": "specbench.compare.comparable",
    "INTERVALS": "specbench.compare.gate",
    "compare_runs": "specbench.compare.gate",
    "RENDERERS": "specbench.compare.render",
    "SUFFIX_FORMATS": "specbench.compare.render",
    "format_change": "specbench.compare.render",
    "format_ci": "specbench.compare.render",
    "format_threshold": "specbench.compare.render",
    "format_value": "specbench.compare.render",
    "format_verdict": "specbench.compare.render",
    "rich_table": "specbench.compare.render",
    "to_dict": "specbench.compare.render",
    "to_json": "specbench.compare.render",
    "to_junit": "specbench.compare.render",
    "to_markdown": "specbench.compare.render",
    "Comparison": "specbench.compare.result",
    "MetricResult": "specbench.compare.result",
    "NotComparableError": "specbench.compare.result",
})

__all__ = ["ACCEPTANCE_THRESHOLD", "Comparison", "INTERVALS", "DEFAULT_METRICS", "GATES", "METRICS", "Metric", "MetricResult",
           "NotComparableError", "RENDERERS", "SUFFIX_FORMATS", "TIMING_THRESHOLD", "VERDICTS", "compare_runs",
           "format_change", "format_ci", "format_threshold", "format_value", "format_verdict", "info_differences",
           "pair_configs", "parse_fraction", "parse_metrics", "parse_thresholds", "rich_table", "setup_differences",
           "to_dict", "to_json", "to_junit", "to_markdown"]
