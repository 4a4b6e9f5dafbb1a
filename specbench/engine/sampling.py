"""Next-token distributions: the one place temperature, top-k and top-p are applied.

Baseline decoding, the draft model and the verifier all call `probs_from_logits`, so the
distribution a speculative step verifies against is exactly the one plain decoding samples
from (docs/engine.md, "The rule": p is exactly what plain decoding samples from).
Softmax runs in float32 whatever the model dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.config import SamplingParams


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """float32 probabilities over the vocabulary for each row of `logits` [..., V].

    Order as in transformers and vLLM: temperature, then top-k, then top-p.
    Not for greedy requests: those take an explicit argmax path.
    """
    assert sp.temperature > 0, "greedy requests use argmax, not a distribution"
    logits = logits.float() / sp.temperature
    vocab = logits.shape[-1]
    if 0 < sp.top_k < vocab:
        kth = torch.topk(logits, sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        # Keep the smallest prefix whose mass reaches top_p; the most likely token always stays.
        sorted_p = sorted_p.masked_fill(mass_before >= sp.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sampling_groups(samplings: Sequence[SamplingParams]
                    ) -> tuple[list[int], list[tuple[SamplingParams, list[int]]]]:
    """Rows of a batch grouped by how they sample: (greedy row indices, [(params, row indices)]
    for each distinct temperature/top-k/top-p), so each group's distributions are computed
    in one call. Seeds and budgets do not matter here."""
    greedy: list[int] = []
    groups: dict[tuple[float, int, float], tuple[SamplingParams, list[int]]] = {}
    for i, sp in enumerate(samplings):
        if sp.greedy:
            greedy.append(i)
        else:
            groups.setdefault((sp.temperature, sp.top_k, sp.top_p), (sp, []))[1].append(i)
    return greedy, list(groups.values())


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id drawn from a 1-D distribution with the request's own generator."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """A per-request RNG, so a request's samples never depend on what shares its batch."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
