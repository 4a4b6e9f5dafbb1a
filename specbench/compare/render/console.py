"""A comparison as a rich table for the console (`specbench compare`'s default format).

Boundary: `Comparison` in, a rich `Table` out; printing is the command's.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from specbench.compare.render.cells import (ci_title, format_change, format_ci, format_threshold, format_value,
                                            format_verdict)
from specbench.compare.result import Comparison


_STYLE = {"regression": "bold red", "inconclusive": "yellow", "improved": "green",
          "n/a": "dim", "ok": ""}


def rich_table(c: Comparison) -> Table:
    """Console view: config (once per group), metric, baseline, current, change, CI, allowed,
    verdict."""
    from rich import box

    t = Table(title=f"specbench compare: {c.baseline.get('run_id')} -> {c.current.get('run_id')}",
              title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("config", overflow="fold")
    t.add_column("metric", no_wrap=True)
    for name in ("baseline", "current", "change", ci_title(c), "allowed"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("verdict", overflow="fold")
    for i, r in enumerate(c.results):
        first = i == 0 or c.results[i - 1].config != r.config
        last = i == len(c.results) - 1 or c.results[i + 1].config != r.config
        style = _STYLE[r.verdict] if r.gated or r.verdict != "regression" else "yellow"
        verdict = format_verdict(r) + (f" ({r.note})" if r.note else "")
        # Text, not markup strings: ids, notes and intervals may contain brackets
        cells = [r.config if first else "", r.metric, format_value(r.metric, r.baseline, r.n),
                 format_value(r.metric, r.current, r.n), format_change(r), format_ci(r),
                 format_threshold(r)]
        t.add_row(*map(Text, cells), Text(verdict, style=style), end_section=last)
    return t
