"""A Llama-family causal LM whose every shape is fixed: the static step's forward pass.

`StaticLM` runs a transformers Llama, Mistral or Qwen2 model's own weights (its linear layers,
norms, rotary embedding and LM head) over KV buffers it preallocates: one per layer,
[slots, kv_heads, capacity, head_dim]. A forward writes `width` tokens per row at positions
start[b] + 0..width-1 with an index write, and every query attends over the whole capacity
with a mask computed on the device from those positions (t <= its own position, within the
layer's sliding window): no shape depends on a row's length, so a compiled or captured graph
over it serves every length. Grouped-query heads are folded onto their kv head (no key
copies), as the eager step's slot attention does (specbench.engine.kv). The arithmetic is
transformers' op for op (RMSNorm in float32, rounded once; rotate-half rotary), so float32
logits agree with the model's own forward to summation order.

Attention over the whole capacity is what a static shape costs: a short row pays for the
longest one reserved. vLLM's paged kernels read only each row's blocks; a kernel with lengths
as data would remove that cost here too.

Boundary: tensors only; nothing here samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specbench.engine.kv import layer_window

# a forward over tree entries: (offset of the entries past start, their depths [B, W] (rotary
# offsets from start), which of the tree's keys each sees [B, W, S])
Tree = tuple[int, torch.Tensor, torch.Tensor]

LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")
NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")


def model_reason(model: torch.nn.Module) -> str:
    """Why `StaticLM` cannot run this model ('' when it can)."""
    cfg = model.config.get_text_config()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not layers:
        return f"{type(model).__name__}: no decoder layers found"
    for i, layer in enumerate(layers):
        name = type(layer).__name__
        if name not in LAYERS:
            return f"layer {i} is a {name} (the static step runs {', '.join(LAYERS)})"
        attn, mlp = layer.self_attn, layer.mlp
        projections = [getattr(attn, p, None) for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
            [getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
        if any(type(p) is not torch.nn.Linear for p in projections):
            return f"layer {i}: a projection is not a plain nn.Linear (prepacked for the CPU fast path?)"
        if any(getattr(attn, n, None) is not None for n in ("q_norm", "k_norm")):
            return f"layer {i}: q/k norms"
        if type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
            return f"layer {i}: activation {type(mlp.act_fn).__name__} (static: SiLU)"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if type(norm).__name__ not in NORMS:
                return f"layer {i}: norm {type(norm).__name__}"
    if type(decoder.norm).__name__ not in NORMS:
        return f"final norm {type(decoder.norm).__name__}"
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "attn_logit_softcapping", None):
        return "logit soft-capping"
    if type(model.get_output_embeddings()) is not torch.nn.Linear:
        return "the LM head is not a plain nn.Linear"
    return ""


@torch.no_grad()
def _stack(module: torch.nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of `module`'s linear layers `names` as one layer: stacked along the
    outputs once, each layer's own parameters then views of the stack (idempotent)."""
    linears = [getattr(module, n) for n in names]
    stacked = getattr(module, "_specbench_stacked", {}).get(names)
    if stacked is not None and all(lin.weight.data_ptr() == v.data_ptr() for lin, v in zip(linears, stacked[2])):
        return stacked[0], stacked[1]
    weight = torch.cat([lin.weight for lin in linears])
    has_bias = any(lin.bias is not None for lin in linears)
    bias = torch.cat([lin.bias if lin.bias is not None else weight.new_zeros(lin.out_features)
                      for lin in linears]) if has_bias else None
    views, at = [], 0
    for lin in linears:
        n = lin.out_features
        lin.weight = torch.nn.Parameter(weight[at:at + n], requires_grad=False)
        if lin.bias is not None:
            lin.bias = torch.nn.Parameter(bias[at:at + n], requires_grad=False)
        views.append(lin.weight)
        at += n
    module.__dict__.setdefault("_specbench_stacked", {})[names] = (weight, bias, views)
    return weight, bias


