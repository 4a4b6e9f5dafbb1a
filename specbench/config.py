"""Configuration as flat frozen dataclasses, and the defaults of a run, defined once.

`SamplingParams` (per request), `SpeculativeConfig` (method, k, draft), `EngineConfig`
(device, dtype), `RunConfig` (the `config` object of a run's run.json, written and read back
through `to_dict`/`from_dict`). Values are validated on construction so a bad flag fails
before any model loads; errors name the field and what would be valid.
`parse_speculative_config` accepts vLLM's `--speculative-config` JSON shape; `split_list` and
`parse_int_list` read the comma-separated, repeatable list flags every command takes.

Longer than 400 lines because every field's validation (the one-line errors naming the flag)
sits beside the field it checks, draft trees' knobs included.

Boundary: the lowest layer. Plain data and parsing only: no models, files or output, so every
other layer (the report included) may import it.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from specbench import limits
from specbench.errors import ConfigError

# Defaults of `specbench run`, `serve` and `sweep`, here once so they cannot drift apart.
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"  # the draft of the default target
DEFAULT_EAGLE3_HEAD = "qwen2.5-coder-1.5b-instruct-eagle3"  # the catalog's EAGLE-3 head of the default target
DEFAULT_NUM_SPECULATIVE_TOKENS = 4  # k when no -k is given
DEFAULT_MAX_NEW_TOKENS = 64  # new tokens per request unless --max-new-tokens says otherwise
DEFAULT_NAMED_PROMPTS = 6  # a named prompt set is sampled down to this many unless told otherwise
# The padded prompt tokens one prefill pass holds at most, vLLM's default token budget of a
# scheduler step (max_num_batched_tokens): the admissions of one turn share a pass up to it.
MAX_PREFILL_TOKENS = 8192


def joins_prefill(longest: int, size: int, length: int, budget: int = MAX_PREFILL_TOKENS) -> bool:
    """Whether a prompt of `length` tokens joins a prefill pass of `size` prompts padded to
    `longest`: the padded pass stays within `budget`, or the pass is empty (a prompt longer
    than the budget runs alone)."""
    return size == 0 or max(longest, length) * (size + 1) <= budget

METHODS = ("none", "draft_model", "ngram", "eagle3", "medusa", "suffix")
DRAFTED_METHODS = ("draft_model", "eagle3", "medusa")  # the methods that take a --draft (model or heads)
# the methods whose drafter has a probability of its own to cut a draft on (draft_confidence_threshold)
THRESHOLD_METHODS = ("none", "draft_model", "eagle3")
TREE_METHODS = ("draft_model", "eagle3", "medusa")  # the methods whose drafter builds trees (topk > 1, a token tree)
HEAD_METHODS = ("eagle3", "medusa")  # drafters that read the target's hidden states (--draft: their directory)
MODEL_FREE_METHODS = ("ngram", "suffix")  # no draft model: --draft is refused
_NO_DRAFT = "--draft cannot be used with method {method!r} ({why} needs no model)"
_NO_DRAFT_WHY = {"ngram": "prompt lookup", "suffix": "suffix decoding"}
_NGRAM_NO_DRAFT = _NO_DRAFT.format(method="ngram", why=_NO_DRAFT_WHY["ngram"])
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bfloat16", "float16", "float32")
INT32_MAX = limits.INT32_MAX  # the records store counts such as top_k as int32
ONEDNN_MODES = ("off", "auto", "on")
# the decode step: auto | off (the eager step) | the static step run op by op, compiled or captured
CAPTURE_MODES = ("auto", "off", "static", "compile", "cudagraph")


def finite(flag: str, value: float | None, *, minimum: float | None = None, above: float | None = None,
           allow_none: bool = True) -> float | None:
    """`value` if it is a finite number within bounds, else a one-line ConfigError naming the
    flag (NaN compares false with everything, so it slips through plain range checks)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{flag} must be >= {minimum:g}, got {value:g}")
    if above is not None and value <= above:
        raise ConfigError(f"{flag} must be > {above:g}, got {value:g}")
    return float(value)


def split_list(values: Sequence[str] | None, flag: str = "the list") -> list[str]:
    """A repeatable, comma-separated flag as its items: `-k 2,4 -k 8` -> ["2", "4", "8"].
    An empty item (`-k 4,,2`, `-k ,`, `-k ''`) is a one-line error: dropping it would run
    something other than what was typed."""
    out = []
    for v in values or ():
        parts = [part.strip() for part in str(v).split(",")]
        if any(not part for part in parts):
            raise ConfigError(f"{flag}: empty item in {str(v)!r} (give comma-separated values, e.g. {flag} 1,2,4)")
        out.extend(parts)
    return out


