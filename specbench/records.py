"""The records schema and its Parquet files: the product of every run.

One pyarrow schema (`SCHEMA`), defined once here, with units in the column names and a short
description per column (field metadata key `description`; `column_docs()` lists them for the
README). One row per sample. The run's metadata (`RunMetadata`: the run configuration, package
versions, device, git revision, command line, status) travels as JSON in the Parquet file's
key-value metadata under the key `specbench`, and beside it as a pretty `run.json`; its
`config` object is `specbench.config.RunConfig` in JSON form.

A run directory holds `samples.parquet` and `run.json`. `RunWriter` rewrites both
atomically (temp file in the same directory, fsync, os.replace) on every `flush()`, so a run
interrupted between configurations keeps everything that completed in a valid file.
`read_run()` loads a run directory or Parquet file back into a DataFrame.

Boundary: records know the row dicts built from `specbench.metrics` and the config types;
they never compute metrics or summaries (that is `specbench.analysis`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata as _importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from specbench.config import RunConfig, SpeculativeConfig
from specbench.errors import RecordsError
from specbench.metrics import METRIC_COLUMNS
from specbench.types import Request

if TYPE_CHECKING:
    import pandas as pd

SAMPLES_FILE = "samples.parquet"
RUN_FILE = "run.json"
JOURNAL_FILE = ".samples.journal.arrows"  # every sample as it completes; gone once the run closes
METADATA_KEY = b"specbench"
SCHEMA_VERSION = 3
DEFAULT_RUNS_DIR = Path("runs")


def _f(name: str, type_: pa.DataType, description: str, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"description": description})


_I32 = pa.int32()
_I64 = pa.int64()
_F64 = pa.float64()
_STR = pa.string()

SCHEMA = pa.schema(
    [
        # --- what was run -------------------------------------------------------------
        _f("run_id", _STR, "Run identifier (also the run directory name)."),
        _f("config_id", _STR, "Configuration label within the run (method, k, concurrency)."),
        _f("backend", _STR, "Backend that served the request: embedded | hf | openai."),
        _f("method", _STR, "Speculative method: none | draft_model | ngram | eagle3."),
        _f("num_speculative_tokens", _I32,
           "k: draft tokens proposed per verification step (0 = baseline)."),
        _f("draft_model", _STR,
           "Draft model name or path (draft_model), or the EAGLE-3 head's directory (eagle3); "
           "null otherwise.", True),
        _f("concurrency", _I32, "Maximum requests in flight at once."),
        _f("request_rate", _F64,
           "Poisson arrival rate in requests/s (null = all requests at once, closed loop).", True),
        _f("is_baseline", pa.bool_(), "True for the non-speculative reference configuration."),
        # --- the prompt and how it was sampled ------------------------------------------
        _f("workload", _STR, "Prompt set name."),
        _f("workload_kind", _STR, "Prompt set kind: real | high-entropy | regression | custom."),
        _f("category", _STR, "Prompt category within the workload (e.g. code, chat)."),
        _f("prompt_id", _STR,
           "Prompt identifier, stable across runs (pairs baseline and speculative samples)."),
        _f("repeat", _I32, "Which repeat of the prompt this sample is (0-based; --repeats), paired across configurations."),
        _f("seed", _I64, "Per-request sampling seed (null = derived from the prompt id).", True),
        _f("temperature", _F64, "Sampling temperature (0 = greedy)."),
        _f("top_p", _F64, "Nucleus sampling mass (1 = off)."),
        _f("top_k", _I32, "Top-k sampling cutoff (0 = off)."),
        _f("max_new_tokens", _I32, "Cap on generated tokens."),
        _f("input_tokens", _I32, "Prompt length in tokens."),
        _f("output_tokens", _I32, "Generated tokens."),
        # --- latency, from per-token timestamps (vLLM definitions) ----------------------
        _f("arrival_s", _F64,
           "Arrival time in s, relative to the start of this configuration.", True),
        _f("finish_s", _F64,
           "Last-token time in s, relative to the start of this configuration.", True),
        _f("ttft_s", _F64, "Time to first token in s: arrival to first output token.", True),
        _f("tpot_s", _F64,
           "Time per output token in s: (e2e_s - ttft_s) / (output_tokens - 1).", True),
        _f("e2e_s", _F64, "End-to-end latency in s: arrival to last output token.", True),
        _f("queue_s", _F64, "Queue wait in s: arrival to start of prefill."),
        _f("itl_s", pa.list_(_F64),
           "Inter-token latencies in s (zero gaps inside one accepted burst kept)."),
        _f("chunk_itl_s", pa.list_(_F64),
           "Gaps in s between successive token-carrying arrivals: streamed chunks (openai, as "
           "vllm bench serve's ITL) or emitting engine steps (embedded)."),
        # --- speculative decoding -------------------------------------------------------
        _f("target_forward_passes", _I32, "Target model forward passes, prefill included."),
        _f("num_steps", _I32, "Verification steps that proposed at least one draft token."),
        _f("drafted_tokens", _I32, "Draft tokens proposed, summed over steps."),
        _f("accepted_tokens", _I32, "Draft tokens accepted, summed over steps."),
        _f("acceptance_rate", _F64,
           "accepted_tokens / drafted_tokens (null when nothing was drafted).", True),
        _f("mean_acceptance_length", _F64,
           "1 + accepted_tokens / num_steps: tokens per drafting step, vLLM's definition (1 for baseline)."),
        _f("tokens_per_target_pass", _F64,
           "output_tokens / target_forward_passes (prefill included): steps without drafts count.", True),
        _f("accepted_per_step", pa.list_(_I32), "Accepted draft tokens at each verification step."),
        _f("rejection_positions", pa.list_(_I32),
           "First rejected draft index at each verification step (-1 = all accepted)."),
        _f("prefill_time_s", _F64, "Time spent in prefill in s."),
        _f("draft_time_s", _F64, "Time spent drafting in s, summed over steps."),
        _f("verify_time_s", _F64, "Time spent in target verification in s, summed over steps."),
        # --- per target step after the prefill (drafting or not), one entry each -------------
        _f("step_batch_size", pa.list_(_I32),
           "Rows in the target pass of each step (null entries: not reported by the backend)."),
        _f("step_context_tokens", pa.list_(_I32),
           "Tokens in context (prompt + output so far) before each step (null: not reported)."),
        _f("step_drafted", pa.list_(_I32), "Draft tokens proposed at each step (0 = plain decode step)."),
        _f("step_accepted", pa.list_(_I32), "Draft tokens accepted at each step."),
        _f("step_emitted", pa.list_(_I32), "Tokens emitted by each step (accepted + 1, clipped at a stop)."),
        _f("step_draft_time_s", pa.list_(_F64),
           "Drafting time of each step in s (shared by the rows of a batched step)."),
        _f("step_verify_time_s", pa.list_(_F64),
           "Target verification time of each step in s (shared by the rows of a batched step)."),
        _f("peak_memory_bytes", _I64,
           "Peak memory in bytes the backend reported (accelerator, or process RSS on CPU).", True),
        # --- outcome --------------------------------------------------------------------
        _f("finish_reason", _STR, "Why generation ended: stop | length | error | cancelled."),
        _f("error", _STR, "Error message (null when the request succeeded).", True),
        _f("output_token_ids", pa.list_(_I32), "Generated token ids."),
        _f("token_match_rate", _F64,
           "Fraction of positions equal to the reference output (agreeing positions / longer "
           "length; null without a reference).", True),
        _f("first_divergence", _I32,
           "First position that differs from the reference output (-1 = identical; null without "
           "a reference).", True),
    ]
)

COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
# Columns each schema version added; runs written by an older version read them back as nulls.
ADDED_IN: dict[int, frozenset[str]] = {
    2: frozenset({"repeat", "tokens_per_target_pass", "step_batch_size", "step_context_tokens", "step_drafted",
                  "step_accepted", "step_emitted", "step_draft_time_s", "step_verify_time_s"}),
    3: frozenset({"chunk_itl_s"}),
}


def added_since(version: int) -> frozenset[str]:
    """Columns a run written with schema `version` lacks (filled with nulls when read)."""
    return frozenset().union(*(cols for v, cols in ADDED_IN.items() if v > version))

_REQUIRED_NON_NULL = frozenset(f.name for f in SCHEMA if not f.nullable)

assert set(METRIC_COLUMNS) <= set(COLUMNS), set(METRIC_COLUMNS) - set(COLUMNS)


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{_type_name(t.value_type)}>"
    return {"double": "float64", "bool": "bool", "string": "string"}.get(str(t), str(t))


def column_docs() -> list[tuple[str, str, str]]:
    """(name, type, description) for every column, in schema order (for the README).
    Types read like `float64`, `list<int32>`; nullable columns end in `?`."""
    return [
        (f.name, _type_name(f.type) + ("?" if f.nullable else ""), f.metadata[b"description"].decode())
        for f in SCHEMA
    ]


def make_row(
    *,
    run_id: str,
    config_id: str,
    backend: str,
    spec: SpeculativeConfig,
    concurrency: int,
    request_rate: float | None,
    request: Request,
    metrics: dict[str, Any],
    is_baseline: bool | None = None,
    repeat: int = 0,
) -> dict[str, Any]:
    """One records row: the configuration and request columns plus `metrics`
    (the dict from `specbench.metrics.sample_metrics`). `is_baseline` defaults to whether
    `spec` is non-speculative."""
    s = request.sampling
    row: dict[str, Any] = {
        "run_id": run_id,
        "config_id": config_id,
        "backend": backend,
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "draft_model": spec.draft,
        "concurrency": concurrency,
        "request_rate": request_rate,
        "is_baseline": (not spec.speculative) if is_baseline is None else is_baseline,
        "workload": request.workload,
        "workload_kind": request.kind,
        "category": request.category,
        "prompt_id": request.id,
        "repeat": repeat,
        "seed": s.seed,
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "top_k": s.top_k,
        "max_new_tokens": s.max_new_tokens,
    }
    row.update(metrics)
    return row


# --------------------------------------------------------------------------------------
# Run metadata


def package_version(name: str) -> str | None:
    # importlib.metadata, not `import torch`: reading a version must not load the library.
    try:
        return _importlib_metadata.version(name)
    except _importlib_metadata.PackageNotFoundError:
        return None


def _git_revision(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and rev else None


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunMetadata:
    """Everything needed to interpret and reproduce a run; stored with its samples."""

    run_id: str
    created_at: str  # UTC, ISO 8601
    # The run configuration in its run.json form (`RunConfig.to_dict()`), kept as JSON here
    # because setup and the runner add to it as they go (`note`, `add_configuration_stats`);
    # `run_config` reads it back typed.
    config: dict[str, Any]
    versions: dict[str, str | None]  # specbench, torch, transformers, python
    device: str | None  # e.g. "NVIDIA H200" or "cpu (x86_64)"
    git_revision: str | None  # HEAD of the repository in the working directory, if any
    hostname: str
    command: list[str]  # the command line, argv style
    # running (the writer is open) | complete | interrupted (Ctrl-C, SIGTERM) | killed (read back
    # from the journal of a writer that never closed); only close(complete=True) says complete
    status: str = "interrupted"
    pid: int | None = None  # the writing process, to tell a running run from a killed one
    finished_at: str | None = None  # UTC, ISO 8601; set by RunWriter.close
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def collect(
        cls,
        run_id: str,
        config: RunConfig | dict[str, Any],
        *,
        device: str | None = None,
        command: list[str] | None = None,
        cwd: Path | None = None,
    ) -> "RunMetadata":
        """Gather versions, host, git revision and command line from the current process.
        `config` is a `RunConfig`, or a dict already in its JSON form (taken as it is)."""
        return cls(
            run_id=run_id,
            created_at=_utc_now(),
            config=config.to_dict() if isinstance(config, RunConfig) else config,
            versions={
                "specbench": package_version("specbench"),
                "torch": package_version("torch"),
                "transformers": package_version("transformers"),
                "python": platform.python_version(),
            },
            device=device,
            git_revision=_git_revision(cwd),
            hostname=socket.gethostname(),
            command=list(sys.argv if command is None else command),
        )

    @property
    def run_config(self) -> RunConfig:
        """The configuration, typed."""
        return RunConfig.from_dict(self.config)

    def note(self, **found: Any) -> None:
        """Add what setting up found or the run ended with, by `RunConfig` field name
        (`dtype_resolved=`, `engine=`, `openai=`, `eagle3_head=`, `interrupted_by=`, ...)."""
        unknown = set(found) - RunConfig.keys()
        assert not unknown, f"not RunConfig fields: {sorted(unknown)}"
        plain = RunConfig(**found).to_dict()  # the JSON form of each value
        self.config.update({name: plain[name] for name in found if name in plain})

    def add_configuration_stats(self, stats: dict[str, dict]) -> None:
        """Record (or replace) configurations' statistics, by configuration id."""
        self.config.setdefault("configuration_stats", {}).update(stats)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_run_id(config_short: str, now: _dt.datetime | None = None) -> str:
    """`<UTC yyyymmdd-HHMMSS>-<config_short>`, e.g. `20261129-101500-draft_model-k4`.
    Characters unsafe in a directory name become `_`."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", config_short).strip("._") or "run"
    return f"{now:%Y%m%d-%H%M%S}-{label}"


def default_run_dir(run_id: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """Where a run goes unless told otherwise: `runs/<run_id>`."""
    return Path(root) / run_id


# --------------------------------------------------------------------------------------
# Writing


def atomic_write(path: Path, write: Any, mode: int | None = None) -> None:
    """Call `write(fileobj)` on a binary temp file beside `path`, fsync it, then rename over
    `path`, with permission bits `mode` (default: what the process umask gives a new file,
    not mkstemp's 0600). A reader (or a crash) sees the old file or the new one, never a
    partial one."""
    if mode is None:
        mode = umask_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not possible on every platform, so best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class RunWriter:
    """Writes a run directory: every sample durable as it completes, the Parquet file atomic.

    `add()` appends each row to an Arrow IPC journal (`.samples.journal.arrows`, carrying the
    run metadata in its schema) and hands it to the OS at once, so a run killed with SIGKILL
    keeps every sample that had completed; the journal is fsynced at most a second after a
    row. `flush()` (after each configuration) rewrites `samples.parquet` and `run.json`
    atomically with every row so far; `close(complete=...)` writes them a last time with the
    run's status and removes the journal. `read_run` recovers a run whose writer never
    closed (status `killed`) from its journal.

    The directory is created and probed for writability up front, before any model loads.
    With `overwrite`, the previous records stay until the first flush that has rows replaces
    them atomically. Files get the process umask's permissions, like any other output.
    """

    def __init__(self, run_dir: Path, metadata: RunMetadata, overwrite: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.metadata = metadata
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise RecordsError(f"run directory {self.run_dir} exists and is not a directory")
        self.previous_rows = 0  # rows of the run being overwritten, still on disk until the first flush
        if self.run_dir.is_dir() and any(self.run_dir.iterdir()):
            if not overwrite:
                raise RecordsError(
                    f"run directory {self.run_dir} already exists and is not empty; "
                    "pass --overwrite to replace it or choose another --out"
                )
            try:
                self.previous_rows = pq.ParquetFile(self.samples_path).metadata.num_rows
            except (OSError, pa.ArrowException):
                self.previous_rows = 0
        self._created = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.run_dir, prefix=".write-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise RecordsError(f"--out {self.run_dir}: cannot write there ({exc.strerror or exc})") from None
        self.metadata.status = "running"
        self.metadata.pid = os.getpid()
        self._tables: list[pa.Table] = []
        self._closed = False
        self._journal: Any = None
        self._journal_file: Any = None
        self._synced_at = 0.0

    @property
    def samples_path(self) -> Path:
        return self.run_dir / SAMPLES_FILE

    @property
    def journal_path(self) -> Path:
        return self.run_dir / JOURNAL_FILE

    @property
    def num_rows(self) -> int:
        return sum(t.num_rows for t in self._tables)

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Validate rows (dicts keyed by `COLUMNS`) and append them to the journal now; they
        reach samples.parquet on the next flush."""
        if not rows:
            return
        for i, row in enumerate(rows):
            missing = [c for c in COLUMNS if c not in row]
            unknown = [c for c in row if c not in SCHEMA.names]
            if missing or unknown:
                raise ValueError(f"row {i}: missing columns {missing}, unknown columns {unknown}")
            nulls = [c for c in _REQUIRED_NON_NULL if row[c] is None]
            if nulls:
                raise ValueError(f"row {i}: null in non-nullable columns {sorted(nulls)}")
        # Converting now surfaces a type error at the row that caused it, not at flush time.
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        self._tables.append(table)
        self._journal_append(table)

    def _journal_append(self, table: pa.Table) -> None:
        if self._journal is None:
            self._journal_file = open(self.journal_path, "wb")
            _chmod_umask(self.journal_path)
            self._journal = pa.ipc.new_stream(self._journal_file, self._schema_with_metadata())
        self._journal.write_table(table)
        self._journal_file.flush()  # in the OS now: a killed process loses nothing
        now = time.monotonic()
        if now - self._synced_at >= 1.0:  # on disk within about a second, even if the machine dies
            os.fsync(self._journal_file.fileno())
            self._synced_at = now

    def _schema_with_metadata(self) -> pa.Schema:
        payload = json.dumps(self.metadata.to_dict(), sort_keys=True).encode()
        return SCHEMA.with_metadata({METADATA_KEY: payload})

    def flush(self) -> None:
        """Write `samples.parquet` and `run.json` with every row added so far."""
        if not self._tables and self.samples_path.exists():
            return  # no new rows yet: keep the records being overwritten until there are
        schema = self._schema_with_metadata()
        if self._tables:
            table = pa.concat_tables(self._tables).replace_schema_metadata(schema.metadata)
            self._tables = [table.replace_schema_metadata(None)]
        else:
            table = schema.empty_table()
        atomic_write(self.samples_path, lambda fh: pq.write_table(table, fh))
        text = json.dumps(self.metadata.to_dict(), indent=2, sort_keys=True) + "\n"
        atomic_write(self.run_dir / RUN_FILE, lambda fh: fh.write(text.encode()))

    def close(self, complete: bool) -> None:
        """Record whether the run completed or was interrupted, write everything, drop the
        journal. A run closed before its first sample leaves the directory as it was (and
        removes it if this writer created it)."""
        self.metadata.status = "complete" if complete else "interrupted"
        self.metadata.finished_at = _utc_now()
        if self._tables or complete:
            self.flush()
        if self._journal is not None:
            self._journal.close()
            self._journal_file.close()
            self._journal = None
        self.journal_path.unlink(missing_ok=True)
        if self._created and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
        self._closed = True

    def abandon(self) -> None:
        """Nothing was measured (setup failed): leave the directory as it was found."""
        if self._tables:
            raise RuntimeError("abandon() after samples were added; close() instead")
        if self._journal is not None:
            self._journal.close()
            self._journal_file.close()
            self._journal = None
        self.journal_path.unlink(missing_ok=True)
        if self._created and self.run_dir.is_dir() and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
        self._closed = True

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._closed:
            self.close(complete=exc_type is None)


def umask_mode() -> int:
    """0666 minus the process umask: what open() would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _chmod_umask(path: Path) -> None:
    try:
        os.chmod(path, umask_mode())
    except OSError:
        pass


def _read_journal(path: Path) -> tuple[pa.Table | None, dict[str, Any] | None]:
    """Every complete batch of a journal (a killed writer may have left a torn last one)."""
    batches, schema = [], None
    try:
        with open(path, "rb") as fh:
            reader = pa.ipc.open_stream(fh)
            schema = reader.schema
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
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
    table, meta = _read_journal(journal)
    if table is None or meta is None:
        return None
    if meta.get("status") == "running" and not _process_alive(meta):
        meta["status"] = "killed"
    meta["recovered_from_journal"] = table.num_rows
    return table.to_pandas(), meta


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
                    else pa.nulls(table.num_rows, field_.type))
            table = table.append_column(field_, fill)
        missing = [c for c in missing if c not in added]
    if missing:
        raise RecordsError(f"{file} is missing column(s): {', '.join(missing)}")
    return table.to_pandas(), meta
