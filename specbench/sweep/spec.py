"""The sweep specification: what `specbench sweep` runs, from a spec file and flags.

`build_spec()` merges spec-file values (`specbench.sweep.specfile`) with flags (flags win),
validates every key and value and returns a frozen `SweepSpec`. Everything a user can get
wrong is a one-line `ConfigError` raised before any model loads or any storage opens:
wrong type, out-of-range value, empty search space, unknown objective, method or sampler,
a server template with an unknown placeholder.

Each option is declared once, in `specbench.sweep.options`; here are the rules that join
options: the search space (`specbench.sweep.space`), the objectives, the models and the
engine settings (validated by `EngineConfig`), sampling (validated by `SamplingParams`), the
budget's and the paths' defaults, the server templates. Nothing here imports Optuna or torch.
Longer than 400 lines because every rule that joins two options or more lives here, each with
its own one-line error naming the key and the flag.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbench import limits
from specbench.config import METHODS, TREE_METHODS, EngineConfig
from specbench.errors import ConfigError
from specbench.session import DEFAULT_DRAFT, DEFAULT_EAGLE3_HEAD, DEFAULT_TARGET
from specbench.structured import TOOL_CALL_PARSERS
from specbench.sweep.options import (
    DEFAULT_N_TRIALS,
    DEFAULT_SERVER_BASE_URL,
    DEFAULT_SWEEPS_DIR,
    ENDPOINTS,
    SERVER_PAIRINGS,
    NAMES,
    OBJECTIVES,
    OPTIONS,
    SAMPLERS,
    SERVER_PLACEHOLDERS,
    SPECULATIVE_METHODS,
    BudgetOptions,
    ModelsOptions,
    ObjectiveOptions,
    ProfileOptions,
    SamplingOptions,
    ServerOptions,
    SpaceOptions,
    StudyOptions,
    WorkloadOptions,
    check_type,
    keys,
    label,
    section,
)
from specbench.sweep.space import Space
from specbench.sweep.urls import JOURNAL_PREFIX, storage_url

# How a trial's speedup is measured; a study remembers it, so trials measured another way
# (a baseline trial minutes apart, before pairing) are never mixed into one study.
PAIRING = "each speculative trial measures the baseline interleaved with it (ABBA blocks)"
SERVER_PAIRINGS_SAID = {
    "alternate": ("each speculative trial launches its server and a baseline server in turn, over halves "
                  "of the prompts (A | B B | A), each warmed up after its launch"),
    "together": ("each speculative trial runs its server and a baseline server at once and measures "
                 "them in ABBA blocks"),
    "none": ("one server per trial: a speculative trial is compared with the baseline trial "
             "at its concurrency, measured at another time (not paired in time)"),
}
SERVER_PAIRING = SERVER_PAIRINGS_SAID["none"]


@dataclass(frozen=True)
class SweepSpec:
    study: StudyOptions  # name and out (the study directory: runs/, profile.yaml) filled in
    target: str
    engine: EngineConfig  # device, dtype, trust_remote_code
    workload: WorkloadOptions
    sampling: SamplingOptions
    space: Space
    objectives: tuple[str, ...]
    max_peak_memory_bytes: int | None  # constraint; None = unconstrained
    budget: BudgetOptions  # n_trials: trials this process runs; None = until every point is measured
    profile: ProfileOptions  # out: where the recommended serving profile is written
    server: ServerOptions | None = None  # [server]: one launched server per trial
    source: Path | None = None  # the spec file, if any
    goodput_slos_ms: dict[str, float] | None = None  # [objective] goodput: SLO bounds in ms

    @property
    def storage_url(self) -> str:
        """The storage URL; a bare path (`studies/x.db`) means a SQLite file there,
        `journal:PATH` Optuna's journal file; default: sweeps/<study name>.db."""
        return storage_url(self.study.storage or str(DEFAULT_SWEEPS_DIR / (self.study.name + ".db")))

    @property
    def paired(self) -> bool:
        """Speculative trials measure their own baseline interleaved with them: always
        embedded; with `[server]` unless its pairing is `none`."""
        return self.server is None or self.server.pairing != "none"

    @property
    def level_batch(self) -> bool:
        """A trial measures its whole concurrency level with one baseline (`[budget] batch`)."""
        return self.budget.batch == "level"

    @property
    def pairing(self) -> str:
        return PAIRING if self.server is None else SERVER_PAIRINGS_SAID[self.server.pairing]

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o].direction for o in self.objectives]

    def setup(self) -> dict[str, Any]:
        """What the measurements depend on; a study refuses to mix two setups."""
        w = self.workload
        return {
            "space": self.space.describe(),
            "objectives": list(self.objectives),
            "max_peak_memory_bytes": self.max_peak_memory_bytes,
            **({"goodput_slos_ms": self.goodput_slos_ms} if self.goodput_slos_ms else {}),
            "target": self.target, "dtype": self.engine.dtype,
            "workload": w.source, "prompt_field": w.prompt_field,
            "num_prompts": w.num_prompts, "chat_template": w.chat_template,
            "truncate": w.truncate, "warmup": w.warmup,
            **({"tool_call_parser": w.tool_call_parser} if w.tool_call_parser != "json" else {}),
            "sampling": dict(sorted(self.sampling.overrides.items())), "seed": self.sampling.seed,
            "ignore_eos": self.sampling.ignore_eos,
            "pairing": self.pairing,
            **({"server": {"command": self.server.command,
                           "baseline_command": self.server.baseline_command,
                           "endpoint": self.server.endpoint}} if self.server else {}),
        }


