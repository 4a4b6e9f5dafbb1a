"""Every option of a sweep spec, declared once.

A sweep spec has sections (`[study]`, `[models]`, ...; `SECTIONS`), each a frozen dataclass
whose fields are its keys. A field's `option(...)` metadata is everything about that option:
the CLI flag, the types a TOML value may have (`Kind`), the help text, the default, and the
bounds a value must keep. From these come

- the TOML schema: valid sections and keys, and each value's type (`check_type`, used by
  `specbench.sweep.specfile` with file:line and by `build_spec`);
- the flag named next to a key in every message (`label`, `OPTIONS[key].flag`);
- the Typer options of `specbench sweep` (`specbench.cli.sweep` builds them from `OPTIONS`);
- a section's values, merged from file and flags, with defaults and bounds applied
  (`section`).

Rules that join several options (the search space, the objectives, the server templates,
the grace period against the heartbeat) and the validation that `SamplingParams` and
`EngineConfig` already own live in `specbench.sweep.spec`. Boundary: declarations and
single-value checks only; nothing here imports Optuna, Typer or torch.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench import limits
from specbench.config import METHODS
from specbench.errors import ConfigError
from specbench.flags import HELP
from specbench.session import DEFAULT_MAX_NEW_TOKENS, DEFAULT_TARGET, sampling_base

# the methods a sweep searches: medusa needs its heads' directory, which a sweep has no option
# for (models.head is the EAGLE-3 head's), so it is refused (spec._space)
SPECULATIVE_METHODS = tuple(m for m in METHODS if m not in ("none", "medusa"))
SAMPLERS = ("grid", "tpe", "random", "model")
DEFAULT_SWEEPS_DIR = Path("sweeps")
DEFAULT_N_TRIALS = 20  # model-based samplers; grid runs until the grid is measured
DEFAULT_HEARTBEAT_S = 10  # a running trial records a heartbeat this often (Optuna's interval)
DEFAULT_GRACE_S = 60  # a running trial without a heartbeat this long is failed, measured again
DEFAULT_STORAGE_RETRY_S = 120.0  # how long a storage call waits for an unreachable database
DEFAULT_WORKLOAD = "real"
DEFAULT_MIN_SPEEDUP = 1.0
# placeholders a [server] command may use (filled per trial, see specbench.sweep.server)
SERVER_PLACEHOLDERS = ("target", "draft", "method", "k", "num_speculative_tokens", "k_plus_1",
                       "topk", "num_draft_tokens", "port", "speculative_config_json", "python", "dtype")
DEFAULT_SERVER_BASE_URL = "http://127.0.0.1:{port}"
DEFAULT_READY_TIMEOUT_S = 600.0
ENDPOINTS = ("completions", "chat")
# How a server sweep pairs a speculative trial with the baseline (see specbench.sweep.server):
# alternate launches of the two servers block by block ([server] blocks), both servers up at once
# with ABBA blocks between them, or (none) a baseline trial measured at another time.
SERVER_PAIRINGS = ("alternate", "together", "none")


@dataclass(frozen=True)
class Objective:
    name: str
    column: str  # the summary (or speedup) column it reads, see specbench.analysis
    direction: str  # minimize | maximize
    label: str


OBJECTIVES = {o.name: o for o in (
    Objective("tpot_p50", "tpot_p50_s", "minimize", "TPOT p50 (s)"),
    Objective("tpot_p95", "tpot_p95_s", "minimize", "TPOT p95 (s)"),
    Objective("output_tps_per_user", "output_tps_per_user", "maximize", "output tok/s per user"),
    Objective("output_tps", "output_tps", "maximize", "total output tok/s"),
    # TPOT p50 of the baseline at the same concurrency / this configuration's (> 1 = faster)
    Objective("speedup", "tpot_p50_speedup", "maximize", "TPOT p50 speedup vs baseline"),
    # requests meeting every [objective] goodput SLO per second of the configuration's own
    # measuring time (vLLM's goodput; needs the SLOs)
    Objective("goodput", "goodput_rps", "maximize", "goodput (req/s meeting every SLO)"),
)}


@dataclass(frozen=True)
class Kind:
    """What a value may be: in a TOML file (`toml`, named `what` in errors) and on the command
    line (`cli`, the Typer type; lists are repeatable flags, each item may hold a,b,c)."""

    toml: tuple[type, ...]
    what: str
    cli: Any


STRING = Kind((str,), "a string", str)
PATH = Kind((str,), "a path", str)  # where the sweep writes (a Path once the spec is built; typed as
# str on the command line, where Typer would make an empty value Path(".") before any check)
PATH_AS_GIVEN = Kind((str,), "a path", str)  # kept as typed: the study's setup records it
INTEGER = Kind((int,), "an integer", int)
NUMBER = Kind((int, float), "a number", float)
SWITCH = Kind((bool,), "true or false", bool)  # --x/--no-x
NAMES = Kind((str, list), "a string or a list", list[str])
INTEGERS = Kind((int, list), "an integer or a list", list[str])
K_VALUES = Kind((int, list, dict, str), "an integer, a list or a range {low, high, step}", list[str])

_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class Option:
    """One option. `key` is `section.field`; `bound` (op, limit) is checked on a given value
    after `convert`, and the message shows the value formatted with `fmt`."""

    flag: str
    kind: Kind
    help: str
    short: str | None = None  # a one-letter alias (-k)
    bound: tuple[str, float] | None = None
    unit: str = ""  # after the limit in messages (" s")
    fmt: str = ""
    convert: Callable[[Any], Any] | None = None
    key: str = ""  # set from the section and field names

    @property
    def label(self) -> str:
        return f"{self.key} ({self.flag})"


def option(flag: str, kind: Kind, help: str, default: Any = None, **rules: Any) -> Any:
    """A section field that is a sweep option (see `Option`)."""
    return dataclasses.field(default=default, metadata={"option": Option(flag, kind, help, **rules)})


# --------------------------------------------------------------------------------------
# The sections, in the order a spec file lists them. Built by `build_spec`, an instance holds
# the values a sweep runs with (defaults filled in, study.out and profile.out as Paths).


@dataclass(frozen=True)
class StudyOptions:
    name: str | None = option(
        "--study-name", STRING,
        "Optuna study name (default: the spec file's name); also names the SQLite file and the study directory.")
    storage: str | None = option(
        "--storage", STRING,
        "Study storage shared by workers: sqlite:///sweeps/x.db, postgresql://user@host/db (driver: pip install "
        "'specbench\\[postgres]') or journal:PATH (a journal file on a shared filesystem) "
        "(default: sqlite:///sweeps/STUDY.db).")
    out: Path | None = option(
        "--out", PATH,
        "Study directory: one run directory per trial under runs/, and profile.yaml (default: sweeps/studies/STUDY).")
    sampler: str = option(
        "--sampler", STRING,
        "grid (every configuration, Optuna GridSampler) | tpe | random | model (corners first, then the point "
        "the fitted speedup model is least sure of; skips points it rules out) "
        f"(default: {SAMPLERS[0]}).", SAMPLERS[0])
    seed: int = option("--sampler-seed", INTEGER, "Sampler seed (grid: the same in every worker).", 0)
    heartbeat_interval_s: int = option(
        "--heartbeat-interval", INTEGER,
        f"Seconds between heartbeats of a running trial (default: {DEFAULT_HEARTBEAT_S}).", DEFAULT_HEARTBEAT_S,
        bound=(">=", 1), unit=" s")
    grace_period_s: int = option(
        "--grace-period", INTEGER,
        "Seconds without a heartbeat after which a running trial counts as lost with its worker and is measured "
        f"again by another (default: {DEFAULT_GRACE_S}).", DEFAULT_GRACE_S)
    storage_retry_s: float = option(
        "--storage-retry", NUMBER,
        "Seconds a worker waits for a storage that stops answering before it gives up "
        f"(default: {DEFAULT_STORAGE_RETRY_S:g}).", DEFAULT_STORAGE_RETRY_S,
        convert=float, bound=(">=", 0), unit=" s", fmt="g")


@dataclass(frozen=True)
class ModelsOptions:
    target: str = option("--target", STRING, HELP["target"], DEFAULT_TARGET)
    draft: Any = option(
        "--draft", NAMES,
        "Draft model(s) for method draft_model; several (a,b) make the draft a search dimension.")
    head: str | None = option("--head", PATH_AS_GIVEN, "EAGLE-3 head directory or catalog head for method eagle3 (default: the catalog's head of the default target).")
    device: str = option("--device", STRING, HELP["device"], "auto")
    dtype: str = option("--dtype", STRING, HELP["dtype"], "auto")
    onednn: str = option("--onednn", STRING, HELP["onednn"], "auto")
    capture: str = option("--capture", STRING, HELP["capture"], "auto")
    trust_remote_code: bool = option("--trust-remote-code", SWITCH, HELP["trust_remote_code"], False)


@dataclass(frozen=True)
class WorkloadOptions:
    source: str = option("--workload", STRING,
                         f"Named prompt set, a prompt file or hf:NAME[:split] (default: {DEFAULT_WORKLOAD}).",
                         DEFAULT_WORKLOAD)
    prompt_field: str | None = option("--prompt-field", STRING, "Field holding the prompt in a user file.")
    num_prompts: int | None = option(  # None = 6 for named sets, all for files
        "--num-prompts", INTEGER, "Seeded sample of this many prompts (default: 6 for named sets, all for files).",
        bound=(">=", 1))
    chat_template: bool = option("--chat-template", SWITCH, "Apply the target tokenizer's chat template.", True)
    truncate: bool = option("--truncate", SWITCH, "Left-truncate prompts longer than the context.", False)
    tool_call_parser: str = option(
        "--tool-call-parser", STRING,
        "The form a named or required tool_choice constrains tool calls to, as vLLM's --tool-call-parser: json, "
        "hermes (<tool_call> blocks) or llama3_json ({\"name\", \"parameters\"} objects), vLLM 0.32's structural "
        "tags, which also constrain an auto choice with a strict tool; give the servers' own (default: json).", "json")
    warmup: int = option("--warmup", INTEGER, "Warm-up requests per trial, excluded from records (default: 1).",
                         1, bound=(">=", 0))


@dataclass(frozen=True)
class SamplingOptions:
    """None = not given: `SamplingParams`' default (64 new tokens), and not part of `overrides`."""

    max_new_tokens: int | None = option(
        "--max-new-tokens", INTEGER, f"Tokens to generate per request (default: {DEFAULT_MAX_NEW_TOKENS}).")
    temperature: float | None = option("--temperature", NUMBER, "Sampling temperature (0 = greedy).")
    top_p: float | None = option("--top-p", NUMBER, "Nucleus sampling mass in (0, 1].")
    top_k: int | None = option("--top-k", INTEGER, "Top-k sampling (0 = off).")
    seed: int = option("--seed", INTEGER, "Base seed: prompt sampling and per-request seeds.", 0)
    ignore_eos: bool = option("--ignore-eos", SWITCH, "Decode exactly max-new-tokens.", False)

    @property
    def overrides(self) -> dict[str, Any]:
        """The values given explicitly (a study's setup and run.json record exactly these)."""
        return {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")
                if getattr(self, k) is not None}

    def params(self) -> Any:
        """The base `SamplingParams` of every request (validated there)."""
        return sampling_base(seed=self.seed, ignore_eos=self.ignore_eos, overrides=self.overrides)


