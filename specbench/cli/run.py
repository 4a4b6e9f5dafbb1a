"""`specbench run`: run prompt sets through a backend at each configuration, paired with the
non-speculative baseline, and write one Parquet row per sample.

The command only parses: flags become a `specbench.plan.RunPlan` (each flag checked on its
own, before anything slow), `specbench.plan.run_plan` measures it, and the records it wrote are
shown as tables. Defaults live in `specbench.config`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specbench.config import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_TARGET,
    EngineConfig,
    SpeculativeConfig,
    finite,
    parse_int_list,
    parse_speculative_config,
)
from specbench.errors import ConfigError
from specbench.flags import HELP
from specbench.progress import PlanProgress
from specbench.session import sampling_base
from specbench.structured import TOOL_CALL_PARSERS
from specbench.config import split_list
from specbench import limits
from specbench import analysis

# Measuring time of the built-in default run (`specbench run`, no workload/size flags): with
# model loading and warm-up it stays within the README's "about 5 minutes" on 2 cores, also in
# float32 where a 1.5B pass costs twice as much.
DEFAULT_RUN_BUDGET_S = 240.0
# Flags whose presence makes a run other than the built-in default one (which has a budget).
_SIZE_FLAGS = ("workload", "num_prompts", "concurrency", "num_speculative_tokens", "max_new_tokens", "trace")

console = Console(stderr=True)


@dataclass(frozen=True)
class RunFlags:
    """`specbench run`'s options as parsed, by parameter name and type (the command's
    signature holds their help and defaults; building this from the command's parameters
    fails at once if the two ever differ)."""

    target: str
    draft: Optional[str]
    method: str
    num_speculative_tokens: Optional[list[str]]
    speculative_config: Optional[str]
    workload: str
    prompt_field: Optional[str]
    num_prompts: Optional[int]
    max_new_tokens: Optional[int]
    temperature: Optional[float]
    top_p: Optional[float]
    top_k: Optional[int]
    seed: int
    ignore_eos: bool
    concurrency: Optional[list[str]]
    request_rate: Optional[list[str]]
    burstiness: float
    trace: Optional[str]
    trace_speedup: float
    turns: int
    goodput: Optional[list[str]]
    client_processes: int
    disable_by_batch_size: Optional[int]
    dynamic_k: bool
    topk: int
    num_draft_tokens: Optional[int]
    warmup: int
    time_budget: Optional[float]
    repeats: int
    interleave: bool
    device: str
    dtype: str
    onednn: str
    capture: str
    backend: str
    base_url: Optional[str]
    model: Optional[str]
    api_key_env: Optional[str]
    endpoint: str
    request_timeout: float
    retries: int
    tokenizer: Optional[str]
    out: Optional[str]
    overwrite: bool
    baseline: bool
    chat_template: bool
    truncate: bool
    tool_call_parser: str
    trust_remote_code: bool


def run(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(help=HELP["target"])] = DEFAULT_TARGET,
    draft: Annotated[Optional[str], typer.Option(help="Draft model for method draft_model (default: the catalog's 0.5B when the target is the default); for method eagle3, the EAGLE-3 head's directory (speculators or original EAGLE-3 format) or a catalog head (default: the catalog's head when the target is the default); for method medusa, the Medusa heads' directory (vLLM or FasterDecoding layout).")] = None,
    method: Annotated[str, typer.Option(help="Speculative method: none | draft_model | ngram | eagle3 | medusa | suffix (suffix decoding's knobs: --speculative-config).")] = "draft_model",
    num_speculative_tokens: Annotated[Optional[list[str]], typer.Option("--num-speculative-tokens", "-k", help="Draft tokens per step; a list (1,2,4) runs one configuration each.")] = None,
    speculative_config: Annotated[Optional[str], typer.Option(help=HELP["speculative_config"])] = None,
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
    request_rate: Annotated[Optional[list[str]], typer.Option(help="Open loop: Poisson arrivals at this many requests/s (seeded by --seed), capped by --concurrency; a list (1,2,4) runs one configuration each.")] = None,
    burstiness: Annotated[float, typer.Option(help="openai, with --request-rate: gamma arrival gaps of this shape, mean 1/rate (vLLM's --burstiness: 1 = Poisson, below 1 burstier).")] = 1.0,
    trace: Annotated[Optional[str], typer.Option(help="Replay an arrival trace: Mooncake/AIPerf JSONL, one request a line (timestamp ms, input_length, output_length, optional hash_ids: 512-token prefix blocks, equal ids shared). Prompts are cut from --workload's text to the lengths given; outputs run to output_length (EOS ignored); --concurrency caps requests in flight (default: 16 embedded, 256 openai, as a server's batch limit).")] = None,
    trace_speedup: Annotated[float, typer.Option(help="With --trace: replay this many times faster (2 = twice the arrival rate).")] = 1.0,
    turns: Annotated[int, typer.Option(help="Replay conversations (ShareGPT, Spec-Bench/MT-bench turns, chat files): up to this many user turns each, every turn sent with the history and this configuration's own earlier answers; records carry conversation_id and turn (1 = first turns only).")] = 1,
    goodput: Annotated[Optional[list[str]], typer.Option(help="SLOs in ms, vLLM's --goodput: ttft:MS tpot:MS e2el:MS (repeat the flag or join with commas); records say which samples met them all, the console the goodput in requests/s.")] = None,
    client_processes: Annotated[int, typer.Option(help="openai: worker processes sending the requests, each with its own event loop, one arrival schedule (0 = this process).")] = 0,
    disable_by_batch_size: Annotated[Optional[int], typer.Option(help="Switch speculation off while more than this many requests are in flight.")] = None,
    dynamic_k: Annotated[bool, typer.Option(help="Per request, grow k by 2 after a fully accepted step and shrink it by 1 otherwise (max = k).")] = False,
    topk: Annotated[int, typer.Option(help="Draft trees (draft_model, eagle3, medusa): children expanded per node, SGLang's --speculative-eagle-topk; -k is then the tree's depth (1 = a chain).")] = 1,
    num_draft_tokens: Annotated[Optional[int], typer.Option(help="Draft trees: tokens each row verifies per step, the root included (SGLang's --speculative-num-draft-tokens; default 1 + k * topk).")] = None,
    warmup: Annotated[int, typer.Option(help="Warm-up waves per configuration (each: --concurrency short requests at that concurrency), excluded from records.")] = 1,
    time_budget: Annotated[Optional[float], typer.Option(help="Stop starting new prompts after this many seconds of measuring; every configuration keeps the same prompts (default: 240 for the built-in default run, none otherwise; 0 = none).")] = None,
    repeats: Annotated[int, typer.Option(help="Measure every prompt this many times per configuration; the speedup CI then covers run-to-run noise too.")] = 1,
    interleave: Annotated[bool, typer.Option("--interleave/--no-interleave", help="Alternate configurations request by request (blocks of one wave above concurrency 1) in ABBA order, so a drifting machine hits all alike.")] = True,
    device: Annotated[str, typer.Option(help=HELP["device"])] = "auto",
    dtype: Annotated[str, typer.Option(help=HELP["dtype"])] = "auto",
    onednn: Annotated[str, typer.Option("--onednn", help=HELP["onednn"])] = "auto",
    capture: Annotated[str, typer.Option("--capture", help=HELP["capture"])] = "auto",
    backend: Annotated[str, typer.Option(help="embedded (specbench's engine) | hf (transformers generate(), the reference) | openai (an OpenAI-compatible server: vLLM, SGLang, specbench serve).")] = "embedded",
    base_url: Annotated[Optional[str], typer.Option(help="openai: server URL, e.g. http://127.0.0.1:8000 (with or without /v1).")] = None,
    model: Annotated[Optional[str], typer.Option(help="openai: served model name (default: the server's only model).")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(help="openai: environment variable holding the API key (sent as a Bearer token).")] = None,
    endpoint: Annotated[str, typer.Option(help="openai: completions (prompt token ids) | chat (messages).")] = "completions",
    request_timeout: Annotated[float, typer.Option(help="openai: seconds before a request counts as failed.")] = 600.0,
    retries: Annotated[int, typer.Option(help="openai: retries of a failed request (429/5xx, timeout, dropped stream).")] = 0,
    tokenizer: Annotated[Optional[str], typer.Option(help="openai: tokenizer source, catalog name or HF directory (default: --target if given, else the served model).")] = None,
    out: Annotated[Optional[str], typer.Option(help="Run directory (default runs/<timestamp>-<config>).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the records in an existing run directory.")] = False,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Pair each configuration with the non-speculative baseline.")] = True,
    chat_template: Annotated[bool, typer.Option("--chat-template/--no-chat-template", help="Apply the target tokenizer's chat template.")] = True,
    truncate: Annotated[bool, typer.Option(help="Left-truncate prompts longer than the context instead of skipping them.")] = False,
    tool_call_parser: Annotated[str, typer.Option(help="The form a named or required tool_choice constrains tool calls to, as vLLM's --tool-call-parser does: json (the arguments, or an array of {name, parameters}), hermes (<tool_call> blocks, vLLM 0.32's structural tag; Qwen2.5, Hermes) or llama3_json ({name, parameters} objects, xgrammar's llama tag; Llama 3.x); under the last two also an auto choice with a strict tool (calls amid free text). Give the server's own parser with --backend openai: outputs are checked in its form.")] = "json",
    trust_remote_code: Annotated[bool, typer.Option(help=HELP["trust_remote_code"])] = False,
) -> None:
    """Run a prompt set through the engine, paired with the baseline; write per-sample Parquet."""
    from specbench.plan import run_plan

    flags = RunFlags(**ctx.params)
    given = {p for p in ctx.params if getattr(ctx.get_parameter_source(p), "name", "DEFAULT") != "DEFAULT"}
    result = run_plan(build_plan(flags, given), log=console.print, progress=ProgressBars())
    if result.interrupted_by is not None:
        _say_interrupted(result)
        raise typer.Exit(result.exit_code)
    print_summary(result)


def build_plan(f: RunFlags, given: set[str]) -> Any:
    """`specbench run`'s flags (by parameter name) as a `RunPlan`, each checked on its own;
    `given`: the flags set on the command line (not defaulted)."""
    from specbench.plan import RunPlan, ServerOptions, check_backend

    check_backend(f.backend)
    if f.out is not None and not str(f.out).strip():
        raise ConfigError("--out is empty: give a run directory, or leave --out out for runs/<timestamp>-<config>")
    if f.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {f.warmup}")
    if f.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {f.repeats}")
    if f.num_prompts is not None and f.num_prompts < 1:
        raise ConfigError(f"--num-prompts must be >= 1, got {f.num_prompts}")
    if f.tool_call_parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {f.tool_call_parser!r}")
    engine = EngineConfig(device=f.device, dtype=f.dtype, trust_remote_code=f.trust_remote_code,
                          onednn=f.onednn, capture=f.capture)
    speculative, ks, declared = _speculation(f, given)
    server = None
    openai_flags = (f.base_url, f.model, f.api_key_env, f.tokenizer)
    if f.backend == "openai":
        server = ServerOptions(f.base_url, model=f.model, api_key_env=f.api_key_env, endpoint=f.endpoint,
                               request_timeout=f.request_timeout, retries=f.retries,
                               tokenizer=f.tokenizer or (f.target if "target" in given else None))
    elif any(openai_flags) or given & {"endpoint", "retries", "request_timeout"}:
        named = [flag for flag, name in (("--base-url", "base_url"), ("--model", "model"),
                                         ("--api-key-env", "api_key_env"), ("--tokenizer", "tokenizer"),
                                         ("--endpoint", "endpoint"), ("--retries", "retries"),
                                         ("--request-timeout", "request_timeout"))
                 if getattr(f, name) is not None and (name not in ("endpoint", "retries", "request_timeout") or name in given)]
        verb = "needs" if len(named) == 1 else "need"
        raise ConfigError(f"{', '.join(named)} {verb} --backend openai (the {f.backend} backend "
                          "sends no HTTP requests)")
    rates = tuple(_parse_rates(f.request_rate))
    trace = _trace_flags(f, given, rates)
    if f.burstiness != 1.0 and not rates:
        raise ConfigError("--burstiness shapes open-loop arrivals: it needs --request-rate")
    if f.client_processes and f.backend != "openai":
        raise ConfigError("--client-processes needs --backend openai")
    from specbench.analysis.serving import parse_goodput
    slos = parse_goodput(f.goodput)
    if server is None:  # the openai backend checks its own timeout
        finite("--request-timeout", f.request_timeout, above=0.0)
    time_budget = finite("--time-budget", f.time_budget, minimum=0.0)
    if time_budget is None and f.backend == "embedded" and not given & set(_SIZE_FLAGS):
        time_budget = DEFAULT_RUN_BUDGET_S  # the built-in default run finishes in about 5 minutes
    overrides = {k: getattr(f, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens") if getattr(f, k) is not None}
    sampling = sampling_base(seed=f.seed, ignore_eos=f.ignore_eos, overrides=overrides)
    return RunPlan(
        target=f.target, speculative=speculative, ks=ks, declared=declared, baseline=f.baseline, workload=f.workload,
        prompt_field=f.prompt_field, num_prompts=f.num_prompts, sampling=sampling, overrides=overrides,
        seed=f.seed, concurrency=tuple(parse_int_list(f.concurrency, "--concurrency") or ([] if trace else [1])),
        trace=trace, trace_speedup=f.trace_speedup, turns=_turns(f.turns, trace),
        request_rate=None, request_rates=rates, burstiness=f.burstiness, goodput_slos_ms=slos,
        client_processes=f.client_processes, warmup=f.warmup, repeats=f.repeats, interleave=f.interleave,
        time_budget_s=time_budget, engine=engine, backend=f.backend, server=server,
        chat_template=f.chat_template, truncate=f.truncate, tool_call_parser=f.tool_call_parser,
        out=Path(f.out) if f.out is not None else None, overwrite=f.overwrite)


def _trace_flags(f: RunFlags, given: set[str], rates: tuple[float, ...]) -> Path | None:
    """--trace's file, with the flags that go with it checked: a trace fixes arrivals and
    output lengths, so --request-rate, --burstiness and --max-new-tokens cannot be given too."""
    if f.trace is None:
        if "trace_speedup" in given:
            raise ConfigError("--trace-speedup scales a replayed trace: it needs --trace")
        return None
    finite("--trace-speedup", f.trace_speedup, above=0.0)
    clash = [flag for flag, name in (("--request-rate", "request_rate"), ("--burstiness", "burstiness"),
                                     ("--max-new-tokens", "max_new_tokens")) if name in given]
    if clash or rates:
        raise ConfigError(f"--trace sets the arrivals and output lengths: drop {', '.join(clash or ['--request-rate'])}")
    return Path(f.trace)


def _turns(turns: int, trace: Path | None) -> int:
    if turns > 1 and trace is not None:
        raise ConfigError("--turns replays conversations, --trace single requests: give one of them")
    return turns


def _parse_rates(values: Any) -> list[float]:
    """`--request-rate 1,2 --request-rate 4` -> [1.0, 2.0, 4.0]; one line for a non-number. A
    rate given twice (5,5 or 5,5.0) counts once, as every list flag's values do."""

    out = []
    for part in split_list(values or [], "--request-rate"):
        try:
            rate = float(part)
        except ValueError:
            raise ConfigError(f"--request-rate: {part!r} is not a number of requests/s (e.g. --request-rate 1,2,4)") from None
        out.append(limits.check("--request-rate", rate))
    return list(dict.fromkeys(out))


