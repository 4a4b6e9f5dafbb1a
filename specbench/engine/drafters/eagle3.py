"""EAGLE-3 drafting: a one-layer head drafts a top-1 chain from the target's own features.

Alignment (as in vLLM, SGLang and the EAGLE-3 training recipe): head position t reads the
target's features at position t together with the token at t + 1, at rotary position t, and
predicts the token at t + 2. So for a row whose sequence is x_0..x_{n-1} (the last token not
yet in the target cache), the head's cache holds real entries for positions 0..L-1, and the
target features of positions L..n-2 wait in `pending` until their next tokens are known:

    add_row   prompt of P tokens: entries 0..P-2 at once (one prefill), feature P-1 pending
              (its next token is the first output token, sampled after the prefill)
    propose   catch up: every pending feature with the token after it (ragged, one batched
              pass); the last of these drafts d_1. Then each further draft step feeds the
              layer's own output (before its final norm) with the token just drafted, at the
              next position: (h, d_1) -> d_2, (h', d_2) -> d_3, ...
    commit    the verify pass's features at [last token, accepted drafts] become pending;
              the draft steps' entries lie past L and are overwritten by the next catch-up,
              so rolling back is moving nothing: a rejected token never reached a real entry
    retain    finished rows leave; survivors' cache slots move down

Vocabulary: the head scores a reduced draft vocabulary; draft id i is target id i + d2t[i].
Greedy rows draft the head's argmax (one-hot q). Sampled rows draw from the head's logits
scattered into the target vocabulary (-inf elsewhere) under the request's temperature, top-k
and top-p, with the row's own generator; that q, zero outside the draft vocabulary, goes to
the verifier, so min(1, p/q) and the residual max(0, p - q) stay exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specbench.engine.drafters.base import Proposal
from specbench.engine.kv import SlotKV, causal_mask, slot_attention
from specbench.engine.model import PackedLinear
from specbench.engine.sampling import probs_from_logits, sampling_groups


class HeadRunner:
    """The head with its own one-layer slot KV cache. Rows are slots 0..rows-1."""

    def __init__(self, head: Any, *, rows: int = 1, capacity: int = 256):
        self.head = head
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        attn = head.layers[0].self_attn
        self.scaling = attn.head_dim ** -0.5
        self.cache = SlotKV(1, attn.kv_heads, attn.head_dim, dtype=self.dtype, device=self.device,
                            rows=rows, capacity=capacity)

    @property
    def weight_bytes(self) -> int:
        """The head's own weights (the shared target embedding is the target's)."""
        packed = sum(m.weight_bytes for m in self.head.modules() if isinstance(m, PackedLinear))
        return packed + sum(p.numel() * p.element_size() for p in self.head.parameters())

    def reserve(self, rows: int, capacity: int) -> None:
        self.cache.reserve(rows, capacity)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, rows: slice, start: torch.Tensor,
                prefill: bool = False) -> torch.Tensor:
        """Write [n, M] entries (target token ids, hidden [n, M, H]) at positions
        start[b] + 0..M-1 of slots `rows`; return the layer outputs [n, M, H]."""
        n, width = tokens.shape
        start = start.to(torch.long).cpu()
        self.cache.begin(rows, start, width, prefill=prefill)
        mask = causal_mask(start, width, self.cache.kv_len, self.device)
        pos = (start.view(n, 1) + torch.arange(width).view(1, width)).to(self.device)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = self.cache.update(k, v, 0)
            return slot_attention(None, q, keys, values, mask, scaling=self.scaling)[0]

        return self.head.decode(tokens.to(self.device), hidden, pos, attend)


class Eagle3Drafter:
    def __init__(self, head: Any):
        self.head = head
        self.lm = HeadRunner(head)  # the engine reads the draft's weight and KV bytes from `lm`
        self.capture_layers: tuple[int, ...] = tuple(head.aux_layers)
        self.draft_ids = head.draft_ids.to(self.lm.device)  # draft id -> target id
        self.vocab_size = int(head.config.vocab_size)
        self.lengths: list[int] = []  # per row: head cache positions holding real entries
        self.pending: list[torch.Tensor] = []  # per row: features [m, F] of positions lengths..

    def reserve(self, rows: int, capacity: int) -> None:
        self.lm.reserve(rows, capacity)

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        assert row == len(self.lengths), "rows join at the end of the batch"
        assert features is not None, "the target captures the head's feature layers"
        n = len(prompt_ids)
        feats = features[0]
        if n > 1:
            hidden = self.head.project(feats[: n - 1]).unsqueeze(0)
            self.lm.forward(torch.tensor([list(prompt_ids[1:])]), hidden, slice(row, row + 1),
                            torch.zeros(1, dtype=torch.long), prefill=True)
        self.lengths.append(n - 1)
        self.pending.append(feats[n - 1:].clone())

    @torch.inference_mode()
    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        B, K = len(rows), max(ks, default=0)
        if K == 0:
            return Proposal([[] for _ in rows])
        dev = self.lm.device
        # Catch up: each drafting row feeds its pending features with the tokens that followed
        # them (rows not drafting ride along on a dummy entry past their length, never read).
        ms = [self.pending[b].shape[0] if ks[b] > 0 else 1 for b in range(B)]
        width, feat_dim = max(ms), self.pending[0].shape[-1]
        feats = torch.zeros(B, width, feat_dim, dtype=self.pending[0].dtype, device=dev)
        toks = torch.zeros(B, width, dtype=torch.long)
        for b, r in enumerate(rows):
            if ks[b] > 0:
                nxt = r.ids[self.lengths[b] + 1:]
                assert len(nxt) == ms[b], (len(nxt), ms[b])
                feats[b, : ms[b]] = self.pending[b]
                toks[b, : ms[b]] = torch.tensor(nxt)
        out = self.lm.forward(toks, self.head.project(feats), slice(0, B), torch.tensor(self.lengths))
        hidden = out[torch.arange(B, device=dev), torch.tensor(ms, device=dev) - 1]  # [B, H]
        for b in range(B):
            if ks[b] > 0:
                self.lengths[b] += ms[b]
                self.pending[b] = self.pending[b][:0]

        greedy, sampled = sampling_groups([r.sampling for r in rows])
        active = [k > 0 for k in ks]
        counts = [0] * B
        steps: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        for i in range(K):
            logits = self.head.logits(hidden).float()  # [B, draft vocabulary]
            tok = torch.zeros(B, dtype=torch.long, device=dev)
            if greedy:
                g = torch.tensor(greedy, device=dev)
                tok[g] = self.draft_ids[logits[g].argmax(dim=-1)]
            if sampled:
                q_i = torch.zeros(B, self.vocab_size, dtype=torch.float32, device=dev)
                for sp, members in sampled:
                    # q over the target vocabulary: the head's distribution, zero off its vocabulary
                    full = torch.full((len(members), self.vocab_size), float("-inf"), device=dev)
                    full[:, self.draft_ids] = logits[members]
                    q_i[members] = probs_from_logits(full, sp)
                    for b in members:
                        if active[b]:  # inactive rows draw nothing: their RNG streams stay their own
                            tok[b] = torch.multinomial(q_i[b], 1, generator=rows[b].gen)[0]
                qs.append(q_i)
            steps.append(tok)
            for b in range(B):
                if active[b]:
                    counts[b] += 1
            active = [a and counts[b] < ks[b] for b, a in enumerate(active)]
            if not any(active):
                break
            # The token just drafted, with the hidden state it was drafted from, at the next
            # position (entries past each row's length: scratch until the next catch-up).
            start = torch.tensor([n + i for n in self.lengths])
            hidden = self.lm.forward(tok.view(B, 1), hidden.unsqueeze(1), slice(0, B), start)[:, 0]
        table = torch.stack(steps, dim=1).tolist()  # [B, steps]: the one device-to-host transfer
        q = torch.stack(qs, dim=1) if qs else None
        return Proposal([table[b][: counts[b]] for b in range(B)], q)

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        assert features is not None
        # The verify pass scored [last token, drafts...]: its features at the last token and the
        # accepted drafts are real positions of the sequence; the rest are dropped here.
        for b, n in enumerate(accepted):
            self.pending[b] = torch.cat([self.pending[b], features[b, : n + 1]])
            assert self.lengths[b] + self.pending[b].shape[0] == valid[b], "head and target disagree"

    def retain(self, keep: Sequence[int]) -> None:
        for dst, src in enumerate(keep):
            self.lm.cache.move_row(src, dst, self.lengths[src])
        self.lengths = [self.lengths[s] for s in keep]
        self.pending = [self.pending[s] for s in keep]