@dataclass(frozen=True)
class SpaceOptions:
    method: Any = option(
        "--method", NAMES,
        f"Speculative methods to search: {', '.join(SPECULATIVE_METHODS)} (the baseline is always measured).",
        ("draft_model",))
    num_speculative_tokens: Any = option(
        "--num-speculative-tokens", K_VALUES, "k values: a list (2,4,8) or a range (1..8 or 2..8:2).", (4,),
        short="-k")
    concurrency: Any = option("--concurrency", INTEGERS,
                              "Concurrency levels (1,4,16); the baseline is measured at each.", (1,))
    topk: Any = option(
        "--topk", INTEGERS,
        "Draft-tree widths to search: children per node (1 = a chain; 1,2,4 searches chains and trees; "
        "draft_model, eagle3 and medusa only; SGLang's --speculative-eagle-topk).", (1,))
    num_draft_tokens: Any = option(
        "--num-draft-tokens", INTEGERS,
        "Tree sizes to search for topk > 1: tokens each target pass verifies, the root included "
        "(SGLang's --speculative-num-draft-tokens; default 1 + k * topk).", ())


@dataclass(frozen=True)
class ObjectiveOptions:
    name: Any = option(
        "--objective", NAMES,
        f"{' | '.join(OBJECTIVES)}; two or more (tpot_p95,output_tps) give a Pareto front. The first "
        "decides the profile.", ("speedup",))
    max_peak_memory_gb: float | None = option(
        "--max-peak-memory-gb", NUMBER,
        "Constraint: trials whose peak memory exceeds this (GiB) are recorded as infeasible.", bound=(">", 0))
    goodput: Any = option(
        "--goodput", NAMES,
        "SLOs in ms, vLLM's --goodput: ttft:MS tpot:MS e2el:MS. Every trial's records say which samples "
        "met them all, and the goodput objective is requests meeting them per second.")


