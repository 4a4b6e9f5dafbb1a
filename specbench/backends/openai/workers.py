"""`--client-processes N`: the requests of a run sent by N worker processes, each with its own
event loop and connections, so neither one core nor this process's other work (records,
journal, progress bar, whose C code can hold the GIL for long) delays a chunk's timestamp.

One arrival schedule for all: this process admits every request (a dispatcher thread), so the
closed-loop concurrency is exact across the workers (a request is sent the moment a slot frees,
to the least loaded worker, and arrives then) and open-loop arrivals keep their seeded
Poisson/gamma times (a request is sent at its arrival time, or when a slot frees under the
concurrency cap, its arrival still the scheduled time). Workers only send and read: each
finished attempt (chunks stamped where their bytes arrived, on CLOCK_MONOTONIC, the same
clock in every process) comes back whole and becomes a `Result` here, with the worker's own
loop lag.

Workers live as long as the backend (spawned once, their keep-alive connections reused by
every run) and end with it, or when this process exits.

Boundary: requests out to the workers, attempts back; no records, no tokenizer in a worker.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import gc
import threading
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any
from specbench.backends.openai.collector import GC_SWEEP_S, quiet_collector
from specbench.backends.openai.lag import LoopLag


def _worker(conn: Connection, settings: dict[str, Any]) -> None:
    """A worker process: requests in on `conn`, (index, attempt, attempts, error, (in-flight
    lag, TTFT lag)) out. `settings["backend"]` is the backend class whose requests it sends
    (OpenAIBackend, handed over by the backend that owns the pool)."""

    be = settings["backend"](settings["root"], settings["model"], api_key=settings["api_key"],
                       endpoint=settings["endpoint"], request_timeout=settings["request_timeout"],
                       retries=settings["retries"], card=settings["card"])
    be.prompt_form, be.extras = settings["prompt_form"], settings["extras"]
    quiet_collector()  # as OpenAIBackend.run, for the worker's life; swept below

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lag = LoopLag()
        monitor = asyncio.ensure_future(lag.watch())
        stop = asyncio.Event()

        def sweep() -> None:
            gc.collect(1)
            loop.call_later(GC_SWEEP_S, sweep)
        loop.call_later(GC_SWEEP_S, sweep)
        tasks: set[asyncio.Task] = set()

        # Finished attempts go back through a sender thread: a blocking conn.send on the loop
        # (the parent busy sending requests, the pipe full) stalled every stream and, at 256
        # streams, deadlocked both ends; pickling the attempt stays off the loop too.
        out: queue.SimpleQueue = queue.SimpleQueue()

        def sender() -> None:
            while (item := out.get()) is not None:
                conn.send(item)
        sending = threading.Thread(target=sender, name="specbench-client-send", daemon=True)
        sending.start()

        async def one(i: int, request: Any, slots: int) -> None:
            att, attempts, error = await be.request_attempt(be._session(slots), request)
            out.put(("done", i, att, attempts, error, (lag.worst(att.sent, att.end), lag.around_ttft(att.chunks))))

        def readable() -> None:
            try:
                msg = conn.recv()
            except EOFError:
                stop.set()
                return
            if msg[0] == "req":
                t = loop.create_task(one(*msg[1:]))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            else:
                stop.set()

        loop.add_reader(conn.fileno(), readable)
        out.put(("ready",))
        await stop.wait()
        monitor.cancel()
        for t in tasks:
            t.cancel()
        if be._http is not None:
            await be._http.close()
        out.put(None)
        sending.join(5)

    asyncio.run(main())


class ClientPool:
    """N worker processes and the dispatcher that feeds them (see the module docstring)."""

    def __init__(self, settings: dict[str, Any], processes: int):
        ctx = mp.get_context("spawn")  # a fork would copy this process's threads' locks
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, settings), daemon=True, name="specbench-client")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(120) or c.recv() != ("ready",):
                self.close()
                raise RuntimeError("a --client-processes worker did not start")

    def run(self, requests: list, concurrency: int, arrivals: list[float] | None,
            done: queue.SimpleQueue) -> threading.Thread:
        """Dispatch every request on a thread; each finished one goes onto `done` as
        (index, request, arrival, attempt, attempts, error, lag), then None."""
        def dispatch() -> None:
            try:
                self._dispatch(requests, concurrency, arrivals, done)
            finally:
                done.put(None)
        t = threading.Thread(target=dispatch, name="openai-dispatch", daemon=True)
        t.start()
        return t

    def _dispatch(self, requests: list, concurrency: int, arrivals: list[float] | None,
                  done: queue.SimpleQueue) -> None:
        slots = max(concurrency, 1)
        pending = deque(range(len(requests)))
        load = [0] * len(self.conns)
        arrival: dict[int, float] = {}
        owner = {id(c): w for w, c in enumerate(self.conns)}
        t0 = time.perf_counter()
        while pending or arrival:
            now = time.perf_counter()
            while pending and len(arrival) < slots and (arrivals is None or t0 + arrivals[pending[0]] <= now):
                i = pending.popleft()
                w = min(range(len(load)), key=load.__getitem__)
                arrival[i] = t0 + arrivals[i] if arrivals is not None else time.perf_counter()
                self.conns[w].send(("req", i, requests[i], slots))
                load[w] += 1
            timeout = None
            if pending and len(arrival) < slots and arrivals is not None:
                timeout = max(0.0, t0 + arrivals[pending[0]] - time.perf_counter())
            for conn in wait(self.conns, timeout):
                try:
                    _, i, att, attempts, error, lag = conn.recv()
                except EOFError:
                    raise RuntimeError("a --client-processes worker died") from None
                load[owner[id(conn)]] -= 1
                done.put((i, requests[i], arrival.pop(i), att, attempts, error, lag))

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop",))
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
        self.conns, self.procs = [], []
