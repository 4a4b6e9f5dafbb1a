"""The Optuna side of a sweep: storage, study, sampler, the objective, and dedupe.

One trial = one run. The objective (built by `make_objective`) suggests
`method`, `concurrency`, `num_speculative_tokens` and `draft` (parameter names equal the
variable names and the records' column names), measures that configuration with
`specbench.runner.run_configuration` into its own run directory under the study directory,
and stores in the trial's user attrs the run id, the run directory and the run's summary
(`specbench.analysis.summarize` of the Parquet it just wrote), so every value traces back to
samples.

Dedupe across processes. A configuration is measured at most once per study, also when
several workers share one storage. Each trial publishes its configuration key
(`config_key`) and then a ticket (1 + the largest ticket among trials with that key), then
defers to any running trial with that key whose (ticket, number) is smaller, or that is
still choosing its ticket: Lamport's bakery algorithm over the storage, which needs only
reads and writes, no locks, so it works on every storage (RDB or journal file). A deferring
trial waits for the winner and returns its stored value (`duplicate_of`); a trial with a key
already measured returns the stored value at once.

Crashed workers (see `specbench.sweep.storage`): a worker killed mid-trial stops its trial's
heartbeat; after the grace period the next worker that looks fails it as stale and Optuna's
`RetryHeartbeatStaleTrialCallback` queues it again with the same parameters (system attr
`failed_trial` names the lost one), so another worker measures it, once. A worker that runs
until every configuration is measured (grid, no --n-trials) waits for other workers' running
trials before it stops, so it is there to pick such a trial up.

Failures: an exception while measuring (out of memory, a model that cannot load) fails the
trial with a one-line `fail_reason` user attr and the sweep goes on; that configuration is
not retried. An interrupted trial (Ctrl-C) fails without a reason and is enqueued again on
the next start, so a resumed sweep measures exactly what is missing. A storage that stops
answering is waited for (`--storage-retry`); it is never recorded as a failure of the
configuration.
"""

from __future__ import annotations

import gc
import json
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from specbench.errors import ConfigError, StorageError
from specbench.sweep import measure as measuring  # module: measuring.measure is looked up per trial
from specbench.sweep.options import OBJECTIVES
from specbench.sweep.space import Point
from specbench.sweep.spec import SweepSpec
from specbench.sweep.storage import (  # noqa: F401 - open_storage etc. are used from here too
    display_url,
    fail_stale,
    first_line,
    normalize_storage_url,
    open_storage,
)
from specbench.sweep.summary import HEADLINE, SPEEDUP_ATTRS, speedups_vs
from specbench.sweep.workers import Worker

POLL_S = 0.5  # how often a waiting trial looks at the storage again
QUEUED_WAIT_S = 2.0  # how long a trial waits for a queued (not yet running) baseline
SETUP_ATTR = "specbench_setup"
CREATION_WAIT_S = 10.0  # how long a worker waits for the setup of a study another worker just created
CONSTRAINT = "peak_memory_over_budget_gib"  # <= 0: feasible
# Optuna metric names (shown by optuna-dashboard), units in the names as in the records
METRIC_NAMES = {"tpot_p50": "tpot_p50_s", "tpot_p95": "tpot_p95_s",
                "output_tps_per_user": "output_tok_per_s_per_user", "output_tps": "output_tok_per_s",
                "speedup": "speedup_tpot_p50_x"}

optuna.logging.set_verbosity(optuna.logging.ERROR)  # the CLI reports trials itself


class TrialFailed(Exception):
    """A trial that failed for a reason worth recording (its message, one line)."""


