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
