"""A smaller model of the same tokenizer proposes k tokens autoregressively.

Greedy requests draft the draft model's argmax (one-hot q). Sampled requests draw each draft
token from the draft's own distribution with the request's temperature/top-k/top-p and hand
those distributions to the verifier as q. Optionally stops early when the draft's confidence
in the token it just proposed falls below a threshold: that only shortens the proposal, so it
stays lossless.
"""

from __future__ import annotations

import torch

from specbench.config import SamplingParams
from specbench.engine.drafters.base import Proposal
from specbench.engine.kv import CachedModel
from specbench.engine.sampling import probs_from_logits


class DraftModelDrafter:
    def __init__(self, model: torch.nn.Module, device: torch.device, confidence_threshold: float = 0.0):
        self.lm = CachedModel(model, device)
        self.threshold = confidence_threshold

    def propose(self, ids: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        if k <= 0:
            return Proposal([], None)
        # Feed what the draft has not seen yet: the whole prompt on the first step, then the
        # tokens the target emitted after the last accepted draft (usually one or two).
        logits = self.lm.forward(ids[self.lm.length:], last_only=True)[-1]
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            if sampling.greedy:
                if self.threshold > 0:
                    probs = torch.softmax(logits.float(), dim=-1)
                    conf, tok = probs.max(dim=-1)
                    tok, conf = int(tok), float(conf)
                else:
                    tok, conf = int(logits.argmax()), 1.0
            else:
                q = probs_from_logits(logits, sampling)
                tok = int(torch.multinomial(q, 1, generator=generator).item())
                qs.append(q)
                conf = float(q[tok]) if self.threshold > 0 else 1.0
            tokens.append(tok)
            if i == k - 1 or conf < self.threshold:
                break
            logits = self.lm.forward([tok])[-1]
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def rollback(self, valid_length: int) -> None:
        self.lm.truncate(valid_length)