def _speculation(f: RunFlags, given: set[str]) -> tuple[SpeculativeConfig, tuple[int, ...], bool]:
    """--method/-k/--draft and the knobs, or --speculative-config in their place: (the method
    and its knobs as one SpeculativeConfig, k left at 0; the k list; whether the flags declare
    an openai server's setup)."""
    if f.speculative_config is not None and not f.speculative_config.strip():
        raise ConfigError("--speculative-config is empty: give a JSON object, e.g. "
                          "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}', or leave it out")
    ks = parse_int_list(f.num_speculative_tokens, "--num-speculative-tokens") or [DEFAULT_NUM_SPECULATIVE_TOKENS]
    declared = bool(f.speculative_config or f.num_speculative_tokens or f.draft or "method" in given)
    if not f.speculative_config and f.method == "none":
        knobs = [flag for flag, name in (("--draft", "draft"), ("--dynamic-k", "dynamic_k"),
                                         ("--disable-by-batch-size", "disable_by_batch_size"), ("--topk", "topk"),
                                         ("--num-draft-tokens", "num_draft_tokens"))
                 if name in given and getattr(f, name) not in (None, False)]
        if knobs:
            raise ConfigError(f"{', '.join(knobs)} {'tunes' if len(knobs) == 1 else 'tune'} speculation, which "
                              "--method none (the baseline alone) does not run: leave "
                              f"{'it' if len(knobs) == 1 else 'them'} out or pick a speculative method")
    if not f.speculative_config:
        spec = SpeculativeConfig.for_method(f.method, 0, f.draft,
                                            disable_by_batch_size=f.disable_by_batch_size,
                                            dynamic_k=f.dynamic_k, topk=f.topk,
                                            num_draft_tokens=f.num_draft_tokens)
        return spec, tuple(ks), declared
    parsed = parse_speculative_config(f.speculative_config)
    spec = replace(parsed, num_speculative_tokens=0, draft=parsed.draft or f.draft,
                   disable_by_batch_size=parsed.disable_by_batch_size or f.disable_by_batch_size,
                   dynamic_k=parsed.dynamic_k or f.dynamic_k)
    return spec, (parsed.num_speculative_tokens,), declared


