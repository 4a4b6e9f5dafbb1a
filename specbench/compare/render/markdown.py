"""A comparison as Markdown, for a pull-request comment.

Boundary: `Comparison` in, text out.
"""

from __future__ import annotations

from typing import Any

from specbench.compare.render.cells import (ci_title, format_change, format_ci, format_threshold, format_value,
                                            format_verdict)
from specbench.compare.result import Comparison


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(c: Comparison) -> str:
    """A Markdown report for a pull-request comment: outcome, a table, what differs."""
    icon = {"pass": "✅", "regression": "❌", "not comparable": "⚠️"}[c.outcome]
    s = c.settings
    lines = [f"### specbench compare: {icon} {c.outcome}", "",
             f"Baseline `{c.baseline.get('run_id')}` → current `{c.current.get('run_id')}`. "
             f"Gate: {s['gate']}; timings by paired bootstrap over prompts "
             f"({s['n_boot']} resamples, {s['confidence']:.0%} CI, min effect "
             f"{s['min_effect'] * 100:g}%).", ""]
    if c.reasons:
        lines.append("**Not comparable:**")
        lines += [f"- {_md(r)}" for r in c.reasons]
        lines.append("")
    if c.results:
        lines += [f"| config | metric | baseline | current | change | {ci_title(c)} | allowed | "
                  "verdict |", "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in c.results:
            verdict = format_verdict(r)
            if r.failed:
                verdict = f"**{verdict}**"
            if r.note:
                verdict += f" ({_md(r.note)})"
            lines.append(f"| {_md(r.config)} | {r.metric} | "
                         f"{format_value(r.metric, r.baseline, r.n)} | "
                         f"{format_value(r.metric, r.current, r.n)} | {format_change(r)} | "
                         f"{format_ci(r)} | {format_threshold(r)} | {verdict} |")
        lines.append("")
    if c.differences:
        lines.append("**What differs** (allowed; reported for information):")
        lines += [f"- {_md(d['field'])}: `{_md(d['baseline'])}` → `{_md(d['current'])}`"
                  for d in c.differences]
        lines.append("")
    if c.unmatched:
        lines.append(f"**Not compared:** {_md(', '.join(c.unmatched))}")
        lines.append("")
    for note in c.notes:
        lines.append(f"_Note: {_md(note)}_")
        lines.append("")
    lines.append(_md(c.summary()))
    return "\n".join(lines) + "\n"
