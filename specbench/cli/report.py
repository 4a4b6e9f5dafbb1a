"""`specbench report`: write one self-contained HTML report (works offline) from runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specbench.errors import ConfigError
from specbench.records.lock import OutLock


def report(
    paths: Annotated[Optional[list[Path]], typer.Argument(metavar="RUN_OR_STUDY", help="Run directories, samples.parquet files, study directories (sweeps/studies/NAME) or a study's SQLite file (sweeps/NAME.db).", show_default=False)] = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Run whose baseline is the reference for every configuration (default: each run's own baseline).")] = None,
    out: Annotated[Optional[str], typer.Option(help="HTML file to write (default reports/<first run id>.html, reports/study-<name>.html for a study); a directory gets that name inside.")] = None,
    allow_mixed: Annotated[bool, typer.Option("--allow-mixed", help="Report runs of different workloads or target models together.")] = False,
    title: Annotated[Optional[str], typer.Option(help="Page title (default: workload and target model).")] = None,
    n_boot: Annotated[int, typer.Option(help="Bootstrap resamples for the speedup confidence intervals.")] = 2000,
    storage: Annotated[Optional[str], typer.Option(help="Optuna RDB URL of a study to report (with --study-name), e.g. postgresql://user@host/db.")] = None,
    study_name: Annotated[Optional[str], typer.Option(help="The study to report when the storage holds several.")] = None,
    study_dir: Annotated[Optional[Path], typer.Option(help="The study directory holding the trials' runs/ (default: studies/NAME beside the .db file).")] = None,
) -> None:
    """Write a self-contained HTML report: verdict per concurrency, plots, the fitted speedup
    model, per-sample table; for a study also the search, the trials and the profile."""
    from specbench.report import build_report, default_out, load_inputs, write_report

    if out is not None and not out.strip():  # as a Path, '' would be '.': the report landed in the cwd
        raise ConfigError("--out is empty: give an .html file name or a directory, or leave --out out for "
                          "reports/<run id>.html")
    if n_boot < 100:
        raise ConfigError(f"--n-boot must be >= 100, got {n_boot}")
    if study_name is not None and storage is None and not paths:
        raise ConfigError("--study-name needs --storage URL or a study's .db file")
    inputs = load_inputs(paths or [], baseline=baseline, allow_mixed=allow_mixed, storage=storage,
                         study_name=study_name, study_dir=study_dir)
    target = Path(out) if out is not None else default_out(inputs)
    if target.is_dir():
        target = target / default_out(inputs).name
    elif target.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {target}: give an .html file name (or an existing directory)")

    with OutLock(target.parent, name=f".{target.name}.lock", label=target):  # one writer per report file
        page = build_report(inputs, title=title, n_boot=n_boot)
        path = write_report(page, target)
    Console().print(f"report: {path}  ({path.stat().st_size / 2**20:.1f} MiB, "
                    f"{len(inputs.frame)} samples from {len(inputs.runs)} run(s))", highlight=False,
                    soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