def build_spec(file_values: dict[str, Any] | None, flags: dict[str, Any] | None = None,
               source: Path | None = None) -> SweepSpec:
    """Merge spec-file values and flags (flags win; None = not given) into a SweepSpec."""
    where = f"{source}: " if source is not None else ""
    values = _merge(file_values, flags, where)
    for key, example in (("study.out", "sweeps/studies/NAME"), ("profile.out", "STUDY_DIR/profile.yaml"),
                         ("study.storage", "sqlite:///sweeps/NAME.db")):
        if values.get(key) is not None and not str(values[key]).strip():
            raise ConfigError(f"{where}{label(key)} is empty: give one (e.g. {example}) or leave it out "
                              "for the default")
    study = _study(section(StudyOptions, values, where), source, where)
    space_opts, models = section(SpaceOptions, values, where), section(ModelsOptions, values, where)
    space = _space(space_opts, models, where)
    engine = _engine(models, where)
    objective = section(ObjectiveOptions, values, where)
    objectives = _objectives(objective, where)
    budget = section(BudgetOptions, values, where)
    n_trials = budget.n_trials
    if n_trials is None and study.sampler not in ("grid", "model"):  # TPE, random: a budget
        # (the model-guided sampler ends by itself, once only skipped points are left)
        n_trials = DEFAULT_N_TRIALS
    timeout = float(budget.timeout_s) if budget.timeout_s is not None else None
    budget = replace(budget, n_trials=n_trials, timeout_s=timeout)
    workload = section(WorkloadOptions, values, where)
    if workload.tool_call_parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"{where}{label('workload.tool_call_parser')} must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                          f"got {workload.tool_call_parser!r}")
    sampling = section(SamplingOptions, values, where)
    sampling.params()  # validates the values now, before any model loads
    profile = section(ProfileOptions, values, where)
    if profile.out is not None and Path(profile.out).expanduser().is_dir():
        raise ConfigError(f"{where}{label('profile.out')} {str(profile.out)!r} is a directory: give the "
                          "profile's file path, e.g. DIR/profile.yaml")
    mem = objective.max_peak_memory_gb
    slos = _goodput(objective, objectives, where)
    server = _server(values, where)
    budget = replace(budget, batch=_batch(budget.batch, study, server is not None, where))
    if server is not None and space.searches_trees:
        # a server started without the tree flags serves a chain: its records would be labelled a tree
        key = "server.command"
        if not ("{topk}" in server.command and "{num_draft_tokens}" in server.command):
            raise ConfigError(f"{where}{label(key)} must pass {{topk}} and {{num_draft_tokens}} when "
                              f"{label('space.topk')} searches trees (SGLang: --speculative-eagle-topk "
                              "{topk} --speculative-num-draft-tokens {num_draft_tokens}); vLLM serves no "
                              "draft trees")
    return SweepSpec(
        study=study, target=models.target, engine=engine, workload=workload, sampling=sampling,
        space=space, objectives=objectives,
        max_peak_memory_bytes=int(mem * 2**30) if mem is not None else None, budget=budget,
        profile=replace(profile, out=Path(profile.out or study.out / "profile.yaml")),
        server=server, source=source, goodput_slos_ms=slos)


