"""The EAGLE-3 head as a torch module (`Eagle3Head`) and its configuration (`HeadConfig`).

Boundary: the layers and their forward pass; reading and writing checkpoints is
`specbench.models.eagle3.formats`, the drafting loop `specbench.engine.drafters.eagle3`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

FORMATS = ("speculators", "eagle3")
SPECULATORS_TYPE = "eagle3"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# keys a speculators checkpoint may carry that inference does not use
_IGNORED_KEYS = ("verifier_lm_head.weight", "verifier_norm.weight")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's and EAGLE-3's default feature layers for an L-layer target: early, middle, late."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class HeadConfig:
    """What a head is, read from its config.json (sizes in elements)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    vocab_size: int  # the target vocabulary the head was trained for (t2d's length)
    draft_vocab_size: int
    target_hidden_size: int
    norm_before_residual: bool
    aux_layers: tuple[int, ...] | None  # None = the target's default (default_aux_layers)
    rope: dict[str, Any] = field(default_factory=dict)  # llama rope keys (rope_theta, ...)
    max_position_embeddings: int = 32768
    format: str = "speculators"
    speculative_tokens: int | None = None  # what the checkpoint was trained/tuned for
    verifier: str | None = None  # the target named by the checkpoint
    qk_norm: bool = False  # an RMSNorm over each head's query and key before rotary (a Qwen3 layer)
    mlp_bias: bool = False

    @property
    def layer_type(self) -> str:
        return "qwen3" if self.qk_norm else "llama"

    def layer_config(self) -> Any:
        """A transformers LlamaConfig for the decoder layer (MLP, rotary embedding)."""
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
                           hidden_act=self.hidden_act, vocab_size=self.vocab_size, num_hidden_layers=1,
                           max_position_embeddings=self.max_position_embeddings, mlp_bias=self.mlp_bias,
                           **self.rope)


# --------------------------------------------------------------------------------------
# The module

# attend(q, k, v) -> [n, M, heads, head_dim]: the caller decides which keys a query sees
# (the engine: a slot KV cache; training: the training-time-test pattern).
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: HeadConfig, bias: bool, out_bias: bool = False):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        h2, hd = 2 * cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(h2, self.heads * hd, bias=bias)
        self.k_proj = nn.Linear(h2, self.kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h2, self.kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.heads * hd, cfg.hidden_size, bias=out_bias)
        # a Qwen3 decoder layer normalizes each head's query and key (over head_dim) before rotary
        self.q_norm = LlamaRMSNorm(hd, eps=cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = LlamaRMSNorm(hd, eps=cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        n, m, _ = x.shape
        q = self.q_proj(x).view(n, m, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, m, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(n, m, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = attend(q, k, v)  # [n, M, heads, head_dim]
        return self.o_proj(out.reshape(n, m, self.heads * self.head_dim))


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: HeadConfig, bias: bool, out_bias: bool = False):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.self_attn = Eagle3Attention(cfg, bias, out_bias)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(cfg.layer_config())

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        """The layer's output before the head's final norm: what the next draft step reads."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        h = residual + self.self_attn(x, cos, sin, attend)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """fc + one EAGLE-3 decoder layer + norm + lm_head over the draft vocabulary."""

    def __init__(self, cfg: HeadConfig, *, attention_bias: bool = False, out_bias: bool = False,
                 own_embedding: bool = False):
        super().__init__()
        from transformers.models.llama.modeling_llama import (
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )

        self.config = cfg
        n_aux = len(cfg.aux_layers) if cfg.aux_layers else 3
        self.fc = nn.Linear(n_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(cfg, attention_bias, out_bias)])
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg.layer_config())
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if own_embedding else None
        self._shared_embedding: list[nn.Module] = []  # the target's, not a submodule (not saved)
        self.aux_layers: tuple[int, ...] = tuple(cfg.aux_layers or ())

    # ---- wiring ----------------------------------------------------------------------

    def share_embedding(self, embedding: nn.Module) -> None:
        """Use the target's token embedding (unless the head ships its own)."""
        self._shared_embedding = [embedding]

    def embed(self, target_ids: torch.Tensor) -> torch.Tensor:
        module = self.embed_tokens if self.embed_tokens is not None else self._shared_embedding[0]
        return module(target_ids)

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft id: i + d2t[i]."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_vocabulary(self, target_ids: Sequence[int] | torch.Tensor) -> None:
        """Make the draft vocabulary these target ids (ascending), filling d2t and t2d."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        assert ids.numel() == self.config.draft_vocab_size, (ids.numel(), self.config.draft_vocab_size)
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    # ---- compute ---------------------------------------------------------------------

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated features [.., len(aux) * H_target] -> [.., H]."""
        return self.fc(features)

    def decode(self, target_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
               attend: Attend) -> torch.Tensor:
        """One layer pass over tokens [n, M] (target ids) and hidden [n, M, H] at rotary
        positions [n, M]; returns the layer output before the final norm [n, M, H]."""
        embeds = self.embed(target_ids).to(hidden.dtype)
        cos, sin = self.rotary(hidden, positions)
        return self.layers[0](embeds, hidden, cos, sin, attend)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from layer outputs."""
        return self.lm_head(self.norm(hidden))
