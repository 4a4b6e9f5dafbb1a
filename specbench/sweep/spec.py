"""The sweep specification: a TOML file in `sweeps/` and the same keys as CLI flags.

`load_spec_file()` reads the TOML (syntax errors name file:line); `build_spec()` merges file
values with flags (flags win), validates every key and value and returns a frozen
`SweepSpec`. Everything a user can get wrong is a one-line `ConfigError` raised before any
model loads or any storage opens: unknown section or key (valid ones listed), wrong type,
empty search space, unknown objective, method or sampler.

Also here: the search space (`Space`), one point in it (`Point`, with the key that dedupes
measurements) and the objectives table. Nothing here imports Optuna or torch.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.config import DEVICES, DTYPES, METHODS, SpeculativeConfig
from specbench.errors import ConfigError
from specbench.session import DEFAULT_DRAFT, DEFAULT_TARGET
from specbench.sweep.urls import JOURNAL_PREFIX, storage_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SPECULATIVE_METHODS = tuple(m for m in METHODS if m != "none")
SAMPLERS = ("grid", "tpe", "random")
DEFAULT_SWEEPS_DIR = Path("sweeps")
DEFAULT_N_TRIALS = 20  # model-based samplers; grid runs until the grid is measured
DEFAULT_HEARTBEAT_S = 10  # a running trial records a heartbeat this often (Optuna's interval)
DEFAULT_GRACE_S = 60  # a running trial without a heartbeat this long is failed, measured again
DEFAULT_STORAGE_RETRY_S = 120.0  # how long a storage call waits for an unreachable database


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
)}

# section -> key -> (accepted python types, what to call them in an error)
_NUM = (int, float)
_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "study": {"name": ((str,), "a string"), "storage": ((str,), "a string"),
              "out": ((str,), "a path"), "sampler": ((str,), "a string"),
              "seed": ((int,), "an integer"), "heartbeat_interval_s": ((int,), "an integer"),
              "grace_period_s": ((int,), "an integer"), "storage_retry_s": (_NUM, "a number")},
    "models": {"target": ((str,), "a string"), "draft": ((str, list), "a string or a list"),
               "head": ((str,), "a path"),
               "device": ((str,), "a string"), "dtype": ((str,), "a string"),
               "trust_remote_code": ((bool,), "true or false")},
    "workload": {"source": ((str,), "a string"), "prompt_field": ((str,), "a string"),
                 "num_prompts": ((int,), "an integer"), "chat_template": ((bool,), "true or false"),
                 "truncate": ((bool,), "true or false"), "warmup": ((int,), "an integer")},
    "sampling": {"max_new_tokens": ((int,), "an integer"), "temperature": (_NUM, "a number"),
                 "top_p": (_NUM, "a number"), "top_k": ((int,), "an integer"),
                 "seed": ((int,), "an integer"), "ignore_eos": ((bool,), "true or false")},
    "space": {"method": ((str, list), "a string or a list"),
              "num_speculative_tokens": ((int, list, dict, str),
                                         "an integer, a list or a range {low, high, step}"),
              "concurrency": ((int, list), "an integer or a list")},
    "objective": {"name": ((str, list), "a string or a list"),
                  "max_peak_memory_gb": (_NUM, "a number")},
    "budget": {"n_trials": ((int,), "an integer"), "timeout_s": (_NUM, "a number")},
    "profile": {"out": ((str,), "a path"), "min_speedup": (_NUM, "a number")},
    "server": {"command": ((str,), "a string"), "baseline_command": ((str,), "a string"),
               "base_url": ((str,), "a string"), "ready_timeout_s": (_NUM, "a number"),
               "endpoint": ((str,), "a string"), "tokenizer": ((str,), "a string")},
}

# spec key -> the CLI flag that sets it (named in error messages)
FLAGS = {
    "study.name": "--study-name", "study.storage": "--storage", "study.out": "--out",
    "study.sampler": "--sampler", "study.seed": "--sampler-seed",
    "study.heartbeat_interval_s": "--heartbeat-interval", "study.grace_period_s": "--grace-period",
    "study.storage_retry_s": "--storage-retry",
    "models.target": "--target", "models.draft": "--draft", "models.head": "--head",
    "models.device": "--device",
    "models.dtype": "--dtype", "models.trust_remote_code": "--trust-remote-code",
    "workload.source": "--workload", "workload.prompt_field": "--prompt-field",
    "workload.num_prompts": "--num-prompts", "workload.chat_template": "--chat-template",
    "workload.truncate": "--truncate", "workload.warmup": "--warmup",
    "sampling.max_new_tokens": "--max-new-tokens", "sampling.temperature": "--temperature",
    "sampling.top_p": "--top-p", "sampling.top_k": "--top-k", "sampling.seed": "--seed",
    "sampling.ignore_eos": "--ignore-eos",
    "space.method": "--method", "space.num_speculative_tokens": "--num-speculative-tokens",
    "space.concurrency": "--concurrency",
    "objective.name": "--objective", "objective.max_peak_memory_gb": "--max-peak-memory-gb",
    "budget.n_trials": "--n-trials", "budget.timeout_s": "--timeout",
    "profile.out": "--profile", "profile.min_speedup": "--min-speedup",
    "server.command": "--server-command", "server.baseline_command": "--server-baseline-command",
    "server.base_url": "--server-base-url", "server.ready_timeout_s": "--server-ready-timeout",
    "server.endpoint": "--endpoint", "server.tokenizer": "--tokenizer",
}
assert set(FLAGS) == {f"{s}.{k}" for s, keys in _SCHEMA.items() for k in keys}


def _label(key: str) -> str:
    return f"{key} ({FLAGS[key]})"


# --------------------------------------------------------------------------------------
# The search space


@dataclass(frozen=True)
class Point:
    """One configuration to measure. The baseline is method 'none' with k = 0, no draft.
    `draft` is the draft model (draft_model) or the EAGLE-3 head's directory (eagle3)."""

    method: str
    num_speculative_tokens: int
    draft: str | None
    concurrency: int

    @classmethod
    def of(cls, method: str, num_speculative_tokens: int = 0, draft: str | None = None,
           concurrency: int = 1) -> "Point":
        """Normalized: every spelling of the baseline (and of an n-gram point) is one point."""
        if method == "none" or num_speculative_tokens == 0:
            return cls("none", 0, None, concurrency)
        return cls(method, num_speculative_tokens, draft if method in ("draft_model", "eagle3") else None,
                   concurrency)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Point":
        return cls.of(params.get("method", "none"), params.get("num_speculative_tokens", 0),
                      params.get("draft"), params.get("concurrency", 1))

    @property
    def is_baseline(self) -> bool:
        return self.method == "none"

    @property
    def key(self) -> str:
        """Dedupe key: two trials with one key measure the same thing (a study has one EAGLE-3
        head, not an Optuna parameter, so it is not part of the key)."""
        draft = self.draft if self.method == "draft_model" else None
        return f"{self.method}|k{self.num_speculative_tokens}|{draft or '-'}|c{self.concurrency}"

    @property
    def params(self) -> dict[str, Any]:
        """Optuna params for `enqueue_trial` (only the ones the objective suggests)."""
        out: dict[str, Any] = {"method": self.method, "concurrency": self.concurrency}
        if not self.is_baseline:
            out["num_speculative_tokens"] = self.num_speculative_tokens
        if self.draft is not None and self.method == "draft_model":
            out["draft"] = self.draft
        return out

    def speculative_config(self) -> SpeculativeConfig:
        return SpeculativeConfig(method=self.method, num_speculative_tokens=self.num_speculative_tokens,
                                 draft=self.draft)


