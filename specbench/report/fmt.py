"""Number formatting shared by the report's sentences and tables (and used as Jinja filters).
Missing values (None, NaN) print as an en dash, never as 'nan'."""

from __future__ import annotations

import math
from typing import Any

DASH = "–"


def missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def ms(seconds: Any) -> str:
    """Seconds as milliseconds, about three significant digits: 1234, 123, 12.3, 1.23."""
    if missing(seconds):
        return DASH
    v = float(seconds) * 1e3
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


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
