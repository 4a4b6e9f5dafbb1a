"""Sweep workers sharing one study on a real PostgreSQL server (a throwaway cluster on
127.0.0.1, see tests/pgcluster.py; skipped with the reason where none can be started).

- three `specbench sweep` processes at once: the trial count is reached exactly, no
  configuration is measured twice, the baseline exists at every concurrency, every trial's
  run directory exists and its Parquet agrees with the stored value, the profile is written
  once (by the last worker), the study opens in optuna-dashboard;
- a worker with a different search space is refused in one line;
- the database going away mid-sweep: the outage is waited out (retried calls) by workers that
  wait long enough, a worker that waits less stops with a one-line error, and the trial it
  had in flight is measured by another; a worker killed with SIGKILL mid-trial: its trial is
  measured, once, by another worker after the heartbeat grace period; the study finishes.
"""

from __future__ import annotations

import signal
import time

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from specbench.errors import StorageError
from specbench.sweep.storage import open_storage
from specbench.sweep.workers import PROFILE_ATTR
from workerkit import check_profile_writers, check_study, finish, get_json, start, sweep_args, write_prompts

SPACE = ["--method", "draft_model,ngram", "-k", "2,4", "--concurrency", "1,2"]
# long enough trials (8 prompts x 120 tokens under the configuration and as many under the
# baseline measured with it, a few seconds) that a kill or an outage lands inside one, and that
# workers starting a little apart all get to work
LONG_PROMPTS = [{"id": f"p{i}", "prompt": f"Item {i}: abc abc abc abc abc"} for i in range(8)]
LONG = ["--max-new-tokens", "120", "--ignore-eos", "--method", "ngram", "-k", "2..6",
        "--concurrency", "1", "--sampler", "grid", "--batch", "trial"]


def _load(url: str, name: str = "shared") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url))