@dataclass(frozen=True)
class Space:
    """What the sampler may choose. The baseline (method none) is always a candidate."""

    method: tuple[str, ...]  # speculative methods
    num_speculative_tokens: tuple[int, ...]  # k values (all of them, also for a range)
    k_range: tuple[int, int, int] | None  # (low, high, step) when given as a range
    concurrency: tuple[int, ...]
    draft: tuple[str, ...]  # draft model choices (method draft_model only)
    head: str | None = None  # the EAGLE-3 head's directory (method eagle3 only)

    def points(self) -> list[Point]:
        """Every distinct configuration, the baseline first at each concurrency."""
        out: list[Point] = []
        for c in self.concurrency:
            out.append(Point.of("none", concurrency=c))
            for m in self.method:
                for k in self.num_speculative_tokens:
                    for d in (self.draft if m == "draft_model" else (self.head,) if m == "eagle3" else (None,)):
                        out.append(Point.of(m, k, d, c))
        return out

    def grid(self) -> dict[str, list[Any]]:
        """Optuna GridSampler search space: the speculative points (the baseline is enqueued)."""
        grid: dict[str, list[Any]] = {"method": list(self.method),
                                      "num_speculative_tokens": list(self.num_speculative_tokens),
                                      "concurrency": list(self.concurrency)}
        if "draft_model" in self.method:
            grid["draft"] = list(self.draft)
        return grid

    def describe(self) -> dict[str, Any]:
        """JSON-able description; a study remembers it and refuses a different one."""
        k: Any = list(self.num_speculative_tokens)
        if self.k_range:
            k = {"low": self.k_range[0], "high": self.k_range[1], "step": self.k_range[2]}
        out = {"method": list(self.method), "num_speculative_tokens": k,
               "concurrency": list(self.concurrency), "draft": list(self.draft)}
        if self.head is not None:
            out["head"] = self.head
        return out