@dataclass(frozen=True)
class BudgetOptions:
    n_trials: int | None = option(  # None (grid): until every configuration is measured
        "--n-trials", INTEGER,
        "Trials this process runs (default: grid = until every configuration is measured; tpe/random = "
        f"{DEFAULT_N_TRIALS}).", bound=(">=", 1))
    timeout_s: float | None = option("--timeout", NUMBER, "Stop starting trials after this many seconds.",
                                     bound=(">", 0), unit=" s")
    sequential: bool = option(
        "--sequential", SWITCH,
        "Stop measuring a configuration as soon as its paired speedup interval (group-sequential, "
        "error spent over the planned prompts) lies wholly above --min-speedup or below 1; "
        "--no-sequential measures every prompt.", True)
    batch: str | None = option(
        "--batch", STRING,
        "level: measure every configuration of a concurrency level still to measure in one run, in "
        "rotation with ONE baseline (each leaves the rotation once its interval decides) | trial: each "
        "speculative trial measures its own baseline (ABBA) (default: level for embedded sweeps with the "
        "grid or model sampler, else trial; server sweeps: trial only).")


@dataclass(frozen=True)
class ProfileOptions:
    out: Path | None = option("--profile", PATH,
                              "Where to write the serving profile (default: STUDY_DIR/profile.yaml).")
    min_speedup: float = option(
        "--min-speedup", NUMBER,
        f"Speculation pays when its gain over the baseline exceeds this (default: {DEFAULT_MIN_SPEEDUP}).",
        DEFAULT_MIN_SPEEDUP, convert=float, bound=(">", 0))