class ProgressBars(PlanProgress):
    """One rich bar per configuration, with its tokens/s over its own measuring time."""

    def __init__(self) -> None:
        self.bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[tps]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                             console=console)
        self.tasks: dict[str, Any] = {}
        self.current: Any = None  # the configuration measuring now (None in a warm-up)
        self.since = 0.0
        self.tokens: dict[str, int] = {}
        self.busy: dict[str, float] = {}  # measuring seconds per configuration

    def start(self, configs, per_config: int) -> None:
        self.bars.start()
        self.tasks = {c.config_id: self.bars.add_task(c.config_id, total=per_config, tps="") for c in configs}

    def block(self, config, phase: str) -> None:
        now = time.perf_counter()
        if self.current is not None:
            cid = self.current.config_id
            self.busy[cid] = self.busy.get(cid, 0.0) + now - self.since
        self.current, self.since = (config, now) if phase == "run" else (None, now)
        label = f"{config.config_id} (warm-up)" if phase == "warm-up" else config.config_id
        self.bars.update(self.tasks[config.config_id], description=label)

    def result(self, request, result) -> None:
        if self.current is None:
            return
        cid = self.current.config_id
        self.tokens[cid] = self.tokens.get(cid, 0) + len(result.output_ids)
        elapsed = self.busy.get(cid, 0.0) + time.perf_counter() - self.since
        self.bars.update(self.tasks[cid], advance=1, tps=f"{self.tokens[cid] / max(elapsed, 1e-9):.1f} tok/s")

    def stop(self) -> None:
        self.bars.stop()