# --------------------------------------------------------------------------------------
# Storage and study


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k in ("space", "sampling"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def open_study(spec: SweepSpec, storage: optuna.storages.BaseStorage,
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create the study, or load it when it exists with the same setup (search space,
    objectives, models, workload, sampling). A different setup is refused."""
    wanted = json.loads(json.dumps(spec.setup()))
    url = display_url(spec.storage_url)

    def check(existing: dict[str, Any]) -> None:
        if existing == wanted:
            return
        a, b = _flat(existing), _flat(wanted)
        diffs = [f"{k}: {a.get(k)!r} in the study, {b.get(k)!r} here"
                 for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        what = "search space" if all(d.startswith("space.") for d in diffs) else "setup"
        raise ConfigError(
            f"study {spec.study.name!r} in {url} was created with a different {what} "
            f"({'; '.join(diffs)}); resume it with the spec it was created with, or start a new "
            "study with --study-name NEW_NAME")

    try:
        study_id = storage.get_study_id_from_name(spec.study.name)
    except KeyError:
        study_id = None
    if study_id is not None:
        existing = storage.get_study_user_attrs(study_id).get(SETUP_ATTR)
        # Another worker may have created the study a moment ago and not yet stored its setup
        # (create_study and set_user_attr are two writes): give it a few seconds.
        deadline = time.monotonic() + CREATION_WAIT_S
        while existing is None and time.monotonic() < deadline:
            time.sleep(0.2)
            existing = storage.get_study_user_attrs(study_id).get(SETUP_ATTR)
        if existing is None:
            raise ConfigError(f"study {spec.study.name!r} in {url} was not created by specbench "
                              "sweep; choose another --study-name")
        check(existing)
        directions = [d.name.lower() for d in storage.get_study_directions(study_id)]
        if directions != spec.directions:
            raise ConfigError(f"study {spec.study.name!r} in {url} optimizes {directions}, not "
                              f"{spec.directions}; start a new study with --study-name NEW_NAME")
    study = optuna.create_study(study_name=spec.study.name, storage=storage, sampler=sampler,
                                directions=spec.directions, load_if_exists=True)
    existing = study.user_attrs.get(SETUP_ATTR)
    if existing is None:
        study.set_user_attr(SETUP_ATTR, wanted)
        with warnings.catch_warnings():  # experimental since Optuna 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAMES[o] for o in spec.objectives])
    else:  # another worker created it a moment ago
        check(existing)
    return study


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler, also after enqueued trials (baselines, retries): they carry no
    grid id, and GridSampler.after_trial looks one up when one grid point is left."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        if "grid_id" in trial.system_attrs:
            super().after_trial(study, trial, state, values)
        elif self.is_exhausted(study):
            study.stop()


def make_sampler(spec: SweepSpec, n_existing: int = 0) -> optuna.samplers.BaseSampler:
    """grid: Optuna's GridSampler over the speculative points (same seed in every worker, so
    workers walk one shuffled grid). tpe/random: seeded by the spec's seed plus the trials
    already in the study, so a single-worker sweep is reproducible and a resumed one does
    not replay its first proposals."""
    if spec.study.sampler == "grid":
        return _GridSampler(spec.space.grid(), seed=spec.study.seed)
    seed = spec.study.seed + n_existing
    if spec.study.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # Constraints reach TPE through Trial.set_constraint (Optuna 5 replaced constraints_func).
    return optuna.samplers.TPESampler(seed=seed)


# --------------------------------------------------------------------------------------
# Reading trials back


RETRY_ATTR = "specbench_retry_failed_before"  # failures of trials numbered below this are retried


def retry_mark(study: optuna.Study) -> int:
    """Trials numbered below this whose failure `--retry-failed` set aside (-1: none)."""
    return int(study.user_attrs.get(RETRY_ATTR, -1))


def retry_failed(study: optuna.Study) -> int:
    """Set every recorded failure so far aside: those configurations are measured again.
    Returns how many configurations that concerns."""
    trials = study.get_trials(deepcopy=False)
    keys = {trial_key(t) for t in trials if t.state == TrialState.FAIL and "fail_reason" in t.user_attrs}
    keys -= {trial_key(t) for t in trials if t.state == TrialState.COMPLETE}
    study.set_user_attr(RETRY_ATTR, len(trials))
    return len(keys - {None})


def settled(t: FrozenTrial, retry_before: int = -1) -> bool:
    """Finished with an outcome that stands: complete, or failed for a recorded reason (and
    not set aside for a retry by --retry-failed)."""
    return t.state == TrialState.COMPLETE or (
        t.state == TrialState.FAIL and "fail_reason" in t.user_attrs and not t.user_attrs.get("retry")
        and t.number >= retry_before)


def trial_key(t: FrozenTrial) -> str | None:
    if "config_key" in t.user_attrs:
        return t.user_attrs["config_key"]
    params = t.params or t.system_attrs.get("fixed_params")
    return Point.from_params(params).key if params else None


def is_measured(t: FrozenTrial) -> bool:
    """A trial that ran its own measurement (not one reusing another trial's)."""
    return "run_id" in t.user_attrs and "duplicate_of" not in t.user_attrs


def settled_keys(trials: list[FrozenTrial], retry_before: int = -1) -> set[str]:
    return {k for t in trials if settled(t, retry_before) and (k := trial_key(t))}


def all_measured(study: optuna.Study, spec: SweepSpec) -> bool:
    done = settled_keys(study.get_trials(deepcopy=False), retry_mark(study))
    return all(p.key in done for p in spec.space.points())


def enqueue_pending(study: optuna.Study, spec: SweepSpec) -> list[Point]:
    """Enqueue the baseline at each concurrency (first, so speculative trials find it) and
    every configuration whose trial was interrupted, unless present already."""
    fail_stale(study)
    trials = study.get_trials(deepcopy=False)
    mark = retry_mark(study)
    taken = {trial_key(t) for t in trials
             if t.state in (TrialState.WAITING, TrialState.RUNNING) or settled(t, mark)}
    by_key = {p.key: p for p in spec.space.points()}
    pending: list[Point] = [p for p in by_key.values() if p.is_baseline]
    # config_key is written once every parameter is suggested, so it names the whole point
    pending += [by_key[k] for t in trials if t.state == TrialState.FAIL and not settled(t, mark)
                and (k := t.user_attrs.get("config_key")) in by_key]
    out: list[Point] = []
    for p in pending:
        if p.key not in taken:
            study.enqueue_trial(p.params)
            taken.add(p.key)
            out.append(p)
    return out


# --------------------------------------------------------------------------------------
# Dedupe: Lamport's bakery over trial user attrs


def _peers(study: optuna.Study, me: Trial, key: str) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False)
            if t.number != me.number and t.user_attrs.get("config_key") == key]


