"""Drivers of a continuous batch: closed-loop and open-loop arrivals, as benchmark clients send them.

`run` admits requests closed-loop (at most `concurrency` in flight; a request arrives when a
slot frees, as `vllm bench serve --max-concurrency`: the first wave at the start, each later
request at the moment the request it replaces emitted its last token) or open-loop (seeded
Poisson arrivals at `request_rate`, capped by `concurrency`). The requests admitted in one
turn (those due when the loop looks, up to the free rows) are prefilled together in one
pass, as vLLM's scheduler batches the prefills of one step, up to `MAX_PREFILL_TOKENS`
padded tokens a pass; a request of the next pass waits for the one before: that wait is
queue time, and part of its TTFT.

Finished requests are handed to `on_finish` by a helper thread, so building records,
writing files and drawing progress never stall the rows in flight; `run` returns only once
every finished request has been handed over (also when interrupted).

Boundary: token ids and timestamps; the arrival schedule itself is specbench.arrivals.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from specbench.arrivals import poisson_arrivals
from specbench.config import MAX_PREFILL_TOKENS, SamplingParams, SpeculativeConfig, joins_prefill
from specbench.engine.rows import Admission

if TYPE_CHECKING:
    from specbench.engine.drafters.base import Drafter
    from specbench.engine.engine import BatchStats, Engine, Generation


class _Handover:
    """Calls `callback(index, generation)` on a helper thread, in finishing order."""

    def __init__(self, callback: Callable[[int, "Generation"], None] | None):
        self.callback = callback
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        if callback is not None:
            self._thread = threading.Thread(target=self._loop, name="specbench-finish", daemon=True)
            self._thread.start()

    def put(self, index: int, g: "Generation") -> None:
        if self._thread is not None:
            self._queue.put((index, g))
        if self.error is not None:
            raise self.error

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.error is None:
                try:
                    self.callback(*item)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the engine's thread
                    self.error = exc

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        if self.error is not None:
            raise self.error


def run(engine: "Engine", requests: Sequence[tuple[Sequence[int], SamplingParams] | tuple[Sequence[int], SamplingParams, Any]],
        spec: SpeculativeConfig, *,
        concurrency: int = 1, request_rate: float | None = None, rate_seed: int = 0,
        on_finish: Callable[[int, "Generation"], None] | None = None,
        drafter: "Drafter | None" = None, schedule: Sequence[float] | None = None,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS) -> tuple[list["Generation"], "BatchStats"]:
    """Decode every (prompt_ids, sampling) pair, or (prompt_ids, sampling, constraint) triple (a
    specbench.engine.constraint.TokenConstraint or None); returns results in input order and
    the batch's statistics. `schedule`: each request's arrival in seconds after the start (a
    replayed trace), in place of closed-loop or Poisson arrivals; `concurrency` still caps it.
    `max_prefill_tokens`: the padded tokens one prefill pass may hold."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    batch = engine.batch(spec, drafter=drafter)
    n = len(requests)
    if n:
        longest = max(len(r[0]) + r[1].max_new_tokens for r in requests)
        if engine.max_context:
            longest = min(longest, engine.max_context)
        batch.reserve(min(concurrency, n), longest, [r[1] for r in requests])
    results: list["Generation | None"] = [None] * n
    handover = _Handover(on_finish)
    start = engine.now()
    arrivals = ([start + t for t in schedule] if schedule is not None else
                poisson_arrivals(n, request_rate, rate_seed, start) if request_rate else None)
    free_at = [start] * min(concurrency, max(n, 1))  # closed loop: when each free slot freed
    pending = deque(range(n))

    def finished(g: "Generation") -> None:
        results[g.tag] = g
        if arrivals is None:
            heapq.heappush(free_at, g.token_times[-1] if g.token_times else time.perf_counter())
        handover.put(g.tag, g)

    def turn() -> list[Admission]:
        """The requests due now that fit beside the running rows, in order, while their
        padded prefill stays within `max_prefill_tokens` (one prompt longer runs alone)."""
        group: list[Admission] = []
        longest = 0
        while pending and len(batch.rows) + len(group) < concurrency:
            i = pending[0]
            if arrivals is not None and arrivals[i] > time.perf_counter():
                break
            if not joins_prefill(longest, len(group), len(requests[i][0]), max_prefill_tokens):
                break
            longest = max(longest, len(requests[i][0]))
            pending.popleft()
            group.append(Admission(requests[i][0], requests[i][1], tag=i,
                                   arrival=arrivals[i] if arrivals is not None else heapq.heappop(free_at),
                                   constraint=requests[i][2] if len(requests[i]) > 2 else None))
        return group

    try:
        while pending or batch.rows:
            while group := turn():
                for g in batch.admit_many(group):
                    finished(g)
            if not batch.rows:
                if pending and arrivals is not None:  # open loop: idle until the next arrival
                    time.sleep(max(0.0, arrivals[pending[0]] - time.perf_counter()))
                continue
            for g in batch.step():
                finished(g)
    finally:
        batch.stats.wall_s = engine.now() - start
        handover.close()
    return results, batch.stats  # type: ignore[return-value]
