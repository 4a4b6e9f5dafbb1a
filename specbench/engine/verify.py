"""Lossless verification of a draft (ENGINE.md, "The rule").

`verify` takes the m draft tokens, the distributions q they were drawn from (or None for a
deterministic drafter: one-hot q) and the target's m+1 distributions p, and returns how many
drafts were accepted and the one extra token the target emits (a correction after a
rejection, or a bonus token after full acceptance). Each step emits between 1 and m+1 tokens.
"""

from __future__ import annotations

import torch


def verify_greedy(draft: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Temperature 0: accept while the draft equals the target's argmax, then emit the
    target's argmax at the first mismatch (or after the last draft)."""
    argmax = target_logits.argmax(dim=-1).tolist()  # one sync for all m+1 positions
    n = 0
    while n < len(draft) and draft[n] == argmax[n]:
        n += 1
    return n, argmax[n]


def verify_sampled(
    draft: list[int],
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Speculative sampling. p: [m+1, V] target distributions (temperature/top-k/top-p applied
    over the prefix that includes the earlier drafts); q: [m, V] draft distributions or None."""
    m = len(draft)
    if m:
        idx = torch.tensor(draft, device=p.device).unsqueeze(-1)
        p_x = p[:m].gather(-1, idx).squeeze(-1)  # p(x_i) for each draft token
        # q(x_i): 1 for a deterministic drafter; q(x) = 0 cannot have produced x, so reject.
        q_x = torch.ones_like(p_x) if q is None else q.gather(-1, idx).squeeze(-1)
        u = torch.rand(m, generator=generator, device=p.device)
        # Accept x_i with probability min(1, p/q), written as u*q < p to avoid dividing by 0.
        accept = (u * q_x < p_x) & (q_x > 0)
        rejected = (~accept).nonzero()
        n = int(rejected[0, 0]) if rejected.numel() else m
    else:
        n = 0
    if n == m:
        # All drafts accepted: one bonus token from the target after the last draft.
        return n, int(torch.multinomial(p[m], 1, generator=generator).item())
    # First rejection at n: resample from the residual norm(max(0, p - q)).
    if q is None:
        residual = p[n].clone()
        residual[draft[n]] = 0.0  # one-hot q: p with the rejected token removed
    else:
        residual = torch.clamp(p[n] - q[n], min=0.0)
    total = residual.sum()
    if not bool(total > 0):  # p <= q everywhere (p == q up to rounding): fall back to p
        residual, total = p[n], p[n].sum()
    return n, int(torch.multinomial(residual / total, 1, generator=generator).item())
