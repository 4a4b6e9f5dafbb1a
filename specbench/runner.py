"""Turns configurations into records: warm-up, the baseline paired with each speculative
configuration on the same requests, interleaved so they see the same machine, honest
timing, one row per sample.

`plan()` lists the configurations of a run (per concurrency, the baseline first);
`run_plan()` measures them all on one backend (or, through a `BackendSwitch`, each on its
own: a sweep's servers), `run_configuration()` one (an unpaired sweep trial).

The runner knows backends (requests in, results out, see `specbench.backends.base`) and the
records schema; it never touches models or text, and draws nothing (it reports to a
`specbench.progress.PlanProgress`). Rows are handed to a `RunWriter` as they complete, so an
interrupted run keeps every finished sample. Longer than 400 lines because the interleaving,
the recorder that pairs rows with their baseline and the statistics per configuration share
the state of one measuring loop (`run_plan`).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specbench.backends.base import Backend, batched
from specbench.config import BASELINE, SpeculativeConfig
from specbench.errors import ConfigError
from specbench.metrics import match_fields, meets_slo, sample_metrics
from specbench.progress import PlanProgress
from specbench.records import SCHEMA, RunWriter, make_row
from specbench.types import Request, Result


# Columns holding a list per sample (token ids, chunk gaps, the per-step arrays).
_LIST_COLUMNS = tuple(f.name for f in SCHEMA if str(f.type).startswith("list"))

# a conversation's next turn after a request's result (a multi-turn replay), or None
FollowUp = Callable[[Request, Result], "Request | None"]


@dataclass(frozen=True)
class Configuration:
    spec: SpeculativeConfig
    concurrency: int = 1
    request_rate: float | None = None  # requests/s (Poisson); None = closed loop
    burstiness: float = 1.0  # gamma shape of the arrival gaps (1 = Poisson), as vLLM's
    trace: bool = False  # arrivals replay a trace's send times (run_plan's `schedule`)

    @property
    def config_id(self) -> str:
        rate = f"-r{self.request_rate:g}" if self.request_rate else ""
        burst = f"-b{self.burstiness:g}" if self.request_rate and self.burstiness != 1.0 else ""
        return f"{self.spec.short}-c{self.concurrency}{rate}{burst}{'-trace' if self.trace else ''}"

    @property
    def is_baseline(self) -> bool:
        return not self.spec.speculative


def plan(specs: Sequence[SpeculativeConfig], concurrencies: Sequence[int],
         baseline: bool = True, request_rate: float | None = None,
         burstiness: float = 1.0, trace: bool = False) -> list[Configuration]:
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
        out.extend(Configuration(s, c, request_rate, burstiness, trace) for s in chosen)
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


class Recorder:
    """Turns (request, result) pairs into records rows and hands each to the writer the
    moment it completes.

    A speculative greedy sample is compared with the baseline's output for the same prompt
    and repeat. When the baseline of that prompt runs later in the schedule (interleaving
    alternates the order), the row is journaled at once without its match fields, marked
    unpaired; the writer pairs it with the baseline's row when it writes the Parquet file, and `read_run` does the
    same when it recovers a killed run from its journal (`records.pair_with_baseline`), so a
    kill loses no completed sample.

    `rows`, the in-memory copy, is kept without a writer, and with one only when `keep_rows`
    (a stopping rule reads it): then its per-token and per-step lists are dropped, since the
    journal holds them. A run with a writer and no stopping rule keeps no rows, so its memory
    does not grow with its length."""

    def __init__(self, backend_name: str, run_id: str, writer: RunWriter | None,
                 on_result: Callable[[Request, Result], None] | None = None, keep_rows: bool = True):
        self.backend_name, self.run_id, self.writer, self.on_result = backend_name, run_id, writer, on_result
        self.keep_rows = keep_rows or writer is None
        self.baseline_outputs: dict[tuple[str, int], list[int]] = {}
        # a replayed conversation's later turns: the baseline's prompt, so a turn whose history
        # already diverged (its own earlier answers differ) is not compared with the baseline's
        self.baseline_prompts: dict[tuple[str, int], tuple[int, ...]] = {}
        self.expect_baseline: set[int] = set()  # repeats whose baseline is part of the plan
        self._waiting: dict[tuple[str, int], list[tuple[dict, Result]]] = {}
        self._lock = threading.Lock()
        self.rows: list[dict] = []
        # Whether baseline outputs are kept as references: only while a speculative
        # configuration is measured beside them (a baseline-only run holds none).
        self.references = True
        self.slos_ms: dict[str, float] | None = None  # --goodput: every row's meets_slo

    def record_many(self, config: "Configuration", pairs: list[tuple[Request, Result]], *,
                    config_start: float, repeat: int, block: int | None = None) -> list[dict]:
        """The rows of requests that finished together, journaled in one write per run of rows
        alike in being paired (one Arrow conversion for a wave, not one per row: a row alone
        costs about 1 ms of the CPU the client's event loop needs)."""
        with self._lock:
            rows = [self._row(config, request, result, config_start=config_start, repeat=repeat, block=block)
                    for request, result in pairs]
            if self.writer is not None:  # durable now, paired or not
                for wait, run in itertools.groupby(rows, key=lambda r: r[1]):
                    self.writer.add([row for row, _ in run], unpaired=wait)
                # The journal holds the whole row now: a copy kept here (for the stopping rules,
                # which read per-sample scalars) drops its per-token and per-step lists.
                if self.keep_rows:
                    for row, _ in rows:
                        for c in _LIST_COLUMNS:
                            row[c] = None
        if self.on_result is not None:
            for request, result in pairs:
                self.on_result(request, result)
        return [row for row, _ in rows]

    def _row(self, config: "Configuration", request: Request, result: Result, *, config_start: float,
             repeat: int, block: int | None = None) -> tuple[dict, bool]:
        """One request's row and whether it waits for its baseline (under the lock)."""
        key = (request.id, repeat)
        reference = None
        wait = False
        if not config.is_baseline and compares_with_baseline(request):
            reference = self.baseline_outputs.get(key)
            if reference is not None and self.baseline_prompts.get(key, request.prompt_ids) != request.prompt_ids:
                reference = None  # a later turn after the conversation diverged: another prompt
            wait = reference is None and key not in self.baseline_outputs and repeat in self.expect_baseline
        metrics = sample_metrics(request, result, config_start=config_start, reference_ids=reference)
        row = make_row(run_id=self.run_id, config_id=config.config_id, backend=self.backend_name,
                       spec=config.spec, concurrency=config.concurrency,
                       request_rate=config.request_rate, request=request, metrics=metrics,
                       is_baseline=config.is_baseline, repeat=repeat, block=block)
        row["meets_slo"] = meets_slo(row, self.slos_ms)
        if self.keep_rows:
            self.rows.append(row)
        if wait and self.keep_rows:  # the kept row gets its match fields when the baseline comes
            self._waiting.setdefault(key, []).append((row, result, request.prompt_ids))
        if config.is_baseline and result.error is None and self.references and compares_with_baseline(request):
            self.baseline_outputs.setdefault(key, list(result.output_ids))
            if request.turn > 1:
                self.baseline_prompts.setdefault(key, request.prompt_ids)
            for waiting_row, res, prompt in self._waiting.pop(key, []):
                if request.turn > 1 and prompt != request.prompt_ids:
                    continue  # the conversation diverged before this turn
                fields = match_fields(res.output_ids, self.baseline_outputs[key])
                waiting_row["token_match_rate"], waiting_row["first_divergence"] = fields
        return row, wait

    def finish(self) -> None:
        """Forget the rows still waiting for a baseline that never came (failed or
        interrupted): they were written when they completed and stay unmatched."""
        with self._lock:
            self._waiting.clear()


class BackendSwitch:
    """The backend of each configuration, for a plan whose configurations are not all served
    by one backend (a server sweep: one server per configuration). `get(config)` returns
    (backend, fresh): fresh when it has not measured since it was started, so the plan warms
    it up first (a relaunched server is cold again). `name` is the backends' common name."""

    name = "switch"

    def get(self, config: "Configuration") -> tuple[Backend, bool]:
        raise NotImplementedError


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
    slos_ms: dict[str, float] | None = None,
) -> tuple[list[dict], dict]:
    """Run every request once under `config` and return (rows, configuration stats): a plan
    of one configuration, one block, one repeat (see `run_plan`). `baseline_outputs`
    (prompt id -> output) supplies and collects the references greedy samples match against;
    `slos_ms` (--goodput) sets every row's meets_slo."""
    recorder = Recorder(backend.name, run_id, writer, on_result)
    recorder.slos_ms = slos_ms
    if baseline_outputs is not None:
        recorder.baseline_outputs.update({(pid, 0): out for pid, out in baseline_outputs.items()})
    if config.is_baseline:
        recorder.expect_baseline.add(0)
    if warmup:
        _warm(backend, requests, config, warmup)
    info = _run_block(backend, list(requests), config, recorder, repeat=0, block=0, offset=0.0,
                      rate_seed=rate_seed)
    recorder.finish()
    if baseline_outputs is not None:
        baseline_outputs.update({pid: out for (pid, rep), out in recorder.baseline_outputs.items() if rep == 0})
    if writer is not None:
        writer.metadata.add_configuration_stats({config.config_id: info})
        writer.flush()
    return recorder.rows, info