BATCHES = ("level", "trial")


def _batch(batch: str | None, study: StudyOptions, server: bool, where: str) -> str:
    """How trials are measured: `level` (one run per concurrency level, one baseline for all
    its configurations) or `trial` (each speculative trial with its own baseline)."""
    if batch is None:
        return "level" if not server and study.sampler in ("grid", "model") else "trial"
    if batch not in BATCHES:
        raise ConfigError(f"{where}{label('budget.batch')} must be one of {', '.join(BATCHES)}, got {batch!r}")
    if batch == "level" and server:
        raise ConfigError(f"{where}{label('budget.batch')} level measures a level's configurations in one "
                          "run on one engine; a server sweep launches a server per configuration: use trial")
    return batch


def _goodput(objective: ObjectiveOptions, objectives: tuple[str, ...], where: str) -> dict[str, float] | None:
    """[objective] goodput (vLLM's --goodput SLOs), required by the goodput objective."""
    from specbench.analysis.serving import parse_goodput

    raw = objective.goodput
    values = [raw] if isinstance(raw, str) else (list(raw) if raw else None)
    slos = parse_goodput([str(v) for v in values] if values else None, name=where + label("objective.goodput"))
    if "goodput" in objectives and not slos:
        raise ConfigError(f"{where}[objective] name = goodput needs the SLOs: goodput = [\"ttft:MS\", "
                          "\"tpot:MS\"] in [objective] (or --goodput ttft:MS)")
    return slos


def _merge(file_values: dict[str, Any] | None, flags: dict[str, Any] | None, where: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        check_type(key, value, where)
        values[key] = value
    for key, value in (flags or {}).items():
        assert key in OPTIONS, key
        if value is not None and value != [] and value != ():
            if isinstance(value, float) and not math.isfinite(value):  # NaN slips past range checks
                raise ConfigError(f"{label(key)} must be a finite number, got {value!r}")
            values[key] = value if not isinstance(value, tuple) else list(value)
    return values


def _study(study: StudyOptions, source: Path | None, where: str) -> StudyOptions:
    if study.name is not None and not study.name.strip():
        raise ConfigError(f"{where}{label('study.name')} is empty: give a name (letters, digits, '.', '_', '-') "
                          "or leave it out for the spec file's name")
    name = study.name or (source.stem if source is not None else "sweep")
    if len(name) > 128:
        raise ConfigError(f"{where}{label('study.name')} is {len(name)} characters long; at most 128 "
                          "(it names the SQLite file and the study directory)")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"{where}{label('study.name')} may hold letters, digits, '.', '_' and "
                          f"'-' only (it names files), got {name!r}")
    if study.sampler not in SAMPLERS:
        raise ConfigError(f"{where}unknown sampler {study.sampler!r} ({OPTIONS['study.sampler'].flag}); "
                          f"valid: {', '.join(SAMPLERS)}")
    if study.grace_period_s <= study.heartbeat_interval_s:
        raise ConfigError(f"{where}{label('study.grace_period_s')} must exceed "
                          f"{label('study.heartbeat_interval_s')} ({study.heartbeat_interval_s} s), "
                          f"got {study.grace_period_s}")
    if study.storage is not None and re.fullmatch(r"sqlite:/*", study.storage.strip()):
        raise ConfigError(f"{where}{label('study.storage')} {study.storage!r} names no database file: "
                          "e.g. sqlite:///sweeps/STUDY.db")
    if study.storage == JOURNAL_PREFIX:
        raise ConfigError(f"{where}{label('study.storage')}: journal:PATH needs a file path, "
                          "e.g. journal:/shared/sweeps/STUDY.log")
    return replace(study, name=name, out=Path(study.out or DEFAULT_SWEEPS_DIR / "studies" / name))


