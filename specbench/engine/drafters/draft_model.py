"""A smaller model of the same tokenizer proposes k tokens autoregressively, for every row at once.

Each draft position is one batched forward of the draft model over all rows (rows that need
no more tokens ride along on a dummy token that is never read, so the batch keeps one
shape). The first forward of a step also catches each row up on the tokens the target
emitted since the draft last saw it (one or two, ragged).

Greedy requests draft the draft model's argmax (one-hot q). Sampled requests draw each draft
token from the draft's own distribution with the request's temperature/top-k/top-p, from the
row's own generator, and hand those distributions to the verifier as q. Optionally a row
stops early when the draft's confidence in the token it just proposed falls below a
threshold: that only shortens the proposal, so it stays lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specbench.engine.drafters.base import Proposal
from specbench.engine.model import ModelRunner
from specbench.engine.sampling import probs_from_logits, sampling_groups


class DraftModelDrafter:
    capture_layers: Sequence[int] = ()

    def __init__(self, runner: ModelRunner, confidence_threshold: float = 0.0):
        self.lm = runner
        self.threshold = confidence_threshold
        self.lengths: list[int] = []  # positions of each row's sequence the draft cache holds

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        assert row == len(self.lengths), "rows join at the end of the batch"
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        self.lm.forward(ids, slice(row, row + 1), torch.zeros(1, dtype=torch.long), positions=None, prefill=True)
        self.lengths.append(len(prompt_ids))

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        B, K = len(rows), max(ks, default=0)
        if K == 0:
            return Proposal([[] for _ in rows])
        dev = self.lm.device
        # Catch up on what the draft has not seen (rows not drafting feed a dummy, unread).
        feeds = [r.ids[self.lengths[b]:] if ks[b] > 0 else [r.ids[-1]] for b, r in enumerate(rows)]
        width = max(len(f) for f in feeds)
        tokens = torch.tensor([f + [0] * (width - len(f)) for f in feeds], dtype=torch.long)
        start = torch.tensor(self.lengths, dtype=torch.long)
        last = torch.tensor([len(f) - 1 for f in feeds], dtype=torch.long)
        logits, _ = self.lm.forward(tokens, slice(0, B), start, positions=last)
        for b in range(B):
            if ks[b] > 0:
                self.lengths[b] += len(feeds[b])

        greedy, sampled = sampling_groups([r.sampling for r in rows])
        active = [k > 0 for k in ks]
        counts = [0] * B  # tokens proposed per row
        steps: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        first = torch.zeros(B, dtype=torch.long)  # the one token fed per row is at index 0
        for i in range(K):
            tok = torch.zeros(B, dtype=torch.long, device=dev)
            conf = torch.ones(B, device=dev)
            if greedy:
                g = torch.tensor(greedy, device=dev)
                if self.threshold > 0:
                    c, t = torch.softmax(logits[g].float(), dim=-1).max(dim=-1)
                    tok[g], conf[g] = t, c
                else:
                    tok[g] = logits[g].argmax(dim=-1)
            if sampled:
                q_i = torch.zeros(B, logits.shape[-1], dtype=torch.float32, device=dev)
                for sp, members in sampled:
                    q_i[members] = probs_from_logits(logits[members], sp)
                    for b in members:
                        if active[b]:  # inactive rows draw nothing: their RNG streams stay their own
                            tok[b] = torch.multinomial(q_i[b], 1, generator=rows[b].gen)[0]
                            conf[b] = q_i[b, tok[b]]
                qs.append(q_i)
            steps.append(tok)
            for b in range(B):
                if active[b]:
                    counts[b] += 1
            done = [counts[b] >= ks[b] for b in range(B)]
            if self.threshold > 0:
                low = (conf < self.threshold).tolist()  # one sync per draft position, only with a threshold
                done = [d or lo for d, lo in zip(done, low)]
            active = [a and not d for a, d in zip(active, done)]
            if not any(active):
                break
            # Feed this position's tokens; only active rows advance (the rest write unread slots).
            start = torch.tensor(self.lengths, dtype=torch.long)
            logits, _ = self.lm.forward(tok.view(B, 1), slice(0, B), start, positions=first)
            for b in range(B):
                if active[b]:
                    self.lengths[b] += 1
        table = torch.stack(steps, dim=1).tolist()  # [B, steps]: the one device-to-host transfer
        tokens_out = [table[b][: counts[b]] for b in range(B)]
        q = torch.stack(qs, dim=1) if qs else None
        return Proposal(tokens_out, q)

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        # The draft cache keeps only what survived: the rejected drafts' positions are reused.
        self.lengths = [min(d, v) for d, v in zip(self.lengths, valid)]

    def retain(self, keep: Sequence[int]) -> None:
        for dst, src in enumerate(keep):
            self.lm.cache.move_row(src, dst, self.lengths[src])
        self.lengths = [self.lengths[s] for s in keep]