def _warm(backend: Backend, requests: Sequence[Request], config: Configuration, waves: int) -> None:
    """Warm-up, discarded: `waves` waves of short requests at the configuration's concurrency."""
    if batched(backend):
        warm = warmup_requests(requests, waves * config.concurrency)
        if warm:
            backend.run(warm, config.spec, concurrency=config.concurrency)
    else:
        for request in warmup_requests(requests, waves):
            backend.generate(request, config.spec, arrival_time=time.perf_counter())


def _run_block(backend: Backend, requests: list[Request], config: Configuration, recorder: Recorder, *,
               repeat: int, block: int, offset: float, rate_seed: int,
               schedule: Sequence[float] | None = None, follow_up: FollowUp | None = None) -> dict:
    """One block of requests under one configuration. Arrival and finish times are recorded
    relative to the configuration's own clock: its earlier blocks' busy time (`offset`) plus
    the time since this block started, so a configuration interleaved with others reads as
    if it had run alone, back to back. `follow_up(request, result)`: a conversation's next turn
    (or None), run as a wave of its own once the wave before has finished, in the same block."""
    together = batched(backend)
    if not together and (config.concurrency != 1 or config.request_rate or config.trace):
        raise ConfigError(
            f"the {backend.name} backend runs one request at a time: use --concurrency 1 "
            "without --request-rate (or --backend embedded)"
        )
    start = time.perf_counter()
    anchor = start - offset

    later: list[Request] = []

    def record(pairs: list[tuple[Request, Result]]) -> None:
        recorder.record_many(config, pairs, config_start=anchor, repeat=repeat, block=block)
        if follow_up is not None:
            later.extend(n for req, res in pairs if res.error is None and (n := follow_up(req, res)) is not None)

    if together:
        burst = {"burstiness": config.burstiness} if config.request_rate and config.burstiness != 1.0 else {}
        if schedule is not None:
            burst["schedule"] = schedule
        _, info = backend.run(requests, config.spec, concurrency=config.concurrency,
                              request_rate=config.request_rate, rate_seed=rate_seed, on_results=record, **burst)
        while later:  # the conversations' next turns, sent as soon as their wave is in
            wave, later[:] = list(later), []
            _, more = backend.run(wave, config.spec, concurrency=config.concurrency, on_results=record)
            info = merge_stats(info, more)
    else:
        todo = list(requests)
        while todo:
            for request in todo:
                record([(request, backend.generate(request, config.spec, arrival_time=time.perf_counter()))])
            todo, later[:] = list(later), []
        info = {"wall_s": time.perf_counter() - start}
    info.setdefault("wall_s", time.perf_counter() - start)
    return info


