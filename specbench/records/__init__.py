"""The records schema and its Parquet files: the product of every run.

One pyarrow schema (`SCHEMA`), defined once here, with units in the column names and a short
description per column (field metadata keys `description` and, for quantities, `unit`;
`column_docs()` lists them for docs/records.md). One row per sample. The run's metadata
(`RunMetadata`: the run configuration, package versions, device, git revision, command line,
status) travels as JSON in the Parquet file's key-value metadata under the key `specbench`, and
beside it as a pretty `run.json`; its `config` object is `specbench.config.RunConfig` in JSON form.

A run directory holds `samples.parquet` and `run.json`. `RunWriter` rewrites both
atomically (temp file in the same directory, fsync, os.replace) on every `flush()`, so a run
interrupted between configurations keeps everything that completed in a valid file.
`read_run()` loads a run directory or Parquet file back into a DataFrame.

Boundary: records know the row dicts built from `specbench.metrics` and the config types;
they never compute metrics or summaries (that is `specbench.analysis`), except pairing a
speculative sample journaled before its baseline with that baseline's output
(`pair_with_baseline`, on flush and on recovery).
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.atomic import atomic_write, umask_mode  # re-exported: records were their first home
    from specbench.records.files import RunWriter, pair_with_baseline, read_run
    from specbench.records.metadata import (
        RunMetadata,
        default_run_dir,
        make_run_id,
        package_version,
    )
    from specbench.records.schema import (
        COLUMNS,
        DEFAULT_RUNS_DIR,
        JOURNAL_FILE,
        METADATA_KEY,
        RUN_FILE,
        SAMPLES_FILE,
        SCHEMA,
        SCHEMA_VERSION,
        added_since,
        column_docs,
        make_row,
    )

__getattr__, __dir__ = exports(__name__, {
    "atomic_write": "specbench.atomic",
    "umask_mode": "specbench.atomic",
    "RunWriter": "specbench.records.files",
    "pair_with_baseline": "specbench.records.files",
    "read_run": "specbench.records.files",
    "RunMetadata": "specbench.records.metadata",
    "default_run_dir": "specbench.records.metadata",
    "make_run_id": "specbench.records.metadata",
    "package_version": "specbench.records.metadata",
    "COLUMNS": "specbench.records.schema",
    "DEFAULT_RUNS_DIR": "specbench.records.schema",
    "JOURNAL_FILE": "specbench.records.schema",
    "METADATA_KEY": "specbench.records.schema",
    "RUN_FILE": "specbench.records.schema",
    "SAMPLES_FILE": "specbench.records.schema",
    "SCHEMA": "specbench.records.schema",
    "SCHEMA_VERSION": "specbench.records.schema",
    "added_since": "specbench.records.schema",
    "column_docs": "specbench.records.schema",
    "make_row": "specbench.records.schema",
})

__all__ = ["COLUMNS", "DEFAULT_RUNS_DIR", "JOURNAL_FILE", "METADATA_KEY", "RUN_FILE", "SAMPLES_FILE", "SCHEMA",
           "SCHEMA_VERSION", "RunMetadata", "RunWriter", "added_since", "atomic_write", "column_docs",
           "default_run_dir", "make_row", "make_run_id", "package_version", "read_run", "umask_mode"]