def parse_int_list(values: Sequence[str] | None, flag: str) -> list[int] | None:
    """`-k 2,4 -k 8` -> [2, 4, 8]; None when the flag was not given; one clear line for
    an empty item, anything that is not an integer, or a value out of `flag`'s bounds
    (`specbench.limits`). A value given twice counts once (first place kept), for every list
    flag alike."""
    if not values:
        return None
    out: list[int] = []
    for part in split_list(values, flag):
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"{flag}: {part!r} is not an integer (use e.g. {flag} 1,2,4)") from None
        out.append(limits.check(flag, value))
    return list(dict.fromkeys(out))


def default_draft(target: str, method: str, draft: str | None) -> str | None:
    """The draft a method uses: the one named, else on the default target the catalog's draft
    model of it (draft_model) or its EAGLE-3 head (eagle3); other targets must name theirs."""
    if draft is None and target == DEFAULT_TARGET:
        return {"draft_model": DEFAULT_DRAFT, "eagle3": DEFAULT_EAGLE3_HEAD}.get(method)
    return draft


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. Temperature 0 means greedy (an explicit argmax path)."""

    temperature: float = 0.0  # 0 = greedy; >0 scales logits before softmax
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    seed: int | None = None  # per-request RNG seed; None = derived from the request id
    max_new_tokens: int = 128  # hard cap on emitted tokens
    stop_token_ids: tuple[int, ...] = ()  # extra ids that end the request (EOS is always one)
    ignore_eos: bool = False  # benchmark mode: decode exactly max_new_tokens

    def __post_init__(self) -> None:
        for flag, value in (("--temperature", self.temperature), ("--top-p", self.top_p), ("--top-k", self.top_k),
                            ("--max-new-tokens", self.max_new_tokens)):
            limits.check(flag, value)
        limits.check("seed", self.seed, label="a request's seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes: Any) -> "SamplingParams":
        return replace(self, **changes)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Which drafter proposes tokens and how many per step."""

    method: str = "none"  # none | draft_model | ngram | eagle3 | medusa | suffix
    num_speculative_tokens: int = 0  # k: draft tokens proposed per verification step
    # draft_model: the draft model (catalog name, HF dir or .gguf); eagle3: the head's
    # directory; medusa: the Medusa heads' directory
    draft: str | None = None
    ngram_min: int = 1  # prompt lookup: shortest suffix n-gram to match
    ngram_max: int = 4  # prompt lookup: longest suffix n-gram to match (tried first)
    # Stop drafting early when the draft model's top probability falls below this
    # (0 = always draft k tokens). Lossless: it only shortens the proposal.
    draft_confidence_threshold: float = 0.0
    # Speculation switches off for a step while more than this many requests are in flight
    # (vLLM's speculative_disable_by_batch_size); None = never.
    disable_by_batch_size: int | None = None
    # Per request, k grows by 2 after a fully accepted step and shrinks by 1 otherwise,
    # within [1, num_speculative_tokens] (transformers' "heuristic" schedule, capped).
    dynamic_k: bool = False
    # Draft trees, SGLang's knobs: num_speculative_tokens is the tree's depth (SGLang's
    # num_steps), `topk` the children expanded per node, `num_draft_tokens` the tokens each
    # row verifies per step, root (the last emitted token) included, so the tree keeps
    # num_draft_tokens - 1 nodes (None: 1 + depth * topk). topk 1 is a chain of depth k.
    topk: int = 1
    num_draft_tokens: int | None = None
    # vLLM's speculative_token_tree: a static tree as paths of branch ranks, e.g.
    # ((0,), (1,), (0, 0)); fixes depth and node count (topk, num_draft_tokens stay unset).
    token_tree: tuple[tuple[int, ...], ...] | None = None
    # Suffix decoding (vLLM's names and defaults): the depth of the suffix trees (it bounds
    # the matched pattern plus the proposal), outputs kept in the global tree across requests
    # (FIFO; 0 = no global tree), proposal length <= factor x matched length, and the lowest
    # estimated probability (frequency ratio) of a proposed token.
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; valid: {', '.join(METHODS)}")
        limits.check("--num-speculative-tokens", self.num_speculative_tokens)
        limits.check("disable_by_batch_size", self.disable_by_batch_size)
        limits.check("dynamic_k", self.dynamic_k)
        limits.check("prompt_lookup_min", self.ngram_min, label="ngram_min")
        limits.check("prompt_lookup_max", self.ngram_max, label="ngram_max")
        limits.check("draft_confidence_threshold", self.draft_confidence_threshold)
        if self.draft_confidence_threshold > 0 and self.method not in THRESHOLD_METHODS:
            raise ConfigError(f"draft_confidence_threshold applies to draft_model and eagle3 drafts (the drafter's "
                              f"own probability); method {self.method} ignores it, so leave it 0")
        if self.method in MODEL_FREE_METHODS and self.draft is not None:
            raise ConfigError(_NO_DRAFT.format(method=self.method, why=_NO_DRAFT_WHY[self.method]))
        if self.method == "draft_model" and self.num_speculative_tokens > 0 and not self.draft:
            raise ConfigError("method 'draft_model' needs a draft model (--draft)")
        if self.method == "eagle3" and self.num_speculative_tokens > 0 and not self.draft:
            raise ConfigError("method 'eagle3' needs an EAGLE-3 head directory (--draft PATH or a catalog head, "
                              "or \"model\" in --speculative-config); --method eagle3 without --draft drafts with "
                              f"{DEFAULT_EAGLE3_HEAD} on the default target ({DEFAULT_TARGET}) only")
        if self.method == "medusa" and self.num_speculative_tokens > 0 and not self.draft:
            raise ConfigError("method 'medusa' needs the Medusa heads' directory (--draft PATH, or \"model\" "
                              "in --speculative-config)")
        _check_suffix(self)
        if not (1 <= self.ngram_min <= self.ngram_max):
            raise ConfigError(
                f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max (prompt_lookup_min, prompt_lookup_max "
                f"in --speculative-config), got "
                f"{self.ngram_min}..{self.ngram_max}"
            )

        self._check_tree()

    def _check_tree(self) -> None:
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise ConfigError(f"--topk must be an integer >= 1, got {self.topk!r}")
        n = self.num_draft_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ConfigError(f"--num-draft-tokens must be an integer >= 2 (the root and at least one "
                              f"draft), got {n!r}")
        if self.token_tree is not None:
            tree = self.token_tree
            if not tree or any(not p or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in p)
                               for p in tree):
                raise ConfigError("speculative_token_tree must be a non-empty list of paths of branch ranks "
                                  "(integers >= 0), e.g. [[0], [1], [0, 0]]")
            too_deep = max((r for p in tree for r in p), default=0)
            if too_deep >= limits.MAX_TOPK:
                raise ConfigError(f"speculative_token_tree: branch rank {too_deep} is past the {limits.MAX_TOPK} "
                                  f"children a node may have (ranks 0..{limits.MAX_TOPK - 1})")
            if len(tree) + 1 > limits.MAX_TREE_TOKENS:
                raise ConfigError(f"speculative_token_tree has {len(tree)} nodes: a row verifies at most "
                                  f"{limits.MAX_TREE_TOKENS} tokens a step, the root included")
            missing = sorted({p[:-1] for p in tree if len(p) > 1} - set(tree))
            if missing:
                raise ConfigError(f"speculative_token_tree: path {list(missing[0])} is missing (every prefix of "
                                  "a path must be a path too)")
            if len(set(tree)) != len(tree):
                raise ConfigError("speculative_token_tree lists a path twice")
            if self.topk != 1 or n is not None:
                raise ConfigError("speculative_token_tree fixes the tree: give neither topk nor num_draft_tokens")
            depth = max(len(p) for p in tree)
            if self.num_speculative_tokens not in (0, depth):
                raise ConfigError(f"speculative_token_tree is {depth} deep but num_speculative_tokens (the "
                                  f"depth) is {self.num_speculative_tokens}")
        tree_asked = self.topk > 1 or n is not None or self.token_tree is not None
        if tree_asked and self.method not in TREE_METHODS and self.method != "none":
            raise ConfigError(f"method {self.method!r} drafts one continuation: topk, num_draft_tokens and "
                              f"speculative_token_tree need a tree drafter ({', '.join(TREE_METHODS)})")
        k = self.num_speculative_tokens
        if n is not None and k > 0:
            pool = tree_pool(k, self.topk)
            if n - 1 > pool:
                raise ConfigError(f"--num-draft-tokens {n} exceeds what a tree of depth {k} and topk "
                                  f"{self.topk} can hold ({pool} nodes + the root = {pool + 1})")

    @property
    def is_tree(self) -> bool:
        """Drafts are trees (more than one child per node somewhere, or a static tree)."""
        return self.topk > 1 or self.token_tree is not None

    @property
    def draft_nodes(self) -> int:
        """The most draft nodes a row verifies per step."""
        if self.token_tree is not None:
            return len(self.token_tree)
        return tree_nodes(self.num_speculative_tokens, self.topk, self.num_draft_tokens)

    @property
    def verify_width(self) -> int:
        """Tokens per row in a verify pass: the root and the draft nodes (SGLang's
        num_draft_tokens; a chain's k + 1)."""
        return 1 + self.draft_nodes if self.speculative else 1

    @classmethod
    def for_method(cls, method: str, num_speculative_tokens: int, draft: str | None = None,
                   **knobs: Any) -> "SpeculativeConfig":
        """The configuration of `method` as flags name it: `draft` is kept for the methods
        that draft with one (draft_model, eagle3), dropped for none, refused for ngram; method
        none is the baseline (k = 0)."""
        spec = cls(method=method, num_speculative_tokens=num_speculative_tokens if method != "none" else 0,
                   draft=draft if method in DRAFTED_METHODS else None, **knobs)
        if method in MODEL_FREE_METHODS and draft is not None:
            raise ConfigError(_NO_DRAFT.format(method=method, why=_NO_DRAFT_WHY[method]))
        return spec

    def with_k(self, k: int) -> "SpeculativeConfig":
        """This configuration at k draft tokens per step (`for_method` of this one's method,
        draft and knobs): how a run's k list becomes one configuration per k."""
        return replace(self, num_speculative_tokens=k if self.method != "none" else 0,
                       draft=self.draft if self.method in DRAFTED_METHODS else None)

    @property
    def speculative(self) -> bool:
        return self.method != "none" and self.num_speculative_tokens > 0

    @property
    def short(self) -> str:
        """A short label for directory names and tables, e.g. `draft_model-k4`."""
        if not self.speculative:
            return "baseline"
        label = f"{self.method}-k{self.num_speculative_tokens}"
        if self.dynamic_k:
            label += "dyn"
        if self.token_tree is not None:
            label += f"-tree{len(self.token_tree)}"
        elif self.topk > 1 or self.num_draft_tokens is not None:
            label += f"-t{self.topk}n{self.verify_width}"
        if self.disable_by_batch_size is not None:
            label += f"-off{self.disable_by_batch_size}"
        return label


