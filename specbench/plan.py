"""`specbench run` as one library call: a `RunPlan` (every flag, parsed and checked one by one)
goes in, a `RunResult` (the run directory, its metadata, the samples read back) comes out.

    result = run_plan(plan, log=console.print, progress=bars)

`run_plan` settles the configurations (defaults, the k list, with `--backend openai` what the
server runs), loads the prompts, opens the run directory before anything slow (an unwritable
--out fails in a second, and a failure before measuring leaves it as it was), has
`specbench.session` load the models and build the backend, measures with
`specbench.runner.run_plan`, and writes run.json from a `RunConfig`. Ctrl-C and SIGTERM end
it with status `interrupted`, every completed sample kept, and the exit code to leave with.

Boundary: above the runner and the session, below the command line: it neither parses flags
nor draws (messages go to `log` as rich markup, progress to a `specbench.progress.PlanProgress`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specbench.config import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_TARGET,
    DRAFTED_METHODS,
    SUFFIX_KNOBS,
    EngineConfig,
    RunConfig,
    SamplingParams,
    SpeculativeConfig,
    default_draft,
)
from specbench import runner
from specbench.errors import ConfigError, WorkloadError
from specbench.records import SAMPLES_FILE, RunMetadata, RunWriter, default_run_dir, make_run_id, read_run
from specbench.progress import PlanProgress
from specbench.runner import Configuration
from specbench import session
from specbench.interrupts import TerminateAsInterrupt
from specbench.models.fetch import named_head
from specbench.workload.conversation import next_turn
from specbench.workload.trace import TraceEntry, load_trace, trace_requests

BACKENDS = ("embedded", "hf", "openai")
Log = Callable[[str], None]


def check_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}")


@dataclass(frozen=True)
class ServerOptions:
    """--backend openai: where the server is and how to speak to it."""

    base_url: str | None
    model: str | None = None  # served model name; None: the server's only one
    api_key_env: str | None = None
    endpoint: str = "completions"  # completions | chat
    request_timeout: float = 600.0  # s
    retries: int = 0
    tokenizer: str | None = None  # tokenizer source; None: the served model's


# --trace without --concurrency: requests in flight at most, as a server's batch limit caps them
# (vLLM's max_num_seqs); the embedded engine reserves KV for every row up front, so fewer there
TRACE_CONCURRENCY = {"embedded": 16, "hf": 1, "openai": 256}


@dataclass(frozen=True)
class RunPlan:
    """Everything one `specbench run` measures, each value already checked on its own."""

    target: str = DEFAULT_TARGET
    # The method and its knobs, one SpeculativeConfig for every k of `ks`: its own
    # num_speculative_tokens is left at 0 (the k list is `ks`), its draft None until settled
    # (the default target's draft, or what an openai server runs).
    speculative: SpeculativeConfig = field(default_factory=lambda: SpeculativeConfig(method="draft_model"))
    ks: tuple[int, ...] = (DEFAULT_NUM_SPECULATIVE_TOKENS,)
    # openai: the flags describe the server's setup (checked against it); else it is read
    # from the server's model card and counters
    declared: bool = True
    baseline: bool = True  # pair every configuration with the non-speculative baseline
    workload: str = "real"
    prompt_field: str | None = None
    num_prompts: int | None = None  # None: the default for the kind of workload
    sampling: SamplingParams = field(default_factory=SamplingParams)  # the base of every request
    overrides: dict[str, Any] = field(default_factory=dict)  # sampling flags given (beat the set's)
    seed: int = 0  # prompt sampling, request seeds, interleaving order, arrivals
    concurrency: tuple[int, ...] = (1,)
    request_rate: float | None = None  # requests/s, Poisson; None = closed loop
    request_rates: tuple[float, ...] = ()  # several rates, one configuration each (beats request_rate)
    burstiness: float = 1.0  # gamma shape of the arrival gaps (1 = Poisson), vLLM's --burstiness
    # --trace: replay this arrival trace (specbench.workload.trace), `trace_speedup` times faster;
    # the workload is then the text its prompts are cut from. Concurrency (): TRACE_CONCURRENCY
    trace: Path | None = None
    trace_speedup: float = 1.0
    turns: int = 1  # --turns: replay each conversation's first this many user turns (1: single prompts)
    goodput_slos_ms: dict[str, float] | None = None  # --goodput: SLO bounds in ms (ttft, tpot, e2el)
    client_processes: int = 0  # --backend openai: worker processes sending the requests (0: this one)
    warmup: int = 1  # warm-up waves per configuration
    repeats: int = 1
    interleave: bool = True
    time_budget_s: float | None = None  # None or 0: no budget
    engine: EngineConfig = field(default_factory=EngineConfig)
    backend: str = "embedded"  # embedded | hf | openai
    server: ServerOptions | None = None  # --backend openai only
    chat_template: bool = True
    truncate: bool = False
    tool_call_parser: str = "json"  # --tool-call-parser: the form tool calls take (specbench.structured)
    out: Path | None = None  # None: runs/<run id>
    overwrite: bool = False


@dataclass
class RunResult:
    """What a run left: its directory and metadata, and the samples read back."""

    run_dir: Path
    metadata: RunMetadata
    frame: Any = None  # pandas DataFrame of the samples; None when interrupted
    interrupted_by: str | None = None  # SIGINT | SIGTERM
    exit_code: int = 0  # 130 after Ctrl-C, 143 after SIGTERM
    kept_rows: int = 0  # samples written by this run
    previous_rows: int = 0  # samples of an overwritten run still in place (interrupted early)

    @property
    def samples_path(self) -> Path:
        return self.run_dir / SAMPLES_FILE

    @property
    def config(self) -> RunConfig:
        return self.metadata.run_config


@dataclass(frozen=True)
class _Settled:
    """The configurations a plan measures, once defaults and the server have spoken."""

    target: str
    speculative: SpeculativeConfig  # the plan's, its method and draft settled (k: `ks`)
    ks: tuple[int, ...]
    baseline: bool
    specs: tuple[SpeculativeConfig, ...]  # one per k
    configs: tuple[Configuration, ...]


def _settle(plan: RunPlan, remote: Any = None, log: Log | None = None) -> _Settled:
    """The configurations of `plan`: the default draft, the k list without 0 (the baseline,
    measured anyway), one per k and concurrency. `remote`: a connected openai backend, whose
    own setup labels the records."""
    sp, ks, baseline, target = plan.speculative, plan.ks, plan.baseline, plan.target
    if remote is not None:  # the server speculates: the flags only label (and check) its setup
        got = remote.server_spec(sp.method, list(ks), sp.draft, (sp.ngram_min, sp.ngram_max),
                                 declared=plan.declared)
        sp = replace(sp, method=got.method, draft=got.draft, ngram_min=got.ngram_min, ngram_max=got.ngram_max,
                     **{k: getattr(got, k) for k in SUFFIX_KNOBS})
        ks, baseline, target = (got.num_speculative_tokens,), not got.speculative, remote.model
    if sp.method == "none" and not baseline:
        raise ConfigError("--method none with --no-baseline leaves nothing to run")
    if all(k == 0 for k in ks) and sp.method != "none":
        raise ConfigError("-k 0 is the baseline, which every run measures: give k >= 1 (e.g. -k 2,4) "
                          "or --method none for the baseline alone")
    if 0 in ks and sp.method != "none":
        if log:
            log("[yellow]note: -k 0 is the baseline, which every run measures; dropped from the k list[/]")
        ks = tuple(k for k in ks if k)
    sp = replace(sp, draft=None if sp.method == "none" else default_draft(target, sp.method, sp.draft))
    specs = tuple(sp.with_k(k) for k in ks)
    rates = plan.request_rates or (plan.request_rate,)
    configs = [c for rate in rates for c in runner.plan(specs, plan.concurrency, baseline=baseline,
                                                          request_rate=rate, burstiness=plan.burstiness,
                                                          trace=plan.trace is not None)]
    if plan.burstiness != 1.0 and plan.backend != "openai":
        raise ConfigError(f"--burstiness {plan.burstiness:g} needs --backend openai (the {plan.backend} backend "
                          "draws Poisson arrivals only); leave it at 1")
    if plan.backend == "hf" and sp.method in ("eagle3", "medusa", "suffix"):
        raise ConfigError(f"--backend hf cannot run method {sp.method} (transformers' assisted generation "
                          "has no such drafter); use --backend embedded")
    if plan.backend == "hf" and (any(c != 1 for c in plan.concurrency) or any(rates)):
        raise ConfigError("--backend hf runs one request at a time: use --concurrency 1 without "
                          "--request-rate (the embedded backend batches)")
    return _Settled(target, sp, ks, baseline, specs, tuple(configs))


def _run_config(plan: RunPlan, s: _Settled, wl: Any) -> RunConfig:
    sp = s.speculative
    return RunConfig(
        target=s.target, draft=sp.draft, method=sp.method, num_speculative_tokens=s.ks,
        ngram=(sp.ngram_min, sp.ngram_max),
        workload=wl.name, workload_kind=wl.kind, num_prompts=len(wl.prompts), sampling=dict(plan.overrides),
        seed=plan.seed, ignore_eos=plan.sampling.ignore_eos or plan.trace is not None, concurrency=plan.concurrency,
        request_rate=plan.request_rates[0] if len(plan.request_rates) == 1 else plan.request_rate,
        disable_by_batch_size=sp.disable_by_batch_size, dynamic_k=sp.dynamic_k,
        warmup=plan.warmup, repeats=plan.repeats, interleave=plan.interleave,
        time_budget_s=plan.time_budget_s or None, device=plan.engine.device, dtype=plan.engine.dtype,
        onednn=plan.engine.onednn, capture=plan.engine.capture, backend=plan.backend, baseline=s.baseline,
        chat_template=plan.chat_template, truncate=plan.truncate,
        configurations=tuple(c.config_id for c in s.configs),
        extra={k: v for k, v in (("request_rates", list(plan.request_rates) if len(plan.request_rates) > 1 else None),
                                 ("burstiness", plan.burstiness if plan.burstiness != 1.0 else None),
                                 ("goodput_slos_ms", plan.goodput_slos_ms),
                                 ("trace", {"file": str(plan.trace), "speedup": plan.trace_speedup}
                                  if plan.trace is not None else None),
                                 ("turns", plan.turns if plan.turns > 1 else None),
                                 ("tool_call_parser", plan.tool_call_parser if plan.tool_call_parser != "json" else None),
                                 ("client_processes", plan.client_processes or None))
               if v is not None})


def _open_writer(plan: RunPlan, s: _Settled, config: RunConfig) -> RunWriter:
    """The run directory, checked writable (and refused when it holds a run, unless
    --overwrite) before any model loads."""
    short = (s.specs[0].short if len(s.specs) == 1
             else f"{s.speculative.method}-k{'_'.join(map(str, s.ks))}")
    run_id = make_run_id(short)
    run_dir = plan.out if plan.out is not None else default_run_dir(run_id)
    if plan.out is not None:
        run_id = run_dir.name
    return RunWriter(run_dir, RunMetadata.collect(run_id, config), overwrite=plan.overwrite, lock=True)


def _assemble(plan: RunPlan, s: _Settled, wl: Any, remote: Any, metadata: RunMetadata,
              log: Log | None, entries: list[TraceEntry] | None) -> tuple[Any, list, list[float] | None, Any]:
    """(backend, requests, schedule, follow_up): the tokenizer or models loaded, the requests
    built (from the workload, or from a trace's `entries` with their send times), the backend
    ready to measure, and with --turns the builder of each conversation's next turn; what
    setup found goes into `metadata`."""

    def requests_of(tokenizer: Any, max_context: int | None) -> tuple[list, list[float] | None, Any]:
        def next_of(request: Any, result: Any) -> Any:
            return next_turn(request, result.output_ids, tokenizer, use_chat_template=plan.chat_template,
                             max_context=max_context)

        follow_up = next_of if plan.turns > 1 else None
        if entries is None:
            return session.tokenize(wl, tokenizer, plan.sampling, max_context=max_context, overrides=plan.overrides,
                                    chat_template=plan.chat_template, truncate=plan.truncate, log=log,
                                    turns=plan.turns, tool_call_parser=plan.tool_call_parser)[0], None, follow_up
        # the workload is the text the trace's prompts are cut from
        return (*trace_requests(entries, tokenizer, plan.sampling, wl, speedup=plan.trace_speedup, seed=plan.seed,
                                max_context=max_context, source=str(plan.trace)), None)

    if remote is not None:  # only the tokenizer: the server holds the weights
        from specbench.backends.openai import load_tokenizer

        tok = load_tokenizer(plan.server.tokenizer, remote, trust_remote_code=plan.engine.trust_remote_code)
        if log:
            log(f"tokenizer [bold]{tok.name}[/]; {remote.root} serves [bold]{remote.model}[/]")
        requests, schedule, follow_up = requests_of(tok.tokenizer, tok.max_context)
        remote.prepare(requests[0], tok.tokenizer, tok.eos_token_ids)  # probes the stream format
        metadata.note(openai=remote.describe())
        metadata.device = remote.device_name
        return remote, requests, schedule, follow_up
    sp = s.speculative
    drafted = sp.method in DRAFTED_METHODS and any(x.speculative for x in s.specs)
    sess = session.open_session(target=s.target, engine_cfg=plan.engine, workload=wl, base=plan.sampling,
                                overrides=plan.overrides, chat_template=plan.chat_template,
                                truncate=plan.truncate, log=log, requests=entries is None, turns=plan.turns,
                                tool_call_parser=plan.tool_call_parser,
                                preload=[(sp.method, sp.draft)] if drafted else [])
    draft = sp.draft if drafted else None
    if draft is not None and sp.method == "eagle3":
        from specbench.models.eagle3 import describe

        head = describe(sess.eagle3_head(draft))  # before the engine packs it
        entry = named_head(draft)
        if entry is not None:  # which release of a catalog head
            head["catalog_sha256"] = entry.sha256
        metadata.note(eagle3_head=head)
    if draft is not None and sp.method == "medusa":
        from specbench.models.medusa import check_depth
        from specbench.models.medusa import describe as describe_medusa

        check_depth(sess.medusa_heads(draft), s.specs, draft)
        metadata.note(medusa_heads=describe_medusa(sess.medusa_heads(draft)))
    if sp.method == "suffix":
        metadata.note(suffix_decoding={k: getattr(s.specs[0], k) for k in SUFFIX_KNOBS} if s.specs else {})
    if plan.backend == "embedded":
        backend = sess.backend_for(draft, sp.method, s.specs)
        metadata.note(engine=backend.describe())
    else:
        backend = sess.hf_backend(draft)
    metadata.device = backend.device_name
    metadata.note(dtype_resolved=sess.dtype_name)
    if entries is None:
        requests, schedule = sess.requests, None
        follow_up = requests_of(sess.target.tokenizer, sess.target.max_context)[2] if plan.turns > 1 else None
    else:
        requests, schedule, follow_up = requests_of(sess.target.tokenizer, sess.target.max_context)
    constrained = next((r for r in requests if r.constraint is not None), None)
    if plan.backend == "hf" and constrained is not None:
        raise ConfigError(f"--backend hf cannot decode under an output constraint (prompt {constrained.id!r} asks "
                          f"for {constrained.scenario} output): use --backend embedded or a server")
    if plan.backend == "embedded":
        backend.check_requests(requests)
    return backend, requests, schedule, follow_up


def run_plan(plan: RunPlan, *, log: Log | None = None, progress: PlanProgress | None = None) -> RunResult:
    """Measure `plan` into a run directory (see the module docstring)."""

    check_backend(plan.backend)
    remote = None
    if plan.backend == "openai":
        from specbench.backends.openai import OpenAIBackend

        if plan.server is None:
            plan = replace(plan, server=ServerOptions(None))  # connect() names the missing --base-url
        o = plan.server
        remote = OpenAIBackend.connect(o.base_url, model=o.model, api_key_env=o.api_key_env, endpoint=o.endpoint,
                                       request_timeout=o.request_timeout, retries=o.retries)
        remote.client_processes = plan.client_processes
    entries = load_trace(plan.trace)[:plan.num_prompts] if plan.trace is not None else None
    if entries is not None and not plan.concurrency:  # a trace's own load, capped as a server's batch is
        plan = replace(plan, concurrency=(min(len(entries), TRACE_CONCURRENCY[plan.backend]),))
    s = _settle(plan, remote, log)
    wl = session.load_prompts(plan.workload, prompt_field=plan.prompt_field,
                              num_prompts=None if entries is not None else plan.num_prompts, seed=plan.seed)
    broken = next((p.later_error for p in wl.prompts if p.later_error), None) if plan.turns > 1 else None
    if broken:  # a replay of later turns: refused before any model loads
        raise WorkloadError(broken)
    if entries is None and plan.num_prompts is not None and len(wl.prompts) < plan.num_prompts and log:
        log(f"[yellow]note: --num-prompts {plan.num_prompts}, but {wl.name!r} has {len(wl.prompts)} "
            f"prompt(s): running all {len(wl.prompts)}[/]")
    writer = _open_writer(plan, s, _run_config(plan, s, wl))
    try:  # until measuring starts, a failure leaves no directory behind
        backend, requests, schedule, follow_up = _assemble(plan, s, wl, remote, writer.metadata, log, entries)
    except BaseException:
        writer.abandon()
        raise
    stop = TerminateAsInterrupt()
    try:
        with stop:
            runner.run_plan(backend, requests, s.configs, run_id=writer.metadata.run_id, writer=writer,
                            warmup=plan.warmup, repeats=plan.repeats, interleave=plan.interleave,
                            seed=plan.seed, time_budget_s=plan.time_budget_s or None, progress=progress,
                            slos_ms=plan.goodput_slos_ms, schedule=schedule, follow_up=follow_up)
    except KeyboardInterrupt:
        writer.metadata.note(interrupted_by=stop.signal_name or "SIGINT")
        writer.close(complete=False)
        return RunResult(writer.run_dir, writer.metadata, interrupted_by=stop.signal_name,
                         exit_code=stop.exit_code, kept_rows=writer.num_rows, previous_rows=writer.previous_rows)
    writer.close(complete=True)
    frame, _ = read_run(writer.run_dir)
    return RunResult(writer.run_dir, writer.metadata, frame=frame, kept_rows=writer.num_rows)
