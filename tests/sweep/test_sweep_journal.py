"""`--storage journal:PATH`: Optuna's journal file, for hosts that share a filesystem but no
database. Two workers on one journal file, checked like the PostgreSQL workers; the journal's
heartbeats (Optuna has none for it; specbench.sweep.storage adds them) fail a silent trial
and queue it again, and only a silent one; the study opens in optuna-dashboard."""

from __future__ import annotations

import time

import optuna
import pytest
from optuna.trial import TrialState

from specbench.sweep.storage import HEARTBEAT_ATTR, fail_stale, open_storage
from workerkit import check_profile_writers, check_study, finish, get_json, start, sweep_args, write_prompts


def test_two_workers_share_one_journal_file(tiny_pair, tmp_path):
    journal = tmp_path / "shared" / "study.log"
    url = f"journal:{journal}"
    args = sweep_args(tiny_pair, write_prompts(tmp_path), url, tmp_path / "study",
                      "--method", "draft_model,ngram", "-k", "2,4", "--concurrency", "1,2",
                      "--max-new-tokens", "6", "--sampler", "random", "--sampler-seed", "3",
                      "--n-trials", "3")
    t0 = time.perf_counter()
    workers = [start(args, tmp_path) for _ in range(2)]
    results = finish(workers)
    wall = time.perf_counter() - t0
    for rc, out, err in results:
        assert rc == 0, err
        assert "Traceback" not in out + err
    study = optuna.load_study(study_name="shared", storage=open_storage(url))
    trials = check_study(study, tmp_path / "study", concurrency=(1, 2))
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    overlapped = check_profile_writers(study, workers, results, tmp_path / "study" / "profile.yaml")
    measured = [t for t in trials if "duplicate_of" not in t.user_attrs]
    print(f"\ntwo journal-file workers: {len(trials)} trials, {len(measured)} measured, "
          f"{len(trials) - len(measured)} reused, duplicates measured 0, wall {wall:.1f} s, "
          f"{'overlapping' if overlapped else 'one after the other'}")

    dashboard = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")
    app = dashboard.wsgi(str(journal))  # `optuna-dashboard PATH` reads a journal file so
    (summary,) = get_json(app, "/api/studies")["study_summaries"]
    detail = get_json(app, f"/api/studies/{summary['study_id']}")
    assert len(detail["trials"]) == 6
    assert {"run_id", "run_dir", "host", "tpot_p50_ms"} <= {a["key"] for a in detail["union_user_attrs"]}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_journal_heartbeat_fails_only_a_silent_trial_and_queues_it_again(tmp_path):
    url = f"journal:{tmp_path / 'hb.log'}"
    storage = open_storage(url, heartbeat_interval=1, grace_period=5)
    study = optuna.create_study(study_name="hb", storage=storage)
    silent, alive = study.ask(), study.ask()
    for trial in (silent, alive):
        trial.suggest_int("k", 1, 8)
    # both were started by another process (a fresh storage object: not its own trials)
    other = open_storage(url, heartbeat_interval=1, grace_period=5)
    other_study = optuna.load_study(study_name="hb", storage=other)
    storage.inner.set_trial_system_attr(silent._trial_id, HEARTBEAT_ATTR, time.time() - 60)
    storage.inner.set_trial_system_attr(alive._trial_id, HEARTBEAT_ATTR, time.time())
    fail_stale(other_study)
    states = {t.number: t.state for t in other_study.trials}
    assert states[silent.number] == TrialState.FAIL and states[alive.number] == TrialState.RUNNING
    (queued,) = [t for t in other_study.trials if t.state == TrialState.WAITING]
    assert queued.params == {"k": silent.params["k"]}
    assert queued.system_attrs["failed_trial"] == silent.number

    # a process never fails its own running trials, even when its heartbeat is late
    storage.record_heartbeat(alive._trial_id)
    storage.inner.set_trial_system_attr(alive._trial_id, HEARTBEAT_ATTR, time.time() - 60)
    fail_stale(study)
    assert study.trials[alive.number].state == TrialState.RUNNING
    fail_stale(other_study)  # but another one does
    assert other_study.trials[alive.number].state == TrialState.FAIL
