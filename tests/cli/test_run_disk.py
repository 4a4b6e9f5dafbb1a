"""A disk that fills up or fails during `specbench run`: the run stops with one line naming the
file, the OS's reason and how many samples are safe, and everything journaled reads back.

The faults are injected where the writer meets the OS (the journal file's writes, the fsync
of samples.parquet's temp file), so the test needs neither root nor a small filesystem."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from cli_harness import specbench
from specbench import records
from specbench.records import read_run
from specbench.records import files as record_files

PROMPTS = [{"id": f"p{i}", "prompt": f"Item {i}: a short note about the number {i}."} for i in range(8)]


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def run(tiny_pair, prompts: Path, out: Path):
    return specbench("run", "--target", tiny_pair[0], "--method", "ngram", "-k", "2", "--workload", prompts,
                     "--max-new-tokens", "6", "--warmup", "0", "--dtype", "float32", "--device", "cpu",
                     "--out", out)


class FillingFile:
    """A real file whose disk fills after `batches` journal batches: the next write lands
    only its first 100 bytes (a torn batch), then ENOSPC, as a full filesystem does."""

    def __init__(self, real, batches: int):
        self.real, self.batches, self.flushes, self.room = real, batches, 0, None

    def write(self, data) -> int:
        data = bytes(data)
        if self.room is not None and len(data) > self.room:
            self.real.write(data[:self.room])
            self.real.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.room is not None:
            self.room -= len(data)
        return self.real.write(data)

    def flush(self) -> None:
        self.real.flush()
        self.flushes += 1
        if self.flushes == self.batches:
            self.room = 100

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.fault("records", "ENOSPC while journaling a sample",
                   sees="one line: the journal's path, 'No space left on device', the samples safe",
                   kept="every sample whose journal batch was whole")
def test_a_full_disk_stops_the_run_and_keeps_what_was_journaled(tiny_pair, prompts, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_open = open

    def filling_open(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        return FillingFile(fh, batches=3) if Path(path).name == records.JOURNAL_FILE and "w" in mode else fh

    monkeypatch.setattr(record_files, "open", filling_open, raising=False)
    res = run(tiny_pair, prompts, out)
    msg = " ".join(res.err.split())
    assert res.code == 2 and "Traceback" not in res.output, res.output
    assert len(res.error_lines) == 1, res.err
    assert f"cannot write {out / records.JOURNAL_FILE}: No space left on device (ENOSPC)" in msg
    assert "the run stopped: 3 completed sample(s) are safe in" in msg
    df, meta = read_run(out)  # the torn fourth batch is left out, the three before read back
    assert len(df) == 3 and meta["recovered_from_journal"] == 3
    assert df["output_tokens"].gt(0).all()
    assert (out / records.JOURNAL_FILE).exists()  # the only whole copy stays


@pytest.mark.fault("records", "EIO while writing samples.parquet",
                   sees="one line: samples.parquet's path, 'Input/output error', the samples safe",
                   kept="every completed sample (the journal), no partial Parquet file")
def test_an_io_error_on_the_parquet_file_keeps_the_journal(tiny_pair, prompts, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):  # atomic_write's temp file
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    res = run(tiny_pair, prompts, out)
    msg = " ".join(res.err.split())
    assert res.code == 2 and "Traceback" not in res.output, res.output
    assert len(res.error_lines) == 1, res.err
    assert f"cannot write {out / records.SAMPLES_FILE}: Input/output error (EIO)" in msg
    # Both configurations measured every prompt before the first flush (one concurrency level).
    assert f"the run stopped: {2 * len(PROMPTS)} completed sample(s) are safe in" in msg
    assert not (out / records.SAMPLES_FILE).exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    df, meta = read_run(out)
    assert len(df) == 2 * len(PROMPTS) and meta["recovered_from_journal"] == len(df)
    assert sorted(df["config_id"].unique()) == ["baseline-c1", "ngram-k2-c1"]
    # Paired on read: greedy speculative samples carry their match with the baseline.
    assert df.loc[~df["is_baseline"], "token_match_rate"].notna().all()
