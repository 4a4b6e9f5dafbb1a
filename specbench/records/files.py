"""Run files: `atomic_write`, `RunWriter` (journal per sample, samples.parquet and run.json
rewritten atomically on flush) and `read_run`, which also recovers a run from its journal.

Boundary: bytes on disk for the schema (`records.schema`) and metadata (`records.metadata`).
Longer than 400 lines because the journal, the spill files and the atomic rewrite are one
durability mechanism: `read_run` recovers exactly what `RunWriter` leaves behind.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from specbench.atomic import _chmod_umask, atomic_write
from specbench.errors import RecordsError
from specbench.metrics import match_fields
from specbench.records.lock import LOCK_FILE, OutLock
from specbench.records.metadata import RunMetadata, _utc_now
from specbench.records.schema import (
    _REQUIRED_NON_NULL,
    COLUMNS,
    JOURNAL_FILE,
    METADATA_KEY,
    RUN_FILE,
    SAMPLES_FILE,
    SCHEMA,
    added_since,
)

if TYPE_CHECKING:
    import pandas as pd

# --------------------------------------------------------------------------------------
# Pairing

UNPAIRED_KEY = b"specbench_unpaired"  # journal batch metadata: samples still to be paired


def pair_with_baseline(table: pa.Table, rows: Iterable[int]) -> pa.Table:
    """Fill the match fields of `rows`: speculative samples written before their baseline
    completed (`RunWriter.add(..., unpaired=True)`).

    A greedy (or regression) speculative sample is compared with the first successful
    baseline sample of the same prompt and repeat in the run. The runner writes a sample the
    moment it completes, so when interleaving ran the speculative configuration first, its
    row reaches the journal with null `token_match_rate`/`first_divergence`, marked unpaired;
    the pairing is done here, on the way to samples.parquet and when a killed run is
    recovered. A row whose baseline never succeeded stays unmatched, and so does a replayed
    conversation's turn whose earlier turn already differed from the baseline's (its prompt holds
    another answer: the two outputs answer different prompts)."""
    todo = sorted(set(rows))
    if table.num_rows == 0 or not todo:
        return table
    names = ["is_baseline", "error", "prompt_id", "repeat"]
    extra = ["config_id", "conversation_id", "turn"]
    turns = all(c in table.column_names for c in extra)
    cols = table.select(names + (extra if turns else [])).to_pydict()
    outputs = table.column("output_token_ids")
    reference: dict[tuple[str, int], int] = {}
    for i in range(table.num_rows):
        if cols["is_baseline"][i] and cols["error"][i] is None:
            reference.setdefault((cols["prompt_id"][i], cols["repeat"][i]), i)
    rate = table.column("token_match_rate").to_pylist()
    first = table.column("first_divergence").to_pylist()
    turn_of = {}
    if turns:
        turn_of = {(cols["config_id"][i], cols["conversation_id"][i], cols["turn"][i], cols["repeat"][i]): i
                   for i in range(table.num_rows) if cols["turn"][i] is not None}
        todo.sort(key=lambda i: cols["turn"][i] or 0)  # a turn's pairing reads the turn before's
    changed = False
    for i in todo:
        ref = reference.get((cols["prompt_id"][i], cols["repeat"][i]))
        if ref is not None and turns and (cols["turn"][i] or 1) > 1:
            before = turn_of.get((cols["config_id"][i], cols["conversation_id"][i], cols["turn"][i] - 1,
                                  cols["repeat"][i]))
            if before is None or first[before] != -1:
                ref = None  # the history diverged (or is unknown): another prompt than the baseline's
        if ref is not None:
            rate[i], first[i] = match_fields(outputs[i].as_py(), outputs[ref].as_py())
            changed = True
    if not changed:
        return table
    for name, values in (("token_match_rate", rate), ("first_divergence", first)):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type))
    return table


# --------------------------------------------------------------------------------------
# Writing


class RunWriter:
    """Writes a run directory: every sample durable as it completes, the Parquet file atomic.

    `add()` appends each row to an Arrow IPC journal (`.samples.journal.arrows`, carrying the
    run metadata in its schema) and hands it to the OS at once, so a run killed with SIGKILL
    keeps every sample that had completed; the journal is fsynced at most a second after a
    row. `flush()` (after each configuration) rewrites `samples.parquet` and `run.json`
    atomically with every row so far. Rows for that are held in memory only until
    `SPILL_ROWS` have gathered; then they go as one table to a hidden spill file in the run
    directory, memory-mapped when a flush reads it, so a run of any length holds a bounded
    number of rows; `close(complete=...)` writes them a last time with the
    run's status and removes the journal. `read_run` recovers a run whose writer never
    closed (status `killed`) from its journal.

    The directory is created and probed for writability up front, before any model loads.
    With `overwrite`, the previous records stay until the first flush that has rows replaces
    them atomically. Files get the process umask's permissions, like any other output.
    """

    def __init__(self, run_dir: Path, metadata: RunMetadata, overwrite: bool = False, *, lock: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.metadata = metadata
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise RecordsError(f"run directory {self.run_dir} exists and is not a directory")
        # one writer per directory (specbench.records.lock): a second one is refused here,
        # before it reads or removes anything, whatever --overwrite says
        self._lock = OutLock(self.run_dir) if lock else None
        self.previous_rows = 0  # rows of the run being overwritten, still on disk until the first flush
        if self.run_dir.is_dir() and any(p.name != LOCK_FILE for p in self.run_dir.iterdir()):
            if not overwrite:
                self._release_lock()
                raise RecordsError(
                    f"run directory {self.run_dir} already exists and is not empty; "
                    "pass --overwrite to replace it or choose another --out"
                )
            try:
                self.previous_rows = pq.ParquetFile(self.samples_path).metadata.num_rows
            except (OSError, pa.ArrowException):
                self.previous_rows = 0
            for stale in self.run_dir.glob(f"{_SPILL_PREFIX}*"):  # a killed writer's, never records
                stale.unlink(missing_ok=True)
        self._created = not self.run_dir.exists() or (self._lock is not None and self._lock.created)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.run_dir, prefix=".write-probe-")
            os.close(fd)
            os.unlink(probe)
            if self._created and self._lock is None:
                # Made again with the first sample: a process killed before it (a sweep
                # worker SIGKILLed while its server starts) leaves no empty run directory.
                # (A locked directory is removed by the lock's release, if still empty.)
                self.run_dir.rmdir()
        except OSError as exc:
            self._release_lock()
            raise RecordsError(f"--out {self.run_dir}: cannot write there ({exc.strerror or exc})") from None
        self.metadata.status = "running"
        self.metadata.pid = os.getpid()
        self._tables: list[pa.Table] = []  # rows not spilled yet
        self._held = 0  # rows in _tables
        self._spills: list[Path] = []  # the rows before them, in order, SPILL_ROWS or more per file
        self._rows = 0  # every row added (summing tables per sample would be quadratic in the run)
        self._closed = False
        self._journal: Any = None
        self._journal_file: Any = None
        self._synced_at = 0.0
        self._journaled = 0  # rows whose journal batch was handed to the OS whole
        self._unpaired: set[int] = set()  # row numbers still to be paired with their baseline
        self._failed: OSError | None = None  # the disk refused a write: nothing more is written

    @property
    def samples_path(self) -> Path:
        return self.run_dir / SAMPLES_FILE

    @property
    def journal_path(self) -> Path:
        return self.run_dir / JOURNAL_FILE

    @property
    def num_rows(self) -> int:
        return self._rows

    def add(self, rows: list[dict[str, Any]], unpaired: bool = False) -> None:
        """Validate rows (dicts keyed by `COLUMNS`) and append them to the journal now; they
        reach samples.parquet on the next flush. `unpaired`: speculative samples whose
        baseline has not completed yet; their match fields are filled from it on flush and
        on recovery (`pair_with_baseline`)."""
        if not rows:
            return
        for i, row in enumerate(rows):
            if row.keys() != _COLUMN_SET:  # one set comparison: this runs for every sample
                missing = [c for c in COLUMNS if c not in row]
                unknown = [c for c in row if c not in _COLUMN_SET]
                raise ValueError(f"row {i}: missing columns {missing}, unknown columns {unknown}")
            nulls = [c for c in _REQUIRED_NON_NULL if row[c] is None]
            if nulls:
                raise ValueError(f"row {i}: null in non-nullable columns {sorted(nulls)}")
        # Converting now surfaces a type error at the row that caused it, not at flush time.
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        if self._failed is not None:
            raise self._disk_error(self.journal_path, self._failed)
        first = self.num_rows
        self._tables.append(table)
        self._held += table.num_rows
        self._rows += table.num_rows
        # A table of one row costs ~60 KiB (a buffer or more per column), ~50x its data: runs of
        # tens of thousands of samples grew by gigabytes. Neighbours are merged as in a binary
        # counter (sizes kept decreasing), so a run holds O(log n) tables and copies each row
        # O(log n) times.
        while len(self._tables) > 1 and self._tables[-2].num_rows <= self._tables[-1].num_rows:
            last = self._tables.pop()
            self._tables[-1] = pa.concat_tables([self._tables[-1], last]).combine_chunks()
        if unpaired:
            self._unpaired.update(range(first, first + table.num_rows))
        try:
            self._journal_append(table, unpaired)
        except OSError as exc:
            self._failed = exc
            raise self._disk_error(self.journal_path, exc) from None
        self._journaled += table.num_rows
        if self._held >= SPILL_ROWS:
            self._spill()

    def _spill(self) -> None:
        """The rows held in memory, to one spill file (Arrow IPC, read back memory-mapped)."""
        path = self.run_dir / f"{_SPILL_PREFIX}{len(self._spills):05d}.arrows"
        table = pa.concat_tables(self._tables).combine_chunks()
        try:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as out:
                out.write_table(table)
        except (OSError, pa.ArrowException) as exc:
            path.unlink(missing_ok=True)
            self._failed = exc if isinstance(exc, OSError) else OSError(str(exc))
            raise self._disk_error(path, self._failed) from None
        self._spills.append(path)
        self._tables, self._held = [], 0

    def _parts(self) -> list[Any]:
        """Every row added, in order, as parts to read one at a time: each spill file's
        (memory-mapped when called) and the table of rows held."""
        parts: list[Any] = [lambda p=p: pa.ipc.open_file(pa.memory_map(str(p))).read_all() for p in self._spills]
        if self._tables:
            held = pa.concat_tables(self._tables)
            parts.append(lambda: held)
        return parts

    def _write_samples(self, fh: Any, schema: pa.Schema) -> None:
        """samples.parquet, one part at a time, so the write holds one spill's pages at once,
        not the run's: the match fields of unpaired rows are settled first, from the columns
        pairing reads, then each part is written with them as row groups of its own."""
        parts = self._parts()
        fixed: dict[str, pa.ChunkedArray] = {}
        if self._unpaired:
            keys = ["is_baseline", "error", "prompt_id", "repeat", "output_token_ids",
                    "token_match_rate", "first_divergence", "config_id", "conversation_id", "turn"]
            paired = pair_with_baseline(pa.concat_tables([part().select(keys) for part in parts]), self._unpaired)
            fixed = {name: paired.column(name) for name in ("token_match_rate", "first_divergence")}
            del paired
        with pq.ParquetWriter(fh, schema) as out:
            start = 0
            for part in parts:
                table = part()
                for name, column in fixed.items():
                    index = table.schema.get_field_index(name)
                    table = table.set_column(index, table.schema.field(index), column.slice(start, table.num_rows))
                out.write_table(table.replace_schema_metadata(schema.metadata))
                start += table.num_rows
                del table

    def _remove_spills(self) -> None:
        for path in self._spills:
            path.unlink(missing_ok=True)
        self._spills = []

    def _disk_error(self, path: Path, exc: OSError) -> RecordsError:
        """The one line a full or failing disk gets: the file, the OS's reason, and how many
        samples are safe (the journal's complete batches, which `read_run` recovers)."""
        import errno

        reason = exc.strerror or str(exc)
        code = errno.errorcode.get(exc.errno or 0)
        where = self.journal_path if self._journaled else None
        safe = (f"{self._journaled} completed sample(s) are safe in {where} (specbench report and read_run "
                "recover them)") if where else "no sample had been written yet"
        return RecordsError(f"cannot write {path}: {reason}{f' ({code})' if code else ''}; the run stopped: {safe}")

    def _journal_append(self, table: pa.Table, unpaired: bool = False) -> None:
        staged = None
        if self._journal is None:
            if self.run_dir.is_dir():
                self._open_journal(self.journal_path)
            else:
                # The directory appears whole, with its first samples: the journal is written in a
                # hidden sibling and renamed into place, so a process killed before that leaves no
                # run directory a reader would trip on (only the sibling, which the next writer
                # of that parent removes once its process is gone).
                self.run_dir.parent.mkdir(parents=True, exist_ok=True)
                _remove_dead_staging(self.run_dir.parent)
                staged = Path(tempfile.mkdtemp(dir=self.run_dir.parent,
                                               prefix=f"{_STAGING_PREFIX}{os.getpid()}-{self.run_dir.name}-"))
                self._open_journal(staged / JOURNAL_FILE)
        for batch in table.to_batches():
            self._journal.write_batch(batch, custom_metadata={UNPAIRED_KEY: b"1"} if unpaired else None)
        self._journal_file.flush()  # in the OS now: a killed process loses nothing
        if staged is not None:
            _chmod_umask(staged, directory=True)
            os.rename(staged, self.run_dir)
        now = time.monotonic()
        if now - self._synced_at >= 1.0:  # on disk within about a second, even if the machine dies
            os.fsync(self._journal_file.fileno())
            self._synced_at = now

    def _open_journal(self, path: Path) -> None:
        self._journal_file = open(path, "wb")
        _chmod_umask(path)
        self._journal = pa.ipc.new_stream(self._journal_file, self._schema_with_metadata())

    def _schema_with_metadata(self) -> pa.Schema:
        payload = json.dumps(self.metadata.to_dict(), sort_keys=True).encode()
        return SCHEMA.with_metadata({METADATA_KEY: payload})

    def flush(self) -> None:
        """Write `samples.parquet` and `run.json` with every row added so far."""
        if self._failed is not None:
            return  # the disk refused the journal: what it holds whole is what is kept
        if not self._rows and self.samples_path.exists():
            return  # no new rows yet: keep the records being overwritten until there are
        schema = self._schema_with_metadata()
        text = json.dumps(self.metadata.to_dict(), indent=2, sort_keys=True) + "\n"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._failed = exc
            raise self._disk_error(self.run_dir, exc) from None
        for path, write in ((self.samples_path, lambda fh: self._write_samples(fh, schema)),
                            (self.run_dir / RUN_FILE, lambda fh: fh.write(text.encode()))):
            try:
                atomic_write(path, write)
            except OSError as exc:  # the journal still holds every sample: it stays
                self._failed = exc
                raise self._disk_error(path, exc) from None

    def close(self, complete: bool) -> None:
        """Record whether the run completed or was interrupted, write everything, drop the
        journal. A run closed before its first sample leaves the directory as it was (and
        removes it if this writer created it)."""
        self.metadata.status = "complete" if complete else "interrupted"
        self.metadata.finished_at = _utc_now()
        if self._failed is not None:  # keep the journal: it is the only whole copy
            self._release_journal()
            self._remove_spills()
            self._release_lock()
            self._closed = True
            return
        if self._rows or complete:
            self.flush()
        self._remove_spills()
        if self._journal is not None:
            self._journal.close()
            self._journal_file.close()
            self._journal = None
        self.journal_path.unlink(missing_ok=True)
        self._remove_if_empty()
        self._closed = True

    def _remove_if_empty(self) -> None:
        """The directory this writer made goes when nothing was written to it; the lock
        goes in any case (its release removes a directory it made, still empty)."""
        if self._created and self._lock is None and self.run_dir.is_dir() and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def _release_journal(self) -> None:
        try:
            if self._journal is not None:
                self._journal.close()
        except (OSError, pa.ArrowException):
            pass
        try:
            if self._journal_file is not None:
                self._journal_file.close()
        except OSError:
            pass
        self._journal = self._journal_file = None

    def abandon(self) -> None:
        """Nothing was measured (setup failed): leave the directory as it was found."""
        if self._rows:
            raise RuntimeError("abandon() after samples were added; close() instead")
        if self._journal is not None:
            self._journal.close()
            self._journal_file.close()
            self._journal = None
        self.journal_path.unlink(missing_ok=True)
        self._remove_if_empty()
        self._closed = True

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._closed:
            self.close(complete=exc_type is None)


_STAGING_PREFIX = ".staging-"
_SPILL_PREFIX = ".samples.spill-"
SPILL_ROWS = 2048  # rows a writer holds in memory at most (~3 KiB each, compacted) before it spills them
_COLUMN_SET = frozenset(COLUMNS)


def _remove_dead_staging(parent: Path) -> None:
    """Remove the staging directories (`.staging-<pid>-<run>-*`) of writers whose process is gone:
    they were killed before their first sample, so they hold nothing a reader could use."""
    import shutil

    for entry in parent.glob(f"{_STAGING_PREFIX}*"):
        pid = entry.name[len(_STAGING_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its writer is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # someone else's live process
        shutil.rmtree(entry, ignore_errors=True)


def _read_journal(path: Path, unpaired: set[int] | None = None) -> tuple[pa.Table | None, dict[str, Any] | None]:
    """Every complete batch of a journal (a killed writer may have left a torn last one);
    the row numbers of batches marked unpaired are added to `unpaired`."""
    batches, schema, rows = [], None, 0
    try:
        with open(path, "rb") as fh:
            reader = pa.ipc.open_stream(fh)
            schema = reader.schema
            while True:
                try:
                    batch, custom = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    break
                if unpaired is not None and custom is not None and custom.get(UNPAIRED_KEY):
                    unpaired.update(range(rows, rows + batch.num_rows))
                rows += batch.num_rows
                batches.append(batch)
    except (pa.ArrowException, OSError):
        pass  # torn or empty: keep what was read
    if schema is None:
        return None, None
    raw = (schema.metadata or {}).get(METADATA_KEY)
    meta = json.loads(raw) if raw else None
    return pa.Table.from_batches(batches, schema=schema.remove_metadata()), meta


def _process_alive(meta: dict[str, Any]) -> bool:
    pid = meta.get("pid")
    if not pid or meta.get("hostname") != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------------------
# Reading


def _recover(journal: Path) -> tuple["pd.DataFrame", dict[str, Any]] | None:
    """A run whose writer never closed: its journal holds every sample it completed (the
    Parquet file, if any, only those of finished configurations, or another run's)."""
    unpaired: set[int] = set()
    table, meta = _read_journal(journal, unpaired)
    if table is None or meta is None:
        return None
    if meta.get("status") == "running" and not _process_alive(meta):
        meta["status"] = "killed"
    meta["recovered_from_journal"] = table.num_rows
    return pair_with_baseline(table, unpaired).to_pandas(), meta


def read_run(path: Path | str) -> tuple["pd.DataFrame", dict[str, Any]]:
    """Load a run: `path` is a run directory or a Parquet file written by `RunWriter`.
    Returns (one row per sample, run metadata dict)."""
    path = Path(path)
    file = path / SAMPLES_FILE if path.is_dir() else path
    journal = file.parent / JOURNAL_FILE
    if journal.is_file():
        recovered = _recover(journal)
        if recovered is not None:
            return recovered
    if not file.is_file():
        if path.is_dir():
            raise RecordsError(f"{path} is not a specbench run: it has no {SAMPLES_FILE}")
        raise RecordsError(f"no run at {path} (expected a run directory or a {SAMPLES_FILE} file)")
    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as exc:
        raise RecordsError(f"{file} is not a readable Parquet file ({exc})") from None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise RecordsError(f"{file} is not a specbench run: its Parquet metadata has no 'specbench' key")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError:
        raise RecordsError(f"{file}: the 'specbench' metadata is not valid JSON") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    added = added_since(int(meta.get("schema_version", 1)))
    if added:
        # Columns added since: filled with nulls, so older runs stay readable.
        for name in [c for c in missing if c in added]:
            field_ = SCHEMA.field(name)
            fill = (pa.array([0] * table.num_rows, field_.type) if name == "repeat"  # one pass = repeat 0
                    else pa.array(["free"] * table.num_rows, field_.type) if name == "scenario"  # before structured output
                    else pa.nulls(table.num_rows, field_.type))
            table = table.append_column(field_, fill)
        missing = [c for c in missing if c not in added]
    if missing:
        raise RecordsError(f"{file} is missing column(s): {', '.join(missing)}")
    return _conform(table, file).to_pandas(), meta


def _conform(table: pa.Table, file: Path) -> pa.Table:
    """`table` with every schema column of the schema's type: a column of another type that
    converts without loss (int32 for int64) is converted; one that does not (text in
    `ttft_s`) is a RecordsError naming the file and column, never a TypeError in a report."""
    for i, name in enumerate(table.column_names):
        if name not in COLUMNS:
            continue
        want = SCHEMA.field(name).type
        have = table.schema.field(name).type
        if have == want:
            continue
        try:
            table = table.set_column(i, pa.field(name, want), table.column(i).cast(want, safe=True))
        except (pa.ArrowException, ValueError):
            raise RecordsError(f"{file}: column {name!r} holds {have}, not the {want} specbench writes "
                               "(a file edited or written by something else?)") from None
    return table
