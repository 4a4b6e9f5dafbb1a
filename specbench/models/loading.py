"""Turn a model spec (catalog name, Hugging Face directory or .gguf file) into a loaded model.

Settles the device and dtype, loads model and tokenizer from local files only (never the
hub), collects the ids that end a generation, and checks that a target and a draft share one
tokenizer, so the engine can compare their distributions token id by token id. Fetching and
conversion live in specbench.models.fetch; nothing here generates text.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.config import EngineConfig
from specbench.errors import ConfigError, ModelError, TokenizerMismatchError
from specbench.models import catalog, fetch

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# --- device and dtype ----------------------------------------------------------------------


def resolve_device(cfg: EngineConfig) -> torch.device:
    """`auto` = the first CUDA device when there is one, else the CPU."""
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {cfg.device}: CUDA is not available (torch {torch.__version__}); "
                "use --device cpu or auto"
            )
        device = torch.device(cfg.device)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {cfg.device}: only {torch.cuda.device_count()} CUDA device(s), "
                f"valid: cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
        return device
    return torch.device("cpu")


@functools.lru_cache(maxsize=1)
def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); without it, bf16 matmuls
    are emulated and slower than float32."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def resolve_dtype(cfg: EngineConfig, device: torch.device) -> torch.dtype:
    """`auto` = bf16 on CUDA (fp16 on GPUs without bf16) and on CPUs with native bf16, else
    float32."""
    if cfg.dtype != "auto":
        return _DTYPES[cfg.dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


# --- paths ---------------------------------------------------------------------------------


def _converted(spec: str, dest: Path, make: Callable[[], Path], done: str, pull_missing: bool) -> Path:
    """`dest` if it is converted already, else `make()` it (or, without `pull_missing`, say how)."""
    if fetch.is_converted(dest):
        return dest
    if not pull_missing:
        raise ModelError(f"model {spec!r} is not {done} yet; run `specbench models pull {spec}`")
    return make()


def resolve_model_path(spec: str, pull_missing: bool = True) -> Path:
    """The local Hugging Face directory for `spec`.

    A path that exists wins over a catalog name (as in transformers: a local directory beats
    a hub id). Catalog names are pulled on first use; a .gguf is converted on first use;
    with `pull_missing=False` either raises instead of fetching or converting."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            hint = f"; pass the .gguf file itself ({ggufs[0]})" if ggufs else ""
            raise ModelError(f"model {spec!r}: directory has no config.json{hint}")
        return path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(
                f"model {spec!r}: not a .gguf file; pass a catalog name, a Hugging Face model "
                "directory or a .gguf file"
            )
        return _converted(spec, fetch.user_gguf_dir(path), lambda: fetch.convert_user_gguf(path),
                          "converted", pull_missing)
    if catalog.is_catalog_name(spec):
        entry = catalog.get_entry(spec)
        if entry.is_head:
            raise ModelError(f"model {spec!r} is an EAGLE-3 head for {entry.target}, not a model to run or draft "
                             f"with: pass it to method eagle3 (--method eagle3 --draft {spec})")
        return _converted(spec, fetch.converted_dir(spec), lambda: fetch.pull(spec), "pulled", pull_missing)
    models = ", ".join(n for n in catalog.names() if not catalog.get_entry(n).is_head)
    raise ModelError(
        f"model {spec!r}: no such file or directory; pass a catalog name "
        f"({models}), a Hugging Face model directory or a .gguf file"
    )


# --- loading -------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    name: str  # what the user passed (catalog name) or the directory / file name
    path: Path  # the Hugging Face directory the weights came from
    model: Any  # a transformers causal LM in eval mode on `device`
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]  # any of these ends a request (unless ignore_eos)
    max_context: int  # prompt + generated tokens the model was trained for
    load_s: float = 0.0  # wall time of tokenizer + weights load and move to device

    @property
    def vocab_size(self) -> int:
        """Rows of the output distribution (lm_head), which may exceed len(tokenizer)."""
        return output_vocab_size(self.model)


def output_vocab_size(model: Any) -> int:
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tiktoken.model",
                   "vocab.txt")