def tree_pool(k: int, topk: int) -> int:
    """The candidates a tree search of depth `k` reaches: `topk` children of the root, then
    `topk` children of each of the `topk` best frontier nodes per depth (EAGLE-2)."""
    return topk + max(k - 1, 0) * topk * topk


def tree_nodes(k: int, topk: int, num_draft_tokens: int | None) -> int:
    """Draft nodes per step of a tree of depth `k` and `topk` children per node under a budget
    of `num_draft_tokens` (the root included; None: k * topk), capped by what the search
    reaches. A chain (topk 1, no budget): k."""
    return min(num_draft_tokens - 1, tree_pool(k, topk)) if num_draft_tokens is not None else k * topk


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_suffix(spec: SpeculativeConfig) -> None:
    """The suffix decoding knobs, each held to its `specbench.limits` bound (checked for every
    method, so a bad value never hides until a suffix configuration runs)."""
    for knob in SUFFIX_KNOBS:
        limits.check(knob, getattr(spec, knob))


SUFFIX_KNOBS = ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")

BASELINE = SpeculativeConfig()
# prompt lookup's (shortest, longest) n-gram when nothing names them: the field defaults above
DEFAULT_NGRAM = (BASELINE.ngram_min, BASELINE.ngram_max)


@dataclass(frozen=True)
class EngineConfig:
    """Where and in which precision the models run."""

    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto = bf16 on CUDA and on CPUs with avx512_bf16, else float32
    trust_remote_code: bool = False  # never run a model repo's own code unless asked
    # The eager step's CPU kernels: off = transformers' forward with the weights as loaded;
    # auto = wherever they apply (linear layers prepacked for oneDNN, Llama-family layers
    # fused); on = those kernels or a one-line error saying why they do not apply here.
    onednn: str = "auto"
    # The decode step (specbench.engine.static): off = the eager step; static = fixed shapes,
    # one device-to-host transfer per step, run op by op; compile = that step through
    # torch.compile; cudagraph = captured as CUDA graphs; auto = cudagraph on CUDA wherever
    # the run's configurations allow it, else off.
    capture: str = "auto"

    def __post_init__(self) -> None:
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)} (or cuda:N), got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.onednn not in ONEDNN_MODES:
            raise ConfigError(f"--onednn must be one of {', '.join(ONEDNN_MODES)}, got {self.onednn!r}")
        if self.capture not in CAPTURE_MODES:
            raise ConfigError(f"--capture must be one of {', '.join(CAPTURE_MODES)}, got {self.capture!r}")
        if self.onednn == "on" and self.capture not in ("auto", "off"):
            raise ConfigError(f"--onednn on and --capture {self.capture} exclude each other: the static step "
                              "runs the models' own linear layers (use --onednn auto or off)")
        if self.capture == "cudagraph" and self.device == "cpu":
            raise ConfigError("--capture cudagraph needs --device cuda (on a CPU: --capture compile)")

    @property
    def pack(self) -> bool | None:
        """What the engine's `pack` argument is for this mode (None = where it applies)."""
        if self.capture in ("static", "compile", "cudagraph"):
            return False
        return {"off": False, "auto": None, "on": True}[self.onednn]

    def static_mode(self, device_type: str, why_not: str) -> tuple[str | None, str]:
        """(the engine's `static` mode or None for the eager step, why not the static step)
        on a `device_type` device, where `why_not` says why the models or configurations of the
        run cannot take the static step ('' when they can). An explicit mode they cannot
        take is a ConfigError."""
        if self.capture == "off":
            return None, "--capture off"
        if self.capture != "auto":
            if why_not:
                raise ConfigError(f"--capture {self.capture}: {why_not} (use --capture off or auto)")
            if self.capture == "cudagraph" and device_type != "cuda":
                raise ConfigError(f"--capture cudagraph needs a CUDA device, the models are on {device_type}")
            return self.capture, ""
        if device_type != "cuda":
            return None, "auto: on a CPU the eager step on oneDNN kernels is the faster one"
        if why_not:
            return None, f"auto: {why_not}"
        return "cudagraph", ""


