"""`specbench sweep`: tune num_speculative_tokens x concurrency x method with Optuna; every
trial is a real run; the study resumes, can be shared by several workers, and ends in a
recommended serving profile (YAML).

The command's options are generated from the sweep's option declarations
(`specbench.sweep.options`: one flag per spec key, with its help text); this module turns
flags into a `SweepSpec` and drives the library: open the study, measure with a progress
bar, write and print the profile."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specbench.sweep.options import OPTIONS, Option
from specbench import sweep as sw
from specbench.records.lock import OutLock
from specbench.errors import ConfigError
from specbench.sweep.urls import display_url

console = Console(stderr=True)


def _param_name(opt: Option) -> str:
    return opt.flag[2:].replace("-", "_")


def _parameter(opt: Option) -> inspect.Parameter:
    """The Typer option of one sweep option: --flag VALUE (a list: repeatable), --x/--no-x."""
    if opt.kind.cli is bool:
        info = typer.Option(f"{opt.flag}/--no-{opt.flag[2:]}", help=opt.help, show_default=False)
    else:
        info = typer.Option(opt.flag, *([opt.short] if opt.short else []), help=opt.help)
    return inspect.Parameter(_param_name(opt), inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[opt.kind.cli], info])


def _spec_values(flags: dict[str, Any]) -> dict[str, Any]:
    """{"section.key": value} of the flags (None = not given; paths as the strings a spec file holds)."""
    values = {}
    for key, opt in OPTIONS.items():
        value = flags[_param_name(opt)]
        values[key] = str(value) if isinstance(value, Path) else value
    return values


def sweep(spec_file: Optional[Path] = None, retry_failed: bool = False, **flags: Any) -> None:
    """Tune speculative decoding with Optuna: each trial is a real run; resumable, shareable
    between workers; ends in a recommended serving profile."""
    # ---- everything that can be wrong in the input fails here, before any model loads ----
    spec = sw.build_spec(sw.load_spec_file(spec_file) if spec_file is not None else None,
                         _spec_values(flags), source=spec_file)
    _check_writable(spec.study.out, "--out (the study directory)")
    _check_writable(Path(spec.profile.out).parent, f"--profile {spec.profile.out}: its directory")

    # workers of this study share the directory (each trial writes its own run directory);
    # a sweep of another study into it is refused in one line, before anything is written
    with OutLock(spec.study.out, owner=f"study {spec.study.name}", what="--out"):
        _sweep(spec, retry_failed)


def _sweep(spec: Any, retry_failed: bool) -> None:
    """The sweep, its study directory locked: measure what is left, write the profile."""
    from specbench.sweep.profile import nothing_measured

    study = _open_study(spec, retry_failed)
    done, total = sw.progress_counts(study, spec)
    if done < total:
        worker = _measure(spec, study)
        write, why = worker.should_write_profile()
    else:
        console.print("every configuration is measured: writing the profile only")
        worker, write, why = None, True, ""

    failure = nothing_measured(study)
    if failure is not None:
        console.print(f"[bold red]error:[/] {escape(failure)}")
        raise typer.Exit(1)
    prof = sw.build_profile(spec, study)
    serving: dict = {}
    if write:
        serving = sw.write_profile(spec.profile.out, prof)
        if worker is not None:
            worker.profile_written(str(spec.profile.out), len(study.trials))
    _print_results(spec, prof, written=write, why=why, serving=serving)


sweep.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("spec_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        Optional[Path], typer.Argument(help="Sweep spec (TOML), e.g. sweeps/quick-cpu.toml; flags override "
                                            "its values.", show_default=False)]),
    *(_parameter(opt) for opt in OPTIONS.values()),
    inspect.Parameter("retry_failed", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
        bool, typer.Option("--retry-failed", help="Measure again the configurations whose trials failed (they "
                                                  "are otherwise settled: a rerun skips them).")]),
])


def _check_writable(directory: Path, what: str) -> None:
    """Probe a directory the sweep will write to (creating it as the sweep would), so a bad
    --out or --profile fails in one line now, not after the first trial or the last."""
    import os
    import tempfile


    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{what} {directory}: cannot write there ({exc.strerror or exc})") from None


def _open_study(spec: Any, retry_failed: bool) -> Any:
    """Open (or create) the study, set failures aside if asked, and say where it stands."""
    from specbench.sweep import trials

    storage = sw.open_storage(spec.storage_url, heartbeat_interval=spec.study.heartbeat_interval_s,
                              grace_period=spec.study.grace_period_s, retry_s=spec.study.storage_retry_s,
                              on_event=lambda m: console.print(f"[yellow]{escape(m)}[/]"))
    study = sw.open_study(spec, storage)
    if retry_failed:
        n = trials.retry_failed(study, spec.space)
        console.print(f"--retry-failed: {n} failed configuration(s) will be measured again" if n
                      else "--retry-failed: no failed configuration to measure again")
    done, total = sw.progress_counts(study, spec)
    console.print(f"study [bold]{spec.study.name}[/] in {display_url(spec.storage_url)}: {done}/{total} "
                  f"configurations measured, {len(study.trials)} trial(s) so far; runs in {spec.study.out / 'runs'}")
    return study


def _measure(spec: Any, study: Any) -> Any:
    """Load what the trials measure with, then run trials with a progress bar; the Worker."""
    from specbench.sweep.measure import open_session

    session = open_session(spec, log=console.print)
    most = max(spec.space.concurrency)
    if most > len(session.requests):
        console.print(f"[yellow]concurrency {most} exceeds the {len(session.requests)} prompt(s): "
                      f"at most {len(session.requests)} requests are ever in flight (raise "
                      "--num-prompts)[/]")
    study.sampler = sw.make_sampler(spec, len(study.trials))
    worker = sw.Worker(study, spec.study.grace_period_s)
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            events = _RichEvents(spec, study, progress)
            sw.run_sweep(spec, session, study, spec.study.out, events, callbacks=(events.after_trial,),
                         worker=worker)
    except KeyboardInterrupt:
        done, total = sw.progress_counts(study, spec)
        console.print(f"[yellow]interrupted: {done}/{total} configurations measured; run the same "
                      "command again to resume (the interrupted trial is measured again)[/]")
        raise typer.Exit(130) from None
    return worker


class _RichEvents:
    """Progress: configurations measured / remaining and the best so far (study-wide, so other
    workers' trials count), and the requests of the trial in flight."""

    def __init__(self, spec: Any, study: Any, progress: Progress) -> None:
        self.sw, self.spec, self.progress = sw, spec, progress
        done, total = sw.progress_counts(study, spec)
        self.overall = progress.add_task(self._label(study), total=total, completed=done)
        self.requests = progress.add_task("", total=1, visible=False)
        self.count = 0

    def _label(self, study: Any) -> str:
        done, total = self.sw.progress_counts(study, self.spec)
        what = "measured or ruled out" if self.spec.study.sampler == "model" else "measured"
        return f"{what} {done}/{total}, {total - done} left · {self.sw.best_so_far(self.spec, study)}"

    def settled(self, study: Any) -> None:
        done, _ = self.sw.progress_counts(study, self.spec)
        self.progress.update(self.overall, completed=done, description=self._label(study))

    def trial_started(self, number: int, config_id: str, n_requests: int) -> None:
        self.progress.reset(self.requests, total=n_requests, visible=True,
                            description=f"  trial {number}: {config_id}")

    def request_done(self) -> None:
        self.progress.advance(self.requests)

    def note(self, message: str) -> None:
        self.progress.console.print(message, soft_wrap=True)  # one line per trial, greppable

    def after_trial(self, study: Any, trial: Any) -> None:
        from optuna.trial import TrialState

        self.count += 1
        done, total = self.sw.progress_counts(study, self.spec)
        self.progress.update(self.overall, completed=done, description=self._label(study))
        self.progress.update(self.requests, visible=False)
        attrs = trial.user_attrs
        what = attrs.get("config_id", "?")
        n_trials = self.spec.budget.n_trials
        budget = f"{self.count}/{n_trials}" if n_trials else str(self.count)
        if trial.state == TrialState.COMPLETE:
            values = ", ".join(f"{o}={v:.4g}" for o, v in zip(self.spec.objectives, trial.values))
            how = (f"same as trial {attrs['duplicate_of']}" if "duplicate_of" in attrs
                   else f"run {attrs.get('run_id')}")
            flag = "" if attrs.get("feasible", True) else " [yellow](infeasible: over the memory budget)[/]"
            self.note(f"trial {trial.number} ({budget}) {what}: {values}{flag} · {how}")
        elif trial.state == TrialState.FAIL and "fail_reason" in attrs:
            self.note(f"[yellow]trial {trial.number} ({budget}) {what} failed: "
                      f"{escape(attrs['fail_reason'])}[/]")
        if "level_batch" in attrs:  # the configurations measured with it, each its own trial
            for t in study.get_trials(deepcopy=False):
                if t.user_attrs.get("batch_of") != trial.number:
                    continue
                a = t.user_attrs
                stopped = (a.get("paired") or {}).get("stopped")
                if t.state == TrialState.COMPLETE:
                    values = ", ".join(f"{o}={v:.4g}" for o, v in zip(self.spec.objectives, t.values))
                    self.note(f"trial {t.number} (with trial {trial.number}) {a.get('config_id', '?')}: {values}"
                              + (f" · {escape(stopped)}" if stopped else ""))
                else:
                    self.note(f"[yellow]trial {t.number} (with trial {trial.number}) {a.get('config_id', '?')} "
                              f"failed: {escape(str(a.get('fail_reason')))}[/]")


def _ms(v: Any) -> str:
    return "–" if v is None else f"{v * 1e3:.1f}"


def _num(v: Any, fmt: str = ".2f") -> str:
    return "–" if v is None else format(v, fmt)


def _ci(band: dict) -> str:
    ci = band.get("tpot_speedup_ci")
    if not ci or any(v is None for v in ci):
        return "–"
    return f"{ci[0]:.3f} [{ci[1]:.3f}, {ci[2]:.3f}]"


def _print_results(spec: Any, prof: dict, written: bool, why: str, serving: dict,
                   out: Console | None = None) -> None:
    out = out or Console()
    table = Table(title=f"Best configuration per concurrency ({spec.objectives[0]})", title_justify="left")
    for col in ("conc", "profile", "best speculative", "gain", "TPOT speedup\n[95% CI]", "prompts",
                "TPOT p50 ms\nspec / base", "tok/s total\nspec / base", "run id"):
        table.add_column(col, justify="left" if col in ("profile", "best speculative", "run id") else "right")
    flagged = []
    for band in prof["bands"]:
        s, b = band["speculative"] or {}, band["baseline"] or {}
        cfg = s.get("config") or {}
        best = (f"{cfg['method']} k={cfg['num_speculative_tokens']}" if cfg else "–")
        if cfg.get("topk", 1) > 1:  # a draft tree: SGLang's topk and tokens per pass
            best += f" topk={cfg['topk']} n={cfg['num_draft_tokens']}"
        paired = s.get("paired") or {}
        prompts = f"{paired['prompts']}/{paired['planned']}" if paired.get("prompts") else "–"
        if paired.get("blocks"):  # above concurrency 1 the interval's unit
            prompts += f"\n{paired['blocks']} blocks"
        base = s.get("paired_baseline") or b
        table.add_row(str(band["measured_at_concurrency"]), band["profile"], best, _num(band["gain"], ".3f"),
                      _ci(band), prompts,
                      f"{_ms(s.get('tpot_p50_s'))} / {_ms(base.get('tpot_p50_s'))}",
                      f"{_num(s.get('output_tps'), '.1f')} / {_num(base.get('output_tps'), '.1f')}",
                      str(s.get("run_id") or b.get("run_id") or "–"))
        flagged += band.get("flagged") or []
    out.print(table)
    for f in flagged:  # impossible results: shown, never recommended
        out.print(f"[yellow]flagged: trial {f['trial']} ({escape(f['config'])}): {escape('; '.join(f['why']))}[/]")
    if "pareto_front" in prof:
        front = Table(title="Pareto front (" + " vs ".join(spec.objectives) + ")", title_justify="left")
        for col in ("trial", "configuration", *spec.objectives, "run id"):
            front.add_column(col)
        for e in prof["pareto_front"]:
            c = e["config"]
            label = "baseline" if c["method"] == "none" else f"{c['method']} k={c['num_speculative_tokens']}"
            front.add_row(str(e["trial"]), f"{label} c{c['concurrency']}",
                          *(f"{e['objective'][o]:.4g}" for o in spec.objectives), e["run_id"])
        out.print(front)
    st = prof["study"]
    skipped = st.get("skipped_by_model")
    out.print(f"trials: {st['trials']} ({st['measured']} measured, {st['reused']} reused, "
              f"{st['failed']} failed, {st['infeasible']} infeasible)"
              + (f"; {len(skipped)} configuration(s) not measured: the fitted model rules them out"
                 if skipped else ""))
    cfg = prof["speculative_config"]
    out.print(f"recommendation: [bold]{prof['recommendation']}[/]"
              + (f" {cfg}" if cfg else "") + f" — {prof['disable_by_batch_size']['why']}")
    out.print(f"profile: {spec.profile.out}" if written else f"profile: not written by this worker ({why})")
    for name, path in serving.items():
        out.print(f"  {name}: {path}")
    for note in prof.get("notes") or []:
        out.print(f"[yellow]note:[/] {escape(note)}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
