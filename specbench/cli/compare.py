"""`specbench compare`: gate a current run against a baseline run (exit 0 pass, 1 regression,
2 not comparable or bad input)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specbench.errors import ConfigError
from specbench import compare as cmp
from specbench.atomic import atomic_write

FORMATS = ("table", "json", "junit", "markdown")


def compare(
    baseline: Annotated[Path, typer.Argument(help="Baseline run: a run directory or its samples.parquet.", show_default=False)],
    current: Annotated[Path, typer.Argument(help="Current run: a run directory or its samples.parquet.", show_default=False)],
    metric: Annotated[Optional[list[str]], typer.Option("--metric", "-m", help="Metric(s) to compare, repeatable or comma-separated (default: tpot_p50, ttft_p50, e2e_p50, output_tps, acceptance_rate, mean_acceptance_length, greedy_match, errors; also tpot_mean, ttft_mean, e2e_mean).")] = None,
    max_regression: Annotated[Optional[list[str]], typer.Option(help="Allowed worsening: 5% or 0.05 sets the timing metrics; METRIC=VALUE sets one (repeatable). Defaults: timing 5%, acceptance_rate and mean_acceptance_length 1%, greedy_match 0, errors 0.")] = None,
    min_effect: Annotated[str, typer.Option(help="Timing: a regression's confidence interval must lie above this worsening (5% or 0.05).")] = "1%",
    gate: Annotated[str, typer.Option(help="Which metrics can fail: all | deterministic (timings reported, not gated; for noisy machines) | none.")] = "all",
    fmt: Annotated[str, typer.Option("--format", "-f", help="Standard output: table | json | junit | markdown.")] = "table",
    output: Annotated[Optional[list[Path]], typer.Option("--output", "-o", help="Also write the report to FILE; the suffix picks the format: .xml JUnit, .md Markdown, .json JSON (repeatable).")] = None,
    allow_config_diff: Annotated[bool, typer.Option(help="Compare the configurations both runs have and pair the others by concurrency (e.g. k4 vs k5) instead of refusing.")] = False,
    n_boot: Annotated[int, typer.Option(help="Bootstrap resamples for the timing metrics.")] = 2000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    confidence: Annotated[float, typer.Option(help="Confidence level of the bootstrap intervals.")] = 0.95,
    interval: Annotated[str, typer.Option(help="Timing intervals from: prompts (paired bootstrap over prompt ids: prompt noise only) | repeats (the spread of each run's per-repeat statistics; runs made with --repeats N, N >= 2).")] = "prompts",
) -> None:
    """Compare CURRENT against BASELINE per configuration: exit 0 if nothing regressed, 1 on a
    regression, 2 when the runs are not comparable (the message names what differs)."""
    from specbench.records import read_run

    # ---- validate every flag before reading anything -------------------------------------
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if gate not in cmp.GATES:
        raise ConfigError(f"--gate must be one of {', '.join(cmp.GATES)}, got {gate!r}")
    if interval not in cmp.INTERVALS:
        raise ConfigError(f"--interval must be one of {', '.join(cmp.INTERVALS)}, got {interval!r}")
    metrics = cmp.parse_metrics(metric)
    thresholds = cmp.parse_thresholds(max_regression, metrics)
    effect = cmp.parse_fraction(min_effect, "--min-effect")
    outputs: list[tuple[Path, str]] = []
    for path in output or []:
        kind = cmp.SUFFIX_FORMATS.get(path.suffix.lower())
        if kind is None:
            raise ConfigError(f"--output {path}: unknown suffix {path.suffix!r}; use "
                              f"{', '.join(cmp.SUFFIX_FORMATS)}")
        for run in (baseline, current):  # a run's own files are records, never a report
            run_dir = (run if run.is_dir() else run.parent).resolve()
            if run_dir in path.resolve().parents:
                raise ConfigError(f"--output {path} is inside the run directory {run}; "
                                  "write the report outside the runs it compares")
        outputs.append((path, kind))

    base_run = read_run(baseline)
    cur_run = read_run(current)
    result = cmp.compare_runs(base_run, cur_run, metrics=metrics, thresholds=thresholds,
                              min_effect=effect, gate=gate, n_boot=n_boot, seed=seed,
                              confidence=confidence, allow_config_diff=allow_config_diff,
                              paths=(str(baseline), str(current)), interval=interval)

    for path, kind in outputs:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            text = cmp.RENDERERS[kind](result)
            atomic_write(path, lambda fh, text=text: fh.write(text.encode()))
        except OSError as exc:
            raise ConfigError(f"--output {path}: cannot write ({exc.strerror or exc})") from None

    out = Console()
    if not out.is_terminal:  # CI logs: rich would assume 80 columns and fold the table
        out = Console(width=max(out.width, 140))
    if fmt != "table":
        # A machine-readable document even when the runs are not comparable (comparable: false).
        typer.echo(cmp.RENDERERS[fmt](result), nl=False)
    elif result.comparable:
        out.print(cmp.rich_table(result))
        for d in result.differences:
            out.print(f"differs (allowed): {d['field']}: {d['baseline']} -> {d['current']}",
                      highlight=False, markup=False, soft_wrap=True)
        if result.unmatched:
            out.print(f"not compared: {', '.join(result.unmatched)}", highlight=False,
                      markup=False, soft_wrap=True)
        for note in result.notes:
            out.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
        out.print(result.summary(), highlight=False, markup=False, soft_wrap=True,
                  style="bold red" if result.failures else "bold green")
    if not result.comparable:
        raise cmp.NotComparableError(result.summary())
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