# --------------------------------------------------------------------------------------
# Sweeps across servers

# placeholders a [server] command may use (filled per trial, see specbench.sweep.server)
SERVER_PLACEHOLDERS = ("target", "draft", "method", "k", "num_speculative_tokens", "k_plus_1",
                       "port", "speculative_config_json", "python", "dtype")
DEFAULT_SERVER_BASE_URL = "http://127.0.0.1:{port}"


@dataclass(frozen=True)
class ServerSpec:
    """`[server]`: start one server per trial from `command` (a launcher template) and measure
    through the openai backend; `baseline_command` (default: `command`) serves the baseline."""

    command: str
    baseline_command: str | None
    base_url: str  # may hold {port}
    ready_timeout_s: float
    endpoint: str  # completions | chat
    tokenizer: str | None  # default: the target

    def template(self, baseline: bool) -> str:
        return (self.baseline_command or self.command) if baseline else self.command


def _check_template(key: str, template: str, allowed: tuple[str, ...], where: str) -> None:
    from specbench.backends.launcher import render

    try:
        render(template, {name: "x" for name in allowed})
    except ConfigError as exc:
        msg = str(exc).replace("server command template: ", "")
        raise ConfigError(f"{where}{_label(key)}: {msg}") from None


def _server_spec(get: Any, where: str) -> ServerSpec | None:
    keys = [k for k in _SCHEMA["server"] if get(f"server.{k}") is not None]
    if not keys:
        return None
    command = get("server.command")
    if not command:
        raise ConfigError(f"{where}{_label('server.command')} is needed with "
                          f"{', '.join(_label('server.' + k) for k in keys)}")
    _check_template("server.command", command, SERVER_PLACEHOLDERS, where)
    baseline_command = get("server.baseline_command")
    if baseline_command is not None:
        _check_template("server.baseline_command", baseline_command, SERVER_PLACEHOLDERS, where)
    base_url = get("server.base_url", DEFAULT_SERVER_BASE_URL)
    _check_template("server.base_url", base_url, ("port",), where)
    if not re.match(r"https?://", base_url):
        raise ConfigError(f"{where}{_label('server.base_url')} must start with http:// or https://, "
                          f"got {base_url!r}")
    timeout = float(get("server.ready_timeout_s", 600.0))
    if timeout <= 0:
        raise ConfigError(f"{where}{_label('server.ready_timeout_s')} must be > 0 s, got {timeout:g}")
    endpoint = get("server.endpoint", "completions")
    if endpoint not in ("completions", "chat"):
        raise ConfigError(f"{where}{_label('server.endpoint')} must be one of completions, chat, "
                          f"got {endpoint!r}")
    return ServerSpec(command=command, baseline_command=baseline_command, base_url=base_url,
                      ready_timeout_s=timeout, endpoint=endpoint, tokenizer=get("server.tokenizer"))


