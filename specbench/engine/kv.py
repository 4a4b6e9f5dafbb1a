"""A model plus its KV cache, with per-sequence rollback.

Wraps transformers' DynamicCache so the rest of the engine speaks only "the cache holds the
first n positions" and "keep only the first n". Rolling back rejected draft positions is a
truncation; the transformers API for it has changed within 5.x (crop now takes a negative
count), which is why it lives behind this one class.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache


class CachedModel:
    """One sequence's view of a causal LM: feed tokens, get logits, truncate."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # positions held in the cache

    def forward(self, tokens: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Append `tokens` at positions [length, length+len(tokens)) and return their logits
        [len(tokens), V] (only the last row when `last_only`, which skips the LM head for the
        rest: on a prefill that is most of the head's cost)."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        keep: int | torch.Tensor = 0
        if last_only and len(tokens) > 1:
            # An index tensor, not `1`: transformers slices hidden[:, -1:, :], whose odd stride
            # on the size-1 dimension sends CPU bf16 matmul down a path ~25x slower than a
            # fresh tensor (measured: 0.5B lm_head 460 ms vs 17 ms). Indexing copies instead.
            keep = torch.tensor([len(tokens) - 1], device=self.device)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.length += len(tokens)
        return out.logits[0]

    def truncate(self, length: int) -> None:
        """Keep only the first `length` positions (drop rejected drafts)."""
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length


class BatchKV:
    """The KV cache of a running batch whose rows have different lengths.

    Every forward appends the same number of slots to every row (rows with fewer new tokens
    are padded with masked dummies). Each slot remembers the logical position it holds
    (-1 = hole), so a row's rejected drafts are rolled back by masking its slots, not by
    clamping the batch; the 2D attention mask hides holes and explicit position ids keep each
    row's positions its own. Tail slots that are holes in every row are cropped; `compact()`
    squeezes the holes out when they pile up. Rows join after their own single-row prefill
    (`add_row`) and leave when they finish (`remove_rows`).
    """

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache: DynamicCache | None = None
        self.pos = torch.empty(0, 0, dtype=torch.long, device=device)  # [B, T] logical position or -1
        self.lengths: list[int] = []  # logical tokens held per row

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def slots(self) -> int:
        return self.pos.shape[1]

    def _layers(self):
        return self.cache.layers if self.cache is not None else []

    def add_row(self, row: CachedModel) -> None:
        """Append a prefilled single-sequence cache as a new row (left-padded to align)."""
        assert row.length == row.cache.get_seq_length(), "single-row cache must have no holes"
        new_pos = torch.arange(row.length, device=self.device).unsqueeze(0)
        if self.cache is None or self.rows == 0:
            self.cache, self.pos, self.lengths = row.cache, new_pos, [row.length]
            return
        width = max(self.slots, row.length)
        pad_b, pad_r = width - self.slots, width - row.length
        for mine, theirs in zip(self.cache.layers, row.cache.layers):
            for attr in ("keys", "values"):
                a, b = getattr(mine, attr), getattr(theirs, attr)
                a = torch.nn.functional.pad(a, (0, 0, pad_b, 0)) if pad_b else a
                b = torch.nn.functional.pad(b, (0, 0, pad_r, 0)) if pad_r else b
                setattr(mine, attr, torch.cat([a, b], dim=0))
        left = lambda t, n: torch.nn.functional.pad(t, (n, 0), value=-1) if n else t  # noqa: E731
        self.pos = torch.cat([left(self.pos, pad_b), left(new_pos, pad_r)], dim=0)
        self.lengths.append(row.length)

    def remove_rows(self, keep: list[int]) -> None:
        """Keep only the rows at indices `keep` (in that order)."""
        if not keep:
            self.cache, self.lengths = None, []
            self.pos = torch.empty(0, 0, dtype=torch.long, device=self.device)
            return
        idx = torch.tensor(keep, device=self.device)
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, idx)
            layer.values = layer.values.index_select(0, idx)
        self.pos = self.pos.index_select(0, idx)
        self.lengths = [self.lengths[i] for i in keep]
        self._crop_tail()

    def forward(self, tokens: list[list[int]], pad_id: int = 0) -> torch.Tensor:
        """Append each row's tokens (ragged) and return logits [B, M, V], M = longest row;
        a row's logits past its own tokens are meaningless."""
        width = max(len(t) for t in tokens)
        if width == 0:
            raise ValueError("no tokens to feed")
        ids = torch.full((self.rows, width), pad_id, dtype=torch.long)
        new_pos = torch.full((self.rows, width), -1, dtype=torch.long)
        for b, toks in enumerate(tokens):
            if toks:
                ids[b, : len(toks)] = torch.tensor(toks)
                new_pos[b, : len(toks)] = torch.arange(self.lengths[b], self.lengths[b] + len(toks))
        ids, new_pos = ids.to(self.device), new_pos.to(self.device)
        pos = torch.cat([self.pos, new_pos], dim=1)
        # Dummies get a harmless position (their own outputs are ignored; they are masked as keys).
        position_ids = torch.where(new_pos >= 0, new_pos, torch.zeros_like(new_pos))
        out = self.model(input_ids=ids, attention_mask=(pos >= 0).long(), position_ids=position_ids,
                         cache=self.cache, use_cache=True)
        self.pos = pos
        for b, toks in enumerate(tokens):
            self.lengths[b] += len(toks)
        return out.logits

    def truncate(self, row: int, length: int) -> None:
        """Row `row` keeps only its first `length` logical tokens (rejected drafts become holes)."""
        if length < self.lengths[row]:
            self.pos[row].masked_fill_(self.pos[row] >= length, -1)
            self.lengths[row] = length

    def settle(self, max_hole_fraction: float = 0.25, min_slots: int = 64) -> None:
        """Call after a step's truncations: crop the all-hole tail, compact when holes pile up."""
        self._crop_tail()
        holes = self.slots - min(self.lengths, default=0)
        if self.slots > min_slots and holes > max_hole_fraction * self.slots:
            self.compact()

    def _crop_tail(self) -> None:
        if self.cache is None or self.slots == 0:
            return
        live = (self.pos >= 0).any(dim=0).nonzero()
        end = int(live[-1, 0]) + 1 if live.numel() else 0
        if end < self.slots:
            self.cache.crop(end - self.slots)
            self.pos = self.pos[:, :end]

    def compact(self) -> None:
        """Move every row's live slots together (left-padded) and drop the holes."""
        live = self.pos >= 0
        width = int(live.sum(dim=1).max())
        # For each row, the slot indices of its live slots, right-aligned into `width` columns.
        order = torch.sort((~live).long(), dim=1, stable=True).indices  # live slots first, in order
        counts = live.sum(dim=1)
        cols = torch.arange(width, device=self.device)
        shift = (width - counts).unsqueeze(1)
        src = torch.gather(order, 1, (cols.unsqueeze(0) - shift).clamp_min(0))
        pad = cols.unsqueeze(0) < shift
        new_pos = torch.gather(self.pos, 1, src).masked_fill(pad, -1)
        for layer in self._layers():
            idx = src[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, idx)
            layer.values = torch.gather(layer.values, 2, idx)
        self.pos = new_pos