def _space(opts: SpaceOptions, models: ModelsOptions, where: str) -> Space:
    methods = _as_list("space.method", opts.method, where)
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"{where}unknown method {m!r} in {label('space.method')}; "
                              f"valid: {', '.join(METHODS)}")
    methods = [m for m in dict.fromkeys(methods) if m != "none"]  # the baseline is always in
    if "medusa" in methods:  # its configurations need the heads' directory: refused, not failed per trial
        raise ConfigError(f"{where}method medusa cannot be swept: a sweep has no option for the Medusa heads' "
                          f"directory ({label('models.head')} is the EAGLE-3 head's); measure medusa with "
                          "specbench run --method medusa --draft PATH")
    ks, k_range = _k_values(opts.num_speculative_tokens, where)
    concurrency = _ints("space.concurrency", _as_list("space.concurrency", opts.concurrency, where), where, 1)
    for key, vals in (("space.method", methods), ("space.num_speculative_tokens", ks),
                      ("space.concurrency", concurrency)):
        if not vals:
            what = (f"lists no speculative method (valid: {', '.join(SPECULATIVE_METHODS)}; the "
                    "baseline is always measured)") if key == "space.method" else "is empty"
            raise ConfigError(f"{where}empty search space: {label(key)} {what}")

    drafts = tuple(dict.fromkeys(_as_list("models.draft", models.draft or [], where)))
    if "draft_model" in methods and not drafts:
        if models.target != DEFAULT_TARGET:
            raise ConfigError(f"{where}method draft_model needs a draft model: set {label('models.draft')}")
        drafts = (DEFAULT_DRAFT,)
    if "draft_model" not in methods:
        drafts = ()
    head = models.head
    if "eagle3" in methods and not head:
        if models.target != DEFAULT_TARGET:
            raise ConfigError(f"{where}method eagle3 needs an EAGLE-3 head directory: set {label('models.head')}")
        head = DEFAULT_EAGLE3_HEAD  # the catalog's head of the default target
    if "eagle3" not in methods:
        head = None  # a spec naming a head, run with --method draft_model (flags win): not an error
    topk = _ints("space.topk", _as_list("space.topk", opts.topk, where), where, 1)
    if not topk:
        raise ConfigError(f"{where}empty search space: {label('space.topk')} is empty (1 = chains)")
    sizes = _ints("space.num_draft_tokens", _as_list("space.num_draft_tokens", opts.num_draft_tokens, where),
                  where, 2)
    if (topk != (1,) or sizes) and not set(methods) & set(TREE_METHODS):
        raise ConfigError(f"{where}{label('space.topk')} and {label('space.num_draft_tokens')} search draft "
                          f"trees, which only {', '.join(TREE_METHODS)} build; the space lists "
                          f"{', '.join(methods)}")
    if sizes and max(topk) == 1:
        raise ConfigError(f"{where}{label('space.num_draft_tokens')} sizes trees: add a topk above 1 to "
                          f"{label('space.topk')} (a chain of k verifies k + 1 tokens)")
    return Space(method=tuple(methods), num_speculative_tokens=ks, k_range=k_range,
                 concurrency=concurrency, draft=drafts, head=head, topk=topk, num_draft_tokens=sizes)


