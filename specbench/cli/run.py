"""`specbench run`: run prompt sets through a backend at each configuration, paired with the
non-speculative baseline, and write one Parquet row per sample."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig, finite, parse_speculative_config
from specbench.errors import ConfigError
from specbench.interrupts import TerminateAsInterrupt

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
BACKENDS = ("embedded", "hf", "openai")
# Measuring time of the built-in default run (`specbench run`, no workload/size flags): with
# model loading and warm-up it stays within the README's "about 5 minutes" on 2 cores, also in
# float32 where a 1.5B pass costs twice as much.
DEFAULT_RUN_BUDGET_S = 240.0

console = Console(stderr=True)


def parse_int_list(values: list[str] | None, flag: str) -> list[int] | None:
    """`-k 2,4 -k 8` -> [2, 4, 8]; one clear line for anything else."""
    if not values:
        return None
    out: list[int] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise ConfigError(f"{flag}: {part!r} is not an integer (use e.g. {flag} 1,2,4)") from None
    return out


def run(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(help="Target model: catalog name, HF model directory or .gguf file.")] = DEFAULT_TARGET,
    draft: Annotated[Optional[str], typer.Option(help="Draft model for method draft_model (default: the catalog's 0.5B when the target is the default); for method eagle3, the EAGLE-3 head's directory (speculators or original EAGLE-3 format).")] = None,
    method: Annotated[str, typer.Option(help="Speculative method: none | draft_model | ngram | eagle3.")] = "draft_model",
    num_speculative_tokens: Annotated[Optional[list[str]], typer.Option("--num-speculative-tokens", "-k", help="Draft tokens per step; a list (1,2,4) runs one configuration each.")] = None,
    speculative_config: Annotated[Optional[str], typer.Option(help="vLLM-style JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'. Overrides --method/-k/--draft.")] = None,
    workload: Annotated[str, typer.Option(help="Named prompt set (see `specbench workloads list`), a .jsonl/.json/.parquet/.csv file, or hf:NAME[:split].")] = "real",
    prompt_field: Annotated[Optional[str], typer.Option(help="Field holding the prompt in a user file.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Seeded sample of this many prompts (default: 6 for named sets, all for files).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Tokens to generate per request.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (0 = greedy).")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling mass in (0, 1].")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Top-k sampling (0 = off).")] = None,
    seed: Annotated[int, typer.Option(help="Base seed: prompt sampling and per-request seeds.")] = 0,
    ignore_eos: Annotated[bool, typer.Option(help="Decode exactly max-new-tokens, ignoring EOS.")] = False,
    concurrency: Annotated[Optional[list[str]], typer.Option(help="Maximum requests in flight (closed loop); a list (1,4,16) runs each.")] = None,
    request_rate: Annotated[Optional[float], typer.Option(help="Open loop: Poisson arrivals at this many requests/s (seeded by --seed), capped by --concurrency.")] = None,
    disable_by_batch_size: Annotated[Optional[int], typer.Option(help="Switch speculation off while more than this many requests are in flight.")] = None,
    dynamic_k: Annotated[bool, typer.Option(help="Per request, grow k by 2 after a fully accepted step and shrink it by 1 otherwise (max = k).")] = False,
    warmup: Annotated[int, typer.Option(help="Warm-up waves per configuration (each: --concurrency short requests at that concurrency), excluded from records.")] = 1,
    time_budget: Annotated[Optional[float], typer.Option(help="Stop starting new prompts after this many seconds of measuring; every configuration keeps the same prompts (default: 240 for the built-in default run, none otherwise; 0 = none).")] = None,
    repeats: Annotated[int, typer.Option(help="Measure every prompt this many times per configuration; the speedup CI then covers run-to-run noise too.")] = 1,
    interleave: Annotated[bool, typer.Option("--interleave/--no-interleave", help="Alternate configurations request by request (blocks of 2 waves above concurrency 1) in ABBA order, so a drifting machine hits all alike.")] = True,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto | bfloat16 | float16 | float32 (auto = bf16 on CUDA and on CPUs with avx512_bf16).")] = "auto",
    compile: Annotated[str, typer.Option("--compile", help="The engine's fast forward path: off (transformers' forward as loaded) | auto (where it applies: CPU linears prepacked for oneDNN) | on (or an error saying why not).")] = "auto",
    backend: Annotated[str, typer.Option(help="embedded (specbench's engine) | hf (transformers generate(), the reference) | openai (an OpenAI-compatible server: vLLM, SGLang, specbench serve).")] = "embedded",
    base_url: Annotated[Optional[str], typer.Option(help="openai: server URL, e.g. http://127.0.0.1:8000 (with or without /v1).")] = None,
    model: Annotated[Optional[str], typer.Option(help="openai: served model name (default: the server's only model).")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(help="openai: environment variable holding the API key (sent as a Bearer token).")] = None,
    endpoint: Annotated[str, typer.Option(help="openai: completions (prompt token ids) | chat (messages).")] = "completions",
    request_timeout: Annotated[float, typer.Option(help="openai: seconds before a request counts as failed.")] = 600.0,
    retries: Annotated[int, typer.Option(help="openai: retries of a failed request (429/5xx, timeout, dropped stream).")] = 0,
    tokenizer: Annotated[Optional[str], typer.Option(help="openai: tokenizer source, catalog name or HF directory (default: --target if given, else the served model).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default runs/<timestamp>-<config>).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the records in an existing run directory.")] = False,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Pair each configuration with the non-speculative baseline.")] = True,
    chat_template: Annotated[bool, typer.Option("--chat-template/--no-chat-template", help="Apply the target tokenizer's chat template.")] = True,
    truncate: Annotated[bool, typer.Option(help="Left-truncate prompts longer than the context instead of skipping them.")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model repositories to run their own code.")] = False,
) -> None:
    """Run a prompt set through the engine, paired with the baseline; write per-sample Parquet."""
    from specbench import analysis
    from specbench.records import RunMetadata, RunWriter, default_run_dir, make_run_id
    from specbench.runner import PlanProgress, plan, run_plan

    # ---- validate every flag before anything slow happens -------------------------------
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    if num_prompts is not None and num_prompts < 1:
        raise ConfigError(f"--num-prompts must be >= 1, got {num_prompts}")
    engine_cfg = EngineConfig(device=device, dtype=dtype, trust_remote_code=trust_remote_code, compile=compile)
    ks = parse_int_list(num_speculative_tokens, "--num-speculative-tokens") or [4]
    if speculative_config:
        parsed = parse_speculative_config(speculative_config)
        method, ks, draft = parsed.method, [parsed.num_speculative_tokens], parsed.draft or draft
        ngram = (parsed.ngram_min, parsed.ngram_max)
    else:
        ngram = (1, 4)
    oa = None
    if backend == "openai":  # the server speculates: --method/-k/--draft only label its setup
        from specbench.backends.openai import OpenAIBackend
        oa = OpenAIBackend.connect(base_url, model=model, api_key_env=api_key_env, endpoint=endpoint,
                                   request_timeout=request_timeout, retries=retries)
        given = {p: getattr(ctx.get_parameter_source(p), "name", "DEFAULT") != "DEFAULT" for p in ("target", "method")}
        server_spec = oa.server_spec(method, ks, draft, ngram, declared=bool(
            speculative_config or num_speculative_tokens or draft or given["method"]))
        method, ks, draft = server_spec.method, [server_spec.num_speculative_tokens], server_spec.draft
        ngram, baseline = (server_spec.ngram_min, server_spec.ngram_max), not server_spec.speculative
        tokenizer_source, target = tokenizer or (target if given["target"] else None), oa.model
    elif base_url or model or api_key_env or tokenizer:
        raise ConfigError("--base-url, --model, --api-key-env and --tokenizer need --backend openai")
    if method == "none" and not baseline:
        raise ConfigError("--method none with --no-baseline leaves nothing to run")
    if method == "draft_model" and draft is None and target == DEFAULT_TARGET:
        draft = DEFAULT_DRAFT
    if method == "none":
        draft = None  # the baseline drafts nothing
    finite("--request-rate", request_rate, above=0.0)  # inf = all at once: leave --request-rate out
    finite("--request-timeout", request_timeout, above=0.0)
    finite("--time-budget", time_budget, minimum=0.0)
    if all(k == 0 for k in ks) and method != "none":
        raise ConfigError("-k 0 is the baseline, which every run measures: give k >= 1 (e.g. -k 2,4) "
                          "or --method none for the baseline alone")
    if 0 in ks:
        console.print("[yellow]note: -k 0 is the baseline, which every run measures; dropped from the k list[/]")
        ks = [k for k in ks if k]
    knobs = {"disable_by_batch_size": disable_by_batch_size, "dynamic_k": dynamic_k}
    if speculative_config:
        knobs = {"disable_by_batch_size": parsed.disable_by_batch_size or disable_by_batch_size,
                 "dynamic_k": parsed.dynamic_k or dynamic_k,
                 "draft_confidence_threshold": parsed.draft_confidence_threshold}
    specs = [SpeculativeConfig(method=method, num_speculative_tokens=k,
                               draft=draft if method in ("draft_model", "eagle3") else None,
                               ngram_min=ngram[0], ngram_max=ngram[1], **knobs) for k in ks]
    if method == "ngram" and draft is not None:
        raise ConfigError("--draft cannot be used with method 'ngram' (prompt lookup needs no model)")
    overrides = {k: v for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                                   ("max_new_tokens", max_new_tokens)) if v is not None}
    base = SamplingParams(seed=seed, ignore_eos=ignore_eos,
                          **{k: v for k, v in overrides.items()})
    if "max_new_tokens" not in overrides:
        base = base.with_(max_new_tokens=64)
    concurrencies = parse_int_list(concurrency, "--concurrency") or [1]
    configs = plan(specs, concurrencies, baseline=baseline, request_rate=request_rate)
    if backend == "hf" and method == "eagle3":
        raise ConfigError("--backend hf cannot run method eagle3 (transformers' assisted generation has no "
                          "EAGLE-3 heads); use --backend embedded")
    if backend == "hf" and (any(c != 1 for c in concurrencies) or request_rate):
        raise ConfigError("--backend hf runs one request at a time: use --concurrency 1 without "
                          "--request-rate (the embedded backend batches)")

    from specbench.workload import build_requests, load_workload

    wl = load_workload(workload, prompt_field=prompt_field,
                       num_prompts=num_prompts if num_prompts is not None else (
                           6 if not Path(workload).suffix and not workload.startswith("hf:") else None),
                       seed=seed)
    if num_prompts is not None and len(wl.prompts) < num_prompts:
        console.print(f"[yellow]note: --num-prompts {num_prompts}, but {wl.name!r} has {len(wl.prompts)} "
                      f"prompt(s): running all {len(wl.prompts)}[/]")
    if time_budget is None and backend == "embedded" and not any(
            getattr(ctx.get_parameter_source(p), "name", "DEFAULT") != "DEFAULT"
            for p in ("workload", "num_prompts", "concurrency", "num_speculative_tokens", "max_new_tokens")):
        time_budget = DEFAULT_RUN_BUDGET_S  # the built-in default run finishes in about 5 minutes
    run_cfg = {
        "time_budget_s": time_budget or None,
        "target": target, "draft": draft, "method": method, "num_speculative_tokens": ks,
        "ngram": list(ngram), "workload": wl.name, "workload_kind": wl.kind,
        "num_prompts": len(wl.prompts), "sampling": overrides, "seed": seed,
        "ignore_eos": ignore_eos, "concurrency": concurrencies, "request_rate": request_rate,
        "disable_by_batch_size": knobs["disable_by_batch_size"], "dynamic_k": knobs["dynamic_k"], "warmup": warmup,
        "repeats": repeats, "interleave": interleave,
        "device": device, "dtype": dtype, "compile": compile, "backend": backend, "baseline": baseline,
        "chat_template": chat_template, "truncate": truncate,
        "configurations": [c.config_id for c in configs],
    }
    short = specs[0].short if len(specs) == 1 else f"{method}-k{'_'.join(map(str, ks))}"
    run_id = make_run_id(short)
    run_dir = out if out is not None else default_run_dir(run_id)
    if out is not None:
        run_id = run_dir.name
    metadata = RunMetadata.collect(run_id, run_cfg)
    writer = RunWriter(run_dir, metadata, overwrite=overwrite)  # refuses an existing dir early

    try:  # until measuring starts, a failure leaves no directory behind
        # ---- models -------------------------------------------------------------------------
        from specbench.models.loading import check_same_tokenizer, load_model

        t0 = time.perf_counter()
        drf = head = None
        if oa is not None:  # only the tokenizer: the server holds the weights
            from specbench.backends.openai import load_tokenizer
            tgt = load_tokenizer(tokenizer_source, oa, trust_remote_code=trust_remote_code)
            console.print(f"tokenizer [bold]{tgt.name}[/]; {oa.root} serves [bold]{oa.model}[/]")
        else:
            console.print(f"loading target [bold]{target}[/]")
            tgt = load_model(target, engine_cfg)
            if any(s.method == "draft_model" and s.speculative for s in specs):
                console.print(f"loading draft [bold]{draft}[/]")
                drf = load_model(draft, engine_cfg)
                check_same_tokenizer(tgt, drf)
            if any(s.method == "eagle3" and s.speculative for s in specs):
                from specbench.models.eagle3 import describe, load_head
                console.print(f"loading EAGLE-3 head [bold]{escape(str(draft))}[/]")
                head = load_head(draft, tgt.model, target_name=tgt.name)
                metadata.config["eagle3_head"] = describe(head)
            console.print(f"models ready in {time.perf_counter() - t0:.1f} s on {tgt.device} ({str(tgt.dtype).replace('torch.', '')})")

        requests, skipped = build_requests(wl, tgt.tokenizer, base, use_chat_template=chat_template,
                                           max_context=tgt.max_context, truncate=truncate,
                                           overrides=overrides)
        if skipped:
            console.print(f"[yellow]skipped {skipped} prompt(s) longer than the context of {tgt.max_context} tokens (use --truncate to keep them)[/]")

        if backend == "embedded":
            from specbench.backends.embedded import EmbeddedBackend
            be = EmbeddedBackend(tgt, drf, head=head, pack=engine_cfg.pack)
            metadata.config["engine"] = be.describe()
        elif oa is not None:
            be = oa
            be.prepare(requests[0], tgt.tokenizer, tgt.eos_token_ids)  # probes the stream format
            metadata.config["openai"] = be.describe()
        else:
            from specbench.backends.hf import HFBackend
            be = HFBackend(tgt, drf)
        metadata.device = be.device_name
        if oa is None:
            metadata.config["dtype_resolved"] = str(tgt.dtype).replace("torch.", "")
    except BaseException:
        writer.abandon()
        raise

    # ---- run ----------------------------------------------------------------------------
    completed = False
    stop = TerminateAsInterrupt()
    try:
        with stop, Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[tps]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=console) as progress:
            tasks = {c.config_id: progress.add_task(c.config_id, total=len(requests) * repeats, tps="")
                     for c in configs}
            current: list = [None, 0.0]  # the configuration running, and since when
            tokens: dict[str, int] = {}
            busy: dict[str, float] = {}

            def on_block(cfg, phase):
                now = time.perf_counter()
                if current[0] is not None:
                    busy[current[0].config_id] = busy.get(current[0].config_id, 0.0) + now - current[1]
                current[0], current[1] = (cfg, now) if phase == "run" else (None, now)
                label = f"{cfg.config_id} (warm-up)" if phase == "warm-up" else cfg.config_id
                progress.update(tasks[cfg.config_id], description=label)

            def tick(req, res):
                cfg = current[0]
                if cfg is None:
                    return
                cid = cfg.config_id
                tokens[cid] = tokens.get(cid, 0) + len(res.output_ids)
                elapsed = busy.get(cid, 0.0) + time.perf_counter() - current[1]
                progress.update(tasks[cid], advance=1, tps=f"{tokens[cid] / max(elapsed, 1e-9):.1f} tok/s")

            run_plan(be, requests, configs, run_id=run_id, writer=writer, warmup=warmup, repeats=repeats,
                     interleave=interleave, seed=seed, time_budget_s=time_budget or None, on_result=tick,
                     progress=PlanProgress(on_block=on_block))
        completed = True
    except KeyboardInterrupt:
        metadata.config["interrupted_by"] = stop.signal_name or "SIGINT"
        writer.close(complete=False)
        if writer.num_rows:
            console.print(f"[yellow]interrupted ({stop.signal_name}): {writer.num_rows} completed sample(s) "
                          f"kept in {writer.samples_path}[/]")
        elif writer.previous_rows:
            console.print(f"[yellow]interrupted ({stop.signal_name}) before any sample completed: "
                          f"{writer.samples_path} still holds the previous run ({writer.previous_rows} samples)[/]")
        else:
            console.print(f"[yellow]interrupted ({stop.signal_name}) before any sample completed: nothing written[/]")
        raise typer.Exit(stop.exit_code)
    finally:
        if completed:
            writer.close(complete=True)

    # ---- summary ------------------------------------------------------------------------
    from specbench.records import read_run

    df, _ = read_run(run_dir)
    summary = analysis.summarize(df)
    # Piped output (CI logs, files) would wrap the tables at 80 columns.
    out_console = Console() if sys.stdout.isatty() else Console(width=150)
    speedups = analysis.speedups(summary)
    stats = metadata.config.get("configuration_stats", {})
    out_console.print(analysis.rich_summary_table(summary, speedups, stats))
    for line in analysis.burst_lines(summary):
        out_console.print(line)
    greedy_diff = df[(~df["is_baseline"]) & (df["temperature"] == 0) & df["token_match_rate"].notna()
                     & (df["token_match_rate"] < 1.0)]
    if len(greedy_diff):
        why = ("reduced-precision verification of several tokens at once can flip near-ties"
               if metadata.config.get("dtype_resolved") in ("bfloat16", "float16")
               else "in float32 this points at a bug: please report it")
        out_console.print(f"[yellow]{len(greedy_diff)} greedy speculative sample(s) differ from the baseline "
                          f"output ({why}; see token_match_rate / first_divergence)[/]")
    for line in analysis.where_speculation_pays(analysis.speedup_verdicts(df)):
        out_console.print(line)
    if oa is not None:
        from specbench.backends.openai import acceptance_lines
        for line in acceptance_lines(stats):
            out_console.print(line)
    stopped = {cid: st["stopped_by_budget"] for cid, st in metadata.config.get("configuration_stats", {}).items()
               if isinstance(st, dict) and "stopped_by_budget" in st}
    if stopped:
        first = next(iter(stopped.values()))
        out_console.print(f"[yellow]time budget ({first['time_budget_s']:g} s) reached: "
                          f"{first['measured']} of {first['planned']} prompt(s) measured per configuration "
                          "(the same ones for each); --time-budget 0 measures them all[/]")
    out_console.print(f"records: {writer.samples_path}  ({len(df)} samples)")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