def claim(study: optuna.Study, trial: Trial, key: str) -> FrozenTrial | None:
    """None when this trial is the one to measure `key`; otherwise the settled trial whose
    outcome it reuses (waiting while another worker measures it)."""
    trial.set_user_attr("config_key", key)  # doorway: "choosing" until the ticket is out
    peers = _peers(study, trial, key)
    ticket = 1 + max((int(t.user_attrs.get("ticket", 0)) for t in peers), default=0)
    trial.set_user_attr("ticket", ticket)
    mine = (ticket, trial.number)
    mark = retry_mark(study)
    while True:
        peers = _peers(study, trial, key)
        done = sorted((t for t in peers if settled(t, mark)),
                      key=lambda t: (t.state != TrialState.COMPLETE, t.number))
        if done:
            return done[0]
        ahead = [t for t in peers if t.state == TrialState.RUNNING
                 and ("ticket" not in t.user_attrs or (int(t.user_attrs["ticket"]), t.number) < mine)]
        if not ahead:
            return None
        time.sleep(POLL_S)
        fail_stale(study)


# what a trial reusing another's outcome copies from it
_COPIED = ("config_id", "run_id", "run_dir", "host", "summary", "speedups", "feasible",
           "constraint", "baseline_trial", *HEADLINE, *SPEEDUP_ATTRS)


def reuse(trial: Trial, original: FrozenTrial) -> Any:
    """Make `trial` a copy of a settled trial with the same configuration."""
    source = original.user_attrs.get("duplicate_of", original.number)
    trial.set_user_attr("duplicate_of", source)
    for k in _COPIED:
        if k in original.user_attrs:
            trial.set_user_attr(k, original.user_attrs[k])
    if "constraint" in original.user_attrs:
        trial.set_constraint(CONSTRAINT, original.user_attrs["constraint"])
    if original.state != TrialState.COMPLETE:
        reason = original.user_attrs.get("fail_reason", "failed")
        if reason.startswith("same configuration as trial"):
            reason = reason.split("which failed: ", 1)[-1]
        message = f"same configuration as trial {source}, which failed: {reason}"
        trial.set_user_attr("fail_reason", message)
        raise TrialFailed(message)
    values = list(original.values)
    return values[0] if len(values) == 1 else values


def baseline_of(study: optuna.Study, concurrency: int) -> FrozenTrial:
    """The complete baseline trial at `concurrency`, waiting while one is running, or queued
    for up to QUEUED_WAIT_S (a worker between trials takes a queued trial within moments; when
    none does, as when a lost baseline is queued again while every worker waits for it, this
    trial gives way with `_Retry` so its worker runs the queued baseline next)."""
    key = Point.of("none", concurrency=concurrency).key
    queued_since: float | None = None
    mark = retry_mark(study)
    while True:
        trials = [t for t in study.get_trials(deepcopy=False) if trial_key(t) == key]
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if done:
            return done[0]
        failed = [t for t in trials if settled(t, mark)]
        if failed:
            raise TrialFailed(f"the baseline at concurrency {concurrency} failed (trial "
                              f"{failed[0].number}: {failed[0].user_attrs.get('fail_reason')})")
        running = any(t.state == TrialState.RUNNING for t in trials)
        queued = any(t.state == TrialState.WAITING for t in trials)
        if queued and not running:
            queued_since = queued_since or time.monotonic()
        if not (running or (queued and time.monotonic() - queued_since < QUEUED_WAIT_S)):
            raise _Retry(f"no baseline measured at concurrency {concurrency} yet")
        time.sleep(POLL_S)
        fail_stale(study)