def _engine(models: ModelsOptions, where: str) -> EngineConfig:
    """EngineConfig validates device, dtype and the fast path; its message names the spec key as well."""
    try:
        return EngineConfig(device=models.device, dtype=models.dtype, trust_remote_code=models.trust_remote_code,
                            onednn=models.onednn, capture=models.capture)
    except ConfigError as exc:
        message = str(exc)
        for key in ("models.device", "models.dtype", "models.onednn", "models.capture"):
            flag = OPTIONS[key].flag
            if message.startswith(flag + " "):
                message = label(key) + message[len(flag):]
        raise ConfigError(where + message) from None


def _objectives(objective: ObjectiveOptions, where: str) -> tuple[str, ...]:
    objectives = tuple(_as_list("objective.name", objective.name, where))
    if not objectives:
        raise ConfigError(f"{where}{label('objective.name')} is empty; valid: {', '.join(OBJECTIVES)}")
    for o in objectives:
        if o not in OBJECTIVES:
            raise ConfigError(f"{where}unknown objective {o!r} ({OPTIONS['objective.name'].flag}); "
                              f"valid: {', '.join(OBJECTIVES)}")
    if len(set(objectives)) != len(objectives):
        raise ConfigError(f"{where}{label('objective.name')} lists an objective twice: {', '.join(objectives)}")
    return objectives


def _server(values: dict[str, Any], where: str) -> ServerOptions | None:
    given = [k for k in keys("server") if values.get(f"server.{k}") is not None]
    if not given:
        return None
    for key in ("server.command", "server.baseline_command"):
        if values.get(key) is not None and not str(values[key]).strip():
            raise ConfigError(f"{where}{label(key)} is empty: give the server's launch command, e.g. "
                              "\"vllm serve {target} --port {port}\"")
    if not values.get("server.command"):
        raise ConfigError(f"{where}{label('server.command')} is needed with "
                          f"{', '.join(label('server.' + k) for k in given)}")
    server = section(ServerOptions, values, where)
    _check_template("server.command", server.command, SERVER_PLACEHOLDERS, where)
    if server.baseline_command is not None:
        _check_template("server.baseline_command", server.baseline_command, SERVER_PLACEHOLDERS, where)
    _check_template("server.base_url", server.base_url, ("port",), where)
    for key in ("server.command", "server.baseline_command", "server.base_url"):
        text = values.get(key) if key != "server.base_url" else server.base_url
        if text is not None and (bad := _UNCLOSED.search(str(text))):
            raise ConfigError(f"{where}{label(key)}: placeholder {bad.group(0)!r} is not closed with '}}'")
    if not re.match(r"https?://[^/:{}\s]+", server.base_url.replace("{port}", "1")):
        raise ConfigError(f"{where}{label('server.base_url')} must be http:// or https:// and a host, "
                          f"e.g. {DEFAULT_SERVER_BASE_URL}, got {server.base_url!r}")
    if "{port}" in server.base_url:
        for key in ("server.command", "server.baseline_command"):
            if values.get(key) is not None and "{port}" not in str(values[key]):
                raise ConfigError(f"{where}{label(key)} does not pass {{port}}, but {label('server.base_url')} "
                                  "connects to it: the server would listen elsewhere (add --port {port})")
    if server.pairing not in SERVER_PAIRINGS:
        raise ConfigError(f"{where}{label('server.pairing')} must be one of {', '.join(SERVER_PAIRINGS)}, "
                          f"got {server.pairing!r}")
    if server.pairing == "together" and "{port}" not in server.base_url:
        raise ConfigError(f"{where}{label('server.pairing')} together runs two servers at once, on two ports: "
                          f"{label('server.base_url')} needs {{port}} (got {server.base_url!r})")
    if server.endpoint not in ENDPOINTS:
        raise ConfigError(f"{where}{label('server.endpoint')} must be one of {', '.join(ENDPOINTS)}, "
                          f"got {server.endpoint!r}")
    return server