@dataclass(frozen=True)
class ServerOptions:
    """`[server]`: start one server per trial from `command` (a launcher template) and measure
    through the openai backend; `baseline_command` (default: `command`) serves the baseline."""

    command: str | None = option(
        "--server-command", STRING,
        "Server launch template, one server per trial, e.g. \"vllm serve {target} --port {port} "
        "--speculative-config '{speculative_config_json}'\"; placeholders: "
        f"{', '.join(SERVER_PLACEHOLDERS)}.")
    baseline_command: str | None = option(
        "--server-baseline-command", STRING,
        "Launch template for the baseline (no speculation) trials (default: --server-command).")
    base_url: str = option("--server-base-url", STRING,
                           f"The launched server's URL (default: {DEFAULT_SERVER_BASE_URL}).",
                           DEFAULT_SERVER_BASE_URL)
    ready_timeout_s: float = option(
        "--server-ready-timeout", NUMBER,
        f"Seconds to wait for a launched server's /health and /v1/models (default: {DEFAULT_READY_TIMEOUT_S:g}).",
        DEFAULT_READY_TIMEOUT_S, convert=float, bound=(">", 0), unit=" s", fmt="g")
    endpoint: str = option("--endpoint", STRING,
                           f"With --server-command: {' | '.join(ENDPOINTS)} (default: {ENDPOINTS[0]}).",
                           ENDPOINTS[0])
    tokenizer: str | None = option(  # default: the target
        "--tokenizer", STRING,
        "With --server-command: the tokenizer to build requests with (default: --target); no weights load locally.")
    pairing: str = option(
        "--server-pairing", STRING,
        "How a speculative trial is paired in time with the baseline: alternate (its server and a baseline "
        "server launched in turn block by block, A | B B | A A | B B | A for --server-blocks 4) | together (both servers up at "
        "once, ABBA blocks between them: only where both fit, e.g. GPU memory) | none (compared with the "
        f"baseline trial, measured at another time) (default: {SERVER_PAIRINGS[0]}).", SERVER_PAIRINGS[0])
    blocks: int = option(
        "--server-blocks", INTEGER,
        "With --server-pairing alternate: blocks of prompts per trial, the servers launched in turn block by "
        "block (4: A | B B | A A | B B | A, five launches). The paired interval counts blocks, not prompts, "
        "as independent (a burst of load or a slow launch moves a whole block), so 2 blocks leave it one "
        "degree of freedom and it seldom decides; each block beyond costs a launch (default: 4).", 4,
        bound=(">=", 2))

    def template(self, baseline: bool) -> str:
        return (self.baseline_command or self.command) if baseline else self.command


