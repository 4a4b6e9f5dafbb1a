"""Analysis of records as DataFrames (no torch, no models; records columns only):

- `summary`: one row per configuration (percentiles, throughput, acceptance) and speedups
  against the baseline at the same concurrency;
- `paired`: paired-bootstrap speedups and `outcome`, the one rule for whether speculation pays;
- `console`: the tables and sentences `specbench run` prints.
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.analysis.console import acceptance_cells, burst_lines, rich_summary_table, where_speculation_pays
    from specbench.analysis.paired import VERDICT_KEYS, outcome, paired_bootstrap_speedup, speedup_verdicts
    from specbench.analysis.summary import (GROUP_KEYS, MIN_DECODE_S, PERCENTILES, SUMMARY_COLUMNS, ok_mask,
                                            per_position_acceptance, per_prompt, ratio, series, speedups,
                                            summarize)

__getattr__, __dir__ = exports(__name__, {
    "acceptance_cells": "specbench.analysis.console",
    "burst_lines": "specbench.analysis.console",
    "rich_summary_table": "specbench.analysis.console",
    "where_speculation_pays": "specbench.analysis.console",
    "VERDICT_KEYS": "specbench.analysis.paired",
    "outcome": "specbench.analysis.paired",
    "paired_bootstrap_speedup": "specbench.analysis.paired",
    "speedup_verdicts": "specbench.analysis.paired",
    "GROUP_KEYS": "specbench.analysis.summary",
    "MIN_DECODE_S": "specbench.analysis.summary",
    "PERCENTILES": "specbench.analysis.summary",
    "SUMMARY_COLUMNS": "specbench.analysis.summary",
    "ok_mask": "specbench.analysis.summary",
    "per_position_acceptance": "specbench.analysis.summary",
    "per_prompt": "specbench.analysis.summary",
    "ratio": "specbench.analysis.summary",
    "series": "specbench.analysis.summary",
    "speedups": "specbench.analysis.summary",
    "summarize": "specbench.analysis.summary",
})

__all__ = ["GROUP_KEYS", "MIN_DECODE_S", "PERCENTILES", "SUMMARY_COLUMNS", "VERDICT_KEYS", "acceptance_cells",
           "burst_lines", "ok_mask", "outcome", "paired_bootstrap_speedup", "per_position_acceptance",
           "per_prompt", "ratio", "rich_summary_table", "series", "speedup_verdicts", "speedups", "summarize",
           "where_speculation_pays"]