# --------------------------------------------------------------------------------------
# The spec


@dataclass(frozen=True)
class SweepSpec:
    study_name: str
    storage: str | None  # RDB URL or journal:PATH; None = sqlite:///sweeps/<study_name>.db
    out: Path  # study directory: runs/ (one run dir per trial) and profile.yaml
    sampler: str  # grid | tpe | random
    sampler_seed: int
    target: str
    device: str
    dtype: str
    trust_remote_code: bool
    workload: str
    prompt_field: str | None
    num_prompts: int | None  # None = 6 for named sets, all for files
    chat_template: bool
    truncate: bool
    warmup: int  # warm-up requests per trial, excluded from records
    sampling: dict[str, Any]  # explicit overrides: temperature, top_p, top_k, max_new_tokens
    seed: int  # prompt sampling and per-request seeds
    ignore_eos: bool
    space: Space
    objectives: tuple[str, ...]
    max_peak_memory_bytes: int | None  # constraint; None = unconstrained
    n_trials: int | None  # trials this process runs; None = until every point is measured
    timeout_s: float | None
    min_speedup: float  # speculation "pays" when its gain over the baseline exceeds this
    profile: Path  # where the recommended serving profile is written
    source: Path | None = None  # the spec file, if any
    server: ServerSpec | None = None  # [server]: one launched server per trial
    heartbeat_interval_s: int = DEFAULT_HEARTBEAT_S  # s between heartbeats of a running trial
    grace_period_s: int = DEFAULT_GRACE_S  # s of silence before a running trial counts as lost
    storage_retry_s: float = DEFAULT_STORAGE_RETRY_S  # s a call waits for an unreachable storage

    @property
    def storage_url(self) -> str:
        """The storage URL; a bare path (`studies/x.db`) means a SQLite file there,
        `journal:PATH` Optuna's journal file."""
        return storage_url(self.storage or str(DEFAULT_SWEEPS_DIR / (self.study_name + ".db")))

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o].direction for o in self.objectives]

    def setup(self) -> dict[str, Any]:
        """What the measurements depend on; a study refuses to mix two setups."""
        return {
            "space": self.space.describe(),
            "objectives": list(self.objectives),
            "max_peak_memory_bytes": self.max_peak_memory_bytes,
            "target": self.target, "dtype": self.dtype,
            "workload": self.workload, "prompt_field": self.prompt_field,
            "num_prompts": self.num_prompts, "chat_template": self.chat_template,
            "truncate": self.truncate, "warmup": self.warmup,
            "sampling": dict(sorted(self.sampling.items())), "seed": self.seed,
            "ignore_eos": self.ignore_eos,
            **({"server": {"command": self.server.command,
                           "baseline_command": self.server.baseline_command,
                           "endpoint": self.server.endpoint}} if self.server else {}),
        }


def _toml_error_line(exc: Exception, text: str) -> int:
    line = getattr(exc, "lineno", None)
    if isinstance(line, int):
        return line
    m = re.search(r"at line (\d+)", str(exc))
    if m:
        return int(m.group(1))
    return max(1, text.count("\n") + (0 if text.endswith("\n") else 1))  # "at end of document"


