"""Studies in a report: an Optuna study written by `specbench sweep`, found from its study
directory (`sweeps/studies/NAME`, with runs/ and profile.yaml), its SQLite file
(`sweeps/NAME.db`) or an RDB URL and a study name, read without writing anything.

- The storage of a study directory: the `study.storage` of its profile.yaml, else the
  `sweep.storage` recorded in its runs' run.json, else `sweeps/NAME.db` beside
  `sweeps/studies/NAME`; a SQLite file that does not exist is never created.
- The study directory of a storage: `--study-dir`, else `studies/NAME` beside the .db file.
- Trials: one row per trial (state, parameters, objective values, run id, feasibility,
  failure reason, the trial it reused); runs: every trial run found on this host (a trial
  measured on another host says so in the notes).

Boundary: Optuna and records only; no torch. `specbench.report.inputs.load_path` tries
`load_study` before the run loader (`specbench.report.loaded`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.config import RunConfig
from specbench.errors import ConfigError, RecordsError
from specbench.records import RUN_FILE, SAMPLES_FILE
from specbench.report.loaded import LoadOptions, RunInput, StudyInput, load_run
from specbench.sweep.guided import label
from specbench.sweep.trials import SKIPPED_ATTR

PROFILE_FILE = "profile.yaml"
_SQLITE_MAGIC = b"SQLite format 3\x00"
SETUP_ATTR = "specbench_setup"  # the study user attr `specbench sweep` writes


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


def _is_study_dir(path: Path) -> bool:
    return path.is_dir() and not (path / SAMPLES_FILE).exists() and (
        (path / PROFILE_FILE).is_file() or (path / "runs").is_dir())


def _read_profile(study_dir: Path | None) -> dict[str, Any] | None:
    if study_dir is None or not (study_dir / PROFILE_FILE).is_file():
        return None
    import yaml

    try:
        got = yaml.safe_load((study_dir / PROFILE_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RecordsError(f"{study_dir / PROFILE_FILE} is not readable YAML ({exc})") from None
    return got if isinstance(got, dict) else None


def _sweep_meta(study_dir: Path) -> dict[str, Any]:
    for run_json in sorted((study_dir / "runs").glob(f"*/{RUN_FILE}")):
        try:
            sweep = RunConfig.from_dict(json.loads(run_json.read_text()).get("config")).sweep
        except (OSError, json.JSONDecodeError):
            continue
        if sweep:
            return sweep
    return {}


def _sqlite_path(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


def _open(url: str, where: str) -> Any:
    import optuna

    path = _sqlite_path(url)
    if path is not None and not _is_sqlite(path):
        raise ConfigError(f"{where}: no Optuna SQLite file at {path}")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(url, skip_table_creation=True)
    except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors of every kind
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{where}: cannot open {url} ({first})") from None


def _study_name(storage: Any, wanted: str | None, where: str) -> str:
    import optuna

    try:
        names = optuna.get_all_study_names(storage)
    except Exception as exc:  # noqa: BLE001 - a SQLite file that is not an Optuna storage
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{where} is not an Optuna study storage ({first[:200]})") from None
    if wanted is not None:
        if wanted not in names:
            raise ConfigError(f"{where}: no study named {wanted!r}; studies there: "
                              f"{', '.join(names) or 'none'}")
        return wanted
    if len(names) == 1:
        return names[0]
    raise ConfigError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'}): pass "
                      "--study-name NAME")


def _display(url: str) -> str:
    from specbench.sweep.study import display_url

    return display_url(url)


def trials_frame(study: Any) -> pd.DataFrame:
    """One row per trial: number, state, params_*, values_<i>, run_id, run_dir, host,
    config_id, feasible, fail_reason, duplicate_of, paired, inconsistent, started, duration_s."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        row: dict[str, Any] = {
            "number": t.number, "state": t.state.name, "run_id": a.get("run_id"),
            "run_dir": a.get("run_dir"), "host": a.get("host"), "config_id": a.get("config_id"),
            "feasible": bool(a.get("feasible", True)), "constraint": a.get("constraint"),
            "fail_reason": a.get("fail_reason") or (None if t.state.name != "FAIL" else "interrupted"),
            "duplicate_of": a.get("duplicate_of"), "baseline_trial": a.get("baseline_trial"),
            # a paired trial's own speedup (baseline measured with it) and its physics flags
            "paired": a.get("paired"), "inconsistent": "; ".join(a.get("inconsistent") or []) or None,
            "started": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
            "duration_s": (t.datetime_complete - t.datetime_start).total_seconds()
            if t.datetime_start and t.datetime_complete else None,
        }
        for k, v in t.params.items():
            row[f"params_{k}"] = v
        for i, v in enumerate(t.values or []):
            row[f"values_{i}"] = v
        rows.append(row)
    return pd.DataFrame(rows)


