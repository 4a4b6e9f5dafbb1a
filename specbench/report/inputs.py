"""What a report is built from: runs (and, later, studies) loaded, checked and joined into one
frame, with every speculative configuration paired with the baseline it is measured against.

`load_inputs(paths, baseline=..., allow_mixed=...)` turns the command line into a
`ReportInputs`:

- `frame`: the samples of every run, one row per sample, with three added columns:
  `label` (the configuration label shown in the report: the run's `config_id`, prefixed with
  the run id where two runs use the same config_id), `series` (the label without its
  concurrency suffix, so one configuration can be followed across concurrency) and `source`
  (the run id). `config_id` is replaced by `label` so `specbench.analysis` groups the
  configurations of different runs apart; the run's own id stays in `run_config_id`.
- `pairs`: speculative label -> baseline label (or None when no baseline matches), at the same
  concurrency and request rate. Without `--baseline`, each run's configurations are measured
  against that run's own baseline (same process, same prompts); a run without one borrows the
  baseline of the only other run that has one. With `--baseline RUN`, RUN's baseline is the
  reference for everything and other runs' baseline rows are left out.

Studies: `loaders()` are the functions tried in order on each path, each called as
`loader(path, options)` and returning a `RunInput`, a `StudyInput` or None ("not mine"). The
run loader is last and raises the records error for a path nobody claims; the study loader
(`specbench.report.study`: a study directory, an Optuna SQLite file) comes first and
returns a `StudyInput` whose `runs` are its trials' runs: those join the frame like any run,
each trial's speculative run paired with the same study's baseline run at its concurrency
(the runs of one study share a `group`), and the study itself reaches the study section.
Loaders must not import torch.

Boundary: reads records through `specbench.records.read_run`; computes no statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.analysis import series
from specbench.errors import ConfigError, RecordsError
from specbench.formatting import same
from specbench.records import SAMPLES_FILE
from specbench.report.loaded import LoadOptions, Loader, RunInput, StudyInput, load_run
from specbench.report.study import load_study, load_study_from_storage

__all__ = ["LoadOptions", "Loader", "ReportInputs", "RunInput", "StudyInput", "combine", "load_inputs", "load_path",
           "load_run", "loaders"]


def loaders() -> list[Loader]:
    """Tried in order on each path: the study loader, then the run loader (last: it raises
    the records error for a path nobody claims)."""
    return [load_study, load_run]


def load_path(path: Path, options: LoadOptions | None = None) -> RunInput | StudyInput:
    for loader in loaders():
        got = loader(Path(path), options or LoadOptions())
        if got is not None:
            return got
    raise RecordsError(f"{path} is neither a specbench run nor a study")  # pragma: no cover


@dataclass
class ReportInputs:
    runs: list[RunInput]
    run_ids: list[str]  # unique per run, same order as `runs` (a repeated id gets '#2')
    studies: list[StudyInput]
    frame: pd.DataFrame
    pairs: dict[str, str | None]
    baseline_run: str | None  # run id given with --baseline
    notes: list[str] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)  # run id -> study name (study runs)
    cache: dict[str, Any] = field(default_factory=dict)  # derived tables computed once per report

    @property
    def labels(self) -> list[str]:
        return list(dict.fromkeys(self.frame["label"]))


def _unique_run_ids(runs: list[RunInput]) -> list[str]:
    ids: list[str] = []
    for r in runs:
        rid, n = r.run_id, 2
        while rid in ids:
            rid, n = f"{r.run_id}#{n}", n + 1
        ids.append(rid)
    return ids


def _check_mixed(runs: list[RunInput], ids: list[str]) -> None:
    """Workloads (and target models) must agree unless --allow-mixed: a speedup measured on
    one prompt set says nothing about another."""
    workloads: dict[str, list[str]] = {}
    targets: dict[str, list[str]] = {}
    for r, rid in zip(runs, ids):
        for w in pd.unique(r.frame["workload"]):
            workloads.setdefault(str(w), []).append(rid)
        target = r.config.target
        if target is not None:
            targets.setdefault(str(target), []).append(rid)
    if len(workloads) > 1:
        listed = "; ".join(f"{w} ({', '.join(v)})" for w, v in workloads.items())
        raise ConfigError(f"the runs use different workloads: {listed}; pass --allow-mixed to "
                          "report them together")
    if len(targets) > 1:
        listed = "; ".join(f"{t} ({', '.join(v)})" for t, v in targets.items())
        raise ConfigError(f"the runs use different target models: {listed}; pass --allow-mixed "
                          "to report them together")


def _pair(frame: pd.DataFrame, baseline_run: str | None,
          groups: dict[str, str] | None = None) -> dict[str, str | None]:
    groups = groups or {}
    configs = frame.drop_duplicates("label")[
        ["label", "source", "is_baseline", "concurrency", "request_rate"]]
    bases = configs[configs["is_baseline"]]
    sources_with_base = list(dict.fromkeys(bases["source"]))
    pairs: dict[str, str | None] = {}
    for c in configs[~configs["is_baseline"]].itertuples():
        group = groups.get(c.source)
        in_group = [s for s in sources_with_base if group is not None and groups.get(s) == group]
        if baseline_run is not None:
            pool = bases
        elif c.source in sources_with_base:
            pool = bases[bases["source"] == c.source]
        elif in_group:  # a study's trial: the study's baseline trials are its reference
            pool = bases[bases["source"].isin(in_group)]
        elif len(sources_with_base) == 1:
            pool = bases
        elif not sources_with_base:
            pool = bases.iloc[0:0]
        else:
            raise ConfigError(
                f"run {c.source} has no baseline and runs {', '.join(sources_with_base)} each "
                "have one; pass --baseline RUN to choose the reference")
        match = pool[(pool["concurrency"] == c.concurrency)
                     & pool["request_rate"].map(lambda r, rate=c.request_rate: same(r, rate))]
        pairs[c.label] = str(match["label"].iloc[0]) if len(match) else None
    return pairs


def combine(runs: Sequence[RunInput], *, baseline: RunInput | None = None,
            allow_mixed: bool = False, groups: Sequence[str | None] | None = None) -> ReportInputs:
    """Join runs into one frame (see the module docstring); `baseline`, when given, must be
    one of `runs` and is the only source of baseline rows. `groups` names, per run, the study
    it belongs to (None for a plain run)."""
    runs = list(runs)
    ids = _unique_run_ids(runs)
    group_of = {rid: g for rid, g in zip(ids, groups or []) if g is not None}
    if not allow_mixed:
        _check_mixed(runs, ids)
    notes: list[str] = []
    baseline_id = None
    if baseline is not None:
        baseline_id = ids[runs.index(baseline)]
        if not baseline.frame["is_baseline"].any():
            raise ConfigError(f"--baseline {baseline.path}: that run has no baseline rows "
                              "(it was run with --no-baseline)")
    frames = []
    for r, rid in zip(runs, ids):
        df = r.frame.copy()
        if baseline_id is not None and rid != baseline_id and df["is_baseline"].any():
            notes.append(f"baseline rows of run {rid} left out: --baseline {baseline_id} is the "
                         "reference")
            df = df[~df["is_baseline"]]
        df["source"] = rid
        frames.append(df)
    frame = pd.concat(frames, ignore_index=True)
    frame["run_config_id"] = frame["config_id"]
    runs_per_config = frame.groupby("config_id")["source"].nunique()
    shared = set(runs_per_config[runs_per_config > 1].index)
    frame["label"] = [f"{s} · {c}" if c in shared else c
                      for s, c in zip(frame["source"], frame["config_id"])]
    frame["series"] = [f"{s} · {series(c)}" if c in shared else series(c)
                       for s, c in zip(frame["source"], frame["config_id"])]
    frame["config_id"] = frame["label"]
    pairs = _pair(frame, baseline_id, group_of)
    missing = sorted(lbl for lbl, b in pairs.items() if b is None)
    if missing:
        notes.append("no baseline at the same concurrency for: " + ", ".join(missing))
    return ReportInputs(runs=runs, run_ids=ids, studies=[], frame=frame, pairs=pairs,
                        baseline_run=baseline_id, notes=notes, groups=group_of)


def load_inputs(paths: Sequence[Path | str], *, baseline: Path | str | None = None,
                allow_mixed: bool = False, storage: str | None = None,
                study_name: str | None = None, study_dir: Path | str | None = None) -> ReportInputs:
    """Load every path (runs and studies) and `combine` them; `storage` (an Optuna RDB URL)
    with `study_name` adds that study. The same run given twice (or again as --baseline, or
    as a study's trial) is read once."""
    options = LoadOptions(study_name, Path(study_dir) if study_dir is not None else None)
    if not paths and storage is None:
        raise ConfigError("give at least one run directory, samples.parquet file or study "
                          "(a study directory, its .db file, or --storage URL --study-name NAME)")
    runs: list[RunInput] = []
    groups: list[str | None] = []
    studies: list[StudyInput] = []
    seen: dict[Path, RunInput] = {}

    def add_run(r: RunInput, group: str | None = None) -> RunInput:
        key = r.path.resolve()
        if key.name == SAMPLES_FILE:
            key = key.parent
        if key not in seen:
            seen[key] = r
            runs.append(r)
            groups.append(group)
        return seen[key]

    def add_study(st: StudyInput) -> None:
        studies.append(st)
        for r in st.runs:
            add_run(r, st.name)

    for p in paths:
        got = load_path(Path(p), options)
        if isinstance(got, StudyInput):
            add_study(got)
        else:
            add_run(got)
    if storage is not None:
        add_study(load_study_from_storage(storage, options))
    if not runs:
        raise RecordsError("the study has no trial run here to report on: "
                           + "; ".join(n for st in studies for n in st.notes))
    base_run = None
    if baseline is not None:
        got = load_path(Path(baseline), options)
        if isinstance(got, StudyInput):
            raise ConfigError(f"--baseline {baseline}: give a run, not a study")
        base_run = add_run(got)
    inputs = combine(runs, baseline=base_run, allow_mixed=allow_mixed, groups=groups)
    inputs.studies = studies
    return inputs
