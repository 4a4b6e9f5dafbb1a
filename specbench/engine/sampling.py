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


# ---- the static step's sampling: per-row parameters as tensors, counter-based random numbers ----
#
# The static step (specbench.engine.static) samples every row of a batch in one computation,
# inside a captured graph, so it cannot call a torch.Generator per row. Its random numbers are
# counter-based instead: the uniform that decides a token is a hash of (the request's seed, what
# is being decided, the sequence position decided), as in Philox-style GPU samplers. A request's
# samples therefore depend only on its seed and its own positions, never on its batch mates or on
# how many draws other rows made, and each (decision, position) is drawn afresh: a position is
# decided once (a rejected draft's position is decided by the recovered token, later drafts start
# past it), and draws for positions past a rejection influenced nothing that was emitted.

SALT_DRAFT = 1  # the draft model's sampled token at a position
SALT_ACCEPT = 2  # the uniform of the min(1, p/q) test of the draft token at a position
SALT_TOKEN = 3  # the recovered, bonus or plain decoding token at a position


def _pcg(x: torch.Tensor) -> torch.Tensor:
    """PCG hash of 32-bit values held in int64 (Jarzynski & Olano, "Hash Functions for GPU
    Rendering", 2020). Every product stays below 2**62, so int64 arithmetic never overflows."""
    state = (x * 747796405 + 2891336453) & 0xFFFFFFFF
    word = ((torch.bitwise_right_shift(state, (state >> 28) + 4) ^ state) * 277803737) & 0xFFFFFFFF
    return (word >> 22) ^ word


def counter_uniform(seed: torch.Tensor, salt: int, position: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in (0, 1), 52 random bits each, one per element of `position` (int64
    [B, ...]) for the rows' int64 `seed` [B]: a pure function of (seed, salt, position)."""
    seed = seed.view(seed.shape[0], *([1] * (position.dim() - 1)))
    lo, hi = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    h = _pcg(lo ^ _pcg(hi ^ _pcg((position & 0xFFFFFFFF) ^ _pcg(position * 0 + salt))))
    h2 = _pcg(h ^ 0x9E3779B9)
    bits = (h >> 6) * 67108864 + (h2 >> 6)  # 26 + 26 bits
    return (bits.double() + 0.5) * (2.0 ** -52)


def row_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, *,
              use_top_k: bool = True, use_top_p: bool = True) -> torch.Tensor:
    """`probs_from_logits` for rows with their own parameters: logits [B, ..., V], temperature,
    top_k, top_p [B] (greedy rows: any temperature > 0, their result is not read). The same
    order (temperature, top-k, top-p) and the same rules; a row whose top_k is 0 (or >= V) or
    whose top_p is 1 is left as softmax(logits / T), exactly. `use_top_k`/`use_top_p` False
    skip the sort when no row of the batch asks for it."""
    shape = (logits.shape[0],) + (1,) * (logits.dim() - 1)
    logits = logits.float() / temperature.view(shape).float()
    vocab = logits.shape[-1]
    if use_top_k or use_top_p:
        ordered = torch.sort(logits, dim=-1, descending=True).values if use_top_k else None
    if use_top_k:
        k = top_k.view(shape)
        on = (k > 0) & (k < vocab)
        kth = ordered.gather(-1, (torch.where(on, k, vocab) - 1).expand(*logits.shape[:-1], 1))
        logits = logits.masked_fill(on & (logits < kth), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if use_top_p:
        p = top_p.view(shape).float()
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p = sorted_p.masked_fill((mass_before >= p) & (p < 1.0), 0.0)
        cut = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = torch.where(p < 1.0, cut / cut.sum(dim=-1, keepdim=True), probs)
    return probs


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token each row of `probs` [B, V] draws with its uniform u [B] (float64): the first
    index whose cumulative mass exceeds u * total (a zero-probability token is never drawn)."""
    cdf = torch.cumsum(probs.double(), dim=-1)
    x = (u * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
