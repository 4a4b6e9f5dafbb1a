"""The KV cache of a running batch: one preallocated slot per row, rolled back by moving a length.

`SlotKV` holds, per layer, key and value buffers of shape [rows, kv_heads, capacity, head_dim].
Row b's cache position p lives at index p of its slot, so a row never has holes: rejecting
drafts moves the row's length back, and the next forward overwrites the rejected positions
(as gpt-fast's `input_pos` does). Nothing is ever concatenated or compacted per step; the only
copies are a row moving into the slot of a finished row (`move_row`, once per finish) and
the rare growth of the buffers (`reserve`, amortized by doubling).

Every forward writes `M` tokens per row at positions `start[b] .. start[b] + M - 1`. Rows with
fewer real tokens are padded; a padded position lies past the row's length, is invisible to
the row's real queries (they see only positions <= their own), and is overwritten before any
later query could see it. So the mask is purely causal by position, per row:
key t is visible to query j of row b iff t <= start[b] + j (and, for sliding-window layers,
t > start[b] + j - window).

The cache is handed to transformers' forward as its `cache=` object: attention layers call
`update()`, which writes the new keys/values and returns views of the slots (no copy), and
`slot_attention` (registered as an attention implementation) runs SDPA on them with
grouped-query heads packed onto their kv head instead of repeated (no `repeat_kv` copies).

The masks do not come from the model: for an attention implementation it does not know,
transformers builds no mask at all on most architectures (Llama, Mistral, Phi-3: their
decoders pass None), so the runner states each forward's masks in `forward_masks` and
`slot_attention` takes the one for the layer's sliding window from there (the `sliding_window`
the attention module passes the attention interface, or where it passes none, the window its
config gives the layer: `layer_window`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "specbench_slots"


class SlotKV:
    """Per-layer [rows, kv_heads, capacity, head_dim] key/value slots plus per-forward write
    indices. Lengths (how many positions of each row are valid) are the engine's to track."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype,
                 device: torch.device, rows: int = 1, capacity: int = 256):
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = 0
        self.capacity = 0
        self.allocations = 0  # buffer (re)allocations: once, plus one per growth
        self.moves = 0  # rows copied into another slot (one per finished row, at most)
        self._alloc(max(rows, 1), max(capacity, 16))
        # Set by `begin()` for the forward about to run.
        self._rows = slice(0, 0)
        self._write_b: torch.Tensor | None = None
        self._write_t: torch.Tensor | None = None
        self._prefill_len = 0  # > 0: the rows written at positions 0.. (a plain slice copy)
        self._kv_len = 0

    # ---- memory -------------------------------------------------------------------------

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    @property
    def allocated_bytes(self) -> int:
        return self.rows * self.capacity * self.bytes_per_token

    @torch.inference_mode()
    def _alloc(self, rows: int, capacity: int) -> None:
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        if self.keys:
            r, c = min(rows, self.rows), min(capacity, self.capacity)
            for old, new in zip(self.keys + self.values, new_k + new_v):
                new[:r, :, :c].copy_(old[:r, :, :c])
        self.keys, self.values = new_k, new_v
        self.rows, self.capacity = rows, capacity
        self.allocations += 1

    def reserve(self, rows: int, capacity: int) -> None:
        """Make room for `rows` slots of `capacity` positions (grows by doubling, keeps data)."""
        if rows > self.rows or capacity > self.capacity:
            self._alloc(max(rows, self.rows, 2 * self.rows if rows > self.rows else 0),
                        max(capacity, self.capacity, 2 * self.capacity if capacity > self.capacity else 0))

    @torch.inference_mode()
    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst`."""
        if src != dst and length > 0:
            for buf in self.keys + self.values:
                buf[dst, :, :length].copy_(buf[src, :, :length])
            self.moves += 1

    # ---- one forward --------------------------------------------------------------------

    def begin(self, rows: slice, start: torch.Tensor, width: int, prefill: bool = False) -> None:
        """Prepare the writes of the next forward: rows `rows` (a contiguous run of slots) each
        get `width` tokens at positions start[b] + 0..width-1. `start` is a CPU int64 tensor."""
        kv_len = int(start.max()) + width
        if kv_len > self.capacity or rows.stop > self.rows:
            self.reserve(rows.stop, kv_len)
        self._rows = rows
        self._kv_len = kv_len
        if prefill:
            assert not bool(start.any()), "a prefill starts at position 0"
            self._prefill_len, self._write_b, self._write_t = width, None, None
        else:
            n = rows.stop - rows.start
            self._prefill_len = 0
            pos = start.view(n, 1) + torch.arange(width).view(1, width)
            self._write_b = torch.arange(rows.start, rows.stop).view(n, 1).expand(n, width).to(self.device)
            self._write_t = pos.to(self.device)

    @torch.inference_mode()
    def gather(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy position src[i] of slot rows[i] to position dst[i] (1-D long tensors), every
        layer: an accepted tree path moving into the slot's next positions. Sources are read
        before any destination is written."""
        if rows.numel() == 0:
            return
        rows, src, dst = rows.to(self.device), src.to(self.device), dst.to(self.device)
        for buf in self.keys + self.values:
            buf[rows, :, dst] = buf[rows, :, src]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' Cache protocol: store this forward's keys/values [n, kv_heads, M, D]
        and return the rows' slots up to the longest position in use (views, no copy)."""
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        r = self._rows
        if self._prefill_len:
            k_buf[r, :, : self._prefill_len].copy_(key_states)
            v_buf[r, :, : self._prefill_len].copy_(value_states)
        else:
            k_buf[self._write_b, :, self._write_t] = key_states.transpose(1, 2).to(self.dtype)
            v_buf[self._write_b, :, self._write_t] = value_states.transpose(1, 2).to(self.dtype)
        return k_buf[r, :, : self._kv_len], v_buf[r, :, : self._kv_len]

    @property
    def kv_len(self) -> int:
        return self._kv_len


def causal_mask(start: torch.Tensor, width: int, kv_len: int, device: torch.device,
                window: int | None = None) -> torch.Tensor:
    """Bool [n, 1, width, kv_len]: key t visible to query j of row b iff t <= start[b] + j
    (and t > start[b] + j - window for a sliding window)."""
    q_pos = (start.view(-1, 1) + torch.arange(width).view(1, -1)).to(device)  # [n, width]
    t = torch.arange(kv_len, device=device).view(1, 1, -1)
    visible = t <= q_pos.unsqueeze(-1)
    if window is not None:
        visible &= t > q_pos.unsqueeze(-1) - window
    return visible.unsqueeze(1)


def layer_window(module: torch.nn.Module | None) -> int | None:
    """The sliding window of the attention module's layer as its decoder masks it, for modules
    that do not pass `sliding_window` to the attention interface (Qwen2-MoE): its config's
    window where `layer_types` marks the layer sliding, or where the config has no layer types
    (the decoder then masks every layer by the config's window, as Mistral's does)."""
    cfg = getattr(module, "config", None)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if window is None or not types:
        return window
    index = getattr(module, "layer_idx", None)
    if index is None:
        raise ValueError(f"{type(module).__name__} passes no sliding_window and has no layer_idx: "
                         "cannot tell whether its layer is a sliding-window one")
    return window if types[index] == "sliding_attention" else None


@dataclass
class TreeAttention:
    """What the queries of a forward over tree entries see. Row b's keys below base[b] are
    its context (visible by position, as in `causal_mask`); key base[b] + s (s < S) is tree
    entry s, visible to query j iff visible[b, j, s]. `positions` [n, M] are the queries'
    rotary positions (context + depth). A chain is the tree whose entry j sees entries 0..j
    at depths 0..j: `causal_mask` exactly.

    The sliding window applies to the context keys; the tree's own keys lie within its depth
    of each query (drafts are far shallower than any window)."""

    base: torch.Tensor  # [n] long
    positions: torch.Tensor  # [n, M] long
    visible: torch.Tensor  # [n, M, S] bool

    def mask(self, kv_len: int, device: torch.device, window: int | None = None) -> torch.Tensor:
        """Bool [n, 1, M, kv_len]."""
        n, m = self.positions.shape
        S = self.visible.shape[-1]
        t = torch.arange(kv_len, device=device).view(1, 1, -1)
        base = self.base.to(device).view(-1, 1, 1)
        q_pos = self.positions.to(device).unsqueeze(-1)
        ctx = t < base
        if window is not None:
            ctx = ctx & (t > q_pos - window)
        s = (t - base).expand(n, m, kv_len)
        tree = self.visible.to(device).gather(2, s.clamp(0, S - 1)) & (s >= 0) & (s < S)
        return (ctx | tree).unsqueeze(1)


class ForwardMasks:
    """The masks of one forward over the slots (`causal_mask`, or a tree's), one per sliding
    window in use, built on first use. A prefill from position 0 needs none (None:
    `slot_attention`'s plain causal attention) unless a window is shorter than the prompt."""

    def __init__(self, start: torch.Tensor, width: int, kv_len: int, device: torch.device,
                 prefill: bool = False, tree: TreeAttention | None = None):
        self.start, self.width, self.kv_len, self.device, self.prefill = start, width, kv_len, device, prefill
        self.tree = tree
        self._masks: dict[int | None, torch.Tensor] = {}

    def get(self, window: int | None) -> torch.Tensor | None:
        window = int(window) if window else None
        if self.prefill and (window is None or self.width <= window):
            return None
        if window not in self._masks:
            self._masks[window] = causal_mask(self.start, self.width, self.kv_len, self.device, window) \
                if self.tree is None else self.tree.mask(self.kv_len, self.device, window)
        return self._masks[window]


_FORWARD_MASKS: ContextVar[ForwardMasks | None] = ContextVar("specbench_forward_masks", default=None)


@contextlib.contextmanager
def forward_masks(masks: ForwardMasks) -> Iterator[None]:
    """The masks `slot_attention` uses, in place of the model's, for the forward run inside."""
    token = _FORWARD_MASKS.set(masks)
    try:
        yield
    finally:
        _FORWARD_MASKS.reset(token)


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA over slot views. query [n, H, M, D]; key/value [n, H_kv, T, D]; mask bool
    [n, 1, M, T]. Grouped-query heads are folded onto their kv head (query head h uses kv
    head h // (H / H_kv), transformers' `repeat_kv` convention), so keys are never copied.
    Returns [n, M, H, D] as transformers' attention functions do.

    Inside `forward_masks` the mask is that forward's for this layer's window, whatever the
    model passed. attention_mask=None stands for a prefill from position 0 (M == T): plain
    causal attention, which SDPA computes without a mask and skips the blocks above the
    diagonal (half the work of the masked form, none of its mask); grouped heads go to SDPA as
    they are."""
    forward = _FORWARD_MASKS.get()
    if forward is not None:
        window = kwargs.get("sliding_window")
        attention_mask = forward.get(window if window is not None else layer_window(module))
    n, heads, m, d = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    if attention_mask is None:
        if m != key.shape[2]:
            raise ValueError(f"an unmasked attention is a prefill from 0: {m} queries, {key.shape[2]} keys")
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=rep > 1)
        return out.transpose(1, 2), None
    q = query.reshape(n, kv_heads, rep * m, d)
    mask = attention_mask
    if rep > 1:
        mask = mask.unsqueeze(2).expand(n, 1, rep, m, mask.shape[-1]).reshape(n, 1, rep * m, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.view(n, heads, m, value.shape[-1]).transpose(1, 2), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, slot_attention)
