"""Request arrival schedules shared by every backend (the embedded engine and HTTP clients).

`poisson_arrivals` gives seeded open-loop arrival times: exponential gaps at `rate`
requests/s, the first request at `start`, so the same seed gives the same schedule in every
backend and every run. `gamma_arrivals` generalizes them with vLLM's `--burstiness`: gamma
gaps of shape `burstiness` and mean 1/rate (1 = Poisson, the very same schedule; below 1
burstier, above 1 more regular).
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


def gamma_arrivals(n: int, rate: float, burstiness: float, seed: int, start: float = 0.0) -> list[float]:
    """Arrival times of n requests at `rate` requests/s with gamma gaps of shape `burstiness`
    and scale 1 / (rate * burstiness), as `vllm bench serve --burstiness` draws them; at
    burstiness 1 exactly `poisson_arrivals`."""
    if burstiness == 1.0:
        return poisson_arrivals(n, rate, seed, start)
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    t, out = start, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
    return out
