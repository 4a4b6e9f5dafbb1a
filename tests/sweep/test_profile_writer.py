"""Which worker of a study writes the serving profile (`specbench.sweep.workers`), decided
in-process on one journal file, with the timing each case needs made explicit: the multi-
process tests cannot force two workers to overlap on a loaded machine."""

from __future__ import annotations

import threading
import time

import optuna
import pytest

from specbench.sweep import workers as wk
from specbench.sweep.storage import open_storage


@pytest.fixture
def study_of(tmp_path):
    url = f"journal:{tmp_path / 'study.log'}"
    optuna.create_study(study_name="s", storage=open_storage(url))

    def one() -> optuna.Study:  # each worker its own storage object, like its own process
        return optuna.load_study(study_name="s", storage=open_storage(url))
    return one


def test_first_to_finish_leaves_the_profile_to_the_one_still_measuring(study_of, monkeypatch):
    monkeypatch.setattr(wk, "SETTLE_S", 0.05)
    a, b = wk.Worker(study_of(), grace_s=60, id="a"), wk.Worker(study_of(), grace_s=60, id="b")
    a.register()
    b.register()
    a.finish()
    write, why = a.should_write_profile()
    assert not write and why.startswith("1 other worker(s) still measuring this study") and "pid" in why
    b.finish()
    assert b.should_write_profile() == (True, "")  # a finished moments ago: b's claim stands


def test_a_worker_silent_past_the_grace_period_does_not_hold_the_profile_back(study_of):
    a, gone = wk.Worker(study_of(), grace_s=1, id="a"), wk.Worker(study_of(), grace_s=1, id="gone")
    gone.register()  # then killed between two trials: no running trial vouches for it
    a.register()
    time.sleep(1.2)
    a.finish()
    assert a.others_alive() == []
    assert a.should_write_profile() == (True, "")


def test_a_worker_alone_writes_without_waiting(study_of, monkeypatch):
    monkeypatch.setattr(wk, "SETTLE_S", 30.0)  # a claim would hang the test
    a = wk.Worker(study_of(), grace_s=60, id="a")
    a.register()
    a.finish()
    t0 = time.monotonic()
    assert a.should_write_profile() == (True, "")
    assert time.monotonic() - t0 < 5


def test_two_workers_finishing_together_write_once(study_of, monkeypatch):
    monkeypatch.setattr(wk, "SETTLE_S", 0.5)
    ws = [wk.Worker(study_of(), grace_s=60, id=i) for i in ("a", "b")]
    for w in ws:
        w.register()
    for w in ws:  # both done before either decides: each sees the other finished, not alive
        w.finish()
    decided: dict[str, tuple[bool, str]] = {}
    threads = [threading.Thread(target=lambda w=w: decided.__setitem__(w.id, w.should_write_profile()))
               for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(decided) == ["a", "b"]
    writers = [i for i, (write, _) in decided.items() if write]
    assert len(writers) == 1, decided
    (loser,) = set(decided) - set(writers)
    assert decided[loser][1] == f"the profile is written by worker {writers[0]}, which finished at the same time"