def check_tokenizer(tokenizer: Any, path: Path, name: str) -> None:
    """A directory without tokenizer files still loads a tokenizer (transformers builds an
    empty one from the config's model type) that turns every prompt into nothing: refuse it
    here, naming the files, rather than blame the prompts later."""
    if len(tokenizer) > 1:
        return
    present = ", ".join(sorted(p.name for p in Path(path).iterdir())) if Path(path).is_dir() else "none"
    raise ModelError(f"{name}: {path} has no usable tokenizer (expected one of {', '.join(TOKENIZER_FILES)} "
                     f"beside config.json; files present: {present}); copy them from the model's repository")


def eos_ids(generation_config: Any, tokenizer: Any) -> tuple[int, ...]:
    """Union of the generation config's eos ids and the tokenizer's, generation config first."""
    out: list[int] = []
    declared = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    items = list(declared) if isinstance(declared, (list, tuple)) else [declared]
    items.append(getattr(tokenizer, "eos_token_id", None))
    for i in items:
        if i is not None and int(i) not in out:
            out.append(int(i))
    return tuple(out)


def _display_name(spec: str) -> str:
    if catalog.is_catalog_name(spec) and not Path(spec).exists():
        return spec
    path = Path(spec).expanduser()
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_model(spec: str, cfg: EngineConfig) -> LoadedModel:
    """Load model and tokenizer for `spec` on the configured device and dtype, in eval mode
    with gradients off (inference only). Fetches or converts on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = resolve_model_path(spec)
    device = resolve_device(cfg)
    dtype = resolve_dtype(cfg, device)
    name = _display_name(spec)
    started = time.perf_counter()
    try:
        with fetch.quiet_transformers_progress():
            tokenizer = AutoTokenizer.from_pretrained(
                path, local_files_only=True, trust_remote_code=cfg.trust_remote_code
            )
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, trust_remote_code=cfg.trust_remote_code,
                attn_implementation="sdpa", local_files_only=True,
            )
    except Exception as exc:  # noqa: BLE001 - a broken config or weights file fails in many ways
        # (TypeError for a config.json that is not an object, SafetensorError for cut weights)
        raise ModelError(f"model {name!r}: could not load from {path}: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from None
    check_tokenizer(tokenizer, path, f"model {name!r}")
    model = model.to(device).eval().requires_grad_(False)
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        gen = getattr(model, "generation_config", None)
    eos = eos_ids(gen, tokenizer)
    if not eos:
        # Without an end-of-sequence id only max_new_tokens ends a request: say so loudly.
        raise ModelError(
            f"model {name!r}: neither generation_config.json nor the tokenizer names an eos token"
        )
    max_context = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 0)
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 10**8:  # tokenizers say ~1e30 for "no limit"
        max_context = min(max_context, tok_max) if max_context else tok_max
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return LoadedModel(name=name, path=path, model=model, tokenizer=tokenizer, device=device,
                       dtype=dtype, eos_token_ids=eos, max_context=max_context or 2048,
                       load_s=time.perf_counter() - started)


# --- target/draft compatibility ------------------------------------------------------------


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a target/draft pair that does not share one vocabulary.

    Speculative decoding compares the two models' probabilities of the same token id, so the
    tokenizers' string -> id maps must be identical, and so must the lm_head widths (the
    distributions are compared row for row). Embedding tables padded beyond len(tokenizer)
    are fine as long as both are padded alike (Qwen2.5 0.5B and 1.5B: 151,936 rows)."""
    pair = f"target {target.name!r} and draft {draft.name!r} do not share a tokenizer"
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if len(tv) != len(dv):
        raise TokenizerMismatchError(f"{pair}: vocabularies of {len(tv):,} vs {len(dv):,} tokens")
    if tv != dv:
        by_id = {i: t for t, i in dv.items()}
        diff = sorted((i, t) for t, i in tv.items() if by_id.get(i) != t)
        i, t = diff[0]
        raise TokenizerMismatchError(
            f"{pair}: {len(diff):,} token ids map to different strings "
            f"(first: id {i} is {t!r} vs {by_id.get(i)!r})"
        )
    tw, dw = output_vocab_size(target.model), output_vocab_size(draft.model)
    if tw != dw:
        raise TokenizerMismatchError(
            f"{pair}: output vocabularies (lm_head rows) of {tw:,} vs {dw:,}; the engine compares "
            "the two distributions row for row"
        )