def _complete_baseline(study: optuna.Study, concurrency: int) -> FrozenTrial | None:
    key = Point.of("none", concurrency=concurrency).key
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE and trial_key(t) == key]
    return done[0] if done else None


class _Retry(TrialFailed):
    """A failure that says nothing about the configuration: retried on the next start."""


# --------------------------------------------------------------------------------------
# The objective


class Events:
    """What the objective reports while it works (the CLI draws progress from it)."""

    def trial_started(self, number: int, config_id: str, n_requests: int) -> None: ...
    def request_done(self) -> None: ...
    def note(self, message: str) -> None: ...


def make_objective(spec: SweepSpec, session: Any, study_dir: Path, events: Events | None = None,
                   worker: Worker | None = None) -> Callable[[Trial], Any]:
    """The objective of a sweep over `spec.space`, measuring with `session`; each trial is
    tagged with the worker (and host) running it."""
    events = events or Events()
    space = spec.space
    baseline_outputs: dict[int, dict[str, list[int]]] = {}  # concurrency -> prompt id -> ids

    def objective(trial: Trial) -> Any:
        if worker is not None:  # who runs this trial; `host` (set by measure) says who measured
            trial.set_user_attr("worker", worker.id)
        method = trial.suggest_categorical("method", ("none", *space.method))
        concurrency = trial.suggest_categorical("concurrency", space.concurrency)
        num_speculative_tokens, draft = 0, None
        if method != "none":
            if space.k_range:
                low, high, step = space.k_range
                num_speculative_tokens = trial.suggest_int("num_speculative_tokens", low, high, step=step)
            else:
                num_speculative_tokens = trial.suggest_categorical("num_speculative_tokens",
                                                                   space.num_speculative_tokens)
        if method == "draft_model":
            draft = trial.suggest_categorical("draft", space.draft)
        elif method == "eagle3":
            draft = space.head  # one head: not a search dimension
        point = Point.of(method, num_speculative_tokens, draft, concurrency)

        original = claim(trial.study, trial, point.key)
        if original is not None:
            return reuse(trial, original)

        base_trial = None
        try:
            if not point.is_baseline:
                if "speedup" in spec.objectives:
                    base_trial = baseline_of(trial.study, concurrency)
                else:
                    base_trial = _complete_baseline(trial.study, concurrency)
                if base_trial is not None:
                    trial.set_user_attr("baseline_trial", base_trial.number)
                    if concurrency not in baseline_outputs:
                        ref = measuring.baseline_outputs_from(study_dir, base_trial)
                        if ref:
                            baseline_outputs[concurrency] = ref
            result = measuring.measure(session, spec, point, trial.number, study_dir,
                                       baseline_outputs.get(concurrency), events,
                                       worker.id if worker is not None else None)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        except _Retry as exc:
            trial.set_user_attr("fail_reason", str(exc))
            trial.set_user_attr("retry", True)
            raise
        except TrialFailed as exc:
            trial.set_user_attr("fail_reason", str(exc))
            raise
        except (StorageError, optuna.exceptions.UpdateFinishedTrialError):
            raise  # says nothing about the configuration: never recorded as its failure
        except Exception as exc:  # noqa: BLE001 - out of memory, model errors: record, go on
            reason = first_line(exc)
            if type(exc).__name__ == "OutOfMemoryError" and not reason.startswith("out of memory"):
                reason = f"out of memory: {reason}"
            trial.set_user_attr("fail_reason", reason)
            _release_memory()
            raise TrialFailed(reason) from None
        for k, v in result.attrs.items():
            trial.set_user_attr(k, v)
        if point.is_baseline and result.outputs:
            baseline_outputs[concurrency] = result.outputs

        summary = result.attrs["summary"]
        speedups = speedups_vs(base_trial.user_attrs["summary"], summary) if base_trial else {}
        if speedups:
            trial.set_user_attr("speedups", speedups)
            for name, column in SPEEDUP_ATTRS.items():  # flat numbers: dashboard columns
                if speedups.get(column) is not None:
                    trial.set_user_attr(name, round(speedups[column], 4))
        if spec.max_peak_memory_bytes is not None:
            peak = summary.get("peak_memory_bytes")
            over = (peak - spec.max_peak_memory_bytes) / 2**30 if peak is not None else 0.0
            trial.set_user_attr("constraint", over)
            trial.set_user_attr("feasible", over <= 0)
            trial.set_constraint(CONSTRAINT, over)  # samplers and best_trials honour it
        values = []
        for name in spec.objectives:
            column = OBJECTIVES[name].column
            v = (1.0 if point.is_baseline else speedups.get(column)) if name == "speedup" else summary.get(column)
            if v is None or not math.isfinite(v):
                reason = (f"objective {name} is undefined for this run ({summary.get('errors')} of "
                          f"{summary.get('n')} requests failed)")
                trial.set_user_attr("fail_reason", reason)
                raise TrialFailed(reason)
            values.append(float(v))
        return values[0] if len(values) == 1 else values

    return objective


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort after an OOM
        pass


