"""What a study's trials say: which configurations are settled, measured or still to run,
and how a trial defers to another measuring the same configuration.

Settled: a trial complete, or failed for a recorded reason (`fail_reason`); that outcome
stands, unless `--retry-failed` set the failures so far aside (`retry_mark`). Interrupted
trials (Ctrl-C) fail without a reason and are enqueued again (`enqueue_pending`), as are the
baselines, first, so speculative trials find theirs. A trial whose worker was lost (no
heartbeat) fails with `fail_reason` "worker lost: ..." and `stale`: not settled, and queued
again by the storage's stale-trial callback only, so its retry is enqueued once.

Dedupe across processes. A configuration is measured at most once per study, also when
several workers share one storage. Each trial publishes its configuration key
(`config_key`) and then a ticket (1 + the largest ticket among trials with that key), then
defers to any running trial with that key whose (ticket, number) is smaller, or that is
still choosing its ticket: Lamport's bakery algorithm over the storage, which needs only
reads and writes, no locks, so it works on every storage (RDB or journal file). A deferring
trial waits for the winner and returns its stored value (`duplicate_of`); a trial with a key
already measured returns the stored value at once. A trial that measures its whole level
(`[budget] batch = "level"`) then claims the level's other keys the same way, a ticket each
(`batch_tickets`, doorway `batch_choosing`), without ever waiting for one: a key another trial
holds is left to it, so two workers split a level and no trial holding keys waits on another.

Boundary: reads and writes trial attrs through Optuna; measures nothing.
"""

from __future__ import annotations

import time
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from specbench.errors import ConfigError
from specbench.runner import Configuration
from specbench.sweep.space import Space, config_key, configuration
from specbench.sweep.spec import SweepSpec
from specbench.sweep.storage import fail_stale
from specbench.sweep.summary import HEADLINE, SPEEDUP_ATTRS

POLL_S = 0.5  # how often a waiting trial looks at the storage again
QUEUED_WAIT_S = 2.0  # how long a trial waits for a queued (not yet running) baseline
CONSTRAINT = "peak_memory_over_budget_gib"  # <= 0: feasible


class TrialFailed(Exception):
    """A trial that failed for a reason worth recording (its message, one line)."""


class RetryLater(TrialFailed):
    """A failure that says nothing about the configuration: retried on the next start."""


# study user attr of the model-guided sampler (`specbench.sweep.guided`): configuration key ->
# why the fitted model rules it out; such configurations count as settled while the model says so
SKIPPED_ATTR = "specbench_model_skipped"
RETRY_ATTR = "specbench_retry_failed_before"  # failures of trials numbered below this are retried


def retry_mark(study: optuna.Study) -> int:
    """Trials numbered below this whose failure `--retry-failed` set aside (-1: none)."""
    return int(study.user_attrs.get(RETRY_ATTR, -1))


def retry_failed(study: optuna.Study, space: Space) -> int:
    """Set every recorded failure so far aside: those configurations are measured again.
    Returns how many configurations that concerns."""
    trials = study.get_trials(deepcopy=False)
    keys = {trial_key(t, space) for t in trials if t.state == TrialState.FAIL and "fail_reason" in t.user_attrs}
    keys -= {trial_key(t, space) for t in trials if t.state == TrialState.COMPLETE}
    study.set_user_attr(RETRY_ATTR, len(trials))
    return len(keys - {None})


def settled(t: FrozenTrial, retry_before: int = -1) -> bool:
    """Finished with an outcome that stands: complete, or failed for a recorded reason (and
    not set aside for a retry by --retry-failed)."""
    return t.state == TrialState.COMPLETE or (
        t.state == TrialState.FAIL and "fail_reason" in t.user_attrs and not t.user_attrs.get("retry")
        and not t.user_attrs.get("stale") and t.number >= retry_before)


def trial_key(t: FrozenTrial, space: Space) -> str | None:
    """The key of the configuration `t` measures: the one it published, else that of its
    params (a queued trial's: the params it was enqueued with); None without any."""
    if "config_key" in t.user_attrs:
        return t.user_attrs["config_key"]
    return params_key(space, t.params or t.system_attrs.get("fixed_params"))