SECTIONS: dict[str, type] = {
    "study": StudyOptions, "models": ModelsOptions, "workload": WorkloadOptions,
    "sampling": SamplingOptions, "space": SpaceOptions, "objective": ObjectiveOptions,
    "budget": BudgetOptions, "profile": ProfileOptions, "server": ServerOptions,
}


def _options() -> dict[str, Option]:
    out = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            out[key] = dataclasses.replace(f.metadata["option"], key=key)
    return out


OPTIONS: dict[str, Option] = _options()  # "section.key" -> Option, in spec order


def label(key: str) -> str:
    """How messages name an option: `section.key (--flag)`."""
    return OPTIONS[key].label


def keys(section: str) -> list[str]:
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def check_type(key: str, value: Any, where: str) -> None:
    """A spec-file value of the wrong type (or a non-finite number) is a one-line error."""
    kind = OPTIONS[key].kind
    ok = isinstance(value, kind.toml) and not (isinstance(value, bool) and bool not in kind.toml)
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        raise ConfigError(f"{where}{label(key)} must be {kind.what}, got {value!r}")


def section(cls: type, values: dict[str, Any], where: str) -> Any:
    """An instance of section `cls` from merged values ({"section.key": value}, None = not
    given): defaults for what is not given, each given value converted and held to its
    bounds."""
    name = next(s for s, c in SECTIONS.items() if c is cls)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        opt: Option = f.metadata["option"]
        value = values.get(f"{name}.{f.name}")
        if value is None:
            continue
        if opt.convert is not None:
            value = opt.convert(value)
        if opt.bound is not None:
            op, limit = opt.bound
            if not _BOUNDS[op](value, limit):
                raise ConfigError(f"{where}{label(f'{name}.{f.name}')} must be {op} {limit:g}{opt.unit}, "
                                  f"got {value:{opt.fmt}}")
        if opt.kind in (INTEGER, NUMBER):  # type and both ends from the one table of bounds
            value = limits.check(opt.flag, value, command="sweep", where=where, label=label(f"{name}.{f.name}"))
        given[f.name] = value
    return cls(**given)