def load_spec_file(path: Path | str) -> dict[str, Any]:
    """Parse a sweep spec file into {"section.key": value}; check sections and keys."""
    path = Path(path)
    if not path.is_file():
        shipped = sorted(p.name for p in DEFAULT_SWEEPS_DIR.glob("*.toml"))
        hint = f"; specs in {DEFAULT_SWEEPS_DIR}/: {', '.join(shipped)}" if shipped else ""
        raise ConfigError(f"sweep spec {path} not found{hint}")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = getattr(exc, "msg", None) or re.sub(r"\s*\((at line|at end).*\)$", "", str(exc))
        raise ConfigError(f"{path}:{_toml_error_line(exc, text)}: invalid TOML: {msg}") from None
    flat: dict[str, Any] = {}
    for section, body in data.items():
        if section not in _SCHEMA:
            # (no square brackets in messages: the CLI prints them through rich markup)
            raise ConfigError(f"{path}:{_line_of(text, section, None)}: unknown section {section!r}; "
                              f"valid sections: {', '.join(_SCHEMA)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}:{_line_of(text, None, section)}: {section!r} must be a "
                              "table (a section header)")
        for key, value in body.items():
            if key not in _SCHEMA[section]:
                raise ConfigError(f"{path}:{_line_of(text, section, key)}: unknown key {key!r} in "
                                  f"section {section!r}; valid keys: {', '.join(_SCHEMA[section])}")
            _check_type(f"{section}.{key}", value, f"{path}:{_line_of(text, section, key)}: ")
            flat[f"{section}.{key}"] = value
    return flat


def _line_of(text: str, section: str | None, key: str | None) -> int:
    """Best-effort line number of `[section]` or of `key = ...` within it (for messages)."""
    lines = text.splitlines()
    start = 0
    if section is not None:
        for i, line in enumerate(lines):
            if re.match(rf"\s*\[\s*{re.escape(section)}\s*\]", line):
                start = i
                if key is None:
                    return i + 1
                break
    if key is not None:
        for i in range(start, len(lines)):
            if re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=", lines[i]):
                return i + 1
    return start + 1


def _check_type(key: str, value: Any, where: str) -> None:
    section, name = key.split(".", 1)
    types, what = _SCHEMA[section][name]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        raise ConfigError(f"{where}{_label(key)} must be {what}, got {value!r}")


def _as_list(key: str, value: Any, where: str) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    out: list[Any] = []
    for item in items:
        if isinstance(item, str) and key not in ("models.draft", "space.method", "objective.name"):
            for part in item.split(","):  # CLI style "1,4,16"
                part = part.strip()
                if part:
                    try:
                        out.append(int(part))
                    except ValueError:
                        raise ConfigError(f"{where}{_label(key)}: {part!r} is not an integer") from None
        elif isinstance(item, str):
            out.extend(p.strip() for p in item.split(",") if p.strip())
        else:
            out.append(item)
    return out


def _ints(key: str, values: list[Any], where: str, minimum: int) -> tuple[int, ...]:
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{where}{_label(key)}: {v!r} is not an integer")
        if v < minimum:
            raise ConfigError(f"{where}{_label(key)} values must be >= {minimum}, got {v}")
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
            raise ConfigError(f"{where}{_label(key)}: a range needs low and high (and optional step), "
                              f"got keys {', '.join(sorted(rng)) or 'none'}")
    elif isinstance(value, str) and ".." in value:  # CLI: 2..8 or 2..8:2
        m = re.fullmatch(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(\d+))?\s*", value)
        if not m:
            raise ConfigError(f"{where}{_label(key)}: {value!r} is not a range like 2..8 or 2..8:2")
        rng = {"low": int(m.group(1)), "high": int(m.group(2)), "step": int(m.group(3) or 1)}
    if rng is not None:
        low, high, step = rng["low"], rng["high"], rng.get("step", 1)
        for v in (low, high, step):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{where}{_label(key)}: range bounds must be integers, got {v!r}")
        if step < 1 or low < 1 or high < low:
            raise ConfigError(f"{where}{_label(key)}: need 1 <= low <= high and step >= 1, "
                              f"got low={low} high={high} step={step}")
        if (high - low) % step:
            raise ConfigError(f"{where}{_label(key)}: high - low must be a multiple of step "
                              f"(Optuna's int distribution), got {low}..{high}:{step}")
        return tuple(range(low, high + 1, step)), (low, high, step)
    return _ints(key, _as_list(key, value, where), where, 1), None


