"""One writer per output (specbench.records.lock): a second writer of a directory is refused in
one line naming it and the holder's pid, workers of one study share theirs, a killed holder
never leaves it locked, and the last holder cleans up what it made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from specbench.errors import RecordsError
from specbench.records import RunMetadata, RunWriter
from specbench.records.lock import LOCK_FILE, OutLock

HOLD = """
import sys, time
from pathlib import Path
from specbench.records.lock import OutLock
lock = OutLock(Path(sys.argv[1]), owner=sys.argv[2] or None)
print("held", flush=True)
time.sleep(60)
"""


def hold(directory, owner: str = "") -> subprocess.Popen:
    """Another process holding the lock (until killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), owner], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_directory_and_the_holder(tmp_path):
    out = tmp_path / "run"
    holder = hold(out)
    try:
        with pytest.raises(RecordsError) as exc:
            OutLock(out)
        message = str(exc.value)
        assert "\n" not in message
        assert str(out) in message and f"pid {holder.pid}" in message and "being written" in message
        # a writer that would overwrite is refused the same way, before it reads or removes anything
        (out / "samples.parquet").write_text("theirs")
        with pytest.raises(RecordsError, match="being written by another process"):
            RunWriter(out, RunMetadata.collect("r", {}), overwrite=True, lock=True)
        assert (out / "samples.parquet").read_text() == "theirs"
    finally:
        holder.kill()
        holder.wait()


def test_workers_of_one_study_share_and_another_study_is_refused(tmp_path):
    out = tmp_path / "study"
    holder = hold(out, "study a")
    try:
        with OutLock(out, owner="study a") as mine:  # a second worker of the same study joins
            pids = json.loads((out / LOCK_FILE).read_text())["pids"]
            assert sorted(pids) == sorted([holder.pid, os.getpid()])
            with pytest.raises(RecordsError, match=rf"pid {holder.pid}, {os.getpid()}, study a\)"):
                OutLock(out, owner="study b")
            with pytest.raises(RecordsError, match="being written"):
                OutLock(out)  # nor may a run write into a study's directory
        assert mine._fd is None
        assert json.loads((out / LOCK_FILE).read_text())["pids"] == [holder.pid]  # still held by the first
        with pytest.raises(RecordsError, match="study a"):
            OutLock(out, owner="study b")
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_nothing_locked(tmp_path):
    out = tmp_path / "run"
    holder = hold(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (out / LOCK_FILE).exists()  # what it left: a member file that means nothing now
    with OutLock(out) as lock:
        assert json.loads((out / LOCK_FILE).read_text())["pids"] == [os.getpid()]
        assert not lock.created
    assert not (out / LOCK_FILE).exists() and out.is_dir()  # it was there before: kept


def test_the_last_holder_removes_what_its_taking_made(tmp_path):
    out = tmp_path / "a" / "run"
    with OutLock(out):
        assert out.is_dir()
    assert not out.exists()  # made by the lock, nothing written: gone
    with OutLock(out):
        (out / "samples.parquet").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["samples.parquet"]  # records stay, the lock goes


def test_a_locked_run_writer_sees_its_own_lock_as_an_empty_directory(tmp_path):
    out = tmp_path / "run"
    writer = RunWriter(out, RunMetadata.collect("r", {}), lock=True)
    assert (out / LOCK_FILE).exists()
    with pytest.raises(RecordsError, match="being written"):
        RunWriter(out, RunMetadata.collect("r2", {}), lock=True)
    writer.abandon()  # nothing measured: the directory it made goes, lock and all
    assert not out.exists()


def test_a_report_file_has_one_writer(tmp_path):
    target = tmp_path / "reports" / "r.html"
    with OutLock(target.parent, name=f".{target.name}.lock", label=target):
        with pytest.raises(RecordsError, match=f"--out {target} is being written"):
            OutLock(target.parent, name=f".{target.name}.lock", label=target)
        OutLock(target.parent, name=".other.html.lock").release()  # another report beside it is free
    assert not target.parent.exists()  # made for the report, nothing written: gone


def test_racing_writers_one_wins(tmp_path):
    """Eight processes take the same new directory's lock at once: exactly one gets it."""
    out = tmp_path / "race"
    code = ("import sys, time\nfrom pathlib import Path\nfrom specbench.records.lock import OutLock\n"
            "from specbench.errors import RecordsError\n"
            "t = float(sys.argv[2])\n"
            "while time.time() < t: pass\n"
            "try:\n    lock = OutLock(Path(sys.argv[1]))\nexcept RecordsError:\n    sys.exit(3)\n"
            "time.sleep(2)\n")
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", code, str(out), str(start)]) for _ in range(8)]
    codes = sorted(p.wait(timeout=60) for p in procs)
    assert codes == [0] + [3] * 7
