"""Number formatting of the report's sentences and tables (and its Jinja filters): the
project's shared formats (`specbench.formatting`: the dash, `missing`, `ms`) plus the
report's own ratios, intervals, percentages and memory sizes. Missing values (None, NaN)
print as an en dash, never as 'nan'."""

from __future__ import annotations

from typing import Any

from specbench.formatting import DASH, missing, ms  # noqa: F401  (the report's filters use them as fmt.*)


def times(x: Any) -> str:
    """A ratio: 1.23×."""
    return DASH if missing(x) else f"{float(x):.2f}×"


def ci(lo: Any, hi: Any) -> str:
    return DASH if missing(lo) or missing(hi) else f"{float(lo):.2f}–{float(hi):.2f}×"


def num(v: Any, digits: int = 2) -> str:
    return DASH if missing(v) else f"{float(v):.{digits}f}"


def pct(v: Any, digits: int = 0) -> str:
    return DASH if missing(v) else f"{100 * float(v):.{digits}f}%"


def mib(nbytes: Any) -> str:
    if missing(nbytes):
        return DASH
    v = float(nbytes) / 2**20
    return f"{v:,.0f} MiB" if abs(v) >= 10 else f"{v:.1f} MiB"


def signed_mib(nbytes: Any) -> str:
    if missing(nbytes):
        return DASH
    return ("+" if float(nbytes) >= 0 else "−") + mib(abs(float(nbytes)))


def signed_pct(frac: Any) -> str:
    """+13%, −2.5% (one decimal below 10%, so small changes do not read as +0%)."""
    if missing(frac):
        return DASH
    v = float(frac)
    return ("+" if v >= 0 else "−") + pct(abs(v), 1 if abs(v) < 0.1 else 0)