# a placeholder opened and never closed: "{port" (JSON in a template, '{"method": ...}', is fine)
_UNCLOSED = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*(?![A-Za-z0-9_}])")


def _check_template(key: str, template: str, allowed: tuple[str, ...], where: str) -> None:
    from specbench.backends.launcher import render

    try:
        render(template, {name: "x" for name in allowed})
    except ConfigError as exc:
        msg = str(exc).replace("server command template: ", "")
        raise ConfigError(f"{where}{label(key)}: {msg}") from None


def _as_list(key: str, value: Any, where: str) -> list[Any]:
    """Items of a list option: a TOML list or scalar, or repeated flags each holding a,b,c;
    integers for integer kinds."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[Any] = []
    for item in items:
        if isinstance(item, str) and OPTIONS[key].kind is not NAMES:
            for part in _items(key, item, where):  # CLI style "1,4,16"
                try:
                    out.append(int(part))
                except ValueError:
                    raise ConfigError(f"{where}{label(key)}: {part!r} is not an integer") from None
        elif isinstance(item, str):
            out.extend(_items(key, item, where))
        else:
            out.append(item)
    return out


def _items(key: str, text: str, where: str) -> list[str]:
    """The comma-separated items of one value; an empty one (`4,,2`, `,`, '') is refused."""
    if not text.strip():
        return []  # nothing given: the search space says it is empty
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise ConfigError(f"{where}{label(key)}: empty item in {text!r} (give comma-separated values, e.g. 1,2,4)")
    return parts


def _ints(key: str, values: list[Any], where: str, minimum: int) -> tuple[int, ...]:
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{where}{label(key)}: {v!r} is not an integer")
        if v < minimum:
            raise ConfigError(f"{where}{label(key)} values must be >= {minimum}, got {v}")
        limits.check(OPTIONS[key].flag, v, command="sweep", where=where, label=f"{label(key)} values")
    return tuple(sorted(set(values)))


def _k_values(value: Any, where: str) -> tuple[tuple[int, ...], tuple[int, int, int] | None]:
    key = "space.num_speculative_tokens"
    rng: dict[str, Any] | None = None
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) and ".." in value[0]:
        value = value[0]  # one CLI range, e.g. -k 2..8
    if isinstance(value, dict):
        rng = dict(value)
        unknown = sorted(set(rng) - {"low", "high", "step"})
        if unknown or "low" not in rng or "high" not in rng:
            raise ConfigError(f"{where}{label(key)}: a range needs low and high (and optional step), "
                              f"got keys {', '.join(sorted(rng)) or 'none'}")
    elif isinstance(value, str) and ".." in value:  # CLI: 2..8 or 2..8:2
        m = re.fullmatch(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(\d+))?\s*", value)
        if not m:
            raise ConfigError(f"{where}{label(key)}: {value!r} is not a range like 2..8 or 2..8:2")
        rng = {"low": int(m.group(1)), "high": int(m.group(2)), "step": int(m.group(3) or 1)}
    if rng is not None:
        low, high, step = rng["low"], rng["high"], rng.get("step", 1)
        for v in (low, high, step):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{where}{label(key)}: range bounds must be integers, got {v!r}")
        if step < 1 or low < 1 or high < low:
            raise ConfigError(f"{where}{label(key)}: need 1 <= low <= high and step >= 1, "
                              f"got low={low} high={high} step={step}")
        limits.check("--num-speculative-tokens", high, command="sweep", where=where,
                     label=f"{label(key)}: the range's high")
        if (high - low) % step:
            raise ConfigError(f"{where}{label(key)}: high - low must be a multiple of step "
                              f"(Optuna's int distribution), got {low}..{high}:{step}")
        return tuple(range(low, high + 1, step)), (low, high, step)
    return _ints(key, _as_list(key, value, where), where, 1), None


