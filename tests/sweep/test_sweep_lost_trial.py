"""A worker's trial that another worker failed as stale (its heartbeats did not get through an
outage) is recognised as lost, whichever way Optuna reports it: as the refusal to tell a
finished trial, or, when the objective itself succeeded, as an internal assertion raised
while that refusal propagates. Any other failure is not taken for a lost trial."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from specbench.sweep.loop import _lost


class Failed(Exception):
    pass


def _optimize(objective) -> BaseException:
    study = optuna.create_study()
    with pytest.raises(BaseException) as info:
        study.optimize(objective, n_trials=1, catch=(Failed,))
    return info.value


def _fail_as_stale(trial: optuna.Trial) -> None:
    """What another worker's stale-trial check does to this trial while it runs."""
    trial.study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def test_a_trial_failed_as_stale_meanwhile_is_lost_whether_its_objective_succeeded_or_not():
    def succeeds(trial):
        _fail_as_stale(trial)
        return 1.0

    def fails(trial):
        _fail_as_stale(trial)
        raise Failed("measurement failed")

    for objective in (succeeds, fails):
        assert _lost(_optimize(objective)), objective.__name__


def test_other_failures_are_not_taken_for_a_lost_trial():
    def asserts(trial):
        assert False, "a bug in the objective"

    def breaks(trial):
        raise ValueError("Cannot tell whether this is lost")

    for objective in (asserts, breaks):
        assert not _lost(_optimize(objective)), objective.__name__
