"""Checks that a measured result is physically possible, so an impossible number is flagged
instead of becoming a recommendation.

- Speedup bound. A speculative step emits at most its tokens per target pass (the mean
  acceptance length, MAL) and costs at least one plain decode step (one target pass over k+1
  tokens per row, plus drafting), so the TPOT speedup over the baseline cannot exceed the MAL.
  A measured speedup above MAL x (1 + `SPEEDUP_TOLERANCE`) means the baseline ran slower than
  it should have: the two ran under different load.
- Step cost (`step_ratio`, recorded): the median verify step over the baseline's median decode
  step, which a reader compares with 1.
- Acceptance-length thresholds. A MAL is at least 1 (the target's own token), so a threshold
  below 1 (a break-even or alert MAL) can never be crossed: flagged, never written.

Each check returns messages beginning with `inconsistent:`; an empty list means nothing was
found. Boundary: numbers and records frames in, messages out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

SPEEDUP_TOLERANCE = 0.10  # measured speedup may exceed the MAL by this share (timing noise)
LOAD = "the baseline and the configuration ran under different load"


def _finite(*values: Any) -> bool:
    return all(v is not None and isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def speedup_bound(speedup: float | None, mal: float | None) -> list[str]:
    """The TPOT speedup against tokens per target pass (see the module docstring)."""
    if not _finite(speedup, mal) or mal <= 0:
        return []
    if speedup > mal * (1.0 + SPEEDUP_TOLERANCE):
        return [f"inconsistent: TPOT speedup {speedup:.3f}x exceeds tokens per target pass "
                f"({mal:.3f}) by more than {SPEEDUP_TOLERANCE:.0%}: {LOAD}"]
    return []


def median_step_s(samples: Any, drafting: bool) -> float | None:
    """Median per-step target time of successful samples: verify steps that drafted
    (`drafting`) or plain decode steps (the baseline's)."""
    if samples is None or not len(samples) or "step_verify_time_s" not in samples:
        return None
    times: list[np.ndarray] = []
    for verify, drafted in zip(samples["step_verify_time_s"], samples["step_drafted"]):
        if verify is None or drafted is None or not len(verify):
            continue
        v, d = np.asarray(verify, dtype=float), np.asarray(drafted, dtype=int)
        times.append(v[d > 0] if drafting else v[d == 0])
    flat = np.concatenate(times) if times else np.zeros(0)
    flat = flat[np.isfinite(flat)]
    return float(np.median(flat)) if flat.size else None


def step_ratio(base_samples: Any, spec_samples: Any) -> float | None:
    """Median verify step of the speculative configuration / median decode step of the
    baseline: about 1 where one pass is memory-bound, higher where k+1 tokens per row cost
    more. Recorded, not flagged: on small models a step is mostly fixed per-step overhead
    that the two paths do not share alike, so a ratio below 1 need not mean a load change."""
    base, spec = median_step_s(base_samples, False), median_step_s(spec_samples, True)
    if not _finite(base, spec) or base <= 0:
        return None
    return spec / base


def mal_threshold(name: str, value: float | None) -> list[str]:
    """A mean-acceptance-length threshold that can never be crossed."""
    if _finite(value) and value < 1.0:
        return [f"inconsistent: {name} {value:.3f} is below 1, which a mean acceptance length never "
                "is (the target always adds its own token): the speedup it was derived from exceeds "
                "the tokens per target pass"]
    return []
