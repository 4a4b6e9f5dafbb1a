"""The two public EAGLE-3 checkpoint formats: read, check, fit to a target, save, describe.

Boundary: files and tensors for `specbench.models.eagle3.module`; nothing from a head
directory is executed (safetensors, or a .bin read with `weights_only=True`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specbench.errors import ModelError
from specbench.models.eagle3.module import (
    _IGNORED_KEYS,
    FORMATS,
    SPECULATORS_TYPE,
    WEIGHT_FILES,
    Eagle3Head,
    HeadConfig,
    default_aux_layers,
)
from specbench.models.fetch import check_head_target
from specbench.atomic import atomic_write
from specbench.models.fetch import catalog_head
from specbench.models.catalog import head_names

# --------------------------------------------------------------------------------------
# Reading a head directory


def _fail(path: Path, what: str) -> ModelError:
    return ModelError(f"EAGLE-3 head {str(path)!r}: {what}")


def _read_json(path: Path, file: Path) -> dict[str, Any]:
    try:
        obj = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"{file.name} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _fail(path, f"{file.name} must hold a JSON object")
    return obj


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's checkpoint: safetensors (one file or an index of
    shards) or a PyTorch .bin, read with weights_only=True (no pickled code runs)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    def load_bin(file: Path) -> dict[str, torch.Tensor]:
        try:
            obj = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:  # an unpickler refusal or a corrupt file: one line either way
            raise _fail(path, f"{file.name} is not a PyTorch weights file readable with "
                              f"weights_only=True ({str(exc).splitlines()[0]})") from None
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise _fail(path, f"{file.name} does not hold a dict of tensors")
        return obj

    def load_st(file: Path) -> dict[str, torch.Tensor]:
        try:
            return load_file(file, device="cpu")
        except (SafetensorError, OSError) as exc:
            raise _fail(path, f"{file.name} is not a safetensors file ({exc})") from None

    for name, loader in (("model.safetensors", load_st), ("pytorch_model.bin", load_bin)):
        single, index = path / name, path / f"{name}.index.json"
        if single.is_file():
            return loader(single)
        if index.is_file():
            shards = sorted(set(_read_json(path, index).get("weight_map", {}).values()))
            out: dict[str, torch.Tensor] = {}
            for shard in shards:
                if not (path / shard).is_file():
                    raise _fail(path, f"{index.name} names {shard}, which is missing")
                out.update(loader(path / shard))
            return out
    raise _fail(path, f"no weights ({' or '.join(WEIGHT_FILES[::2])}); not an EAGLE-3 head")


def _int(path: Path, obj: dict[str, Any], key: str, where: str, default: Any = None) -> int:
    value = obj.get(key)
    if value is None:  # null means absent (speculators' converter writes target_hidden_size: null)
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _fail(path, f"{where}{key} must be a positive integer, got {value!r}")
    return value


def _layer_ids(path: Path, value: Any, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in value):
        raise _fail(path, f"{key} must be a list of layer indices, got {value!r}")
    return tuple(sorted(value))  # features are concatenated in layer order, as vLLM does


def parse_config(path: Path, cfg: dict[str, Any], keys: set[str]) -> HeadConfig:
    """The HeadConfig of a head directory's config.json; `keys` are its weight names (they
    tell the original release's `midlayer.*` layout from anything else)."""
    kind = cfg.get("speculators_model_type")
    if kind is not None:
        if kind != SPECULATORS_TYPE:
            raise _fail(path, f"unknown head format: speculators_model_type {kind!r} "
                              f"(valid: {SPECULATORS_TYPE!r}; EAGLE-1, MLP and other speculators are not EAGLE-3)")
        layer = cfg.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise _fail(path, "config.json has no transformer_layer_config object (the decoder layer's config)")
        fmt, where, nbr_default = "speculators", "transformer_layer_config.", True
        spec_cfg = cfg.get("speculators_config") or {}
        methods = spec_cfg.get("proposal_methods") or [{}]
        tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
        verifier = (spec_cfg.get("verifier") or {}).get("name_or_path")
        aux = _layer_ids(path, cfg.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids")
    else:
        if "fc.weight" not in keys:
            hint = " (it looks like a full model: use --method draft_model)" if any(
                k.startswith(("model.layers.", "model.embed_tokens")) for k in keys) else ""
            raise _fail(path, f"not an EAGLE-3 head: no fc.weight among its weights{hint}")
        if not any(k.startswith(("midlayer.", "layers.0.")) for k in keys):
            raise _fail(path, "unknown head format: fc.weight without a decoder layer (midlayer.* as in the "
                              "EAGLE-3 release, or layers.0.* with speculators_model_type 'eagle3')")
        if "draft_vocab_size" not in cfg and "d2t" in keys:
            raise _fail(path, "config.json has no draft_vocab_size")
        layer, fmt, where, nbr_default = cfg, "eagle3", "", False
        tokens = verifier = None
        eagle_cfg = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
        aux = _layer_ids(path, cfg.get("eagle_aux_hidden_state_layer_ids",
                                       eagle_cfg.get("eagle_aux_hidden_state_layer_ids")),
                         "eagle_aux_hidden_state_layer_ids")
    if cfg.get("norm_before_fc"):
        raise _fail(path, "norm_before_fc is set (an RMSNorm before fc, gpt-oss heads); this engine "
                          "runs heads without it")
    for flag, what in (("fc_norm", "an RMSNorm on each feature layer before fc"),
                       ("norm_output", "the next draft step reads the normalized output (EAGLE 3.1)")):
        if cfg.get(flag):
            raise _fail(path, f"{flag} is set ({what}); this engine runs heads without it")
    # the decoder layer: llama, or Qwen3 (a llama layer with q/k norms, as speculators builds for
    # Qwen3 targets); without a model_type the weights tell
    layer_type = layer.get("model_type", "llama")
    if layer_type not in ("llama", "qwen3"):
        raise _fail(path, f"{where}model_type is {layer_type!r}; this engine runs EAGLE-3 heads with a "
                          "'llama' or 'qwen3' decoder layer")
    qk_norm = layer_type == "qwen3" or "layers.0.self_attn.q_norm.weight" in keys
    layers = layer.get("num_hidden_layers", 1)
    if layers != 1:
        raise _fail(path, f"{where}num_hidden_layers is {layers!r}; this engine runs one-layer EAGLE-3 heads")
    hidden = _int(path, layer, "hidden_size", where)
    heads = _int(path, layer, "num_attention_heads", where)
    vocab = _int(path, layer, "vocab_size", where)
    rope = {k: layer[k] for k in ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")
            if layer.get(k) is not None}
    return HeadConfig(
        hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=_int(path, layer, "num_key_value_heads", where, heads),
        head_dim=_int(path, layer, "head_dim", where, hidden // heads),
        intermediate_size=_int(path, layer, "intermediate_size", where),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), hidden_act=str(layer.get("hidden_act", "silu")),
        vocab_size=vocab, draft_vocab_size=_int(path, cfg, "draft_vocab_size", "", vocab),
        target_hidden_size=_int(path, cfg, "target_hidden_size", "", hidden),
        norm_before_residual=bool(cfg.get("norm_before_residual", nbr_default)), aux_layers=aux, rope=rope,
        max_position_embeddings=int(layer.get("max_position_embeddings", 32768)), format=fmt,
        speculative_tokens=tokens if isinstance(tokens, int) else None,
        verifier=verifier if isinstance(verifier, str) else None,
        qk_norm=qk_norm, mlp_bias="layers.0.mlp.gate_proj.bias" in keys,
    )


def read_head(path: str | Path) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """(config, weights renamed to this module's names) of a head directory, checked for
    the pieces every format needs; no target needed."""
    path = Path(path).expanduser()
    if not path.exists():
        path = catalog_head(str(path)) or path
    if not path.is_dir():
        what = "is a file; pass the head's directory" if path.is_file() else "no such directory"
        raise _fail(path, f"{what} (method eagle3 reads an EAGLE-3 head: a directory with config.json + weights, "
                          f"or a catalog head: {', '.join(head_names()) or 'none'})")
    if not (path / "config.json").is_file():
        raise _fail(path, "no config.json; not an EAGLE-3 head")
    cfg = _read_json(path, path / "config.json")
    weights = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
               for k, v in read_weights(path).items() if k not in _IGNORED_KEYS}
    head_cfg = parse_config(path, cfg, set(weights))
    if head_cfg.draft_vocab_size < head_cfg.vocab_size and "d2t" not in weights:
        raise _fail(path, f"no d2t in the weights, but its draft vocabulary ({head_cfg.draft_vocab_size:,} "
                          f"tokens) is smaller than the target vocabulary ({head_cfg.vocab_size:,}): d2t maps "
                          "draft ids to target ids")
    for key in ("fc.weight", "norm.weight", "lm_head.weight", "layers.0.self_attn.q_proj.weight"):
        if key not in weights:
            raise _fail(path, f"missing weight {key!r}")
    return head_cfg, weights


