"""Turns a run plan into records: warm-up, the baseline paired with each speculative
configuration on the same requests, honest timing, one row per sample.

The runner knows backends (requests in, results out) and the records schema; it never
touches models or text. Rows are handed to a `RunWriter` as they complete, so an interrupted
run keeps every finished sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specbench.backends.base import Backend
from specbench.config import BASELINE, SpeculativeConfig
from specbench.errors import ConfigError
from specbench.metrics import sample_metrics
from specbench.records import RunWriter, make_row
from specbench.types import Request, Result


@dataclass(frozen=True)
class Configuration:
    spec: SpeculativeConfig
    concurrency: int = 1
    request_rate: float | None = None  # requests/s (Poisson); None = closed loop

    @property
    def config_id(self) -> str:
        rate = f"-r{self.request_rate:g}" if self.request_rate else ""
        return f"{self.spec.short}-c{self.concurrency}{rate}"

    @property
    def is_baseline(self) -> bool:
        return not self.spec.speculative


def plan(specs: Sequence[SpeculativeConfig], concurrencies: Sequence[int],
         baseline: bool = True, request_rate: float | None = None) -> list[Configuration]:
    """Per concurrency: the baseline first (so speculative rows can be matched against its
    outputs), then each distinct speculative configuration."""
    out: list[Configuration] = []
    for c in concurrencies:
        if c < 1:
            raise ConfigError(f"--concurrency values must be >= 1, got {c}")
        chosen = [BASELINE] if baseline else []
        for s in specs:
            if not s.speculative:
                continue  # k = 0 or method none is the baseline: run only when asked for
            if s not in chosen:
                chosen.append(s)
        out.extend(Configuration(s, c, request_rate) for s in chosen)
    if not out:
        raise ConfigError("nothing to run: --no-baseline with only non-speculative configurations")
    return out


WARMUP_PROMPT_TOKENS = 64  # warm-up requests keep the last this many prompt tokens...
WARMUP_NEW_TOKENS = 16  # ...and generate at most this many


def warmup_requests(requests: Sequence[Request], n: int) -> list[Request]:
    """n short requests cycling through `requests`: their prompts' last 64 tokens and at most
    16 new tokens each, enough to run every batched draft and verify shape once."""
    if not requests or n <= 0:
        return []
    out = []
    for i in range(n):
        r = requests[i % len(requests)]
        sp = r.sampling.with_(max_new_tokens=min(r.sampling.max_new_tokens, WARMUP_NEW_TOKENS))
        out.append(replace(r, id=f"warmup-{i}", prompt_ids=r.prompt_ids[-WARMUP_PROMPT_TOKENS:], sampling=sp))
    return out


def compares_with_baseline(request: Request) -> bool:
    """Match fields are recorded for greedy requests (lossless decoding must reproduce the
    baseline token for token) and for every regression prompt. A sampled regression prompt
    only matches in distribution, so its match rate is informative, not a correctness check."""
    return request.sampling.greedy or request.kind == "regression"


def run_configuration(
    backend: Backend,
    requests: Sequence[Request],
    config: Configuration,
    *,
    run_id: str,
    writer: RunWriter | None = None,
    warmup: int = 0,
    baseline_outputs: dict[str, list[int]] | None = None,
    on_result: Callable[[Request, Result], None] | None = None,
    rate_seed: int = 0,
) -> tuple[list[dict], dict]:
    """Run every request once under `config` and return (rows, configuration stats).

    Warm-up runs first and is discarded: `warmup` waves of `concurrency` short requests at
    the configuration's own concurrency, so the batched shapes it measures are warm too. Rows
    reach the writer as requests finish, so an interrupt keeps every completed sample.
    """
    batched = hasattr(backend, "run")
    if not batched and (config.concurrency != 1 or config.request_rate):
        raise ConfigError(
            f"the {backend.name} backend runs one request at a time: use --concurrency 1 "
            "without --request-rate (or --backend embedded)"
        )
    rows: list[dict] = []

    def record(request: Request, result: Result) -> None:
        reference = None
        if baseline_outputs is not None and not config.is_baseline and compares_with_baseline(request):
            reference = baseline_outputs.get(request.id)
        metrics = sample_metrics(request, result, config_start=config_start, reference_ids=reference)
        row = make_row(run_id=run_id, config_id=config.config_id, backend=backend.name,
                       spec=config.spec, concurrency=config.concurrency,
                       request_rate=config.request_rate, request=request, metrics=metrics,
                       is_baseline=config.is_baseline)
        rows.append(row)
        if writer is not None:
            writer.add([row])
        if config.is_baseline and baseline_outputs is not None and result.error is None:
            baseline_outputs[request.id] = list(result.output_ids)
        if on_result is not None:
            on_result(request, result)

    if batched:
        warm = warmup_requests(requests, warmup * config.concurrency)
        if warm:
            backend.run(warm, config.spec, concurrency=config.concurrency)
        config_start = time.perf_counter()
        _, info = backend.run(list(requests), config.spec, concurrency=config.concurrency,
                              request_rate=config.request_rate, rate_seed=rate_seed,
                              on_result=record)
    else:
        for request in warmup_requests(requests, warmup):
            backend.generate(request, config.spec, arrival_time=time.perf_counter())
        config_start = time.perf_counter()
        for request in requests:
            record(request, backend.generate(request, config.spec, arrival_time=time.perf_counter()))
        info = {"wall_s": time.perf_counter() - config_start}
    if writer is not None:
        stats = writer.metadata.config.setdefault("configuration_stats", {})
        stats[config.config_id] = info
        writer.flush()
    return rows, info