def params_key(space: Space, params: dict[str, Any] | None) -> str | None:
    """The key of the configuration Optuna `params` name (eagle3: with the space's head);
    None for params that name none, or only part of one (a trial stopped while drawing them,
    e.g. draft_model without its draft): no configuration of the space has such a key."""
    if not params:
        return None
    try:
        return config_key(space.from_params(params))
    except ConfigError:
        return None


def is_measured(t: FrozenTrial) -> bool:
    """A trial that ran its own measurement (not one reusing another trial's)."""
    return "run_id" in t.user_attrs and "duplicate_of" not in t.user_attrs


def settled_keys(trials: list[FrozenTrial], space: Space, retry_before: int = -1) -> set[str]:
    return {k for t in trials if settled(t, retry_before) and (k := trial_key(t, space))}


def done_keys(study: optuna.Study, spec: SweepSpec) -> set[str]:
    """The configuration keys settled (with the model-guided sampler: or skipped by the model)."""
    done = settled_keys(study.get_trials(deepcopy=False), spec.space, retry_mark(study))
    if spec.study.sampler == "model":
        done |= set(study.user_attrs.get(SKIPPED_ATTR) or {})
    return done


def all_measured(study: optuna.Study, spec: SweepSpec) -> bool:
    """Every configuration settled (with the model-guided sampler: or skipped by the model)."""
    done = done_keys(study, spec)
    return all(config_key(c) in done for c in spec.space.configurations())


def enqueue_pending(study: optuna.Study, spec: SweepSpec) -> list[Configuration]:
    """Enqueue the baseline at each concurrency (first, so speculative trials find it) and
    every configuration whose trial was interrupted, unless present already."""
    fail_stale(study)
    trials = study.get_trials(deepcopy=False)
    mark = retry_mark(study)
    taken = {trial_key(t, spec.space) for t in trials
             if t.state in (TrialState.WAITING, TrialState.RUNNING) or settled(t, mark)}
    by_key = {config_key(c): c for c in spec.space.configurations()}
    # measured by level, a level's run carries its baseline: none is queued on its own
    pending: list[Configuration] = [] if spec.level_batch else [c for c in by_key.values() if c.is_baseline]
    # config_key is written once every parameter is suggested, so it names the whole configuration.
    # A trial failed as stale is queued again by Optuna's callback, once, in the worker whose
    # write failed it: never here as well.
    pending += [by_key[k] for t in trials if t.state == TrialState.FAIL and not settled(t, mark)
                and not t.user_attrs.get("stale") and (k := t.user_attrs.get("config_key")) in by_key]
    out: list[Configuration] = []
    for c in pending:
        if config_key(c) not in taken:
            study.enqueue_trial(spec.space.params(c))
            taken.add(config_key(c))
            out.append(c)
    return out


def progress_counts(study: optuna.Study, spec: SweepSpec) -> tuple[int, int]:
    """(configurations settled or skipped by the model, configurations in the space)."""
    configs = spec.space.configurations()
    done = done_keys(study, spec)
    return sum(1 for c in configs if config_key(c) in done), len(configs)


# --------------------------------------------------------------------------------------
# Dedupe: Lamport's bakery over trial user attrs


def covers(t: FrozenTrial, key: str) -> bool:
    """`t` claims `key`: its own configuration, or one of its level batch's."""
    return t.user_attrs.get("config_key") == key or key in (t.user_attrs.get("batch_tickets") or {})


def ticket_of(t: FrozenTrial, key: str) -> int | None:
    """`t`'s ticket for `key` (None: still choosing)."""
    batch = t.user_attrs.get("batch_tickets") or {}
    if key in batch:
        return int(batch[key])
    return int(t.user_attrs["ticket"]) if "ticket" in t.user_attrs else None


def _choosing(t: FrozenTrial) -> bool:
    """In a doorway: its configuration published and its ticket not yet, or its level batch
    being claimed."""
    return t.state == TrialState.RUNNING and (
        ("config_key" in t.user_attrs and "ticket" not in t.user_attrs) or bool(t.user_attrs.get("batch_choosing")))


def _others(study: optuna.Study, me: Trial) -> list[FrozenTrial]:
    """Every trial of the study but `me`, as stored now."""
    return [t for t in study.get_trials(deepcopy=False) if t.number != me.number]


def _peers(study: optuna.Study, me: Trial, key: str) -> list[FrozenTrial]:
    return [t for t in _others(study, me) if covers(t, key)]


