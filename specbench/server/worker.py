"""The engine worker of `specbench serve`: one thread that owns the engine and its continuous
batch. Requests join in arrival order after their prefill, those waiting together in one
pass (at most `max_num_seqs` decoding at once, the rest wait), every step verifies all of them in one target pass, and
each step's tokens go to their request's event queue as they are emitted. At most
`max_concurrency` requests are admitted (running + waiting). A request whose client went away
is cancelled at the next step. It keeps the counters /metrics shows (`ServerCounters`).

Boundary: token ids and `SamplingParams` in, events out (`("tokens", ids)`, `("done",
generation)`, `("error", status, message)`); no HTTP, no tokenizer.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from specbench.acceptance import SpecDecodingStats
from specbench.config import SamplingParams, SpeculativeConfig, joins_prefill


@dataclass
class Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class ServerCounters:
    """What /metrics reports, under vLLM's names where vLLM has one (`specbench.server.exposition`)."""

    spec: SpecDecodingStats  # drafts of finished requests
    prompt_tokens: int = 0  # prefilled
    generation_tokens: int = 0  # emitted, counted at each step
    success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0})
    cancelled: int = 0
    steps: int = 0  # batched engine steps
    step_rows: int = 0  # rows decoded, summed over steps
    running: int = 0  # gauges, set when a snapshot is taken
    waiting: int = 0


def _internal_error(exc: BaseException) -> tuple:
    oom = type(exc).__name__ == "OutOfMemoryError"
    return ("error", 503 if oom else 500,
            f"{'out of memory' if oom else 'internal error'}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}")


class EngineWorker:
    """Owns the engine and its one continuous batch: admits requests in arrival order (at most
    `max_num_seqs` decoding at once, the rest wait), runs one batched step for all of them at
    a time, streams each step's tokens to its request, and keeps vLLM-named counters."""

    def __init__(self, engine: Any, spec: SpeculativeConfig, max_concurrency: int, max_num_seqs: int | None = None):
        self.engine, self.spec, self.max_concurrency = engine, spec, max_concurrency
        self.max_num_seqs = max_num_seqs or max_concurrency
        self.batch = engine.batch(spec)
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.admitted = 0  # running + waiting
        self.running = 0
        k = spec.num_speculative_tokens if spec.speculative else 0
        self.counters = ServerCounters(spec=SpecDecodingStats.new(k))
        self._thread = threading.Thread(target=self._loop, name="specbench-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> bool:
        with self._lock:
            if self.admitted >= self.max_concurrency:
                return False
            self.admitted += 1
        self._queue.put(job)
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def snapshot(self) -> ServerCounters:
        """A consistent copy of the counters, with the running / waiting gauges filled in."""
        with self._lock:
            c = copy.deepcopy(self.counters)
            c.running, c.waiting = self.running, max(self.admitted - self.running, 0)
        return c

    def _release(self) -> None:
        with self._lock:
            self.admitted -= 1

    def _loop(self) -> None:
        waiting: deque[Job] = deque()
        while True:
            try:  # block only when there is nothing to decode
                job = self._queue.get(block=not (len(self.batch) or waiting))
                while True:
                    if job is None:
                        return
                    waiting.append(job)
                    job = self._queue.get_nowait()
            except queue.Empty:
                pass
            for running in self.batch.tags:  # every row's tag is its Job
                if running.cancelled.is_set():
                    self.batch.cancel(running)
            while waiting and len(self.batch) < self.max_num_seqs:
                self._admit(self._turn(waiting))
            if len(self.batch):
                self._step()
            with self._lock:
                self.running = len(self.batch)

    def _turn(self, waiting: deque[Job]) -> list[Job]:
        """The waiting jobs that join now, in order: as many as free rows allow while their
        padded prefill stays within MAX_PREFILL_TOKENS (one prompt longer runs alone). A job
        whose client went away, or that the engine refuses (a prompt that leaves no room in
        the context), is answered here and takes no row."""
        group: list[Job] = []
        longest = 0
        while waiting and len(self.batch) + len(group) < self.max_num_seqs:
            job = waiting[0]
            if not joins_prefill(longest, len(group), len(job.prompt_ids)):
                break
            waiting.popleft()
            if job.cancelled.is_set():  # its client went away while it waited: nothing decoded
                with self._lock:
                    self.counters.cancelled += 1
                self._release()
                continue
            try:
                self.engine.limits(job.prompt_ids, job.sampling)
            except ValueError as exc:  # e.g. a prompt that leaves no room in the context
                job.events.put(("error", 400, str(exc)))
                self._release()
                continue
            longest = max(longest, len(job.prompt_ids))
            group.append(job)
        return group

    def _admit(self, jobs: list[Job]) -> None:
        """Prefill `jobs` together (one pass, as vLLM's scheduler batches a step's prefills)."""
        if not jobs:
            return
        from specbench.engine.rows import Admission  # lazy on purpose: torch stays off `specbench --help`'s path

        def on_tokens(job: Job):
            def emitted(ids: list[int], t: float) -> None:
                # Counted as emitted, as vLLM counts each step's tokens: /metrics shows a running or
                # abandoned request's tokens at once, not when it ends.
                with self._lock:
                    self.counters.generation_tokens += len(ids)
                job.events.put(("tokens", list(ids)))
            return emitted

        try:
            done = self.batch.admit_many([Admission(job.prompt_ids, job.sampling, on_tokens=on_tokens(job), tag=job)
                                          for job in jobs])
        except Exception as exc:  # noqa: BLE001 - a failed prefill fails its jobs, not the server
            # (what a request can get wrong, _turn refused with a 400 before the pass)
            event = _internal_error(exc)
            for job in jobs:
                job.events.put(event)
                self._release()
            return
        with self._lock:
            self.counters.prompt_tokens += sum(len(job.prompt_ids) for job in jobs)  # prefilled
        for g in done:
            self._finished(g.tag, g)

    def _step(self) -> None:
        rows = len(self.batch)
        try:
            finished = self.batch.step()
        except Exception as exc:  # noqa: BLE001 - a failed batched step fails every row in it
            event = _internal_error(exc)
            for running in self.batch.tags:
                running.events.put(event)
                self._release()
            self.batch = self.engine.batch(self.spec)
            return
        with self._lock:
            self.counters.steps += 1
            self.counters.step_rows += rows
        for g in finished:
            self._finished(g.tag, g)

    def _finished(self, job: Job, g: Any) -> None:
        with self._lock:
            c = self.counters
            c.spec.observe_steps(g.steps)
            if g.finish_reason == "cancelled":
                c.cancelled += 1
            else:
                c.success[g.finish_reason] = c.success.get(g.finish_reason, 0) + 1
        self._release()
        job.events.put(("done", g))
