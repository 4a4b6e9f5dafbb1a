"""Medusa-1 training pieces (the target frozen, only the heads learn), shared by
benchmarks/train_medusa.py and the tests.

- `init_heads`: as the Medusa recipe initializes them: every residual linear at zero (each
  block starts as the identity), each head's LM head a copy of the target's (or of the rows
  of a reduced draft vocabulary, `vocab`), optionally one LM head shared by all heads and
  frozen (vLLM's `original_lm_head`), which leaves only the residual blocks to train.
- `last_hidden`: the target's last hidden state (after its final norm) at every position
  of a token sequence, what the heads read when drafting.
- `medusa_loss`: head i at position t is trained on the token at t + 2 + i, cross-entropy,
  weighted 0.8^i as in the paper; positions whose label lies outside the draft vocabulary or
  outside `valid` are skipped. Returns the loss and each head's top-1 accuracy.

Boundary: tensors only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.models.medusa import MedusaConfig, MedusaHeads

HEAD_DECAY = 0.8  # loss weight of head i: HEAD_DECAY ** i


def init_heads(target: torch.nn.Module, num_heads: int, *, num_layers: int = 1,
               vocab: torch.Tensor | None = None, shared_lm_head: bool = False, seed: int = 0) -> MedusaHeads:
    """Heads for `target` in float32 (see the module docstring). `vocab`: target ids of a
    reduced draft vocabulary (sorted), or None for the whole vocabulary."""
    tcfg = target.config.get_text_config()
    lm = target.get_output_embeddings().weight.detach().float()
    V = lm.shape[0]
    rows = lm if vocab is None else lm[vocab]
    cfg = MedusaConfig(num_heads=num_heads, num_layers=num_layers, hidden_size=int(tcfg.hidden_size),
                       vocab_size=V, draft_vocab_size=rows.shape[0], bias=True, shared_lm_head=shared_lm_head,
                       format="vllm")
    torch.manual_seed(seed)
    heads = MedusaHeads(cfg)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block.layers:
                layer.weight.zero_()
                layer.bias.zero_()
        for lm_head in heads.lm_heads:
            lm_head.weight.copy_(rows)
    if vocab is not None:
        heads.token_map = vocab.to(torch.long).clone()
    if shared_lm_head:
        heads.lm_heads.requires_grad_(False)
    return heads


@torch.no_grad()
def last_hidden(target: torch.nn.Module, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """[T, H] float32: the target's last hidden state (after the final norm) at each position."""
    x = torch.as_tensor(ids, dtype=torch.long).view(1, -1)
    out = target.get_decoder()(input_ids=x.to(next(target.parameters()).device))
    return out.last_hidden_state[0].float().cpu()


def medusa_loss(heads: MedusaHeads, hidden: torch.Tensor, ids: torch.Tensor,
                valid: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float]]:
    """hidden [N, T, H], ids [N, T], valid [N, T] (positions whose labels count; default all).
    (weighted loss, top-1 accuracy per head over the positions it is trained on)."""
    N, T, _ = hidden.shape
    K = heads.num_heads
    tm = heads.token_map
    if tm is not None:  # target id -> draft id (-1: outside the draft vocabulary)
        to_draft = torch.full((heads.config.vocab_size,), -1, dtype=torch.long)
        to_draft[tm.cpu()] = torch.arange(tm.numel())
    states = heads.head_states(hidden)
    total = hidden.new_zeros(())
    accs: list[float] = []
    for i, x in enumerate(states):
        shift = i + 2
        if T <= shift:
            accs.append(float("nan"))
            continue
        labels = ids[:, shift:]
        if tm is not None:
            labels = to_draft[labels]
        mask = labels >= 0
        if valid is not None:
            mask &= valid[:, shift:]
        if not mask.any():
            accs.append(float("nan"))
            continue
        lm_head = heads.lm_heads[0 if heads.config.shared_lm_head else i]
        logits = lm_head(x[:, :T - shift][mask])
        target = labels[mask]
        total = total + HEAD_DECAY ** i * torch.nn.functional.cross_entropy(logits.float(), target)
        accs.append(float((logits.argmax(-1) == target).float().mean()))
    return total, accs


def top_tokens(seqs: Sequence[Sequence[int]], vocab_size: int, n: int) -> torch.Tensor:
    """The `n` most frequent ids of `seqs` (sorted ids): a reduced draft vocabulary."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(torch.as_tensor(list(s), dtype=torch.long), minlength=vocab_size)
    n = min(n, vocab_size)
    return torch.sort(counts.topk(n).indices).values
