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


def draft_token(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator,
                need_confidence: bool) -> tuple[int, float, torch.Tensor | None]:
    """One draft token from the draft model's logits: (token, the draft's probability of it,
    q). Greedy requests take the argmax (one-hot q, returned as None); sampled requests draw
    from the draft's own processed distribution, which the verifier needs as q."""
    if sampling.greedy:
        if not need_confidence:
            return int(logits.argmax()), 1.0, None
        conf, tok = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return int(tok), float(conf), None
    q = probs_from_logits(logits, sampling)
    tok = int(torch.multinomial(q, 1, generator=generator).item())
    return tok, float(q[tok]), q


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
            tok, conf, q = draft_token(logits, sampling, generator, self.threshold > 0)
            if q is not None:
                qs.append(q)
            tokens.append(tok)
            if i == k - 1 or conf < self.threshold:
                break
            logits = self.lm.forward([tok])[-1]
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def rollback(self, valid_length: int) -> None:
        self.lm.truncate(valid_length)
