"""Medusa on the static step: the heads' part of `specbench.engine.static.StaticBatch`.

As the eager drafter (specbench.engine.drafters.medusa): the heads read the target's hidden
state at the position that produced the last emitted token, after the target's own final
norm; head i scores the token i + 1 places after it, and the chain is each of the first k
heads' argmax, for greedy and sampled rows alike (q one-hot, so the verifier's one-hot rule
keeps sampling exact: accept x with probability p(x), else draw from p without x). Trees (a
static speculative_token_tree, Medusa's own form, or topk > 1: the dynamic search over every
head's top tokens, cut to the budget) are grown by the draft model's tree functions
(specbench.engine.static_tree) with head d's distribution at every node of depth d, and
nothing fed: the verify walk keeps the state at the last accepted node. The device
keeps that state per slot (`mstate`, before the norm: the static forward's features at the
final norm); the verify pass returns it at every fed position and keeps the one at the last
accepted token. No cache of their own: nothing to catch up, nothing to roll back.

Boundary: tensors; the step itself is StaticBatch's.
"""

from __future__ import annotations

from typing import Any

import torch


class StaticMedusa:
    """Medusa heads (specbench.models.medusa.MedusaHeads) as the static step's drafter: what
    the step asks of a drafter besides drafting (no KV of their own)."""

    allocations = 0
    allocated_bytes = 0
    bytes_per_token = 0

    def __init__(self, heads: torch.nn.Module):
        self.heads = heads
        self.num_heads = int(heads.num_heads)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.heads.parameters())

    def reserve(self, rows: int, capacity: int) -> bool:
        return False

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        pass


class MedusaStep:
    """The Medusa heads' state and draft, mixed into StaticBatch (which provides `medusa`, a
    StaticMedusa or None, `target` and the per-slot state)."""

    medusa: Any
    target: Any

    def _medusa_state(self, rows: int) -> dict[str, torch.Tensor]:
        if self.medusa is None:
            return {}
        hidden = int(self.target.decoder.embed_tokens.embedding_dim)
        return {"mstate": torch.zeros(rows, hidden, dtype=self.target.dtype, device=self.target.device)}

    def _medusa_logits(self, B: int) -> torch.Tensor:
        """Every head's logits [B, heads, V] (float32) from each row's state, after the target's
        final norm: head i scores the token i + 1 places after the last emitted one."""
        return self.medusa.heads(self.target.final_norm(self.mstate[:B])).float()

    def _medusa_level(self, heads: torch.Tensor, d: int, width: int) -> torch.Tensor:
        """The draft distribution [B, width, V] of every frontier node of depth d of a tree:
        head d's, whatever the path (the heads read one state, not the drafted tokens). Past
        the last head it repeats it: no row drafts deeper than the heads (its draft length)."""
        B, H, V = heads.shape
        return heads[:, min(d, H - 1)].unsqueeze(1).expand(B, width, V)

    def _draft_medusa(self, B: int, K: int, sampled: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """[B, K] drafts (the first K heads' argmax), their one-hot q (sampled batches) and
        each row's draft length."""
        logits = self._medusa_logits(B)[:, :K]  # [B, K, V]
        drafts = logits.argmax(-1)
        q = torch.nn.functional.one_hot(drafts, logits.shape[-1]).to(torch.float32) if sampled else None
        return drafts, q, self.ks[:B]

    def _medusa_commit(self, B: int, feats: torch.Tensor, n: torch.Tensor, live: torch.Tensor) -> None:
        """The state at the last accepted token (index n of [last token, drafts...])."""
        at = feats.gather(1, n.view(B, 1, 1).expand(B, 1, feats.shape[-1])).squeeze(1)
        self.mstate[:B] = torch.where(live.view(B, 1), at.to(self.mstate.dtype), self.mstate[:B])
