"""The client's own lag: how late its event loop wakes while requests are in flight. A timer
due every millisecond records how late it fired; a request's `loop_lag_s` is the worst of
those while it was in flight, an upper bound on how late any of its timestamps can be (a
chunk that arrived while the loop was busy is stamped when the loop gets to it). When the
client, not the server, is the bottleneck, `lag_lines` says so, naming the lag.

Boundary: timestamps in, figures and console lines out.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from array import array
from typing import Any

PERIOD_S = 0.001
# A configuration whose typical request saw the loop this late has client-made timings:
# the goals of the client are 2 ms on TTFT p50 and 10 ms on p99.
WARN_P50_S = 0.002
WARN_P99_S = 0.010


class LoopLag:
    def __init__(self) -> None:
        self.times = array("d")
        self.lags = array("d")

    async def watch(self) -> None:
        """Run until cancelled: the 1 ms timer and its lateness."""
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(PERIOD_S)
            now = time.perf_counter()
            self.times.append(now)
            self.lags.append(max(now - t0 - PERIOD_S, 0.0))

    def worst(self, start: float, end: float | None) -> float | None:
        """The largest lag of a tick in [start, end] (the tick after `end` included: it
        measured the wait that covered `end`); None without ticks."""
        n = len(self.times)
        lo = bisect.bisect_left(self.times, start, 0, n)
        hi = bisect.bisect_right(self.times, end if end is not None else float("inf"), 0, n)
        hi = min(hi + 1, n)
        return max(self.lags[lo:hi]) if hi > lo else None


def lag_lines(df: Any) -> list[str]:
    """Console warnings, per configuration, when the client's loop lag reached the size of the
    errors it may cause (records' `client_loop_lag_s`)."""
    if "client_loop_lag_s" not in df.columns:
        return []
    lines = []
    for cid, g in df.groupby("config_id", sort=False):
        lag = g["client_loop_lag_s"].dropna()
        if lag.empty:
            continue
        p50, p99 = float(lag.quantile(0.5)), float(lag.quantile(0.99))
        if p50 > WARN_P50_S or p99 > WARN_P99_S:
            lines.append(f"[yellow]{cid}: the client itself was the bottleneck: its event loop lagged "
                         f"{p50 * 1e3:.1f} ms (p50) / {p99 * 1e3:.1f} ms (p99) while requests were in flight, "
                         f"so TTFT/ITL may read that much late; spread it with --client-processes N[/]")
    return lines