def open_study_input(url: str, options: LoadOptions, *, path: Path, study_dir: Path | None,
                     where: str) -> StudyInput:
    """Read one study and every trial run found under its study directory."""
    import optuna

    storage = _open(url, where)
    name = _study_name(storage, options.study_name, where)
    study = optuna.load_study(study_name=name, storage=storage)
    setup = study.user_attrs.get(SETUP_ATTR) or {}
    objectives = list(setup.get("objectives") or [f"objective {i}" for i in range(len(study.directions))])
    st = StudyInput(path=path, name=name, trials=trials_frame(study),
                    directions=[d.name.lower() for d in study.directions], objectives=objectives,
                    study=study, study_dir=study_dir, storage=_display(url), setup=setup)
    if not setup:
        st.notes.append(f"study {name!r} was not written by specbench sweep (no setup attributes)")
    skipped = study.user_attrs.get(SKIPPED_ATTR) or {}
    if skipped:
        st.notes.append(f"{len(skipped)} configuration(s) not measured (--sampler model): the fitted speedup "
                        "model ruled them out: " + "; ".join(f"{label(k)}: {v}" for k, v in skipped.items()))
    st.profile = _read_profile(study_dir)
    if study_dir is None or not study_dir.is_dir():
        st.notes.append(f"no study directory for {name!r} (pass --study-dir DIR): its runs are "
                        "not in the report")
        return st
    loaded: dict[str, RunInput] = {}
    away: list[str] = []
    for t in st.trials.itertuples():
        rel = getattr(t, "run_dir", None)
        if not isinstance(rel, str) or t.run_id in loaded:
            continue
        run_dir = study_dir / rel
        if not (run_dir / SAMPLES_FILE).is_file():
            away.append(f"trial {t.number} ({t.run_id}{', host ' + t.host if t.host else ''})")
            continue
        try:
            loaded[t.run_id] = load_run(run_dir)
        except RecordsError as exc:
            st.notes.append(f"trial {t.number}: {exc}")
    st.runs = list(loaded.values())
    if away:
        st.notes.append(f"{len(away)} trial run(s) are not under {study_dir} (measured on another "
                        f"host?): {', '.join(away)}")
    return st


def _storage_of_study_dir(study_dir: Path, profile: dict[str, Any] | None) -> tuple[str, str | None]:
    name = ((profile or {}).get("study") or {}).get("name")
    url = ((profile or {}).get("study") or {}).get("storage")
    if url is None or name is None:
        sweep = _sweep_meta(study_dir)
        name = name or sweep.get("study")
        url = url or sweep.get("storage")
    name = name or study_dir.name
    candidates = []
    if url:
        candidates.append(url)
    candidates.append(f"sqlite:///{study_dir.parent.parent / (name + '.db')}")
    for c in candidates:
        path = _sqlite_path(c)
        if path is None:
            if "***" in c:
                raise ConfigError(f"{study_dir}: its storage {c} needs a password: pass "
                                  f"--storage URL --study-name {name} --study-dir {study_dir}")
            return c, name
        if _is_sqlite(path):
            return c, name
    raise ConfigError(f"{study_dir}: cannot find the study's storage (tried "
                      f"{', '.join(candidates)}); pass --storage URL --study-name {name}")


def load_study(path: Path, options: LoadOptions) -> StudyInput | None:
    """A study directory or an Optuna SQLite file (`specbench.report.inputs.load_path` asks
    first); None for anything else."""
    if _is_study_dir(path):
        url, name = _storage_of_study_dir(path, _read_profile(path))
        opts = LoadOptions(options.study_name or name, options.study_dir)
        return open_study_input(url, opts, path=path, study_dir=options.study_dir or path,
                                where=str(path))
    if path.is_file() and _is_sqlite(path):
        storage = _open(f"sqlite:///{path}", str(path))
        name = _study_name(storage, options.study_name, str(path))
        study_dir = options.study_dir or path.parent / "studies" / name
        return open_study_input(f"sqlite:///{path}", LoadOptions(name, options.study_dir), path=path,
                                study_dir=study_dir, where=str(path))
    return None


def load_study_from_storage(url: str, options: LoadOptions) -> StudyInput:
    """`--storage URL --study-name NAME [--study-dir DIR]`."""
    from specbench.sweep.study import normalize_storage_url

    url = normalize_storage_url(url)
    storage = _open(url, f"--storage {_display(url)}")
    name = _study_name(storage, options.study_name, f"--storage {_display(url)}")
    path = _sqlite_path(url)
    study_dir = options.study_dir or (path.parent / "studies" / name if path else None)
    return open_study_input(url, LoadOptions(name, options.study_dir), path=path or Path(name),
                            study_dir=study_dir, where=f"--storage {_display(url)}")

