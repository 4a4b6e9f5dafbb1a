"""The sweep loop: run trials until the budget is spent or every configuration is measured.

Crashed workers (see `specbench.sweep.storage`): a worker killed mid-trial stops its trial's
heartbeat; after the grace period the next worker that looks fails it as stale and Optuna's
`RetryHeartbeatStaleTrialCallback` queues it again with the same parameters (system attr
`failed_trial` names the lost one), so another worker measures it, once. A worker that runs
until every configuration is measured (grid, no --n-trials) waits for other workers' running
trials before it stops, so it is there to pick such a trial up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from specbench.errors import StorageError
from specbench.sweep.objective import Events, make_objective
from specbench.sweep.space import config_key
from specbench.sweep.spec import SweepSpec
from specbench.sweep.trials import (
    POLL_S,
    SKIPPED_ATTR,
    TrialFailed,
    all_measured,
    enqueue_pending,
    retry_mark,
    trial_key,
)
from specbench.sweep.workers import Worker


def _lost(exc: BaseException) -> bool:
    """The trial in flight was failed as stale by another worker meanwhile (its heartbeats did
    not reach the storage for the grace period): Optuna refuses to update it. When the
    objective itself succeeded, Optuna's own bookkeeping then fails an internal assertion
    while that refusal propagates, so the refusal is looked for along the exception chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or (
                isinstance(exc, ValueError) and str(exc).startswith("Cannot tell a FAIL trial")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def wait_for_others(study: optuna.Study, spec: SweepSpec, worker: Worker, events: Events) -> bool:
    """While other workers' trials run: wait, failing stale trials (which Optuna queues
    again). True when a queued trial is there to run; False once no trial is queued or
    running. A queued trial whose configuration is measured already takes the stored outcome
    at once, so the study ends with every trial finished: none left running for a worker
    that died, none queued for nobody (two workers may both queue a lost trial again)."""
    noted = False
    while True:
        enqueue_pending(study, spec)  # fails stale trials first; queues interrupted ones
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return True
        running = [t for t in trials if t.state == TrialState.RUNNING]
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


def guide(study: optuna.Study, spec: SweepSpec, study_dir: Path, events: Events) -> bool:
    """The model-guided sampler's turn (`specbench.sweep.guided`): record what the model
    skips now, enqueue the configuration it picks. False when nothing is left to measure."""
    from specbench.sweep import guided

    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return True  # a baseline or a retry goes first
    choice = guided.choose(spec, trials, study_dir, retry_mark(study))
    before = study.user_attrs.get(SKIPPED_ATTR) or {}
    for key, why in choice.skipped.items():
        if key not in before:
            events.note(f"model: skipping {guided.label(key)}: {why}")
    for key in set(before) - set(choice.skipped):
        events.note(f"model: {guided.label(key)} is no longer ruled out; it may be measured")
    study.set_user_attr(SKIPPED_ATTR, choice.skipped)
    events.settled(study)
    if choice.config is None:
        events.note(f"model: done, {choice.why}")
        return False
    key = config_key(choice.config)
    if key not in {trial_key(t, spec.space) for t in trials if t.state == TrialState.WAITING}:
        study.enqueue_trial(spec.space.params(choice.config))
    events.note(f"model: next {guided.label(key)}: {choice.why}")
    return True


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
    guided = spec.study.sampler == "model"
    deadline = time.monotonic() + spec.budget.timeout_s if spec.budget.timeout_s is not None else None
    try:
        while True:
            left = None if spec.budget.n_trials is None else spec.budget.n_trials - ran
            timeout = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or (timeout is not None and timeout <= 0):
                break
            if guided:  # one trial at a time, each chosen on what the trials so far say
                if all_measured(study, spec) or not guide(study, spec, study_dir, events):
                    if budget or not wait_for_others(study, spec, worker, events):
                        break  # else a trial is queued (a lost one, measured here)
                left = 1
            try:
                study.optimize(objective, n_trials=left, timeout=timeout, catch=(TrialFailed,),
                               callbacks=[after_trial, *callbacks], gc_after_trial=False)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError, AssertionError) as exc:
                if not _lost(exc):
                    raise
                ran += 1  # it took its place in this worker's budget
                events.note(f"[yellow]a trial of this worker was taken for lost by another worker "
                            f"(no heartbeat reached the storage for {spec.study.grace_period_s} s) and is "
                            "measured again there; going on[/]")
                continue
            if guided:
                continue
            if budget or not wait_for_others(study, spec, worker, events):
                break
    except StorageError:
        raise  # the storage is gone: marking this worker done would only wait for it again
    except BaseException:
        worker.finish()
        raise
    worker.finish()
