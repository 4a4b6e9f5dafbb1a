"""Request arrival schedules shared by every backend (the embedded engine and HTTP clients).

`poisson_arrivals` gives seeded open-loop arrival times: exponential gaps at `rate`
requests/s, the first request at `start`, so the same seed gives the same schedule in every
backend and every run.
"""

from __future__ import annotations

import random


def poisson_arrivals(n: int, rate: float, seed: int, start: float = 0.0) -> list[float]:
    """Arrival times (same clock as `start`) of n requests at `rate` requests/s."""
    rng = random.Random(seed)
    t, out = start, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out