def _rms(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' Llama-family RMSNorm, op for op (float32 inside, rounded once)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class StaticLM:
    """A Llama-family causal LM over preallocated KV slots; every forward writes `width`
    tokens per row of slots row0..row0+B-1 at positions start[b] + 0..width-1, and a query sees
    the keys at positions up to its own (within the layer's sliding window). Lengths are data:
    no shape here depends on one."""

    def __init__(self, model: torch.nn.Module, *, rows: int = 1, capacity: int = 256):
        why = model_reason(model)
        if why:
            raise ValueError(f"the static step does not run this model: {why}")
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.decoder = model.get_decoder()
        self.layers = list(self.decoder.layers)
        self.lm_head = model.get_output_embeddings()
        cfg = model.config.get_text_config()
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.vocab_size = int(self.lm_head.out_features)
        self.windows = [getattr(layer.self_attn, "sliding_window", None) or layer_window(layer.self_attn)
                        for layer in self.layers]
        self.max_position = getattr(cfg, "max_position_embeddings", None)
        # q, k, v and gate, up as one GEMM each: their weights stacked once, and the modules'
        # own weights made views of the stacks (no second copy; the eager step reads the same)
        self.qkv = [_stack(layer.self_attn, ("q_proj", "k_proj", "v_proj")) for layer in self.layers]
        self.gate_up = [_stack(layer.mlp, ("gate_proj", "up_proj")) for layer in self.layers]
        self.rows = self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.allocations = 0
        self.reserve(rows, capacity)

    @property
    def bytes_per_token(self) -> int:
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    @property
    def allocated_bytes(self) -> int:
        return self.rows * self.capacity * self.bytes_per_token

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @torch.inference_mode()
    def reserve(self, rows: int, capacity: int) -> bool:
        """Room for `rows` slots of `capacity` positions (kept data); True when the buffers
        were reallocated (captured graphs over the old ones are then stale)."""
        if rows <= self.rows and capacity <= self.capacity:
            return False
        rows, capacity = max(rows, self.rows), max(capacity, self.capacity)
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        for old, new in zip(self.keys + self.values, keys + values):
            new[:old.shape[0], :, :old.shape[2]].copy_(old)
        self.keys, self.values, self.rows, self.capacity = keys, values, rows, capacity
        self.allocations += 1
        return True

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Slot dst[i] takes slot src[i]'s entries (1-D long tensors on the device)."""
        for buf in self.keys + self.values:
            buf.index_copy_(0, dst, buf.index_select(0, src))

    def move_positions(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Slot b's entry at position src[b, j] moves to dst[b, j] ([B, n] long on the device,
        slots 0..B-1; all read before any is written): a tree's accepted path into place."""
        rows = torch.arange(src.shape[0], device=self.device).view(-1, 1).expand_as(src)
        for buf in self.keys + self.values:
            buf[rows, :, dst] = buf[rows, :, src]

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The model's final norm as its LM head reads it, without the module's hooks (an eager
        engine on the same model captures features through them)."""
        return _rms(x, self.decoder.norm)

    def forward(self, tokens: torch.Tensor, start: torch.Tensor, *, row0: int = 0,
                last_only: bool = False, tree: Tree | None = None, features: tuple[int, ...] = (),
                last_at: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, W] (device) at positions start[b] + 0..W-1 (start: device long [B]) of
        slots row0..row0+B-1; logits [B, W, V] (last_only: [B, V] at each row's last token,
        index W - 1, or last_at[b] when given: a padded prefill's last real tokens).

        `features` (layer indices; the number of layers: the final norm's input): also return
        the inputs of those layers concatenated, [B, W, len(features) * hidden], every token's
        (what an EAGLE-3 head reads; specbench.engine.model.ModelRunner captures the same).

        `tree` (offset, depth [B, W], visible [B, W, S]): the tokens are tree entries, written
        at start[b] + offset + 0..W-1 with rotary positions start[b] + depth; a query sees the
        context (keys below start[b], within the sliding window) and key start[b] + s (s < S)
        where visible[b, w, s] (its ancestors and itself)."""
        B, W = tokens.shape
        dev, cap = self.device, self.capacity
        offsets = torch.arange(W, device=dev)
        t = torch.arange(cap, device=dev).view(1, 1, cap)
        if tree is None:
            pos = start.view(B, 1) + offsets.view(1, W)  # [B, W]
            at = pos
        else:
            offset, depth, vis = tree
            pos = start.view(B, 1) + depth
            at = start.view(B, 1) + offset + offsets.view(1, W)
            s = t - start.view(B, 1, 1)
            in_tree = vis.gather(2, s.clamp(0, vis.shape[-1] - 1).expand(B, W, cap)) & (s >= 0) & (s < vis.shape[-1])
        rows = torch.arange(row0, row0 + B, device=dev).view(B, 1).expand(B, W)
        rep = self.heads // self.kv_heads
        masks: dict[int | None, torch.Tensor] = {}
        for window in set(self.windows):
            visible = t <= pos.unsqueeze(-1) if tree is None else t < start.view(B, 1, 1)
            if window:
                visible = visible & (t > pos.unsqueeze(-1) - int(window))
            if tree is not None:  # the window applies to the context, the tree's keys lie within its depth
                visible = visible | in_tree
            # grouped-query heads folded onto their kv head: [B, 1, rep * W, cap]
            masks[window] = visible.unsqueeze(1).expand(B, rep, W, cap).reshape(B, 1, rep * W, cap)
        x = self.decoder.embed_tokens(tokens)
        cos, sin = self.decoder.rotary_emb(x, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        d, h, hkv = self.head_dim, self.heads, self.kv_heads
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in features:
                captured[i] = x
            attn, mlp = layer.self_attn, layer.mlp
            y = _rms(x, layer.input_layernorm)
            qkv = F.linear(y, *self.qkv[i])
            q = _rotate(qkv[..., :h * d].view(B, W, h, d).transpose(1, 2), cos, sin)
            k = _rotate(qkv[..., h * d:(h + hkv) * d].view(B, W, hkv, d).transpose(1, 2), cos, sin)
            v = qkv[..., (h + hkv) * d:].view(B, W, hkv, d).transpose(1, 2)
            kbuf, vbuf = self.keys[i], self.values[i]
            kbuf[rows, :, at] = k.transpose(1, 2).to(self.dtype)
            vbuf[rows, :, at] = v.transpose(1, 2).to(self.dtype)
            out = F.scaled_dot_product_attention(q.reshape(B, hkv, rep * W, d), kbuf[row0:row0 + B],
                                                 vbuf[row0:row0 + B], attn_mask=masks[self.windows[i]],
                                                 scale=attn.scaling)
            out = out.view(B, h, W, d).transpose(1, 2).reshape(B, W, h * d)
            x = x + attn.o_proj(out)
            y = _rms(x, layer.post_attention_layernorm)
            gate, up = F.linear(y, *self.gate_up[i]).chunk(2, dim=-1)
            x = x + mlp.down_proj(mlp.act_fn(gate) * up)
        if features:
            captured[len(self.layers)] = x
            feats = torch.cat([captured[i] for i in features], dim=-1)
        if last_only:
            x = x[:, -1] if last_at is None else x[torch.arange(B, device=dev), last_at]
        x = self.final_norm(x)
        return (self.lm_head(x), feats) if features else self.lm_head(x)
