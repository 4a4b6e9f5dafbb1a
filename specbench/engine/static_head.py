"""An EAGLE-3 head over preallocated KV slots: the static step's draft for method eagle3.

`StaticHead` runs the head's own layer (`Eagle3Head.decode`, its attention handed a static
`attend`) over one KV buffer it preallocates, [slots, kv_heads, capacity, head_dim], as
`StaticLM` does for a model: a forward writes `width` entries per row at positions
start[b] + 0..width-1 with an index write, and every query attends over the whole capacity
with a mask computed on the device (t <= its own position). No shape depends on a row's
length. The head's alignment (position t reads the target's features at t with the token at
t + 1) and what is pending between steps are `specbench.engine.static`'s (see its
`_head_catch_up`), as the eager drafter's are `specbench.engine.drafters.eagle3`'s.

Boundary: tensors only; nothing here samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class StaticHead:
    """An EAGLE-3 head (specbench.models.eagle3.Eagle3Head) with its own static KV slots."""

    def __init__(self, head: torch.nn.Module, *, rows: int = 1, capacity: int = 256):
        self.head = head
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        attn = head.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.scaling = attn.head_dim ** -0.5  # as the eager HeadRunner's slot attention
        self.draft_ids = head.draft_ids.to(self.device)  # draft id -> target id
        self.aux_layers = tuple(int(i) for i in head.aux_layers)
        self.rows = self.capacity = 0
        self.keys = self.values = torch.zeros(0)
        self.allocations = 0
        self.reserve(rows, capacity)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    @property
    def allocated_bytes(self) -> int:
        return self.rows * self.capacity * self.bytes_per_token

    @property
    def weight_bytes(self) -> int:
        """The head's own weights (the shared target embedding is the target's)."""
        return sum(p.numel() * p.element_size() for p in self.head.parameters())

    @torch.inference_mode()
    def reserve(self, rows: int, capacity: int) -> bool:
        """Room for `rows` slots of `capacity` positions (kept data); True when reallocated."""
        if rows <= self.rows and capacity <= self.capacity:
            return False
        rows, capacity = max(rows, self.rows), max(capacity, self.capacity)
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.rows:
            keys[:self.rows, :, :self.capacity].copy_(self.keys)
            values[:self.rows, :, :self.capacity].copy_(self.values)
        self.keys, self.values, self.rows, self.capacity = keys, values, rows, capacity
        self.allocations += 1
        return True

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Slot dst[i] takes slot src[i]'s entries (1-D long tensors on the device)."""
        for buf in (self.keys, self.values):
            buf.index_copy_(0, dst, buf.index_select(0, src))

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, start: torch.Tensor, *,
                row0: int = 0, tree: tuple[int, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Entries (target ids [B, W], hidden [B, W, H]: projected features, or the parents'
        layer outputs while drafting) at positions start[b] + 0..W-1 of slots
        row0..row0+B-1, each seeing the keys up to its own position; returns the layer outputs
        [B, W, H] (before the head's final norm).

        `tree` (offset, depth [B, W], visible [B, W, S]), as `StaticLM.forward`'s: the entries
        are tree nodes, written at start[b] + offset + 0..W-1 with rotary positions
        start[b] + depth; a node sees the context (keys below start[b]) and key start[b] + s
        (s < S) where visible[b, w, s] (its fed ancestors and itself)."""
        B, W = tokens.shape
        dev, cap = self.device, self.capacity
        offsets = torch.arange(W, device=dev).view(1, W)
        t = torch.arange(cap, device=dev).view(1, 1, cap)
        rows = torch.arange(row0, row0 + B, device=dev).view(B, 1).expand(B, W)
        rep = self.heads // self.kv_heads
        if tree is None:
            pos = at = start.view(B, 1) + offsets
            visible = t <= pos.unsqueeze(-1)
        else:
            offset, depth, vis = tree
            pos, at = start.view(B, 1) + depth, start.view(B, 1) + offset + offsets
            s = t - start.view(B, 1, 1)
            in_tree = vis.gather(2, s.clamp(0, vis.shape[-1] - 1).expand(B, W, cap)) & (s >= 0) & (s < vis.shape[-1])
            visible = (t < start.view(B, 1, 1)) | in_tree
        mask = visible.unsqueeze(1).expand(B, rep, W, cap).reshape(B, 1, rep * W, cap)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # q [B, heads, W, d], k and v [B, kv_heads, W, d]: written, then attended over the capacity
            self.keys[rows, :, at] = k.transpose(1, 2).to(self.dtype)
            self.values[rows, :, at] = v.transpose(1, 2).to(self.dtype)
            d = self.head_dim
            out = F.scaled_dot_product_attention(q.reshape(B, self.kv_heads, rep * W, d),
                                                 self.keys[row0:row0 + B], self.values[row0:row0 + B],
                                                 attn_mask=mask, scale=self.scaling)
            return out.view(B, self.heads, W, d).transpose(1, 2)  # [B, W, heads, d]

        return self.head.decode(tokens, hidden, pos, attend)

    def draft_logits(self, outputs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """The head's logits at layer outputs [..., H], scattered into the target vocabulary
        [..., V] (-inf outside the draft vocabulary)."""
        small = self.head.logits(outputs).float()
        full = torch.full((*outputs.shape[:-1], vocab_size), float("-inf"), device=self.device)
        return full.index_copy(full.dim() - 1, self.draft_ids, small)
