"""Lossless verification of every row's draft in one batched computation (docs/engine.md,
"The rule"), in vLLM's words: accepted draft tokens, then one recovered token (after the
first rejection) or one bonus token (after a fully accepted draft).

`verify` takes the padded drafts [B, K] with each row's draft length, the target's logits
[B, K+1, V] over [last token, drafts...], the distributions q the drafts were drawn from
([B, K, V], or None for deterministic drafters: one-hot q), and each row's sampling
parameters and generator. It returns, per row, how many drafts were accepted and the one
extra token the target emits, with a single device-to-host transfer. Each row emits between
1 and its draft length + 1 tokens.

A row's random draws come from its own generator in a fixed order (its draft length's
uniforms, then one categorical draw), so its samples never depend on its batch mates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.config import SamplingParams
from specbench.engine.sampling import probs_from_logits, sampling_groups


def verify(draft: torch.Tensor, draft_len: Sequence[int], logits: torch.Tensor, q: torch.Tensor | None,
           samplings: Sequence[SamplingParams], generators: Sequence[torch.Generator]
           ) -> tuple[list[int], list[int]]:
    """(accepted per row, extra token per row). draft: [B, K] long on the logits' device."""
    B, K1, _ = logits.shape
    K = K1 - 1
    dev = logits.device
    lens = torch.tensor(list(draft_len), device=dev)
    in_draft = torch.arange(K, device=dev).view(1, K) < lens.view(B, 1)  # [B, K]: a real draft
    n_acc = torch.zeros(B, dtype=torch.long, device=dev)
    extra = torch.zeros(B, dtype=torch.long, device=dev)
    greedy, sampled = sampling_groups(samplings)
    if greedy:
        g = torch.tensor(greedy, device=dev)
        # Temperature 0: accept while the draft equals the target's argmax, then emit the argmax.
        am = logits[g].argmax(dim=-1)  # [G, K+1]
        n = ((draft[g] == am[:, :K]) & in_draft[g]).long().cumprod(dim=1).sum(dim=1)
        n_acc[g] = n
        extra[g] = am.gather(1, n.view(-1, 1)).view(-1)
    for sp, members in sampled:
        s = torch.tensor(members, device=dev)
        S = len(members)
        # p: the target's distribution at each verified position (only j <= draft length is
        # ever read; padding is left at zero), by the same function plain decoding samples with.
        needed = torch.arange(K1, device=dev).view(1, K1) <= lens[s].view(S, 1)
        p = torch.zeros(S, K1, logits.shape[-1], dtype=torch.float32, device=dev)
        p[needed] = probs_from_logits(logits[s][needed], sp)
        x = draft[s]  # [S, K]
        if K:
            p_x = p[:, :K].gather(-1, x.unsqueeze(-1)).squeeze(-1)  # p(x_i)
            # q(x_i): 1 for a deterministic drafter; q(x) = 0 cannot have produced x: reject.
            q_x = torch.ones_like(p_x) if q is None else q[s].gather(-1, x.unsqueeze(-1)).squeeze(-1)
            u = torch.ones(S, K, device=dev)
            for i, b in enumerate(members):
                if draft_len[b]:
                    u[i, : draft_len[b]] = torch.rand(draft_len[b], generator=generators[b], device=dev)
            # Accept x_i with probability min(1, p/q), written u*q < p to avoid dividing by 0.
            accept = (u * q_x < p_x) & (q_x > 0) & in_draft[s]
            n = accept.long().cumprod(dim=1).sum(dim=1)
        else:
            n = torch.zeros(S, dtype=torch.long, device=dev)
        rows = torch.arange(S, device=dev)
        p_n = p[rows, n]  # [S, V]: the target's distribution at the first rejection / after the draft
        full = n == lens[s]
        if K:
            at = n.clamp(max=K - 1)
            if q is None:  # one-hot q: the residual is p with the rejected token removed
                residual = p_n.scatter(1, x.gather(1, at.view(-1, 1)), 0.0)
            else:  # norm(max(0, p - q)) at the first rejection
                residual = torch.clamp(p_n - q[s][rows, at], min=0.0)
            dist = torch.where(full.view(-1, 1), p_n, residual)  # bonus token after full acceptance
        else:
            dist = p_n
        total = dist.sum(dim=-1, keepdim=True)
        # p <= q everywhere (p == q up to rounding): fall back to p.
        dist = torch.where(total > 0, dist / total.clamp_min(1e-30), p_n)
        for i, b in enumerate(members):
            extra[b] = torch.multinomial(dist[i], 1, generator=generators[b])[0]
        n_acc[s] = n
    out = torch.stack([n_acc, extra]).tolist()  # the one device-to-host transfer
    return out[0], out[1]