def _say_interrupted(result: Any) -> None:
    how = f"interrupted ({result.interrupted_by})"
    if result.kept_rows:
        console.print(f"[yellow]{how}: {result.kept_rows} completed sample(s) kept in {result.samples_path}[/]")
    elif result.previous_rows:
        console.print(f"[yellow]{how} before any sample completed: {result.samples_path} still holds the "
                      f"previous run ({result.previous_rows} samples)[/]")
    else:
        console.print(f"[yellow]{how} before any sample completed: nothing written[/]")


def print_summary(result: Any) -> None:
    """The run's records as the console shows them: the summary table, bursts, where
    speculation pays, greedy mismatches, server acceptance and the time budget."""
    df, cfg = result.frame, result.config
    summary = analysis.summarize(df)
    # Piped output (CI logs, files) would wrap the tables at 80 columns.
    out = Console() if sys.stdout.isatty() else Console(width=150)
    stats = dict(cfg.configuration_stats)
    out.print(analysis.rich_summary_table(summary, analysis.speedups(summary), stats))
    for line in analysis.burst_lines(summary):
        out.print(line)
    from specbench.analysis.scenarios import has_scenarios, invalid_lines, rich_scenario_table
    from specbench.analysis.turns import has_turns, rich_turn_table
    if has_scenarios(df):
        out.print(rich_scenario_table(df))
    if has_turns(df):
        out.print(rich_turn_table(df))
    for line in invalid_lines(df):
        out.print(line)
    greedy_diff = df[(~df["is_baseline"]) & (df["temperature"] == 0) & df["token_match_rate"].notna()
                     & (df["token_match_rate"] < 1.0)]
    if len(greedy_diff):
        why = ("reduced-precision verification of several tokens at once can flip near-ties"
               if cfg.dtype_resolved in ("bfloat16", "float16")
               else "in float32 this points at a bug: please report it")
        out.print(f"[yellow]{len(greedy_diff)} greedy speculative sample(s) differ from the baseline "
                  f"output ({why}; see token_match_rate / first_divergence)[/]")
    for line in analysis.where_speculation_pays(analysis.speedup_verdicts(df)):
        out.print(line)
    if cfg.backend == "openai":
        from specbench.backends.openai import acceptance_lines, lag_lines
        for line in acceptance_lines(stats) + lag_lines(stats):
            out.print(line)
    from specbench.analysis.serving import serving_lines
    for line in serving_lines(df, stats, cfg.extra.get("goodput_slos_ms")):
        out.print(line)
    stopped = [st["stopped_by_budget"] for st in stats.values() if isinstance(st, dict) and "stopped_by_budget" in st]
    if stopped:
        first = stopped[0]
        out.print(f"[yellow]time budget ({first['time_budget_s']:g} s) reached: {first['measured']} of "
                  f"{first['planned']} prompt(s) measured per configuration (the same ones for each); "
                  "--time-budget 0 measures them all[/]")
    if cfg.ignore_eos:
        out.print(f"[yellow]{IGNORE_EOS_BIAS}[/]")
    out.print(f"records: {result.samples_path}  ({len(df)} samples)")


# what forcing lengths does to acceptance (the report says it in its header)
IGNORE_EOS_BIAS = ("--ignore-eos forced every output to max_new_tokens: acceptance past where the model would "
                   "stop (EOS) differs from that of EOS-terminated outputs, which production sees; read acceptance "
                   "and speedup as a forced-length figure")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