def claim(study: optuna.Study, trial: Trial, key: str) -> FrozenTrial | None:
    """None when this trial is the one to measure `key`; otherwise the settled trial whose
    outcome it reuses (waiting while another worker measures it, or claims it in a level
    batch ahead of this trial)."""
    trial.set_user_attr("config_key", key)  # doorway: "choosing" until the ticket is out
    peers = _peers(study, trial, key)
    ticket = 1 + max((ticket_of(t, key) or 0 for t in peers), default=0)
    trial.set_user_attr("ticket", ticket)
    mine = (ticket, trial.number)
    mark = retry_mark(study)
    while True:
        others = _others(study, trial)
        peers = [t for t in others if covers(t, key)]
        done = sorted((t for t in peers if t.user_attrs.get("config_key") == key and settled(t, mark)),
                      key=lambda t: (t.state != TrialState.COMPLETE, t.number))
        if done:
            return done[0]
        ahead = [t for t in peers if t.state == TrialState.RUNNING
                 and ((tk := ticket_of(t, key)) is None or (tk, t.number) < mine)]
        # a trial claiming its level batch may be claiming this key: wait until it has
        ahead += [t for t in others if t.state == TrialState.RUNNING and t.user_attrs.get("batch_choosing")]
        if not ahead:
            return None
        time.sleep(POLL_S)
        fail_stale(study)


def claim_batch(study: optuna.Study, trial: Trial, keys: list[str]) -> list[str]:
    """The keys of `keys` (the other configurations of this trial's concurrency level) this
    trial measures with its own, in one run (`[budget] batch = "level"`). Called once the
    trial owns its own key (`claim`), so a trial holding batch keys never waits for a key:
    each is claimed with a ticket of its own (the bakery's doorway again, `batch_choosing`)
    and one another trial has settled, or claims with a smaller (ticket, number), is left to
    it. The keys given up are released (a trial waiting for one of them stops waiting)."""
    if not keys:
        return []
    trial.set_user_attr("batch_choosing", True)
    others = _others(study, trial)
    tickets = {k: 1 + max((ticket_of(t, k) or 0 for t in others if covers(t, k)), default=0) for k in keys}
    trial.set_user_attr("batch_tickets", tickets)
    trial.set_user_attr("batch_choosing", False)
    while any(_choosing(t) for t in _others(study, trial)):
        time.sleep(POLL_S)
        fail_stale(study)
    mark = retry_mark(study)
    others = _others(study, trial)
    owned = []
    for k in keys:
        taken = any(t.user_attrs.get("config_key") == k and settled(t, mark) for t in others)
        ahead = any(t.state == TrialState.RUNNING and covers(t, k)
                    and (ticket_of(t, k) or 0, t.number) < (tickets[k], trial.number) for t in others)
        if not (taken or ahead):
            owned.append(k)
    trial.set_user_attr("batch_tickets", {k: tickets[k] for k in owned})
    return owned


# what a trial reusing another's outcome copies from it
_COPIED = ("config_id", "run_id", "run_dir", "host", "summary", "speedups", "feasible",
           "constraint", "baseline_trial", "baseline_summary", "paired", "paired_speedup_x",
           "inconsistent", *HEADLINE, *SPEEDUP_ATTRS)


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


def baseline_of(study: optuna.Study, space: Space, concurrency: int) -> FrozenTrial:
    """The complete baseline trial at `concurrency`, waiting while one is running, or queued
    for up to QUEUED_WAIT_S (a worker between trials takes a queued trial within moments; when
    none does, as when a lost baseline is queued again while every worker waits for it, this
    trial gives way with `RetryLater` so its worker runs the queued baseline next)."""
    base = config_key(configuration(concurrency=concurrency))
    queued_since: float | None = None
    mark = retry_mark(study)
    while True:
        trials = [t for t in study.get_trials(deepcopy=False) if trial_key(t, space) == base]
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
            raise RetryLater(f"no baseline measured at concurrency {concurrency} yet")
        time.sleep(POLL_S)
        fail_stale(study)


def complete_baseline(study: optuna.Study, space: Space, concurrency: int) -> FrozenTrial | None:
    base = config_key(configuration(concurrency=concurrency))
    done = [t for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE and trial_key(t, space) == base]
    return done[0] if done else None