def build_head(cfg: HeadConfig, weights: dict[str, torch.Tensor], path: Path | str = "<memory>") -> Eagle3Head:
    """An Eagle3Head holding `weights` (CPU, float32 until moved). Shapes must match `cfg`."""
    path = Path(path)
    fc = weights["fc.weight"]
    n_aux, rem = divmod(fc.shape[1], cfg.target_hidden_size)
    if rem or fc.shape[0] != cfg.hidden_size:
        raise _fail(path, f"fc.weight has shape {tuple(fc.shape)}, but the config says hidden size "
                          f"{cfg.hidden_size} and target_hidden_size {cfg.target_hidden_size}")
    if cfg.aux_layers is not None and len(cfg.aux_layers) != n_aux:
        raise _fail(path, f"fc.weight reads {n_aux} feature layers but eagle_aux_hidden_state_layer_ids "
                          f"lists {len(cfg.aux_layers)}")
    if cfg.aux_layers is None and n_aux != 3:
        raise _fail(path, f"fc.weight reads {n_aux} feature layers; without eagle_aux_hidden_state_layer_ids "
                          "the default is 3")
    head = Eagle3Head(cfg, attention_bias="layers.0.self_attn.q_proj.bias" in weights,
                      out_bias="layers.0.self_attn.o_proj.bias" in weights,
                      own_embedding="embed_tokens.weight" in weights)
    state = dict(weights)
    if "d2t" not in state:  # full-vocabulary head: draft id = target id
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    if "t2d" not in state:  # redundant with d2t: rebuild it
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        d2t = state["d2t"].long()
        ids = torch.arange(d2t.numel()) + d2t
        if ids.numel() and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
            raise _fail(path, f"d2t maps draft ids outside the vocabulary of {cfg.vocab_size:,}")
        t2d[ids] = True
        state["t2d"] = t2d
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise _fail(path, f"missing weight {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    # a weight this module has no place for would be dropped and the head would draft
    # differently from where it was trained: refuse it
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise _fail(path, f"weight {unknown[0]!r} has no place in a one-layer llama/qwen3 EAGLE-3 head"
                          + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    for key, value in expected.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise _fail(path, f"weight {key!r} has shape {tuple(state[key].shape)}, the config implies "
                              f"{tuple(value.shape)}")
    head.load_state_dict({k: state[k] for k in expected})
    ids = head.draft_ids
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
        raise _fail(path, f"d2t maps draft ids outside the vocabulary of {cfg.vocab_size:,}")
    if int(head.t2d.sum()) != cfg.draft_vocab_size or not bool(head.t2d[ids].all()):
        raise _fail(path, "t2d does not mark exactly the target ids d2t maps to")
    return head.eval().requires_grad_(False)


def output_rows(target: Any) -> int:
    """Rows of the target's output distribution (its lm_head, packed or not)."""
    head = target.get_output_embeddings()
    rows = getattr(head, "out_features", None)
    if rows is None and getattr(head, "weight", None) is not None:
        rows = head.weight.shape[0]
    return int(rows or target.config.get_text_config().vocab_size)


def fit_to_target(head: Eagle3Head, target: Any, *, path: Path | str, target_name: str) -> Eagle3Head:
    """Check a head against the target model it will draft for, share the target's embedding
    and settle its feature layers. One-line ModelErrors name both sides of a mismatch."""
    path, cfg = Path(path), head.config
    tcfg = target.config.get_text_config()
    t_hidden, t_layers = int(tcfg.hidden_size), int(tcfg.num_hidden_layers)
    t_vocab = output_rows(target)
    if cfg.target_hidden_size != t_hidden:
        raise _fail(path, f"the head reads target features of hidden size {cfg.target_hidden_size} "
                          f"(target_hidden_size / fc.weight), but target {target_name!r} has hidden size {t_hidden}")
    if cfg.vocab_size != t_vocab:
        raise _fail(path, f"the head's target vocabulary has {cfg.vocab_size:,} tokens (vocab_size, t2d), but "
                          f"target {target_name!r} has {t_vocab:,}")
    if head.embed_tokens is None:
        emb = target.get_input_embeddings()
        if int(emb.weight.shape[1]) != cfg.hidden_size:
            raise _fail(path, f"head hidden size {cfg.hidden_size} differs from target {target_name!r}'s "
                              f"embedding width {int(emb.weight.shape[1])} and the head ships no embed_tokens")
        head.share_embedding(emb)
    aux = cfg.aux_layers or default_aux_layers(t_layers)
    bad = [i for i in aux if not 0 <= i <= t_layers]
    if bad:
        raise _fail(path, f"feature layer {bad[0]} is outside target {target_name!r}'s layers 0..{t_layers}"
                          + ("" if cfg.aux_layers else f" (the default for {t_layers} layers; the head names none)"))
    if len(set(aux)) != len(aux):
        raise _fail(path, f"feature layers {list(aux)} repeat a layer")
    head.aux_layers = tuple(aux)
    p = next(target.parameters())
    return head.to(device=p.device, dtype=p.dtype)


def load_head(spec: str | Path, target: Any, *, target_name: str = "target") -> Eagle3Head:
    """Read the head directory `spec`, check it against `target` (a transformers causal LM)
    and return it on the target's device and dtype, in eval mode."""
    check_head_target(str(spec), target_name)
    cfg, weights = read_head(spec)
    head = build_head(cfg, weights, spec)
    return fit_to_target(head, target, path=spec, target_name=target_name)


# --------------------------------------------------------------------------------------
# Writing a head directory


def _layer_dict(cfg: HeadConfig, head: Eagle3Head) -> dict[str, Any]:
    attn = head.layers[0].self_attn
    d = {"model_type": cfg.layer_type,
         "architectures": ["Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"], "hidden_size": cfg.hidden_size,
         "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
         "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
         "rms_norm_eps": cfg.rms_norm_eps, "hidden_act": cfg.hidden_act, "vocab_size": cfg.vocab_size,
         "num_hidden_layers": 1, "max_position_embeddings": cfg.max_position_embeddings,
         "tie_word_embeddings": False, "attention_bias": attn.q_proj.bias is not None, "mlp_bias": cfg.mlp_bias}
    d.update(cfg.rope)
    return d


def save_head(head: Eagle3Head, path: str | Path, *, fmt: str = "speculators", weights: str = "safetensors",
              verifier: str | None = None, speculative_tokens: int | None = None,
              extra: dict[str, Any] | None = None) -> Path:
    """Write `head` as a head directory in format `fmt` (speculators | eagle3) with its weights
    as safetensors or a PyTorch .bin. Each file is written atomically. `extra` goes into
    config.json as is (for example how the head was trained)."""
    from safetensors.torch import save


    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = head.config
    aux = list(head.aux_layers or cfg.aux_layers or ()) or None
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    if cfg.draft_vocab_size == cfg.vocab_size and not bool(state["d2t"].any()):
        # a full-vocabulary head has no vocabulary map: speculators saves none, and vLLM refuses
        # one ("no module or parameter named 'draft_id_to_target_id'")
        del state["d2t"], state["t2d"]
    if fmt == "speculators":
        config: dict[str, Any] = {
            "speculators_model_type": SPECULATORS_TYPE, "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": _layer_dict(cfg, head), "draft_vocab_size": cfg.draft_vocab_size,
            "norm_before_residual": cfg.norm_before_residual, "target_hidden_size": cfg.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": aux,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy",
                                      "speculative_tokens": speculative_tokens or cfg.speculative_tokens or 3}],
                "verifier": {"name_or_path": verifier or cfg.verifier, "architectures": []},
            },
        }
    else:
        config = {**_layer_dict(cfg, head), "architectures": ["LlamaForCausalLMEagle3"],
                  "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
                  "norm_before_residual": cfg.norm_before_residual}
        if aux:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True}
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
    config.update(extra or {})
    for stale in WEIGHT_FILES:
        if (path / stale).exists():
            (path / stale).unlink()
    if weights == "safetensors":
        atomic_write(path / "model.safetensors", lambda fh: fh.write(save(state, metadata={"format": "pt"})))
    elif weights == "bin":
        atomic_write(path / "pytorch_model.bin", lambda fh: torch.save(state, fh))
    else:
        raise ValueError("weights must be 'safetensors' or 'bin'")
    atomic_write(path / "config.json", lambda fh: fh.write(json.dumps(config, indent=2).encode()))
    return path


def describe(head: Eagle3Head) -> dict[str, Any]:
    """A JSON-able summary for run.json."""
    cfg = head.config
    params = sum(p.numel() for p in head.parameters())
    return {"format": cfg.format, "hidden_size": cfg.hidden_size, "draft_vocab_size": cfg.draft_vocab_size,
            "aux_layers": list(head.aux_layers), "norm_before_residual": cfg.norm_before_residual,
            "parameters": params, "own_embedding": head.embed_tokens is not None}


__all__ = ["FORMATS", "HeadConfig", "Eagle3Head", "default_aux_layers", "read_head", "build_head",
           "fit_to_target", "load_head", "save_head", "describe"]
