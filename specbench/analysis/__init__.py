"""Analysis of records as DataFrames (no torch, no models; records columns only):

- `summary`: one row per configuration (percentiles, throughput, acceptance) and speedups
  against the baseline at the same concurrency;
- `paired`: paired-bootstrap speedups and `outcome`, the one rule for whether speculation pays;
- `console`: the tables and sentences `specbench run` prints.
"""

from specbench.analysis.console import acceptance_cells, burst_lines, rich_summary_table, where_speculation_pays
from specbench.analysis.paired import VERDICT_KEYS, outcome, paired_bootstrap_speedup, speedup_verdicts
from specbench.analysis.summary import (GROUP_KEYS, MIN_DECODE_S, PERCENTILES, SUMMARY_COLUMNS, ok_mask,
                                        per_position_acceptance, per_prompt, ratio, speedups, summarize)

__all__ = ["GROUP_KEYS", "MIN_DECODE_S", "PERCENTILES", "SUMMARY_COLUMNS", "VERDICT_KEYS", "acceptance_cells",
           "burst_lines", "ok_mask", "outcome", "paired_bootstrap_speedup", "per_position_acceptance",
           "per_prompt", "ratio", "rich_summary_table", "speedup_verdicts", "speedups", "summarize",
           "where_speculation_pays"]