def build_spec(file_values: dict[str, Any] | None, flags: dict[str, Any] | None = None,
               source: Path | None = None) -> SweepSpec:
    """Merge spec-file values and flags (flags win; None = not given) into a SweepSpec."""
    where = f"{source}: " if source is not None else ""
    values: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        _check_type(key, value, where)
        values[key] = value
    for key, value in (flags or {}).items():
        assert key in FLAGS, key
        if value is not None and value != [] and value != ():
            if isinstance(value, float) and not math.isfinite(value):  # NaN slips past range checks
                raise ConfigError(f"{_label(key)} must be a finite number, got {value!r}")
            values[key] = value if not isinstance(value, tuple) else list(value)
    get = values.get

    name = get("study.name") or (source.stem if source is not None else "sweep")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"{where}{_label('study.name')} may hold letters, digits, '.', '_' and "
                          f"'-' only (it names files), got {name!r}")
    sampler = get("study.sampler", "grid")
    if sampler not in SAMPLERS:
        raise ConfigError(f"{where}unknown sampler {sampler!r} ({FLAGS['study.sampler']}); "
                          f"valid: {', '.join(SAMPLERS)}")

    methods = _as_list("space.method", get("space.method", ["draft_model"]), where)
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"{where}unknown method {m!r} in {_label('space.method')}; "
                              f"valid: {', '.join(METHODS)}")
    methods = [m for m in dict.fromkeys(methods) if m != "none"]  # the baseline is always in
    ks, k_range = _k_values(get("space.num_speculative_tokens", [4]), where)
    concurrency = _ints("space.concurrency", _as_list("space.concurrency", get("space.concurrency", [1]), where),
                        where, 1)
    for key, vals in (("space.method", methods), ("space.num_speculative_tokens", ks),
                      ("space.concurrency", concurrency)):
        if not vals:
            what = (f"lists no speculative method (valid: {', '.join(SPECULATIVE_METHODS)}; the "
                    "baseline is always measured)") if key == "space.method" else "is empty"
            raise ConfigError(f"{where}empty search space: {_label(key)} {what}")

    target = get("models.target", DEFAULT_TARGET)
    drafts = tuple(dict.fromkeys(_as_list("models.draft", get("models.draft", []), where)))
    if "draft_model" in methods and not drafts:
        if target != DEFAULT_TARGET:
            raise ConfigError(f"{where}method draft_model needs a draft model: set {_label('models.draft')}")
        drafts = (DEFAULT_DRAFT,)
    if "draft_model" not in methods:
        drafts = ()
    head = get("models.head")
    if "eagle3" in methods and not head:
        raise ConfigError(f"{where}method eagle3 needs an EAGLE-3 head directory: set {_label('models.head')}")
    if "eagle3" not in methods:
        head = None
    device, dtype = get("models.device", "auto"), get("models.dtype", "auto")
    if device not in DEVICES and not str(device).startswith("cuda:"):
        raise ConfigError(f"{where}{_label('models.device')} must be one of {', '.join(DEVICES)} "
                          f"(or cuda:N), got {device!r}")
    if dtype not in DTYPES:
        raise ConfigError(f"{where}{_label('models.dtype')} must be one of {', '.join(DTYPES)}, got {dtype!r}")

    objectives = tuple(_as_list("objective.name", get("objective.name", ["speedup"]), where))
    if not objectives:
        raise ConfigError(f"{where}{_label('objective.name')} is empty; valid: {', '.join(OBJECTIVES)}")
    for o in objectives:
        if o not in OBJECTIVES:
            raise ConfigError(f"{where}unknown objective {o!r} ({FLAGS['objective.name']}); "
                              f"valid: {', '.join(OBJECTIVES)}")
    if len(set(objectives)) != len(objectives):
        raise ConfigError(f"{where}{_label('objective.name')} lists an objective twice: {', '.join(objectives)}")
    mem = get("objective.max_peak_memory_gb")
    if mem is not None and mem <= 0:
        raise ConfigError(f"{where}{_label('objective.max_peak_memory_gb')} must be > 0, got {mem}")

    n_trials = get("budget.n_trials")
    if n_trials is None and sampler != "grid":
        n_trials = DEFAULT_N_TRIALS
    if n_trials is not None and n_trials < 1:
        raise ConfigError(f"{where}{_label('budget.n_trials')} must be >= 1, got {n_trials}")
    timeout = get("budget.timeout_s")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"{where}{_label('budget.timeout_s')} must be > 0 s, got {timeout}")

    for key, minimum in (("workload.num_prompts", 1), ("workload.warmup", 0)):
        if get(key) is not None and get(key) < minimum:
            raise ConfigError(f"{where}{_label(key)} must be >= {minimum}, got {get(key)}")
    sampling = {k: get(f"sampling.{k}") for k in ("temperature", "top_p", "top_k", "max_new_tokens")
                if get(f"sampling.{k}") is not None}
    from specbench.session import sampling_base

    sampling_base(seed=get("sampling.seed", 0), ignore_eos=bool(get("sampling.ignore_eos", False)),
                  overrides=sampling)  # validates the values now, before any model loads
    min_speedup = float(get("profile.min_speedup", 1.0))
    if min_speedup <= 0:
        raise ConfigError(f"{where}{_label('profile.min_speedup')} must be > 0, got {min_speedup}")

    heartbeat, grace = (get("study.heartbeat_interval_s", DEFAULT_HEARTBEAT_S),
                        get("study.grace_period_s", DEFAULT_GRACE_S))
    if heartbeat < 1:
        raise ConfigError(f"{where}{_label('study.heartbeat_interval_s')} must be >= 1 s, got {heartbeat}")
    if grace <= heartbeat:
        raise ConfigError(f"{where}{_label('study.grace_period_s')} must exceed "
                          f"{_label('study.heartbeat_interval_s')} ({heartbeat} s), got {grace}")
    retry = float(get("study.storage_retry_s", DEFAULT_STORAGE_RETRY_S))
    if retry < 0:
        raise ConfigError(f"{where}{_label('study.storage_retry_s')} must be >= 0 s, got {retry:g}")
    storage = get("study.storage")
    if storage is not None and storage == JOURNAL_PREFIX:
        raise ConfigError(f"{where}{_label('study.storage')}: journal:PATH needs a file path, "
                          "e.g. journal:/shared/sweeps/STUDY.log")

    server = _server_spec(get, where)
    out = Path(get("study.out") or DEFAULT_SWEEPS_DIR / "studies" / name)
    return SweepSpec(
        study_name=name, storage=storage, out=out, sampler=sampler,
        sampler_seed=int(get("study.seed", 0)), target=target, device=device, dtype=dtype,
        trust_remote_code=bool(get("models.trust_remote_code", False)),
        workload=get("workload.source", "real"), prompt_field=get("workload.prompt_field"),
        num_prompts=get("workload.num_prompts"), chat_template=bool(get("workload.chat_template", True)),
        truncate=bool(get("workload.truncate", False)), warmup=int(get("workload.warmup", 1)),
        sampling=sampling, seed=int(get("sampling.seed", 0)),
        ignore_eos=bool(get("sampling.ignore_eos", False)),
        space=Space(method=tuple(methods), num_speculative_tokens=ks, k_range=k_range,
                    concurrency=concurrency, draft=drafts, head=head),
        objectives=objectives,
        max_peak_memory_bytes=int(mem * 2**30) if mem is not None else None,
        n_trials=n_trials, timeout_s=float(timeout) if timeout is not None else None,
        min_speedup=min_speedup, profile=Path(get("profile.out") or out / "profile.yaml"),
        source=source, server=server, heartbeat_interval_s=int(heartbeat),
        grace_period_s=int(grace), storage_retry_s=retry,
    )
