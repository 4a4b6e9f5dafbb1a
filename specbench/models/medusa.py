"""Medusa heads (Cai et al., 2024, arXiv:2401.10774): read, check, fit to a target, save.

Head i (0-based) reads the target's last hidden state h_t (after the final norm: what the
target's own LM head reads) and predicts the token at t + 2 + i:

    x = h_t;  for each layer j: x = x + SiLU(W_ij x + b_ij);  logits_i = U_i x

(the paper's residual block, `num_hidden_layers` of them per head, then a linear map to the
vocabulary). Two checkpoint layouts are read, safetensors or a PyTorch file read with
`weights_only=True` (no pickled code runs):

- vLLM's (`vllm/model_executor/models/medusa.py`): config.json with `num_heads`,
  `num_hidden_layers`, `hidden_size`, `vocab_size`, optional `medusa_fc_bias`,
  `truncated_vocab_size` with a `token_map` tensor (a reduced draft vocabulary: draft id i is
  target id token_map[i]), `original_lm_head` (one LM head shared by every head);
  weights `blocks.{i}.layers.{j}.weight` (+ `.bias`), `lm_heads.{i}.weight`, optionally
  prefixed `medusa_heads.`.
- FasterDecoding's (`medusa_lm_head.safetensors` / `.pt` / `.bin` beside a config.json with
  `medusa_num_heads`, `medusa_num_layers`): weights `{i}.{j}.linear.weight` / `.bias` and
  `{i}.{num_layers}.weight` (the head's LM head), optionally prefixed `medusa_head.`.

`save_heads` writes vLLM's layout (what `vllm serve --speculative-config '{"method":
"medusa", "model": DIR, ...}'` loads). Training: specbench.models.medusa_train.

Boundary: files and tensors; the drafting loop lives in specbench.engine.drafters.medusa.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbench.errors import ConfigError, ModelError
from specbench.atomic import atomic_write

# Weight files tried in order: vLLM / HF style, then FasterDecoding's names.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "medusa_lm_head.safetensors", "medusa_lm_head.pt",
                "medusa_lm_head.bin")
_VLLM_KEY = re.compile(r"^(blocks\.\d+\.layers\.\d+\.(weight|bias)|lm_heads\.\d+\.weight|lm_head\.weight|token_map)$")
_FD_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def _fail(path: Path | str, what: str) -> ModelError:
    return ModelError(f"Medusa heads {str(path)!r}: {what}")


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int  # residual blocks per head
    hidden_size: int
    vocab_size: int  # the target vocabulary
    draft_vocab_size: int  # rows of each head's LM head (== vocab_size unless token_map)
    bias: bool = True  # the residual linears have a bias (FasterDecoding: always; vLLM: medusa_fc_bias)
    shared_lm_head: bool = False  # vLLM's original_lm_head
    format: str = "vllm"  # vllm | medusa (FasterDecoding)


class MedusaHeads(torch.nn.Module):
    """K Medusa heads; `forward(h [..., H])` -> logits [..., K, vocab_size] over the target
    vocabulary (-inf outside a reduced draft vocabulary)."""

    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.blocks = torch.nn.ModuleList()
        for _ in range(cfg.num_heads):
            block = torch.nn.Module()
            block.layers = torch.nn.ModuleList([torch.nn.Linear(H, H, bias=cfg.bias) for _ in range(cfg.num_layers)])
            self.blocks.append(block)
        n_lm = 1 if cfg.shared_lm_head else cfg.num_heads
        self.lm_heads = torch.nn.ModuleList([torch.nn.Linear(H, cfg.draft_vocab_size, bias=False) for _ in range(n_lm)])
        self.register_buffer("token_map", None)

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def head_states(self, h: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for block in self.blocks:
            x = h
            for layer in block.layers:
                x = x + torch.nn.functional.silu(layer(x))
            out.append(x)
        return out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        states = self.head_states(h)
        logits = [self.lm_heads[0 if self.config.shared_lm_head else i](x) for i, x in enumerate(states)]
        out = torch.stack(logits, dim=-2)  # [..., K, draft vocab]
        if self.token_map is None:
            return out
        full = torch.full((*out.shape[:-1], self.config.vocab_size), float("-inf"), dtype=out.dtype,
                          device=out.device)
        full[..., self.token_map] = out
        return full


# --------------------------------------------------------------------------------------
# Reading


def _read_weights(path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for name in WEIGHT_FILES:
        file = path / name
        if not file.is_file():
            continue
        if name.endswith(".safetensors"):
            try:
                return name, load_file(str(file))
            except (SafetensorError, OSError) as exc:
                raise _fail(path, f"{name} is not a safetensors file ({exc})") from None
        try:
            obj = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:  # an unpickler refusal or a corrupt file: one line either way
            raise _fail(path, f"{name} is not a PyTorch weights file readable with weights_only=True "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise _fail(path, f"{name} does not hold a dict of tensors")
        return name, obj
    raise _fail(path, f"no weights ({', '.join(WEIGHT_FILES)}); not a Medusa heads directory")


def _strip(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in weights.items():
        for prefix in ("medusa_heads.", "medusa_head."):
            if k.startswith(prefix):
                k = k[len(prefix):]
                break
        out[k] = v
    return out


def _count(cfg: dict[str, Any], word: str) -> int | None:
    """vLLM's reading: any config key with "num" and `word` in it (num_heads, medusa_num_heads)."""
    for k, v in cfg.items():
        if "num" in k and word in k and isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _from_fasterdecoding(path: Path, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FasterDecoding's keys as vLLM's: `{i}.{j}.linear.*` -> blocks.{i}.layers.{j}.*, and
    the last index of a head (a bare `.weight`) -> lm_heads.{i}.weight."""
    out: dict[str, torch.Tensor] = {}
    last: dict[int, int] = {}
    for k in w:
        m = _FD_KEY.match(k)
        if m and m.group(3) == "weight":
            last[int(m.group(1))] = max(last.get(int(m.group(1)), -1), int(m.group(2)))
    for k, v in w.items():
        m = _FD_KEY.match(k)
        if m is None:
            raise _fail(path, f"unexpected weight {k!r} in the FasterDecoding layout ({{head}}.{{layer}}.linear.weight)")
        i, j, kind = int(m.group(1)), int(m.group(2)), m.group(3)
        if kind == "weight":
            if j != last[i]:
                raise _fail(path, f"weight {k!r}: a bare weight must be head {i}'s last module (its LM head)")
            out[f"lm_heads.{i}.weight"] = v
        else:
            out[f"blocks.{i}.layers.{j}.{kind.split('.')[1]}"] = v
    return out


def read_heads(path: str | Path) -> tuple[MedusaConfig, dict[str, torch.Tensor]]:
    """The config and weights (in vLLM's names) of the heads directory `path`."""
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise _fail(path, f"{what} (method medusa reads a local directory: config.json + weights)")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise _fail(path, "no config.json; not a Medusa heads directory")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"config.json is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise _fail(path, "config.json must hold a JSON object")
    _, raw = _read_weights(path)
    w = _strip(raw)
    if any(k.startswith(("model.", "transformer.")) for k in w):
        raise _fail(path, "holds a whole model (model.* weights), not Medusa heads; a draft model goes with "
                          "--method draft_model")
    if any(_VLLM_KEY.match(k) for k in w):
        fmt = "vllm"
        stray = [k for k in w if not _VLLM_KEY.match(k)]
        if stray:
            raise _fail(path, f"unexpected weight {stray[0]!r} (vLLM layout: blocks.{{i}}.layers.{{j}}.weight, "
                              "lm_heads.{i}.weight)")
    elif w and all(_FD_KEY.match(k) for k in w):
        fmt, w = "medusa", _from_fasterdecoding(path, w)
    else:
        first = next(iter(w), None)
        raise _fail(path, f"weights in no known layout (first key {first!r}; expected vLLM's blocks.*/lm_heads.* "
                          "or FasterDecoding's {head}.{layer}.linear.weight)")
    heads = sorted({int(k.split(".")[1]) for k in w if k.startswith("blocks.")})
    n_heads = _count(cfg, "heads") or len(heads)
    if n_heads < 1 or heads != list(range(n_heads)):
        raise _fail(path, f"config says {n_heads} heads, the weights hold residual blocks of heads {heads}")
    layers = sorted({int(k.split(".")[3]) for k in w if k.startswith("blocks.0.")})
    n_layers = _count(cfg, "layers") or len(layers)
    if n_layers < 1 or layers != list(range(n_layers)):
        raise _fail(path, f"config says {n_layers} layers per head, head 0 holds layers {layers}")
    w0 = w["blocks.0.layers.0.weight"]
    hidden = int(w0.shape[1])
    shared = bool(cfg.get("original_lm_head", False)) and fmt == "vllm"
    if shared and "lm_head.weight" in w:
        w["lm_heads.0.weight"] = w.pop("lm_head.weight")
    lm_names = ["lm_heads.0.weight"] if shared else [f"lm_heads.{i}.weight" for i in range(n_heads)]
    missing = [k for k in lm_names if k not in w]
    if missing:
        raise _fail(path, f"missing weight {missing[0]!r} (each head's LM head)")
    draft_vocab = int(w[lm_names[0]].shape[0])
    token_map = w.get("token_map")
    for key in ("vocab_size", "hidden_size"):
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise _fail(path, f"config.json's {key} must be a positive integer, got {v!r}")
    vocab = int(cfg.get("vocab_size") or draft_vocab)
    if token_map is None and draft_vocab != vocab:
        raise _fail(path, f"the LM heads have {draft_vocab:,} rows but vocab_size is {vocab:,} and there is no token_map")
    bias = "blocks.0.layers.0.bias" in w
    config = MedusaConfig(n_heads, n_layers, hidden, vocab, draft_vocab, bias=bias, shared_lm_head=shared, format=fmt)
    if "hidden_size" in cfg and cfg["hidden_size"] != hidden:
        raise _fail(path, f"config.json says hidden_size {cfg['hidden_size']}, the weights are {hidden} wide")
    return config, w


def build_heads(cfg: MedusaConfig, weights: dict[str, torch.Tensor], path: Path | str = "<memory>") -> MedusaHeads:
    heads = MedusaHeads(cfg)
    state = heads.state_dict()
    missing = [k for k in state if k not in weights]
    if missing:
        raise _fail(path, f"missing weight {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for k, v in state.items():
        if weights[k].shape != v.shape:
            raise _fail(path, f"weight {k!r} has shape {tuple(weights[k].shape)}, the config implies {tuple(v.shape)}")
    heads.load_state_dict({k: weights[k] for k in state})
    tm = weights.get("token_map")
    if tm is not None:
        if tm.is_floating_point() or tm.is_complex() or tm.dtype == torch.bool:
            raise _fail(path, f"token_map must hold integer token ids, it holds {str(tm.dtype).replace('torch.', '')}")
        tm = tm.to(torch.long).view(-1)
        if tm.numel() != cfg.draft_vocab_size or (tm.numel() and not 0 <= int(tm.min()) <= int(tm.max()) < cfg.vocab_size):
            raise _fail(path, f"token_map must list {cfg.draft_vocab_size:,} ids of the vocabulary of {cfg.vocab_size:,}")
        if int(torch.unique(tm).numel()) != tm.numel():
            raise _fail(path, "token_map lists a token id twice (each draft id maps to its own target id)")
        heads.token_map = tm
    return heads.eval().requires_grad_(False)


def fit_to_target(heads: MedusaHeads, target: Any, *, path: Path | str, target_name: str) -> MedusaHeads:
    """Check heads against the target they draft for; place them on its device and dtype."""
    from specbench.models.eagle3.formats import output_rows

    cfg = heads.config
    tcfg = target.config.get_text_config()
    if cfg.hidden_size != int(tcfg.hidden_size):
        raise _fail(path, f"the heads read hidden states of size {cfg.hidden_size}, but target {target_name!r} "
                          f"has hidden size {int(tcfg.hidden_size)}")
    t_vocab = output_rows(target)
    if cfg.vocab_size != t_vocab:
        raise _fail(path, f"the heads' vocabulary has {cfg.vocab_size:,} tokens, but target {target_name!r} has {t_vocab:,}")
    p = next(target.parameters())
    return heads.to(device=p.device, dtype=p.dtype)


def load_heads(spec: str | Path, target: Any, *, target_name: str = "target") -> MedusaHeads:
    cfg, weights = read_heads(spec)
    return fit_to_target(build_heads(cfg, weights, spec), target, path=spec, target_name=target_name)


# --------------------------------------------------------------------------------------
# Writing


def save_heads(heads: MedusaHeads, path: str | Path, *, base_model: str | None = None) -> Path:
    """Write `heads` in vLLM's layout (config.json + model.safetensors), atomically per file."""
    from safetensors.torch import save


    cfg = heads.config
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in heads.state_dict().items() if v is not None}
    blob = save(state)
    atomic_write(path / "model.safetensors", lambda fh: fh.write(blob))
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": cfg.hidden_size,
              "vocab_size": cfg.vocab_size, "num_heads": cfg.num_heads, "num_hidden_layers": cfg.num_layers,
              "medusa_fc_bias": cfg.bias, "truncated_vocab_size": cfg.draft_vocab_size,
              "original_lm_head": cfg.shared_lm_head}
    if base_model:
        config["base_model_name_or_path"] = base_model
    text = (json.dumps(config, indent=2) + "\n").encode()
    atomic_write(path / "config.json", lambda fh: fh.write(text))
    return path


def check_depth(heads: MedusaHeads, specs: Any, path: Path | str) -> None:
    """Medusa heads draft one token per head: a configuration asking for a deeper draft would
    be recorded as k while drafting fewer, so it is refused (a ConfigError naming -k)."""
    n = heads.config.num_heads
    for spec in specs:
        if spec.method == "medusa" and spec.num_speculative_tokens > n:
            raise ConfigError(f"--num-speculative-tokens {spec.num_speculative_tokens}: the Medusa heads in "
                              f"{str(path)!r} draft at most {n} token(s) deep, one per head (use -k 1..{n})")


def describe(heads: MedusaHeads) -> dict[str, Any]:
    cfg = heads.config
    return {"format": cfg.format, "num_heads": cfg.num_heads, "num_layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size, "draft_vocab_size": cfg.draft_vocab_size,
            "parameters": sum(p.numel() for p in heads.parameters())}


__all__ = ["MedusaConfig", "MedusaHeads", "read_heads", "build_heads", "fit_to_target", "load_heads",
           "save_heads", "describe", "check_depth", "WEIGHT_FILES"]
