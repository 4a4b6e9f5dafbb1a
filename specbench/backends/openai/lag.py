"""The client's own lag: how late its event loop wakes while requests are in flight. A timer
due every millisecond records how late it fired. Per request, two figures: `loop_lag_s`, the
worst of those while it was in flight (an upper bound on how late any of its timestamps can
be: a chunk that arrived while the loop was busy is stamped when the loop gets to it), and
`ttft_lag_s`, the lag around the stamp of its first chunk (its TTFT's other stamp, the write,
is taken inline before the bytes go out and cannot be late). When the client, not the server, is the bottleneck, `lag_lines` says so,
naming the lag: from the TTFT lags against the client's TTFT goals (2 ms p50, 10 ms p99), and
from the in-flight worst (a typical request stalled by 10 ms: its ITL p99 reads that much).
A stream's in-flight worst alone cannot say that: over a few seconds an idle host's loop
wakes 2-3 ms late at least once, which is no error in a TTFT.

Boundary: timestamps in, figures and console lines out.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from array import array
from typing import Any

PERIOD_S = 0.001
# A configuration whose requests' TTFT stamps saw the loop this late has client-made timings:
# the goals of the client are 2 ms on TTFT p50 and 10 ms on p99.
WARN_TTFT_P50_S = 0.002
WARN_TTFT_P99_S = 0.010
# ... and one whose typical request was stalled this long somewhere in flight has its ITL p99.
WARN_INFLIGHT_P50_S = 0.010


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

    def around_ttft(self, chunks: Any) -> float | None:
        """The lag around the stamp of a TTFT's first chunk (the first with a token's text or
        ids): the tick after it measured the wait that covered it. The write, TTFT's other
        stamp, is taken inline just before the bytes go to the socket, so a busy loop delays
        the write (the request's queue time) but never the stamp; counting the write's tick
        made every closed-loop wave of sends (the loop busy building the next requests) warn
        of tens of ms that no TTFT contained."""
        first = next((c.t for c in chunks if c.ids or c.text), None)
        return self.worst(first, first) if first is not None else None


LAG_KEYS = ("ttft_lag_s", "loop_lag_s")  # a Result's `extra` keys, in the summary as "ttft", "in_flight"


def summarize_lags(lags: dict[str, Any]) -> dict[str, float] | None:
    """A configuration's lag figures for run.json (ms): p50/p99 of the requests' TTFT lags and
    of their in-flight worst (`lags`: each key of `LAG_KEYS` to its values); None when nothing
    was measured."""
    import numpy as np

    out = {}
    for key, name in zip(LAG_KEYS, ("ttft", "in_flight")):
        xs = np.asarray(lags.get(key, ()), dtype=float)
        if xs.size:
            out[f"{name}_p50_ms"] = float(np.percentile(xs, 50)) * 1e3
            out[f"{name}_p99_ms"] = float(np.percentile(xs, 99)) * 1e3
    return out or None


def lag_summary(results: Any) -> dict[str, float] | None:
    """`summarize_lags` of results' own figures."""
    return summarize_lags({key: [r.extra[key] for r in results if r.extra.get(key) is not None]
                           for key in LAG_KEYS})


def lag_lines(configuration_stats: dict[str, dict]) -> list[str]:
    """Console warnings, per configuration (run.json's `configuration_stats`, each with its
    `client_loop_lag` summary), when the client's loop lag reached the size of the errors it
    may cause."""
    lines = []
    for cid, info in configuration_stats.items():
        lag = (info or {}).get("client_loop_lag") if isinstance(info, dict) else None
        if not lag:
            continue
        ttft50, ttft99 = lag.get("ttft_p50_ms", 0.0), lag.get("ttft_p99_ms", 0.0)
        flight50 = lag.get("in_flight_p50_ms", 0.0)
        if ttft50 > WARN_TTFT_P50_S * 1e3 or ttft99 > WARN_TTFT_P99_S * 1e3 or flight50 > WARN_INFLIGHT_P50_S * 1e3:
            lines.append(f"[yellow]{cid}: the client itself was the bottleneck: its event loop lagged "
                         f"{ttft50:.1f} ms (p50) / {ttft99:.1f} ms (p99) around the TTFT stamps and "
                         f"{flight50:.1f} ms (p50 of each request's worst) in flight, so TTFT/ITL may "
                         f"read that much late; spread it with --client-processes N[/]")
    return lines