def _running(study: optuna.Study, pid: int) -> list[optuna.trial.FrozenTrial]:
    """Running trials of the worker with this pid, past choosing their configuration."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if f":{pid}:" in t.user_attrs.get("worker", "") and "ticket" in t.user_attrs]


def _wait_until_all_run(url: str, workers: list, timeout: float = 180) -> optuna.Study:
    """Wait until each of these worker processes is inside a trial at the same moment."""
    storage, deadline, seen = None, time.monotonic() + timeout, set()
    while time.monotonic() < deadline:
        for w in workers:
            assert w.poll() is None, f"worker {w.pid} exited ({w.returncode}): {w.stderr.read()[-2000:]}"
        try:
            storage = storage or open_storage(url)
            study = optuna.load_study(study_name="shared", storage=storage)
        except KeyError:  # not created yet
            time.sleep(0.1)
            continue
        inside = [w.pid for w in workers if _running(study, w.pid)]
        seen.update(inside)
        if len(inside) == len(workers):
            return study
        time.sleep(0.05)
    raise AssertionError(f"workers {[w.pid for w in workers]} were never all inside a trial at "
                         f"once within {timeout} s (seen inside one: {sorted(seen)})")


@pytest.fixture(scope="module")
def three_workers(postgres, tiny_pair, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pg3")
    url = postgres.new_database()
    args = sweep_args(tiny_pair, write_prompts(tmp), url, tmp / "study", *SPACE,
                      "--max-new-tokens", "6", "--sampler", "random", "--sampler-seed", "7",
                      "--n-trials", "4")
    t0 = time.perf_counter()
    workers = [start(args, tmp) for _ in range(3)]
    results = finish(workers)
    wall = time.perf_counter() - t0
    return url, tmp, results, wall, workers


def test_three_workers_share_one_postgres_study(three_workers):
    url, tmp, results, wall, workers = three_workers
    for rc, out, err in results:
        assert rc == 0, err
        assert "Traceback" not in out + err
    trials = check_study(_load(url), tmp / "study", concurrency=(1, 2))
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETE for t in trials)  # 3 x 4
    assert len({t.user_attrs["worker"] for t in trials}) == 3
    measured = [t for t in trials if "duplicate_of" not in t.user_attrs]

    # the profile: written by the last worker to finish (only by it, where they overlapped), from all 12 trials
    overlapped = check_profile_writers(_load(url), workers, results, tmp / "study" / "profile.yaml")
    profile = yaml.safe_load((tmp / "study" / "profile.yaml").read_text())
    assert profile["study"]["trials"] == 12 and profile["study"]["measured"] == len(measured)
    assert _load(url).user_attrs[PROFILE_ATTR]["trials"] == 12
    print(f"\nthree PostgreSQL workers: {len(trials)} trials, {len(measured)} measured, "
          f"{len(trials) - len(measured)} reused, duplicates measured 0, wall {wall:.1f} s, "
          f"{'overlapping' if overlapped else 'not all overlapping'}")


def test_worker_with_another_search_space_is_refused_in_one_line(three_workers, tiny_pair):
    url, tmp, _, _, _ = three_workers
    args = sweep_args(tiny_pair, tmp / "prompts.jsonl", url, tmp / "study",
                      *[("2,8" if a == "2,4" else a) for a in SPACE], "--max-new-tokens", "6",
                      "--sampler", "random", "--sampler-seed", "7", "--n-trials", "4")
    (rc, out, err), = finish([start(args, tmp)], timeout=120)
    assert rc == 2 and "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "different search space" in lines[0], err
    assert "space.num_speculative_tokens: [2, 4] in the study, [2, 8] here" in lines[0]
    assert len(_load(url).trials) == 12  # nothing added


def test_study_opens_in_optuna_dashboard(three_workers):
    dashboard = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")
    url, tmp, _, _, _ = three_workers
    app = dashboard.wsgi(url)  # the dashboard's own reading of the storage URL
    studies = get_json(app, "/api/studies")["study_summaries"]
    (summary,) = [s for s in studies if s["study_name"] == "shared"]
    detail = get_json(app, f"/api/studies/{summary['study_id']}")
    assert detail["objective_names"] == ["speedup_tpot_p50_x"]  # named, with its unit
    assert len(detail["trials"]) == 12
    columns = {a["key"]: a["sortable"] for a in detail["union_user_attrs"]}
    for key in ("tpot_p50_ms", "output_tok_per_s", "speedup_tpot_p50_x", "peak_memory_gib"):
        assert columns.get(key) is True, (key, columns)  # numbers: sortable table columns
    for key in ("run_id", "run_dir", "host", "worker"):
        assert key in columns
    study = _load(url)
    for t in detail["trials"]:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        assert attrs["run_id"] == study.trials[t["number"]].user_attrs["run_id"]
        assert (tmp / "study" / attrs["run_dir"] / "samples.parquet").is_file()


def test_storage_call_gives_one_line_error_when_the_database_stays_away(postgres):
    url = postgres.new_database()
    study = optuna.create_study(study_name="gone", storage=open_storage(url, retry_s=1))
    postgres.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageError) as info:
            study.set_user_attr("x", 1)
        assert time.monotonic() - t0 >= 1
    finally:
        postgres.resume()
    message = str(info.value)
    assert "\n" not in message and "gave no answer for 1 s" in message and "OperationalError" in message
    study.set_user_attr("x", 2)  # the same storage object works again once the server is back
    assert optuna.load_study(study_name="gone", storage=open_storage(url)).user_attrs["x"] == 2


def test_killed_worker_and_database_outage_lose_no_trial(postgres, tiny_pair, tmp_path):
    """Three workers on one study (grid over 6 configurations, 1 s heartbeat, 3 s grace).
    1. The database goes away while all three are inside a trial: the worker that waits 2 s
       (--storage-retry 2) stops with a one-line error, exit 2; the two that wait 60 s carry on
       once it is back.
    2. One of those two is killed with SIGKILL mid-trial.
    The last worker measures what the other two had in flight, each once, after the grace
    period, and finishes the study."""
    url = postgres.new_database()
    prompts = write_prompts(tmp_path, LONG_PROMPTS)
    common = [*LONG, "--heartbeat-interval", "1", "--grace-period", "3"]
    brief, victim, survivor = (
        start(sweep_args(tiny_pair, prompts, url, tmp_path / "study", *common,
                         "--storage-retry", str(retry)), tmp_path) for retry in (2, 60, 60))

    # 1. outage
    study = _wait_until_all_run(url, [brief, victim, survivor])
    (in_flight,) = _running(study, brief.pid)
    postgres.pause()
    try:
        (rc, out, err), = finish([brief], timeout=120)
        time.sleep(1)  # the patient workers have waited as long as the brief one, and more
    finally:
        postgres.resume()
    assert rc == 2 and "Traceback" not in out + err, err
    error = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and "gave no answer for 2 s" in error[0], err

    # 2. SIGKILL, once the grace period after the outage has passed (within it nobody's
    #    trial counts as stale: no heartbeat could get through), so the kill is timed alone
    time.sleep(3)
    study = _wait_until_all_run(url, [victim, survivor])
    victim.send_signal(signal.SIGKILL)
    killed_at = time.time()
    victim.communicate(timeout=30)
    lost = _running(study, victim.pid)  # what it had in flight, still "running" in the study
    (rc, out, err), = finish([survivor], timeout=240)
    assert lost, "the victim finished its trial just before the kill; nothing was in flight"
    (lost,) = lost
    assert rc == 0, err
    assert "Traceback" not in out + err
    assert "unreachable" in err and "answers again after" in err  # the outage, waited out

    study = _load(url)
    # a worker stopped after measuring but before recording leaves a run directory no trial
    # links to: the brief worker's trial in flight, the victim's if it was killed then, and a
    # live worker's trial failed as stale because its heartbeats did not get through the
    # outage within the grace period (it notices, and the trial is measured again)
    stale = {t.number for t in study.trials if t.state == TrialState.FAIL
             and str(t.user_attrs.get("fail_reason", "")).startswith("worker lost")}
    assert {in_flight.number, lost.number} <= stale
    trials = check_study(study, tmp_path / "study", concurrency=(1,), n_prompts=len(LONG_PROMPTS),
                         unrecorded=stale)
    complete = {t.user_attrs["config_key"] for t in trials if t.state == TrialState.COMPLETE}
    assert len(complete) == 6  # every configuration measured, each once (check_study)
    retried = {}
    for gone in (in_flight, lost):
        assert trials[gone.number].state == TrialState.FAIL
        # lost, not a failure of its configuration: named as such
        assert trials[gone.number].user_attrs["fail_reason"].startswith("worker lost: no heartbeat")
        # the trial queued again for it (Optuna's retry history ends with the lost trial; a
        # trial lost twice, as when the victim was killed running a retry, keeps the first
        # number in `failed_trial`)
        retries = [t for t in trials if t.system_attrs.get("retry_history", [])[-1:] == [gone.number]]
        assert len(retries) == 1, (gone.number, [(t.number, t.state.name, t.system_attrs) for t in trials])
        (retry,) = retries
        assert retry.params == gone.params and gone.user_attrs["config_key"] in complete
        retried[gone.number] = retry
    retry = retried[lost.number]
    assert retry.state == TrialState.COMPLETE
    started = retry.datetime_start.timestamp()
    assert started - killed_at >= 3 - 1  # not before the grace period (1 s heartbeat slack)
    assert f":{survivor.pid}:" in retry.user_attrs["worker"]
    if "duplicate_of" in retry.user_attrs:
        # The victim's trial was a second trial of a configuration another trial was measuring
        # (the grid hands a running point out again once every point is taken; the second one
        # waits for the first): the retry takes that measurement instead of repeating it.
        source = trials[retry.user_attrs["duplicate_of"]]
        assert source.state == TrialState.COMPLETE and "duplicate_of" not in source.user_attrs
        assert source.user_attrs["config_key"] == lost.user_attrs["config_key"]
        how = f"took trial {source.number}'s measurement of the same configuration"
    else:
        how = f"measured in {(retry.datetime_complete - retry.datetime_start).total_seconds():.1f} s, once"
    assert "profile: " + str(tmp_path / "study" / "profile.yaml") in out
    print(f"\nSIGKILL mid-trial: trial {lost.number} ({lost.user_attrs['config_key']}) queued again "
          f"as trial {retry.number}, started {started - killed_at:.1f} s after the kill "
          f"(grace 3 s), {how}; outage: trial {in_flight.number} of the worker that gave up measured "
          f"again as trial {retried[in_flight.number].number}; study finished with {len(trials)} trials, "
          "none left running or queued")
