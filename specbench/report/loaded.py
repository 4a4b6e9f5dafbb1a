"""What a report loader returns (`RunInput`, `StudyInput`) and is given (`LoadOptions`), and
the run loader itself: the types both `specbench.report.inputs` (which joins what was loaded)
and `specbench.report.study` (the study loader) build on, so neither imports the other's
module back.

Boundary: reads records through `specbench.records.read_run`; no Optuna, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.config import RunConfig
from specbench.errors import RecordsError
from specbench.records import read_run


@dataclass
class RunInput:
    """One run: its samples (records columns) and its run.json metadata."""

    path: Path
    frame: pd.DataFrame
    meta: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.path.name)

    @property
    def config(self) -> RunConfig:
        """run.json's configuration, typed (older runs read with what they have)."""
        return RunConfig.from_dict(self.meta.get("config"))


@dataclass
class StudyInput:
    """A parameter search over runs (an Optuna study written by `specbench sweep`).
    `trials` has one row per trial with at least `number`, `state`, `run_id`, one
    `values_<objective>` column per objective and one `params_<name>` column per parameter
    (Optuna's `study.trials_dataframe()` shape); `directions` is minimize/maximize per
    objective, in the order of `objectives`. `study` is the Optuna study itself (None when
    built by hand), `profile` the study's profile.yaml read back (None when absent)."""

    path: Path
    name: str
    trials: pd.DataFrame
    directions: list[str]
    runs: list[RunInput] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    study: Any = None
    study_dir: Path | None = None
    storage: str | None = None  # display URL (no password)
    profile: dict[str, Any] | None = None
    setup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoadOptions:
    """What a loader may need beyond the path (from the command line)."""

    study_name: str | None = None
    study_dir: Path | None = None


Loader = Callable[[Path, LoadOptions], "RunInput | StudyInput | None"]


def load_run(path: Path, options: LoadOptions | None = None) -> RunInput:
    """A run directory or samples.parquet; raises `RecordsError` for anything else."""
    df, meta = read_run(path)
    if df.empty:
        raise RecordsError(f"{path} has no samples (an empty or interrupted run)")
    return RunInput(Path(path), df, meta)