# --------------------------------------------------------------------------------------
# The loop


def progress_counts(study: optuna.Study, spec: SweepSpec) -> tuple[int, int]:
    """(configurations settled, configurations in the space)."""
    points = spec.space.points()
    done = settled_keys(study.get_trials(deepcopy=False), retry_mark(study))
    return sum(1 for p in points if p.key in done), len(points)


def _lost(exc: BaseException) -> bool:
    """The trial in flight was failed as stale by another worker meanwhile (its heartbeats did
    not reach the storage for the grace period): Optuna refuses to update it."""
    return isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or (
        isinstance(exc, ValueError) and str(exc).startswith("Cannot tell a FAIL trial"))


def wait_for_others(study: optuna.Study, spec: SweepSpec, worker: Worker, events: Events) -> bool:
    """While configurations are unmeasured and other workers' trials run: wait, failing stale
    trials (which Optuna queues again). True when a queued trial is there to run."""
    noted = False
    while True:
        enqueue_pending(study, spec)  # fails stale trials first; queues interrupted ones
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return True
        if all_measured(study, spec):
            return False
        done = settled_keys(trials, retry_mark(study))
        running = [t for t in trials if t.state == TrialState.RUNNING
                   and t.user_attrs.get("config_key") not in (None, *done)]
        if not running:
            return False
        if not noted:
            events.note(f"waiting for {len(running)} trial(s) of other workers (trial "
                        f"{', '.join(str(t.number) for t in running)}); a worker that stopped is "
                        f"noticed {spec.study.grace_period_s} s after its last heartbeat and its trial "
                        "is measured again")
            noted = True
        worker.touch()
        time.sleep(POLL_S)


def run_sweep(spec: SweepSpec, session: Any, study: optuna.Study, study_dir: Path,
              events: Events | None = None,
              callbacks: tuple[Callable[[optuna.Study, FrozenTrial], None], ...] = (),
              worker: Worker | None = None) -> None:
    """Measure until the budget (`n_trials` in this process, `timeout_s`) is spent or every
    configuration of the space is measured. Interrupted configurations and the baselines are
    enqueued first. Without a budget, the worker also waits for other workers' trials, so a
    trial lost with its worker is measured here. `worker` is registered in the study while
    this runs and marked done after (see `specbench.sweep.workers`)."""
    if all_measured(study, spec):
        return
    events = events or Events()
    worker = worker or Worker(study, spec.study.grace_period_s)
    worker.register()
    enqueue_pending(study, spec)
    ran = 0

    def after_trial(study: optuna.Study, _: FrozenTrial) -> None:
        nonlocal ran
        ran += 1
        worker.touch()
        if all_measured(study, spec):
            study.stop()
        else:  # a crashed worker's trials fail as stale meanwhile: queue them again
            enqueue_pending(study, spec)

    objective = make_objective(spec, session, study_dir, events, worker)
    budget = spec.budget.n_trials is not None or spec.budget.timeout_s is not None
    deadline = time.monotonic() + spec.budget.timeout_s if spec.budget.timeout_s is not None else None
    try:
        while True:
            left = None if spec.budget.n_trials is None else spec.budget.n_trials - ran
            timeout = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or (timeout is not None and timeout <= 0):
                break
            try:
                study.optimize(objective, n_trials=left, timeout=timeout, catch=(TrialFailed,),
                               callbacks=[after_trial, *callbacks], gc_after_trial=False)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
                if not _lost(exc):
                    raise
                ran += 1  # it took its place in this worker's budget
                events.note(f"[yellow]a trial of this worker was taken for lost by another worker "
                            f"(no heartbeat reached the storage for {spec.study.grace_period_s} s) and is "
                            "measured again there; going on[/]")
                continue
            if budget or all_measured(study, spec) or not wait_for_others(study, spec, worker, events):
                break
    except StorageError:
        raise  # the storage is gone: marking this worker done would only wait for it again
    except BaseException:
        worker.finish()
        raise
    worker.finish()
