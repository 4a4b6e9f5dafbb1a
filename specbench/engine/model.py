"""One causal LM as the engine sees it: token ids in, logits out, over a slot KV cache.

`ModelRunner` drives a transformers causal LM's own forward pass with a `SlotKV` as its cache
and the slot attention function (specbench.engine.kv), so every architecture whose attention
goes through transformers' cache and attention interfaces works unchanged. Around that
forward it adds what an engine needs and `generate()` does not give:

- ragged rows: each row writes its tokens at its own positions (`start`), with explicit
  position ids, and rolls back by moving a length;
- logits only where they are needed: every position (verification), or one chosen position
  per row (prefill, drafting), so the LM head never runs over padding;
- hidden states captured at chosen layer inputs, for drafters that read the target's
  features (EAGLE-3);
- the fast CPU path (`pack_linears`): every linear layer's weight reordered once into
  oneDNN's blocked layout, which runs small-M GEMMs (a few rows of a few tokens) near the
  memory-bandwidth floor where the default path is about 2x slower. bf16 results are
  bit-identical to the default path; float32 ones differ in summation order (~1e-6).
  The engine also fuses the decoder layers of the Llama family on that path
  (specbench.engine.fused), which rounds less often than transformers' layers.

Boundary: token ids and tensors only; nothing here samples or knows about requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
import torch

from specbench.engine.fused import FusedLayer
from specbench.engine.kv import (ATTN_IMPLEMENTATION, ForwardMasks, SlotKV, TreeAttention, forward_masks,
                                register_attention)


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W reordered once into oneDNN's blocked layout (CPU)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, 1), persistent=False)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)
        self.weight_bytes = w.numel() * w.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def can_pack(model: torch.nn.Module) -> tuple[bool, str]:
    """Whether `pack_linears` applies to this model here, and why not when it does not."""
    p = next(model.parameters())
    if p.device.type != "cpu":
        return False, f"weights on {p.device.type} (the packed path is for CPUs)"
    if not torch.backends.mkldnn.is_available():
        return False, "this torch build has no oneDNN"
    if p.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, "this CPU has no native bf16 GEMM in oneDNN"
    if p.dtype not in (torch.float32, torch.bfloat16):
        return False, f"dtype {p.dtype} (packed: float32, bfloat16)"
    return True, ""


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every nn.Linear of `model` (LM head included) by a `PackedLinear`, in place.
    Idempotent. A tied LM head gets its own packed copy of the embedding matrix.
    Returns the number of layers packed."""
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
                n += 1
    if n:
        # The weights left (embeddings, norms) may still live in the checkpoint's memory map,
        # which would keep every page of the file resident: give them their own memory.
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.clone()
    return n


@contextlib.contextmanager
def _attention(configs: Sequence) -> Iterator[None]:
    """Route the model's attention through the slot attention for one forward."""
    before = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = ATTN_IMPLEMENTATION
    try:
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b


class ModelRunner:
    """A causal LM with its slot cache. Rows are slots 0..rows-1 of the cache."""

    def __init__(self, model: torch.nn.Module, *, rows: int = 1, capacity: int = 256,
                 capture_layers: Sequence[int] = ()):
        register_attention()
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        cfg = model.config.get_text_config()
        self.config = cfg
        self.num_layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        self.hidden_size = int(cfg.hidden_size)
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.vocab_size = int(getattr(self.lm_head, "out_features", None) or self.lm_head.weight.shape[0])
        # The slot attention computes causal (optionally sliding-window) softmax attention and
        # nothing else: refuse what it would silently leave out.
        unknown = set(getattr(cfg, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"{type(model).__name__}: attention layer types {sorted(unknown)} are not "
                             "supported (supported: full_attention, sliding_attention)")
        if getattr(cfg, "attn_logit_softcapping", None):
            raise ValueError(f"{type(model).__name__}: attention logit soft-capping is not supported")
        if any(getattr(m, "sinks", None) is not None for m in model.modules()):
            raise ValueError(f"{type(model).__name__}: attention sinks are not supported")
        self.cache = SlotKV(self.num_layers, self.kv_heads, self.head_dim, dtype=self.dtype,
                            device=self.device, rows=rows, capacity=capacity)
        self._configs = list({id(m.config): m.config for m in model.modules()
                              if getattr(m, "config", None) is not None
                              and hasattr(m.config, "_attn_implementation")}.values())
        self.capture_layers: tuple[int, ...] = ()
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list = []
        self.set_capture(capture_layers)

    def set_capture(self, layers: Sequence[int]) -> None:
        """Capture the inputs of these decoder layers (index = num_layers: the last layer's
        output, before the final norm) on every forward."""
        layers = tuple(layers)
        if layers == self.capture_layers:
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for i in layers:
            if not 0 <= i <= self.num_layers:
                raise ValueError(f"layer {i} is outside 0..{self.num_layers}")
            module = self.decoder.norm if i == self.num_layers else self.decoder.layers[i]
            self._hooks.append(module.register_forward_pre_hook(self._hook(i), with_kwargs=True))
        self.capture_layers = layers

    def _hook(self, index: int):
        def hook(module, args, kwargs):
            self._captured[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    @property
    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for m in self.model.modules():
            if isinstance(m, (PackedLinear, FusedLayer)):  # weights held as packed buffers
                total += m.weight_bytes
        for p in self.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        return total

    def reserve(self, rows: int, capacity: int) -> None:
        self.cache.reserve(rows, capacity)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, rows: slice, start: torch.Tensor, *,
                positions: torch.Tensor | str | None = "all", prefill: bool = False,
                tree: TreeAttention | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Write `tokens` [n, M] into slots `rows` at positions start[b] + 0..M-1 and return
        (logits, captured features).

        positions = "all": logits [n, M, V]; a CPU int64 tensor [n]: logits [n, V] at each row's
        own position index; None: no logits (the LM head does not run). Captured features (when the runner captures layers) are the
        concatenated layer inputs [n, M, len(capture_layers) * hidden].

        `tree`: the tokens are draft-tree entries (specbench.engine.kv.TreeAttention): rotary
        positions and visibility come from it instead of start + 0..M-1 causally."""
        n, width = tokens.shape
        start = start.to(torch.long).cpu()
        self.cache.begin(rows, start, width, prefill=prefill)
        kv_len = self.cache.kv_len
        pos = (start.view(n, 1) + torch.arange(width).view(1, width)) if tree is None else tree.positions
        pos = pos.to(self.device)
        masks = ForwardMasks(start, width, kv_len, self.device, prefill=prefill, tree=tree)
        with _attention(self._configs), forward_masks(masks):
            hidden = self.decoder(input_ids=tokens.to(self.device), position_ids=pos,
                                  cache=self.cache, use_cache=True).last_hidden_state
        logits = None
        if positions is not None:
            sel = hidden if isinstance(positions, str) else \
                hidden[torch.arange(n, device=self.device), positions.to(self.device)]
            logits = self.lm_head(sel)
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
        feats = None
        if self.capture_layers:
            feats = torch.cat([self._captured[i] for i in self.capture_layers], dim=-1)
            self._captured.clear()
        return logits, feats
