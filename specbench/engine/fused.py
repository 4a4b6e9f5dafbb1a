"""Fused decoder layers for the Llama family on CPU: fewer, larger oneDNN calls per layer.

transformers' decoder layer runs, per layer and pass, seven linear layers and some twenty
elementwise ops (RMSNorm's casts, power, mean and products; rotary's halves; SiLU, the gate
product, two residual adds), each reading and writing its whole activation. For the few
tokens of a decode step that is dispatch overhead; for a prefill of hundreds of tokens it is
a quarter of the pass. `fuse_layers` replaces each layer, in place, by a `FusedLayer` that
computes the same function with:

- q, k and v in one GEMM (their weights and biases stacked);
- SiLU, the gate product and both residual adds as oneDNN post-ops of the GEMMs that produce
  their inputs (gate: `swish`; up: binary `mul` by the gated half; o_proj and down_proj:
  binary `add` of the residual), applied to the float32 accumulator before rounding, where
  transformers rounds to the model dtype after every op;
- rotary embedding applied to the stacked q and k heads at once;
- RMSNorm as torch's `rms_norm` (float32 inside, one rounding).

So in bfloat16 the fused pass rounds less often than transformers' (its logits are not
bit-identical to it; in float32 they differ by summation order): tests/engine/test_fused.py
checks the float32 logits against the unfused layers, and benchmarks/fast_path_match.py
measures the greedy match rate against transformers' generate(). Baseline and speculative decoding both run on the fused pass, so
speculation stays lossless against its own baseline exactly as on the unfused one.

Which layers: Llama, Mistral and Qwen2 decoder layers whose structure is checked here (the
same names, bias only on q/k/v or on all of q/k/v/o, SiLU MLP, no q/k norms). Anything else
keeps transformers' layer (`can_fuse` says why). The attention itself goes through
transformers' attention interface with the original attention module, so the slot attention
(specbench.engine.kv) and any other cache work unchanged.

Boundary: tensors only; like specbench.engine.model, nothing here samples.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from specbench.engine.kv import layer_window

LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
_linear = torch.ops.mkldnn._linear_pointwise


def _pack(weights: list[torch.Tensor]) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights).contiguous(), 1)


def _bias(linears: list[torch.nn.Linear]) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias.detach() if lin.bias is not None else
                      torch.zeros(lin.out_features, dtype=lin.weight.dtype) for lin in linears])


def _eps(norm: torch.nn.Module) -> float | None:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return float(eps) if eps is not None else None


def layer_reason(layer: torch.nn.Module) -> str:
    """Why this decoder layer cannot be fused ('' when it can, or already is)."""
    if isinstance(layer, FusedLayer):
        return ""
    name = type(layer).__name__
    if name not in LAYERS:
        return f"{name} (fused: {', '.join(LAYERS)})"
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    projections = [getattr(attn, p, None) for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
        [getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
    if any(type(p) is not torch.nn.Linear for p in projections):
        return f"{name}: a projection is not a plain nn.Linear"
    if any(getattr(attn, n, None) is not None for n in ("q_norm", "k_norm")):
        return f"{name}: q/k norms"
    if type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
        return f"{name}: activation {type(mlp.act_fn).__name__} (fused: SiLU)"
    if any(p.bias is not None for p in projections[4:]):
        return f"{name}: MLP biases"
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        if type(norm).__name__ not in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm") or _eps(norm) is None:
            return f"{name}: norm {type(norm).__name__}"
    return ""


def can_fuse(model: torch.nn.Module) -> tuple[bool, str]:
    """Whether `fuse_layers` applies to every decoder layer of `model` here, and why not (on
    a CPU where specbench.engine.model.can_pack holds: the fused layers run on oneDNN)."""
    p = next(model.parameters())
    if p.device.type != "cpu":
        return False, f"weights on {p.device.type} (fused layers are for CPUs)"
    layers = getattr(model.get_decoder(), "layers", None)
    if not layers:
        return False, "no decoder layers found"
    reasons = {layer_reason(layer) for layer in layers} - {""}
    return (not reasons), "; ".join(sorted(reasons))


class FusedLayer(torch.nn.Module):
    """One decoder layer (pre-norm attention and SiLU MLP, each with a residual) on stacked,
    prepacked weights. Called as transformers calls its decoder layers."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.attention = attn  # for the attention interface: scaling, groups, config, layer_idx
        self.layer_idx = attn.layer_idx
        self.config = attn.config
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        # the window the original module passes the attention interface (Qwen2: per layer type,
        # Mistral: its config's, Llama: none), as its config gives it
        self.sliding_window = layer_window(attn)
        # transformers' eager attention of this architecture, for attn_implementation="eager"
        self._eager = getattr(sys.modules[type(attn).__module__], "eager_attention_forward")
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.register_buffer("qkv", _pack([p.weight.detach() for p in qkv]), persistent=False)
        self.register_buffer("qkv_bias", _bias(qkv), persistent=False)
        self.register_buffer("o", _pack([attn.o_proj.weight.detach()]), persistent=False)
        self.register_buffer("o_bias", _bias([attn.o_proj]), persistent=False)
        self.register_buffer("gate", _pack([mlp.gate_proj.weight.detach()]), persistent=False)
        self.register_buffer("up", _pack([mlp.up_proj.weight.detach()]), persistent=False)
        self.register_buffer("down", _pack([mlp.down_proj.weight.detach()]), persistent=False)
        self.register_buffer("norm1", layer.input_layernorm.weight.detach().clone(), persistent=False)
        self.register_buffer("norm2", layer.post_attention_layernorm.weight.detach().clone(), persistent=False)
        self.eps1, self.eps2 = _eps(layer.input_layernorm), _eps(layer.post_attention_layernorm)
        self.weight_bytes = sum(t.numel() * t.element_size() for t in
                                [*(p.weight for p in [*qkv, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]),
                                 *(b for b in (self.qkv_bias, self.o_bias) if b is not None), self.norm1, self.norm2])
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):  # their weights live on in the stacks
            delattr(attn, name)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)

    def _rotate(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of q and k heads stacked [n, M, heads, D] (transformers'
        `rotate_half` convention), cos/sin [n, M, D]."""
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        half = qk.shape[-1] // 2
        rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
        return qk * cos + rotated * sin

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache=None, use_cache: bool | None = False,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                past_key_values=None, **kwargs) -> torch.Tensor:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        cache = cache if cache is not None else past_key_values
        n, m, _ = hidden_states.shape
        d, h, hkv = self.head_dim, self.heads, self.kv_heads
        x = self._norm(hidden_states, self.norm1, self.eps1)
        qkv = _linear(x, self.qkv, self.qkv_bias, "none", [], "")
        qk = self._rotate(qkv[..., : (h + hkv) * d].view(n, m, h + hkv, d), *position_embeddings)
        q = qk[:, :, :h].transpose(1, 2)
        k = qk[:, :, h:].transpose(1, 2)
        v = qkv[..., (h + hkv) * d:].view(n, m, hkv, d).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, self._eager)
        out, _ = attend(self.attention, q, k, v, attention_mask, dropout=0.0,
                        scaling=self.attention.scaling, sliding_window=self.sliding_window, **kwargs)
        out = out.reshape(n, m, h * d).contiguous()
        # o_proj(out) + residual; then the MLP: down(silu(gate(x)) * up(x)) + residual
        residual = torch.ops.mkldnn._linear_pointwise.binary(out, hidden_states, self.o, self.o_bias, "add")
        x = self._norm(residual, self.norm2, self.eps2)
        gated = _linear(x, self.gate, None, "swish", [], "")
        product = torch.ops.mkldnn._linear_pointwise.binary(x, gated, self.up, None, "mul")
        return torch.ops.mkldnn._linear_pointwise.binary(product, residual, self.down, None, "add")


def fuse_layers(model: torch.nn.Module) -> int:
    """Replace every decoder layer of `model` by a `FusedLayer`, in place (after checking
    `can_fuse`). Idempotent. Returns the number of layers fused."""
    layers = model.get_decoder().layers
    n = 0
    with torch.inference_mode():
        for i, layer in enumerate(layers):
            if isinstance(layer, FusedLayer):
                continue
            reason = layer_reason(layer)
            if reason:
                raise ValueError(f"layer {i}: {reason}")
            layers[i] = FusedLayer(layer)
            n += 1
    return n