def block_size(concurrency: int) -> int:
    """Requests per block when configurations alternate: one wave, `concurrency` requests
    (one at concurrency 1: request by request). Above concurrency 1 a block is the unit a
    paired interval counts as independent (a burst of load shifts a whole block), so blocks
    are kept short: 24 prompts at concurrency 8 are three blocks, where two-wave blocks made
    them two, too few to tell a burst from an effect."""
    return max(1, concurrency)


def _levels_of(configs: Sequence[Configuration]) -> dict[tuple, list[Configuration]]:
    """The configurations measured together: one group per (concurrency, request rate,
    burstiness), in the order they first appear."""
    groups: dict[tuple, list[Configuration]] = {}
    for cfg in configs:
        groups.setdefault((cfg.concurrency, cfg.request_rate, cfg.burstiness), []).append(cfg)
    return groups


def run_plan(backend: Backend | BackendSwitch, requests: Sequence[Request], configs: Sequence[Configuration], *,
             run_id: str, writer: RunWriter | None = None, warmup: int = 0, repeats: int = 1,
             interleave: bool = True, blocks: int | None = None, seed: int = 0,
             time_budget_s: float | None = None,
             on_result: Callable[[Request, Result], None] | None = None,
             progress: PlanProgress | None = None,
             slos_ms: dict[str, float] | None = None,
             stop: Callable[[list[dict], int], str | dict[str, str] | None] | None = None,
             schedule: Sequence[float] | None = None, follow_up: FollowUp | None = None) -> dict[str, dict]:
    """Measure every configuration on every request, `repeats` times, so that configurations
    compared with each other see the same machine.

    Configurations at one concurrency (and request rate) are measured together: each is
    warmed up once, then the requests are cut into blocks (`block_size`) and every block runs
    under every configuration, the order reversing from one block to the next (A B C, C B A,
    A B C, ...: ABBA for two) from a seeded start, so a drift of the machine hits every
    configuration alike. With `interleave=False` each configuration runs all its requests in
    one block, one after another (the order still alternates between repeats); `blocks` cuts
    them into that many blocks instead (as even as they come: fewer, longer blocks where
    switching configurations is dear, e.g. a server launch per switch).

    With a `BackendSwitch` each configuration runs on the backend it names, and is warmed up
    whenever that backend is fresh (before its first block, and again after a relaunch)
    rather than once at the start.

    `time_budget_s` bounds the measuring time (warm-ups included): the budget left is shared
    evenly by the concurrency levels still to run, and a level starts no block it would
    finish after its share (it always runs its first). Every configuration of a level then
    has the same prompts. Returns each configuration's statistics, summed over its blocks;
    `stopped_by_budget` says when prompts were left out.

    `stop(rows, done)` is asked after every block that all configurations of a level have
    run (rows: every row recorded so far; done: requests of the level measured by each):
    a reason string stops the level there (sequential stopping, `stopped_early`); a dict
    {config_id: reason} takes those configurations out of the level's rotation, which goes on
    for the others (each configuration compared with a baseline leaves when its comparison
    is decided) and stops once no configuration but baselines is left.

    `schedule` (a replayed trace: each request's send time in seconds, configurations planned
    with `trace`): every configuration replays all the requests at those times, in one block
    (a trace's timeline cannot be cut into interleaved blocks).

    `follow_up(request, result)` (a multi-turn replay): the next turn of a request's
    conversation, built from that configuration's own answer, or None; it runs in the same
    block as the turn before, once that turn's wave has finished (`_run_block`)."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    progress = progress or PlanProgress()

    def finished(request: Request, result: Result) -> None:
        if on_result is not None:
            on_result(request, result)
        progress.result(request, result)

    recorder = Recorder(backend.name, run_id, writer, finished, keep_rows=stop is not None)
    recorder.slos_ms = slos_ms
    plan = _Levels(backend, requests, recorder, progress, warmup=warmup, repeats=repeats, seed=seed, stop=stop,
                   schedule=schedule, follow_up=follow_up)
    groups = _levels_of(configs)
    started = time.monotonic()
    progress.start(configs, sum(1 + len(r.later_turns) for r in requests) * repeats)
    try:
        for g_index, ((concurrency, *_), group) in enumerate(groups.items()):
            share = None
            if time_budget_s:  # the budget left, shared evenly by the levels still to run
                left = time_budget_s - (time.monotonic() - started)
                share = time.monotonic() + max(left, 0.0) / (len(groups) - g_index)
            size = len(requests) if schedule is not None else \
                _block_requests(len(requests), len(group), concurrency, interleave, blocks)
            plan.level(group, size, share, time_budget_s)
            if writer is not None:
                writer.metadata.add_configuration_stats({c.config_id: plan.stats[c.config_id] for c in group})
                writer.flush()
    finally:
        recorder.finish()
        progress.stop()
        if writer is not None:
            writer.metadata.add_configuration_stats(plan.stats)
    return plan.stats


def _block_requests(n_requests: int, n_configs: int, concurrency: int, interleave: bool, blocks: int | None) -> int:
    """How many requests one block of a level holds: a `blocks`-th of them when asked, one
    wave (`block_size`) when configurations interleave, else all of them."""
    if blocks is not None and n_configs > 1:
        return max(1, -(-n_requests // blocks))
    return block_size(concurrency) if interleave and n_configs > 1 else n_requests


class _Levels:
    """Runs the levels of a plan (configurations at one concurrency and rate) in blocks, and
    keeps each configuration's statistics (`stats`) and busy time across them."""

    def __init__(self, backend: Backend | BackendSwitch, requests: Sequence[Request], recorder: Recorder,
                 progress: PlanProgress, *, warmup: int, repeats: int, seed: int,
                 stop: Callable[[list[dict], int], str | dict[str, str] | None] | None,
                 schedule: Sequence[float] | None = None, follow_up: FollowUp | None = None):
        self.backend, self.requests, self.recorder, self.progress = backend, requests, recorder, progress
        self.schedule, self.follow_up = schedule, follow_up
        self.warmup, self.repeats, self.seed, self.stop = warmup, repeats, seed, stop
        self.switch = backend if isinstance(backend, BackendSwitch) else None
        self.rng = random.Random(seed)
        self.stats: dict[str, dict] = {}
        self.busy: dict[str, float] = {}

    def backend_of(self, cfg: Configuration) -> Backend:
        """The backend `cfg` runs on; a switch's fresh backend is warmed up first."""
        if self.switch is None:
            return self.backend  # type: ignore[return-value]
        b, fresh = self.switch.get(cfg)
        if fresh and self.warmup:
            self.progress.block(cfg, "warm-up")
            _warm(b, self.requests, cfg, self.warmup)
        return b

    def level(self, group: list[Configuration], size: int, share: float | None,
              time_budget_s: float | None) -> None:
        """Warm up, then run every block of `size` requests under every configuration of the
        group, the order reversing from one block to the next, until the requests (times
        `repeats`) are done, `stop` decides, or the level's time `share` would be overrun."""
        recorder, requests = self.recorder, self.requests
        recorder.expect_baseline = set(range(self.repeats)) if any(c.is_baseline for c in group) else set()
        recorder.references = any(not c.is_baseline for c in group)
        order = list(group)
        self.rng.shuffle(order)
        for cfg in order if self.switch is None else ():
            self.progress.block(cfg, "warm-up")
            if self.warmup:
                _warm(self.backend, requests, cfg, self.warmup)  # type: ignore[arg-type]
        cut = [list(requests[i:i + size]) for i in range(0, len(requests), size)]
        planned = len(requests) * self.repeats
        turn, block_s, done, reason = 0, 0.0, 0, None
        left: dict[str, str] = {}  # configurations out of the rotation -> why
        for repeat, (b, chunk) in itertools.product(range(self.repeats), enumerate(cut)):
            if share is not None and turn and time.monotonic() + block_s > share:
                break
            t_block = time.monotonic()
            for cfg in (order if turn % 2 == 0 else order[::-1]):
                if cfg.config_id not in left:
                    self._block(cfg, chunk, repeat, turn, b)
            turn += 1
            done += len(chunk)
            block_s = max(block_s, time.monotonic() - t_block)
            reason = self._stopping(group, left, done, planned)
            if reason:
                break
        if done < planned and not reason:
            for cfg in group:
                if cfg.config_id not in left:
                    self.stats[cfg.config_id]["stopped_by_budget"] = {
                        "measured": done, "planned": planned, "time_budget_s": time_budget_s}
        recorder.finish()

    def _block(self, cfg: Configuration, chunk: list[Request], repeat: int, turn: int, b: int) -> None:
        self.progress.block(cfg, "run")
        info = _run_block(self.backend_of(cfg), chunk, cfg, self.recorder, repeat=repeat, block=turn,
                          offset=self.busy.get(cfg.config_id, 0.0), rate_seed=self.seed + 1000 * repeat + b,
                          schedule=self.schedule if cfg.trace else None, follow_up=self.follow_up)
        self.busy[cfg.config_id] = self.busy.get(cfg.config_id, 0.0) + info["wall_s"]
        self.stats[cfg.config_id] = merge_stats(self.stats.get(cfg.config_id), info)

    def _stopping(self, group: list[Configuration], left: dict[str, str], done: int, planned: int) -> str | None:
        """Sequential stopping after a block all configurations ran: `stop` says why the level
        ends here (a reason), or takes decided configurations out of the rotation (a dict),
        which ends the level once only baselines are left. Marks what it stops."""
        reason = self.stop(self.recorder.rows, done) if self.stop is not None else None
        if isinstance(reason, dict):
            for cid, why in reason.items():
                if cid not in left:
                    left[cid] = why
                    self.stats[cid]["stopped_early"] = {"measured": done, "planned": planned, "why": why}
            if not all(c.is_baseline or c.config_id in left for c in group):
                return None
            reason = "every configuration compared with the baseline is decided"
            for cfg in group:
                self.stats[cfg.config_id].setdefault("stopped_early", {"measured": done, "planned": planned,
                                                                       "why": reason})
            return reason
        if reason:
            for cfg in group:
                self.stats[cfg.config_id]["stopped_early"] = {"measured": done, "planned": planned, "why": reason}
        return reason or None


_MAX_KEYS = ("peak_memory_bytes", "allocated_bytes", "peak_bytes", "weight_bytes")


def merge_stats(total: dict | None, part: dict) -> dict:
    """A configuration's statistics over several blocks: counts and seconds add up,
    histograms add per bin, memory figures take the maximum, anything else the latest."""
    if total is None:
        return json.loads(json.dumps(part))
    out = dict(total)
    for key, value in part.items():
        have = out.get(key)
        if isinstance(value, dict) and isinstance(have, dict):
            out[key] = merge_stats(have, value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(have, (int, float)):
            out[key] = value
        elif key.endswith(_MAX_KEYS):
            out[key] = max(have, value)
        else:
            out[key] = have + value
    return out