_VLLM_METHOD_ALIASES = {
    "draft_model": "draft_model",
    "draft": "draft_model",
    "ngram": "ngram",
    "prompt_lookup": "ngram",
    "eagle3": "eagle3",
    "medusa": "medusa",
    "suffix": "suffix",
    "none": "none",
}


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """Parse vLLM's `--speculative-config` JSON, e.g.
    `{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}` or
    `{"method": "eagle3", "model": "path/to/head", "num_speculative_tokens": 3}`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--speculative-config is not valid JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise ConfigError("--speculative-config is nested too deeply: it must be one flat JSON object") from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        raise ConfigError(f"--speculative-config holds a number too long to read ({str(exc).split(':')[0]})") from None
    if not isinstance(obj, dict):
        raise ConfigError("--speculative-config must be a JSON object")
    known = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
             "draft_confidence_threshold", "disable_by_batch_size", "speculative_disable_by_batch_size",
             "dynamic_k", "topk", "num_draft_tokens", "num_steps", "speculative_token_tree", *SUFFIX_KNOBS}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ConfigError(
            f"--speculative-config: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    where = "--speculative-config: "
    for key in ("method", "model"):
        if obj.get(key) is not None and not (isinstance(obj[key], str) and obj[key].strip()):
            raise ConfigError(f"{where}{key} must be a non-empty string, got {obj[key]!r}")
    for key in sorted(known - {"method", "model", "speculative_token_tree"}):  # the tree: _token_tree
        if key in obj:
            if obj[key] is None:
                raise ConfigError(f"{where}{key} must be {limits.limit(key).describe()}, got null "
                                  "(leave the key out for its default)")
            limits.check(key, obj[key], where=where)
    if "disable_by_batch_size" in obj and "speculative_disable_by_batch_size" in obj:
        raise ConfigError(f"{where}give disable_by_batch_size or speculative_disable_by_batch_size, not both")
    raw_method = obj.get("method")
    if raw_method is None:
        raw_method = "draft_model" if obj.get("model") else "none"
    method = _VLLM_METHOD_ALIASES.get(str(raw_method))
    if method is None:
        raise ConfigError(
            f"--speculative-config: unknown method {raw_method!r}; valid: {', '.join(sorted(_VLLM_METHOD_ALIASES))}"
        )
    tree = _token_tree(obj.get("speculative_token_tree"))
    for key in ("num_steps", "topk", "num_draft_tokens"):
        if key in obj and (not isinstance(obj[key], int) or isinstance(obj[key], bool)):
            raise ConfigError(f"--speculative-config: {key} must be an integer, got {obj[key]!r}")
    # vLLM's suffix method drafts up to the tree depth when no k is given
    depth = obj.get("suffix_decoding_max_tree_depth", BASELINE.suffix_decoding_max_tree_depth)
    default_k = 0 if method == "none" else (
        depth if method == "suffix" and _is_int(depth) and depth >= 1 else DEFAULT_NUM_SPECULATIVE_TOKENS)
    if tree is not None:
        # vLLM: num_speculative_tokens counts the tree's nodes; here the depth is what varies
        nodes = obj.get("num_speculative_tokens", len(tree))
        if nodes != len(tree):
            raise ConfigError(f"--speculative-config: num_speculative_tokens is {nodes!r} but "
                              f"speculative_token_tree has {len(tree)} nodes (vLLM: they must agree)")
        k = max(len(p) for p in tree)
    else:
        k = obj.get("num_steps", obj.get("num_speculative_tokens", default_k))
        if "num_steps" in obj and "num_speculative_tokens" in obj and obj["num_steps"] != obj["num_speculative_tokens"]:
            raise ConfigError("--speculative-config: num_steps (the tree's depth) and num_speculative_tokens "
                              "disagree; give one")
    k = limits.check("num_speculative_tokens", k, where=where)
    if k < 1 and method != "none":
        raise ConfigError(f"--speculative-config: num_speculative_tokens must be >= 1 for method "
                          f"{raw_method!r}, got {k}")
    return SpeculativeConfig(
        topk=obj.get("topk", 1), num_draft_tokens=obj.get("num_draft_tokens"), token_tree=tree,
        method=method,
        num_speculative_tokens=k,
        draft=obj.get("model"),
        ngram_min=limits.check("prompt_lookup_min", obj.get("prompt_lookup_min", DEFAULT_NGRAM[0])),
        ngram_max=limits.check("prompt_lookup_max", obj.get("prompt_lookup_max", DEFAULT_NGRAM[1])),
        draft_confidence_threshold=limits.check("draft_confidence_threshold",
                                                obj.get("draft_confidence_threshold", 0.0)),
        disable_by_batch_size=limits.check("disable_by_batch_size", obj.get(
            "disable_by_batch_size", obj.get("speculative_disable_by_batch_size"))),
        dynamic_k=obj.get("dynamic_k", False),
        **{knob: obj[knob] for knob in SUFFIX_KNOBS if knob in obj},
    )


def _token_tree(value: Any) -> tuple[tuple[int, ...], ...] | None:
    """vLLM's speculative_token_tree: a list of paths, or that list written as a Python
    literal string ("[(0,), (1,), (0, 0)]", as vLLM takes it)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            shown = repr(value) if len(value) <= 60 else repr(value[:57] + "...")
            raise ConfigError(f"--speculative-config: speculative_token_tree {shown} is not a list of "
                              "paths, e.g. \"[(0,), (1,), (0, 0)]\"") from None
    # the depth (the longest path) is taken before SpeculativeConfig checks the tree: an empty
    # tree or path must be refused here
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(p, (list, tuple)) and p for p in value)):
        raise ConfigError("--speculative-config: speculative_token_tree must be a non-empty list of "
                          "non-empty paths of branch ranks, e.g. [[0], [1], [0, 0]]")
    return tuple(tuple(p) for p in value)


