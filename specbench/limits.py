"""The bounds of every number a user can give specbench, in one table.

Every integer and float flag of every command (`specbench.cli` applies `check` to each one
as click parses it), every list item (`-k 2,4`, `--concurrency 1,4`), every
`--speculative-config` key, every sweep option (`specbench.sweep.options`) and every sampling
cell of a prompt file is held to the `Limit` of its name here: its type (an integer is never
a bool, a float with a fraction or a string; a number is never NaN or infinite) and a range
wide enough for any real use and narrow enough that nothing downstream overflows, allocates
terabytes or loops for hours. `tests/cli/test_limits.py` walks every command's options and
fails for a numeric flag this table does not name, so a new one cannot slip through.

A name is a flag (`--warmup`) or a key (`prompt_lookup_max`); `COMMAND_LIMITS` holds the few
flags whose meaning differs by command (`compare --seed` seeds NumPy: 32 bits).

Boundary: the lowest layer; plain data and one-line `ConfigError`s, nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specbench.errors import ConfigError

INT32_MAX = 2**31 - 1  # records store counts such as top_k, k and concurrency as int32
INT64_MAX = 2**63 - 1  # records store seeds as int64
SEED32_MAX = 2**32 - 1  # NumPy's and Optuna's samplers take 32-bit seeds
MAX_K = 256  # draft tokens per step: far beyond any acceptance length that pays
MAX_CONCURRENCY = 65_536
MAX_NGRAM = 256  # prompt lookup's longest n-gram
MAX_TOPK = 64  # children per draft-tree node (SGLang's defaults use 4, vLLM guides 8)
MAX_TREE_TOKENS = 4096  # tokens one row verifies per step, the root included
MAX_NEW_TOKENS = 2**20  # beyond any model context
MAX_WAVES = 1_000  # --warmup, --repeats: each multiplies the run's length
MAX_TURNS = 1_000  # --turns: user turns replayed per conversation
MAX_N_BOOT = 100_000  # bootstrap resamples: 2000 is plenty, 100k already takes a while
MAX_SECONDS = 10**7  # about 115 days: any timeout or budget beyond is a typo
MIN_TEMPERATURE = 1e-5  # below this logits / T overflow; vLLM treats it as greedy too


@dataclass(frozen=True)
class Limit:
    """What a value must be: `kind` int, float or bool, within [low, high] (the ends
    excluded where `low_open`/`high_open`). `nonzero_min`: a positive value must be at least
    this (0 itself stays allowed: --temperature)."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nonzero_min: float | None = None
    hint: str = ""  # appended to a range error: what the value means or what to use instead
    interval: bool = False  # say the range as an interval ("in (0, 1]"): a fraction, not a count

    def describe(self) -> str:
        if self.kind is bool:
            return "true or false"
        what = "an integer" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            if self.kind is int and not (self.low_open or self.high_open):
                return f"{what} between {_fmt(self.low)} and {_fmt(self.high)}"
            return (f"{what} in {'(' if self.low_open else '['}{_fmt(self.low)}, {_fmt(self.high)}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {_fmt(self.low)}"
        if self.high is not None:
            return f"{what} {'<' if self.high_open else '<='} {_fmt(self.high)}"
        return what


def _fmt(x: float) -> str:
    if isinstance(x, int) or float(x).is_integer():
        return str(int(x))
    return f"{x:g}"


def _shown(value: int) -> str:
    digits = len(str(abs(value)))
    return str(value) if digits <= 15 else f"{'-' if value < 0 else ''}a {digits}-digit number"


def _i(low: int | None, high: int | None, hint: str = "") -> Limit:
    return Limit(int, low, high, hint=hint)


def _f(low: float | None, high: float | None, *, low_open: bool = False, high_open: bool = False,
       hint: str = "", nonzero_min: float | None = None, interval: bool = False) -> Limit:
    return Limit(float, low, high, low_open=low_open, high_open=high_open, hint=hint, nonzero_min=nonzero_min,
                 interval=interval)


_TEMPERATURE = _f(0, 100, nonzero_min=MIN_TEMPERATURE, hint="0 = greedy")
_TOP_P = _f(0, 1, low_open=True, interval=True)
_TOP_K = _i(0, INT32_MAX, "0 = off")
# a request's own seed: int64 as vLLM and torch.Generator take it (negative included)
_REQUEST_SEED = _i(-INT64_MAX - 1, INT64_MAX)
_MAX_NEW = _i(1, MAX_NEW_TOKENS)
_K = _i(0, MAX_K, "0 = the baseline")
_DISABLE = _i(1, MAX_CONCURRENCY)

LIMITS: dict[str, Limit] = {
    # ---- run (and the flags sweep shares with it) ------------------------------------
    "--num-speculative-tokens": _K,
    "--concurrency": _i(1, MAX_CONCURRENCY),
    "--num-prompts": _i(1, 10**7),
    "--max-new-tokens": _MAX_NEW,
    "--temperature": _TEMPERATURE,
    "--top-p": _TOP_P,
    "--top-k": _TOP_K,
    "--seed": _i(0, INT64_MAX),
    # below one request in about 17 minutes a run waits more than it measures
    "--request-rate": _f(1e-3, 10**6, hint="requests/s; leave it out for all at once"),
    "--disable-by-batch-size": _DISABLE,
    "--topk": _i(1, MAX_TOPK),
    "--num-draft-tokens": _i(2, MAX_TREE_TOKENS, "the root and at least one draft token"),
    "--warmup": _i(0, MAX_WAVES),
    "--repeats": _i(1, MAX_WAVES),
    "--turns": _i(1, MAX_TURNS),
    "--time-budget": _f(0, MAX_SECONDS, hint="seconds; 0 = none"),
    "--request-timeout": _f(0, MAX_SECONDS, low_open=True),
    # gamma shape of open-loop arrivals (vLLM's --burstiness): 1 = Poisson, < 1 burstier
    "--burstiness": _f(0, 1000, low_open=True),
    # replaying a trace faster (2 = twice the arrival rate) or slower
    "--trace-speedup": _f(0, 10**4, low_open=True),
    "--client-processes": _i(0, 256, "0 = this process"),
    "--retries": _i(0, 100),
    # ---- report, compare ----------------------------------------------------------------
    "--n-boot": _i(100, MAX_N_BOOT),
    "--confidence": _f(0, 1, low_open=True, high_open=True, interval=True),
    # ---- serve --------------------------------------------------------------------------
    "--port": _i(0, 65535, "0 = any free port"),
    "--max-concurrency": _i(1, MAX_CONCURRENCY),
    "--max-num-seqs": _i(1, MAX_CONCURRENCY),
    "--read-timeout": _f(0, MAX_SECONDS, low_open=True),
    # ---- sweep --------------------------------------------------------------------------
    "--sampler-seed": _i(0, SEED32_MAX),
    "--heartbeat-interval": _i(1, 86_400),
    "--grace-period": _i(1, MAX_SECONDS),
    "--storage-retry": _f(0, MAX_SECONDS),
    "--max-peak-memory-gb": _f(0, 10**6, low_open=True),
    "--n-trials": _i(1, 10**6),
    "--timeout": _f(0, MAX_SECONDS, low_open=True),
    "--min-speedup": _f(0, 1000, low_open=True),
    "--server-ready-timeout": _f(0, MAX_SECONDS, low_open=True),
    # alternate server pairing: each block beyond two costs a server launch
    "--server-blocks": _i(2, 1000),
    # ---- --speculative-config keys (vLLM's names) ---------------------------------------
    "num_speculative_tokens": _K,
    "prompt_lookup_min": _i(1, MAX_NGRAM),
    "prompt_lookup_max": _i(1, MAX_NGRAM),
    "draft_confidence_threshold": _f(0, 1, high_open=True, hint="0 = always draft k tokens", interval=True),
    "disable_by_batch_size": _DISABLE,
    "speculative_disable_by_batch_size": _DISABLE,
    "dynamic_k": Limit(bool),
    # suffix decoding (vLLM's names): tree depth, outputs kept across requests (0 = no global
    # tree), proposal length per matched token, the lowest proposed token's frequency ratio
    "suffix_decoding_max_tree_depth": _i(1, 4096),
    "suffix_decoding_max_cached_requests": _i(0, 2**31 - 1, "0 = no global tree"),
    "suffix_decoding_max_spec_factor": _f(0, 1000, low_open=True),
    "suffix_decoding_min_token_prob": _f(0, 1, interval=True),
    # draft trees (SGLang's knobs): depth, children per node, tokens verified per row
    "num_steps": _K,
    "topk": _i(1, MAX_TOPK),
    "num_draft_tokens": _i(2, MAX_TREE_TOKENS, "the root and at least one draft token"),
    # ---- a prompt file's sampling cells ---------------------------------------------------
    "temperature": _TEMPERATURE,
    "top_p": _TOP_P,
    "top_k": _TOP_K,
    "seed": _REQUEST_SEED,
    "max_new_tokens": _MAX_NEW,
}

# Flags whose meaning differs by command: (command, flag) -> Limit.
COMMAND_LIMITS: dict[tuple[str, str], Limit] = {
    ("compare", "--seed"): _i(0, SEED32_MAX, "the bootstrap's NumPy seed"),
    ("sweep", "--warmup"): _i(0, 10_000, "warm-up requests per trial"),
    ("serve", "--num-speculative-tokens"): _i(1, MAX_K, "leave out --method and --draft to serve without speculation"),
}


def limit(name: str, command: str | None = None) -> Limit:
    found = COMMAND_LIMITS.get((command, name)) if command else None
    if found is None:
        found = LIMITS.get(name)
    if found is None:
        raise KeyError(f"specbench.limits names no bound for {name!r}")
    return found


def check(name: str, value: Any, *, command: str | None = None, where: str = "", label: str | None = None,
          error: type[Exception] = ConfigError) -> Any:
    """`value` if it has the type and range `name`'s `Limit` allows (None passes: not given),
    else a one-line ConfigError: `{where}{label} must be ..., got ...`. An integral float
    (4.0, as TOML and JSON may hold it) is an integer; 3.9 is not."""
    if value is None:
        return None
    lim = limit(name, command)
    label = label or name
    if lim.kind is bool:
        if not isinstance(value, bool):
            raise error(f"{where}{label} must be true or false, got {value!r}")
        return value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if ok and lim.kind is int and isinstance(value, float):
        ok = value.is_integer()
        value = int(value) if ok else value
    if not ok:
        what = lim.describe() if lim.low is not None or lim.high is not None else ""
        what = what.replace("a number", "a finite number", 1) or (
            "an integer" if lim.kind is int else "a finite number")
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise error(f"{where}{label} must be {what}, got {shown}")
    low = lim.low is not None and (value <= lim.low if lim.low_open else value < lim.low)
    high = lim.high is not None and (value >= lim.high if lim.high_open else value > lim.high)
    if low or high:
        shown = f"{value:g}" if isinstance(value, float) else _shown(value)
        if lim.interval:  # "in (0, 1]"
            interval = lim.describe().split(" in ", 1)[1]
            raise error(f"{where}{label} must be in {interval}{f' ({lim.hint})' if lim.hint else ''}, got {shown}")
        # The side broken first, as users know it ("--warmup must be >= 0"), then the whole
        # valid range.
        side = (f"{'>' if lim.low_open else '>='} {_fmt(lim.low)}" if low
                else f"{'<' if lim.high_open else '<='} {_fmt(lim.high)}")
        notes = ", ".join(n for n in (lim.describe() if lim.low is not None and lim.high is not None else "",
                                      lim.hint) if n)
        raise error(f"{where}{label} must be {side}{f' ({notes})' if notes else ''}, got {shown}")
    if lim.nonzero_min is not None and 0 < value < lim.nonzero_min:
        raise error(f"{where}{label} must be 0 or at least {lim.nonzero_min:g}, got {value:g} "
                          f"({lim.hint}; smaller values overflow the logits)")
    return float(value) if lim.kind is float else int(value)
