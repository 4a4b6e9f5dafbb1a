"""`specbench sweep`: tune num_speculative_tokens x concurrency x method with Optuna; every
trial is a real run; the study resumes, can be shared by several workers, and ends in a
recommended serving profile (YAML)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(stderr=True)


def _opt(help: str, *names: str) -> Any:
    return typer.Option(*names, help=help)


def sweep(
    spec_file: Annotated[Optional[Path], typer.Argument(help="Sweep spec (TOML), e.g. sweeps/quick-cpu.toml; flags override its values.", show_default=False)] = None,
    study_name: Annotated[Optional[str], _opt("Optuna study name (default: the spec file's name); also names the SQLite file and the study directory.")] = None,
    storage: Annotated[Optional[str], _opt("Study storage shared by workers: sqlite:///sweeps/x.db, postgresql://user@host/db (driver: pip install 'specbench\\[postgres]') or journal:PATH (a journal file on a shared filesystem) (default: sqlite:///sweeps/STUDY.db).")] = None,
    heartbeat_interval: Annotated[Optional[int], _opt("Seconds between heartbeats of a running trial (default: 10).")] = None,
    grace_period: Annotated[Optional[int], _opt("Seconds without a heartbeat after which a running trial counts as lost with its worker and is measured again by another (default: 60).")] = None,
    storage_retry: Annotated[Optional[float], _opt("Seconds a worker waits for a storage that stops answering before it gives up (default: 120).")] = None,
    out: Annotated[Optional[Path], _opt("Study directory: one run directory per trial under runs/, and profile.yaml (default: sweeps/studies/STUDY).")] = None,
    sampler: Annotated[Optional[str], _opt("grid (every configuration, Optuna GridSampler) | tpe | random (default: grid).")] = None,
    sampler_seed: Annotated[Optional[int], _opt("Sampler seed (grid: the same in every worker).")] = None,
    target: Annotated[Optional[str], _opt("Target model: catalog name, HF model directory or .gguf file.")] = None,
    draft: Annotated[Optional[list[str]], _opt("Draft model(s) for method draft_model; several (a,b) make the draft a search dimension.")] = None,
    head: Annotated[Optional[str], _opt("EAGLE-3 head directory for method eagle3.")] = None,
    device: Annotated[Optional[str], _opt("auto | cpu | cuda | cuda:N.")] = None,
    dtype: Annotated[Optional[str], _opt("auto | bfloat16 | float16 | float32.")] = None,
    trust_remote_code: Annotated[Optional[bool], typer.Option("--trust-remote-code/--no-trust-remote-code", help="Allow model repositories to run their own code.", show_default=False)] = None,
    workload: Annotated[Optional[str], _opt("Named prompt set, a prompt file or hf:NAME[:split] (default: real).")] = None,
    prompt_field: Annotated[Optional[str], _opt("Field holding the prompt in a user file.")] = None,
    num_prompts: Annotated[Optional[int], _opt("Seeded sample of this many prompts (default: 6 for named sets, all for files).")] = None,
    chat_template: Annotated[Optional[bool], typer.Option("--chat-template/--no-chat-template", help="Apply the target tokenizer's chat template.", show_default=False)] = None,
    truncate: Annotated[Optional[bool], typer.Option("--truncate/--no-truncate", help="Left-truncate prompts longer than the context.", show_default=False)] = None,
    warmup: Annotated[Optional[int], _opt("Warm-up requests per trial, excluded from records (default: 1).")] = None,
    max_new_tokens: Annotated[Optional[int], _opt("Tokens to generate per request (default: 64).")] = None,
    temperature: Annotated[Optional[float], _opt("Sampling temperature (0 = greedy).")] = None,
    top_p: Annotated[Optional[float], _opt("Nucleus sampling mass in (0, 1].")] = None,
    top_k: Annotated[Optional[int], _opt("Top-k sampling (0 = off).")] = None,
    seed: Annotated[Optional[int], _opt("Base seed: prompt sampling and per-request seeds.")] = None,
    ignore_eos: Annotated[Optional[bool], typer.Option("--ignore-eos/--no-ignore-eos", help="Decode exactly max-new-tokens.", show_default=False)] = None,
    method: Annotated[Optional[list[str]], _opt("Speculative methods to search: draft_model, ngram, eagle3 (the baseline is always measured).")] = None,
    num_speculative_tokens: Annotated[Optional[list[str]], typer.Option("--num-speculative-tokens", "-k", help="k values: a list (2,4,8) or a range (1..8 or 2..8:2).")] = None,
    concurrency: Annotated[Optional[list[str]], _opt("Concurrency levels (1,4,16); the baseline is measured at each.")] = None,
    objective: Annotated[Optional[list[str]], _opt("tpot_p50 | tpot_p95 | output_tps_per_user | output_tps | speedup; two or more (tpot_p95,output_tps) give a Pareto front. The first decides the profile.")] = None,
    max_peak_memory_gb: Annotated[Optional[float], _opt("Constraint: trials whose peak memory exceeds this (GiB) are recorded as infeasible.")] = None,
    n_trials: Annotated[Optional[int], _opt("Trials this process runs (default: grid = until every configuration is measured; tpe/random = 20).")] = None,
    timeout: Annotated[Optional[float], _opt("Stop starting trials after this many seconds.")] = None,
    min_speedup: Annotated[Optional[float], _opt("Speculation pays when its gain over the baseline exceeds this (default: 1.0).")] = None,
    profile: Annotated[Optional[Path], _opt("Where to write the serving profile (default: STUDY_DIR/profile.yaml).")] = None,
    server_command: Annotated[Optional[str], _opt("Server launch template, one server per trial, e.g. \"vllm serve {target} --port {port} --speculative-config '{speculative_config_json}'\"; placeholders: target, draft, method, k, num_speculative_tokens, k_plus_1, port, speculative_config_json, python, dtype.")] = None,
    server_baseline_command: Annotated[Optional[str], _opt("Launch template for the baseline (no speculation) trials (default: --server-command).")] = None,
    server_base_url: Annotated[Optional[str], _opt("The launched server's URL (default: http://127.0.0.1:{port}).")] = None,
    server_ready_timeout: Annotated[Optional[float], _opt("Seconds to wait for a launched server's /health and /v1/models (default: 600).")] = None,
    endpoint: Annotated[Optional[str], _opt("With --server-command: completions | chat (default: completions).")] = None,
    tokenizer: Annotated[Optional[str], _opt("With --server-command: the tokenizer to build requests with (default: --target); no weights load locally.")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Measure again the configurations whose trials failed (they are otherwise settled: a rerun skips them).")] = False,
) -> None:
    """Tune speculative decoding with Optuna: each trial is a real run; resumable, shareable
    between workers; ends in a recommended serving profile."""
    from specbench import sweep as sw

    flags = {
        "study.name": study_name, "study.storage": storage, "study.out": str(out) if out else None,
        "study.sampler": sampler, "study.seed": sampler_seed,
        "study.heartbeat_interval_s": heartbeat_interval, "study.grace_period_s": grace_period,
        "study.storage_retry_s": storage_retry, "models.target": target,
        "models.draft": draft, "models.head": head, "models.device": device, "models.dtype": dtype,
        "models.trust_remote_code": trust_remote_code, "workload.source": workload,
        "workload.prompt_field": prompt_field, "workload.num_prompts": num_prompts,
        "workload.chat_template": chat_template, "workload.truncate": truncate,
        "workload.warmup": warmup, "sampling.max_new_tokens": max_new_tokens,
        "sampling.temperature": temperature, "sampling.top_p": top_p, "sampling.top_k": top_k,
        "sampling.seed": seed, "sampling.ignore_eos": ignore_eos, "space.method": method,
        "space.num_speculative_tokens": num_speculative_tokens, "space.concurrency": concurrency,
        "objective.name": objective, "objective.max_peak_memory_gb": max_peak_memory_gb,
        "budget.n_trials": n_trials, "budget.timeout_s": timeout,
        "profile.out": str(profile) if profile else None, "profile.min_speedup": min_speedup,
        "server.command": server_command, "server.baseline_command": server_baseline_command,
        "server.base_url": server_base_url, "server.ready_timeout_s": server_ready_timeout,
        "server.endpoint": endpoint, "server.tokenizer": tokenizer,
    }
    # ---- everything that can be wrong in the input fails here, before any model loads ----
    file_values = sw.load_spec_file(spec_file) if spec_file is not None else None
    spec = sw.build_spec(file_values, flags, source=spec_file)
    storage_obj = sw.open_storage(spec.storage_url, heartbeat_interval=spec.heartbeat_interval_s,
                                  grace_period=spec.grace_period_s, retry_s=spec.storage_retry_s,
                                  on_event=lambda m: console.print(f"[yellow]{escape(m)}[/]"))
    study = sw.open_study(spec, storage_obj)
    if retry_failed:
        n = sw.study.retry_failed(study)
        console.print(f"--retry-failed: {n} failed configuration(s) will be measured again" if n
                      else "--retry-failed: no failed configuration to measure again")
    url = sw.study.display_url(spec.storage_url)
    done, total = sw.progress_counts(study, spec)
    console.print(f"study [bold]{spec.study_name}[/] in {url}: {done}/{total} configurations "
                  f"measured, {len(study.trials)} trial(s) so far; runs in {spec.out / 'runs'}")

    if done < total and spec.server is not None:  # one launched server per trial
        from specbench.sweep.server import open_server_session

        session: Any = open_server_session(spec, log=console.print)
    elif done < total:
        from specbench.config import EngineConfig
        from specbench.session import open_session, sampling_base

        session = open_session(
            target=spec.target,
            engine_cfg=EngineConfig(device=spec.device, dtype=spec.dtype,
                                    trust_remote_code=spec.trust_remote_code),
            workload=spec.workload,
            base=sampling_base(seed=spec.seed, ignore_eos=spec.ignore_eos, overrides=spec.sampling),
            overrides=spec.sampling, prompt_field=spec.prompt_field, num_prompts=spec.num_prompts,
            seed=spec.seed, chat_template=spec.chat_template, truncate=spec.truncate,
            log=console.print)
    if done < total:
        most = max(spec.space.concurrency)
        if most > len(session.requests):
            console.print(f"[yellow]concurrency {most} exceeds the {len(session.requests)} prompt(s): "
                          f"at most {len(session.requests)} requests are ever in flight (raise "
                          "--num-prompts)[/]")
        study.sampler = sw.make_sampler(spec, len(study.trials))
        worker = sw.Worker(study, spec.grace_period_s)
        try:
            _optimize(sw, spec, session, study, worker)
        except KeyboardInterrupt:
            done, total = sw.progress_counts(study, spec)
            console.print(f"[yellow]interrupted: {done}/{total} configurations measured; run the same "
                          "command again to resume (the interrupted trial is measured again)[/]")
            raise typer.Exit(130)
        write, why = worker.should_write_profile()
    else:
        console.print("every configuration is measured: writing the profile only")
        write, why, worker = True, "", None

    if not sw.profile.candidates(study):
        failed = [t for t in study.get_trials(deepcopy=False) if "fail_reason" in t.user_attrs]
        first = f" (first: trial {failed[0].number}: {failed[0].user_attrs['fail_reason']})" if failed else ""
        console.print(f"[bold red]error:[/] no configuration was measured: {len(failed)} trial(s) failed{escape(first)}; "
                      f"no profile written. Fix the cause, then rerun with --retry-failed")
        raise typer.Exit(1)
    prof = sw.build_profile(spec, study)
    serving: dict = {}
    if write:
        serving = sw.write_profile(spec.profile, prof)
        if worker is not None:
            worker.profile_written(str(spec.profile), len(study.trials))
    _print_results(sw, spec, study, prof, written=write, why=why, serving=serving)


class _RichEvents:
    """Progress: configurations measured / remaining and the best so far (study-wide, so other
    workers' trials count), and the requests of the trial in flight."""

    def __init__(self, sw: Any, spec: Any, study: Any, progress: Progress) -> None:
        self.sw, self.spec, self.progress = sw, spec, progress
        done, total = sw.progress_counts(study, spec)
        self.overall = progress.add_task(self._label(study), total=total, completed=done)
        self.requests = progress.add_task("", total=1, visible=False)
        self.started = time.perf_counter()
        self.count = 0

    def _label(self, study: Any) -> str:
        done, total = self.sw.progress_counts(study, self.spec)
        return f"measured {done}/{total}, {total - done} left · {self.sw.best_so_far(self.spec, study)}"

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
        budget = f"{self.count}/{self.spec.n_trials}" if self.spec.n_trials else str(self.count)
        if trial.state == TrialState.COMPLETE:
            values = ", ".join(f"{o}={v:.4g}" for o, v in zip(self.spec.objectives, trial.values))
            how = (f"same as trial {attrs['duplicate_of']}" if "duplicate_of" in attrs
                   else f"run {attrs.get('run_id')}")
            flag = "" if attrs.get("feasible", True) else " [yellow](infeasible: over the memory budget)[/]"
            self.note(f"trial {trial.number} ({budget}) {what}: {values}{flag} · {how}")
        elif trial.state == TrialState.FAIL and "fail_reason" in attrs:
            self.note(f"[yellow]trial {trial.number} ({budget}) {what} failed: "
                      f"{escape(attrs['fail_reason'])}[/]")


def _optimize(sw: Any, spec: Any, session: Any, study: Any, worker: Any) -> None:
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        events = _RichEvents(sw, spec, study, progress)
        sw.run_sweep(spec, session, study, spec.out, events, callbacks=(events.after_trial,),
                     worker=worker)


def _ms(v: Any) -> str:
    return "–" if v is None else f"{v * 1e3:.1f}"


def _num(v: Any, fmt: str = ".2f") -> str:
    return "–" if v is None else format(v, fmt)


def _print_results(sw: Any, spec: Any, study: Any, prof: dict, written: bool = True, serving: dict | None = None,
                   why: str = "") -> None:
    out = Console()
    table = Table(title=f"Best configuration per concurrency ({spec.objectives[0]})", title_justify="left")
    for col in ("conc", "profile", "best speculative", "gain", "TPOT p50 ms\nspec / base",
                "tok/s total\nspec / base", "speedup\nTPOT / tok/s", "run id"):
        table.add_column(col, justify="left" if col in ("profile", "best speculative", "run id") else "right")
    for band in prof["bands"]:
        s, b = band["speculative"] or {}, band["baseline"] or {}
        cfg = s.get("config") or {}
        best = (f"{cfg['method']} k={cfg['num_speculative_tokens']}" if cfg else "–")
        table.add_row(str(band["measured_at_concurrency"]), band["profile"], best, _num(band["gain"], ".3f"),
                      f"{_ms(s.get('tpot_p50_s'))} / {_ms(b.get('tpot_p50_s'))}",
                      f"{_num(s.get('output_tps'), '.1f')} / {_num(b.get('output_tps'), '.1f')}",
                      f"{_num(s.get('speedup_tpot_p50'))} / {_num(s.get('speedup_output_tps'))}",
                      str(s.get("run_id") or b.get("run_id") or "–"))
    out.print(table)
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
    out.print(f"trials: {st['trials']} ({st['measured']} measured, {st['reused']} reused, "
              f"{st['failed']} failed, {st['infeasible']} infeasible)")
    cfg = prof["speculative_config"]
    out.print(f"recommendation: [bold]{prof['recommendation']}[/]"
              + (f" {cfg}" if cfg else "") + f" — {prof['disable_by_batch_size']['why']}")
    out.print(f"profile: {spec.profile}" if written else f"profile: not written by this worker ({why})")
    for name, path in (serving or {}).items():
        out.print(f"  {name}: {path}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)