def _plain(value: Any) -> Any:
    """`value` as JSON holds it: tuples as lists, mappings as dicts, all the way down."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class RunConfig:
    """The `config` object of a run's run.json: the run as it was asked for (the command's
    flags, resolved), what setting it up found, and what the runner added per configuration.

    `to_dict()` writes the JSON keys runs have always had; `from_dict()` reads them back, also
    from older runs and sweep trials, which lack some: a missing key reads as None (or empty),
    never as a guess. Keys not named here travel in `extra`, so nothing read is lost. Whatever
    reads run.json's configuration (compare, report, sweep) goes through `from_dict`, not
    through key strings. Mapping fields are read-only views of the JSON.
    """

    # ---- as asked: every run writes these keys ------------------------------------------
    target: str | None = None  # catalog name, model directory or .gguf (openai: the served model)
    draft: str | None = None  # the draft model, or (eagle3) the EAGLE-3 head's directory
    method: str | None = None  # none | draft_model | ngram | eagle3
    num_speculative_tokens: tuple[int, ...] = ()  # k of each configuration
    ngram: tuple[int, ...] | None = None  # prompt lookup's (ngram_min, ngram_max)
    workload: str | None = None  # prompt-set name or file
    workload_kind: str | None = None  # real | high-entropy | regression | custom
    num_prompts: int | None = None  # prompts per configuration, after sampling
    sampling: Mapping[str, Any] = field(default_factory=dict)  # sampling flags given explicitly
    seed: int | None = None  # base seed: prompt sampling, request seeds, interleaving order
    ignore_eos: bool | None = None
    concurrency: tuple[int, ...] = ()  # requests in flight, one level after another
    request_rate: float | None = None  # requests/s of Poisson arrivals; None = closed loop
    disable_by_batch_size: int | None = None
    dynamic_k: bool | None = None
    warmup: int | None = None  # warm-up waves per configuration
    repeats: int | None = None  # measurements of every prompt per configuration
    interleave: bool | None = None  # configurations alternated block by block
    time_budget_s: float | None = None  # measuring time after which no prompt starts; None = none
    device: str | None = None  # as asked: auto | cpu | cuda | cuda:N
    dtype: str | None = None  # as asked: auto | bfloat16 | float16 | float32
    onednn: str | None = None  # the eager step's CPU kernels: off | auto | on
    capture: str | None = None  # the decode step asked for: auto | off | static | compile | cudagraph
    backend: str | None = None  # embedded | hf | openai
    baseline: bool | None = None  # paired with the non-speculative baseline
    chat_template: bool | None = None
    truncate: bool | None = None  # long prompts left-truncated (else skipped)
    configurations: tuple[str, ...] = ()  # configuration ids, in plan order
    # ---- found while setting up: written once known ----------------------------------
    dtype_resolved: str | None = None  # the dtype the models really run in
    engine: Mapping[str, Any] | None = None  # embedded: the forward path and why
    eagle3_head: Mapping[str, Any] | None = None  # eagle3: the head's format and sizes
    medusa_heads: Mapping[str, Any] | None = None  # medusa: the heads' layout and sizes
    suffix_decoding: Mapping[str, Any] | None = None  # suffix: the suffix_decoding_* knobs run
    openai: Mapping[str, Any] | None = None  # openai: the server and how it is spoken to
    server: Mapping[str, Any] | None = None  # a sweep across servers: the trial's command and log
    sweep: Mapping[str, Any] | None = None  # a sweep trial: study, storage, trial, objectives, host
    # ---- added by the runner ----------------------------------------------------------
    configuration_stats: Mapping[str, Any] = field(default_factory=dict)  # per configuration id
    interrupted_by: str | None = None  # SIGINT | SIGTERM
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys not named above, as read

    @property
    def dtype_used(self) -> str | None:
        """The dtype the models ran in, or (older runs, servers) the one asked for."""
        return self.dtype_resolved or self.dtype

    @classmethod
    def keys(cls) -> frozenset[str]:
        """The run.json keys this class names (`extra` holds any other)."""
        return frozenset(f.name for f in fields(cls)) - {"extra"}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object for run.json: every "as asked" key; the others once they are set."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in _SET_WHEN_KNOWN and value in (None, {})):
                continue
            out[f.name] = _plain(value)
        out.update(_plain(self.extra))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "RunConfig":
        """Read run.json's `config` object (None or {} for a run that has none)."""
        data = dict(data or {})
        known = cls.keys()
        values = {k: tuple(v) if k in _LIST_KEYS and isinstance(v, list) else v
                  for k, v in data.items() if k in known and v is not None}
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})


_SET_WHEN_KNOWN = frozenset({"dtype_resolved", "engine", "eagle3_head", "medusa_heads", "suffix_decoding", "openai", "server", "sweep",
                             "configuration_stats", "interrupted_by"})
_LIST_KEYS = frozenset({"num_speculative_tokens", "ngram", "concurrency", "configurations"})
