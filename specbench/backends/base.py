"""The backend contract: what every backend offers the runner, and in which order it is used.

A backend turns `Request`s into `Result`s: output ids and raw per-token timestamps, timed from
each request's arrival. It knows nothing of records, of pairing with the baseline or of files;
one backend object measures every configuration of a run. Its life (as GuideLLM documents its
backends' startup -> validate -> resolve -> shutdown):

1. start: construct it on what it runs on, so bad settings fail as a `SpecbenchError` before
   anything is measured. Embedded and hf: `EmbeddedBackend(target, draft, head=, pack=)`,
   `HFBackend(target, draft)` on loaded models (`specbench.session` loads them). openai:
   `OpenAIBackend.connect(base_url, ...)` checks the flags and the server's model list.
2. validate: what can only be learnt from the server, once, before measuring; openai only,
   in this order:
   - `server_spec(method, ks, draft, ngram, declared=)` -> the `SpeculativeConfig` the server
     runs (its model card and counters), which labels every record; called before the
     configurations are planned, since one server is one configuration;
   - `prepare(first_request, tokenizer, eos_token_ids)` once the requests exist: short probe
     requests settle how prompts are sent and output tokens counted.
   `describe()` (embedded, openai) then says for run.json how it runs.
3. run: any number of calls, under any configuration. A backend that batches has `run()`
   (`BatchedBackend`: every request at a concurrency, or as seeded Poisson arrivals, calling
   `on_results` with the requests finished since its last call); one that cannot has only `generate()`, one request at a time,
   and the runner sends it requests one by one (`batched()` tells which).
4. stop: nothing to call. Each `run()` opens and closes what it uses (the openai backend's HTTP
   client); models go with the backend object; a server the harness launched is stopped by
   its launcher (`specbench.backends.launcher`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from specbench.config import SpeculativeConfig
from specbench.types import Request, Result


class Backend(Protocol):
    name: str  # "embedded" | "hf" | "openai": the records' `backend` column
    device_name: str  # for the run metadata, e.g. "cpu (AMD EPYC, 2 threads)"

    def generate(self, request: Request, spec: SpeculativeConfig, *, arrival_time: float) -> Result:
        """Run one request to completion. `arrival_time` (perf_counter) is when it was queued."""
        ...


class BatchedBackend(Backend, Protocol):
    def run(self, requests: Sequence[Request], spec: SpeculativeConfig, *, concurrency: int = 1,
            request_rate: float | None = None, rate_seed: int = 0,
            on_results: Callable[[list[tuple[Request, Result]]], None] | None = None,
            schedule: Sequence[float] | None = None) -> tuple[list[Result], dict[str, Any]]:
        """Every request under `spec`: `concurrency` in flight (closed loop), or arriving as a
        Poisson process at `request_rate`/s seeded by `rate_seed`, or at `schedule` (seconds
        after the start, one per request: a replayed trace), `concurrency` capping it. Returns the results in
        request order (an empty list when `on_results` is given: it took each as it finished,
        and a long run holds none) and the configuration's statistics for run.json (at least
        `wall_s`).
        `on_results(pairs)`: the (request, result) pairs finished since its last call, in the
        order they finished, from one thread at a time; a wave that finishes together comes
        as one list, so the records of a whole wave are converted and journaled at once."""
        ...


def batched(backend: Any) -> bool:
    """Whether `backend` runs requests together (`BatchedBackend.run`) or one at a time."""
    return callable(getattr(backend, "run", None))
