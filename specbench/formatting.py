"""Values as specbench prints, serialises and compares them, defined once for the console tables
(`specbench.analysis`), the OpenAI backend's console lines, the compare gate's renderers and
the HTML report (`specbench.report.fmt` adds the report's own formats on top):

- a missing value is None or NaN, printed as an en dash (`DASH`), never as "nan";
- `plain` turns numpy scalars into Python ones and a missing value into None (JSON null);
- `same`: two values are the same when both are missing or equal (numbers as floats);
- `ms` prints seconds as milliseconds with about three significant digits.

Boundary: scalars in, strings or scalars out; no pandas, no I/O.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DASH = "–"


def missing(v: Any) -> bool:
    """None or NaN (of any numeric type); a string is never missing."""
    if v is None:
        return True
    if isinstance(v, (str, bytes)):
        return False
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def plain(v: Any, *, finite: bool = False) -> Any:
    """numpy scalars -> plain Python; NaN -> None (with `finite`, infinities too)."""
    if v is None:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and (math.isnan(v) or (finite and math.isinf(v))):
        return None
    return v


def same(a: Any, b: Any) -> bool:
    """Both missing, or equal (numbers of any type compare as floats)."""
    a_na, b_na = missing(a), missing(b)
    if a_na or b_na:
        return a_na and b_na
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)):
        return float(a) == float(b)
    return a == b


def ms(seconds: Any) -> str:
    """Seconds as milliseconds, about three significant digits: 1234, 123, 12.3, 1.23."""
    if missing(seconds):
        return DASH
    v = float(seconds) * 1e3
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def dash_or(v: Any, spec: str) -> str:
    """`format(v, spec)`, or the dash for a missing value."""
    return DASH if missing(v) else format(v, spec)
