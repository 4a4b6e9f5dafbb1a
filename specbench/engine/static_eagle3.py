"""EAGLE-3 on the static step: the head's part of `specbench.engine.static.StaticBatch`.

The alignment is the eager drafter's (specbench.engine.drafters.eagle3): head position t reads
the target's features at t with the token at t + 1 and predicts the token at t + 2. A row of a
sequence x_0..x_{n-1} (ctx = n; the target cache holds 0..n-2) keeps on the device:

    hlen  head cache positions holding real entries (L)
    pend  the target features of positions L..n-2, [slots, k + 1, F], waiting for their next
          tokens; `ptok` holds those next tokens (x_{L+1}..x_{n-1}), `pn` how many there are
          (hlen + pn = ctx - 1, and pn >= 1 between steps)

- Admission: the target's prefill returns every prompt position's features; the head writes
  entries 0..P-2 (P prompt tokens) at once, and feature P-1 waits with the first output token.
- Draft (one graph): catch-up writes every row's pending entries at hlen + 0..k (a fixed
  width; entries past pn are scratch past the row's length, rewritten before anything reads
  them), the output at pn - 1 gives the root's logits, then each chain node is fed with its
  parent's layer output at position ctx - 1 + j. Logits over the draft vocabulary are
  scattered into the target's (-inf elsewhere), so greedy rows take the head's best token and
  sampled rows draw from, and hand the verifier, that distribution in target ids.
- Verify (one graph): the target also returns its features at [last token, drafts]; those of
  the last token and the accepted drafts become pending, with the tokens that follow them
  (the accepted drafts and the emitted token). A rejected draft's head entry lies past hlen.
- Trees (specbench.engine.static_tree): after the same catch-up, the nodes that have children
  are fed depth by depth, each with its parent's layer output, at rotary position
  ctx - 2 + its depth and seeing the context and its fed ancestors (StaticHead's tree mask);
  the verify walk makes the features of the last token and of the accepted path pending.
  The drafted entries are scratch either way: the catch-up rewrites real positions from the
  target's features.
- A step where no row drafts appends one pending entry per row; before one would overflow
  the buffer, `_head_flush` catches up all but the last (eagerly: only after non-drafting
  steps, as the draft model's `_catch_up_draft`).

Boundary: tensors and per-row host counts; the step itself is StaticBatch's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class HeadStep:
    """The EAGLE-3 head's state and passes, mixed into StaticBatch (which provides `head`, a
    StaticHead or None, `target`, `dev`, `k` and the per-slot state)."""

    head: Any
    target: Any
    dev: torch.device
    k: int

    @property
    def head_width(self) -> int:
        """Pending entries a row can hold: a drafting step leaves k + 1 at most."""
        return self.k + 1

    def _head_state(self, rows: int) -> dict[str, torch.Tensor]:
        if self.head is None:
            return {}
        feat = len(self.head.aux_layers) * int(self.target.decoder.embed_tokens.embedding_dim)
        P, dev = self.head_width, self.dev
        return {
            "hlen": torch.zeros(rows, dtype=torch.long, device=dev),
            "pn": torch.zeros(rows, dtype=torch.long, device=dev),
            "pend": torch.zeros(rows, P, feat, dtype=self.target.dtype, device=dev),
            "ptok": torch.zeros(rows, P, dtype=torch.long, device=dev),
        }

    def _target_pass(self, tokens: torch.Tensor, start: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, Any]:
        """The target's forward, with its features where heads read them (None otherwise): an
        EAGLE-3 head's feature layers, or Medusa's last layer output (the final norm's input)."""
        layers = self.head.aux_layers if self.head is not None else \
            (len(self.target.layers),) if getattr(self, "medusa", None) is not None else ()
        if not layers:
            return self.target.forward(tokens, start, **kw), None
        return self.target.forward(tokens, start, features=layers, **kw)

    def _admit_head(self, b: int, prompt: Sequence[int], feats: torch.Tensor, first: int) -> None:
        """Slot b's head entries for its prompt, and its first pending feature."""
        n = len(prompt)
        if n > 1:
            tokens = torch.tensor([list(prompt[1:])], dtype=torch.long, device=self.dev)
            self.head.forward(tokens, self.head.head.project(feats[:, : n - 1]),
                              torch.zeros(1, dtype=torch.long, device=self.dev), row0=b)
        self.hlen[b] = n - 1
        self.pn[b] = 1
        self.pend[b, 0] = feats[0, n - 1]
        self.ptok[b, 0] = first

    def _head_catch_up(self, B: int) -> torch.Tensor:
        """Every row's pending entries into the head's cache; returns the layer output at the
        last of them [B, H] (the chain's root)."""
        pn, hlen = self.pn[:B], self.hlen[:B]
        out = self.head.forward(self.ptok[:B], self.head.head.project(self.pend[:B]), hlen)
        at = (pn - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, out.shape[-1])
        self.hlen[:B] = hlen + pn
        self.pn[:B] = 0
        return out.gather(1, at).squeeze(1)

    def _head_next(self, tok: torch.Tensor, hidden: torch.Tensor, ctx: torch.Tensor, j: int) -> torch.Tensor:
        """Chain node j + 1 (tokens [B]) fed with its parent's layer output [B, H] at position
        ctx - 1 + j; returns its own layer output [B, H]."""
        B = tok.shape[0]
        return self.head.forward(tok.view(B, 1), hidden.view(B, 1, -1), ctx - 1 + j)[:, 0]

    def _head_commit(self, B: int, K: int, feats: torch.Tensor, drafts: torch.Tensor | None, n: torch.Tensor,
                     extra: torch.Tensor, live: torch.Tensor) -> None:
        """The verify pass's features of the last token and the n accepted drafts [B, K + 1, F]
        become pending, with the tokens that follow them (the drafts, then `extra`)."""
        pn = self.pn[:B]
        idx = (pn.view(B, 1) + torch.arange(K + 1, device=self.dev).view(1, K + 1)).clamp(max=self.head_width - 1)
        self.pend[:B].scatter_(1, idx.unsqueeze(-1).expand(B, K + 1, feats.shape[-1]), feats.to(self.pend.dtype))
        nxt = torch.zeros(B, K + 1, dtype=torch.long, device=self.dev)
        if K:
            nxt[:, :K] = drafts
        nxt.scatter_(1, n.view(B, 1), extra.view(B, 1))
        self.ptok[:B].scatter_(1, idx, nxt)
        self.pn[:B] = torch.where(live, pn + n + 1, pn)

    def _head_flush(self, B: int) -> None:
        """Before a step that drafts nothing: rows whose pending buffer is full catch up all
        but their last entry, which moves to the front (the next catch-up's root)."""
        if max(self.head_pending[:B], default=0) < self.head_width:
            return
        pn = self.pn[:B]
        self.head.forward(self.ptok[:B], self.head.head.project(self.pend[:B]), self.hlen[:B])
        last = (pn - 1).clamp(min=0)
        self.hlen[:B] += last
        self.pend[:B, 0] = self.pend[:B].gather(
            1, last.view(B, 1, 1).expand(B, 1, self.pend.shape[-1])).squeeze(1)
        self.ptok[:B, 0] = self.ptok[:B].gather(1, last.view(B, 1)).squeeze(1)
        self.pn[:B] = pn.clamp(max=1)
        self.head_pending[:B] = [min(p, 1) for p in self.head_pending[:B]]
