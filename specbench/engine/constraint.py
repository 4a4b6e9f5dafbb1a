"""Decoding under a constraint (structured output: a JSON schema, a regex, a grammar, a tool
call): which token ids a request may emit next, and how a speculative step keeps that exact.

A request's constraint is a `TokenConstraint`, a matcher over token ids that the engine
advances as the request emits tokens (specbench.backends.grammar builds one from a grammar
and the tokenizer; the engine never sees text). The constrained target distribution at a
position is the target's with the disallowed logits set to -inf before temperature, top-k and
top-p (vLLM's order), and the speculative step stays lossless against it:

- verify: every position the target scores (the root and each draft node) gets the mask of the
  state reached along that node's path (`mask_verify_logits`); a node the grammar refuses keeps
  p(x) = 0, so it is rejected as any token the target cannot emit (for a point-mass draft the
  residual is then p itself); its descendants are never reached, so their masks are never read;
- draft: drafters never see the grammar, as vLLM's and SGLang's proposers do not; a sampled
  row hands the verifier the q it drew from (unmasked), which keeps the step lossless;
- chains are cut first (`trim_chains`): a constrained row's point-mass chain (greedy, n-gram,
  suffix) keeps only the prefix its grammar accepts, as vLLM's scheduler cuts drafts
  (`validate_tokens`) before it verifies them, so drafted and accepted counts are vLLM's (a
  refused token would be rejected anyway: the outputs are the same either way). A sampled
  draw is not cut: that would not be lossless (vLLM cuts it, and its outputs then lean
  toward p where the rejection would have drawn the residual);
- emit: the matcher consumes what the step emitted; the constraint's stop ids end the row
  (the grammar allows nothing else once complete), even under ignore_eos.

The masks are computed on the host from the proposal the step already read back, so this runs
on the eager step only (the static step refuses constrained requests: specbench.engine.static).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch


class TokenConstraint(Protocol):
    """One request's output constraint over token ids, advanced token by token."""

    stop_ids: frozenset[int]  # the ids that end the output once the grammar is complete (EOS)

    def allowed(self, vocab_size: int) -> torch.Tensor:
        """bool [vocab_size]: the ids the current state may emit next (at least one)."""
        ...

    def advance(self, tokens: Sequence[int]) -> int:
        """Consume `tokens` while the grammar accepts them; returns how many it consumed (the
        state stays at the last accepted one)."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens."""
        ...


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """`logits` [..., V] with the disallowed ids at -inf (None: unconstrained)."""
    return logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))


def _path(parents: Sequence[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def row_masks(constraint: TokenConstraint, tokens: Sequence[int], parents: Sequence[int], width: int,
              vocab_size: int) -> torch.Tensor:
    """bool [width, V]: the mask at the root (entry 0) and at every node i (entry i + 1) of one
    row's tree, for the state reached along the node's path; all True where the path leaves
    the grammar (never read: the walk cannot get there) and past the row's nodes."""
    out = torch.ones(width, vocab_size, dtype=torch.bool)
    out[0] = constraint.allowed(vocab_size)
    for i in range(len(tokens)):
        path = [tokens[j] for j in _path(parents, i)]
        consumed = constraint.advance(path)
        if consumed == len(path):
            out[i + 1] = constraint.allowed(vocab_size)
        constraint.rollback(consumed)
    return out


def mask_verify_logits(logits: torch.Tensor, rows: Sequence[Any], tokens: Sequence[Sequence[int]],
                       parents: Sequence[Sequence[int]]) -> torch.Tensor:
    """The verify pass's logits [B, width, V] with each constrained row's feed masked
    (`row_masks`); unconstrained rows untouched, and no mask built for them."""
    constrained = [b for b, r in enumerate(rows) if r.constraint is not None]
    if not constrained:
        return logits
    _, width, vocab = logits.shape
    masks = torch.stack([row_masks(rows[b].constraint, tokens[b], parents[b], width, vocab) for b in constrained])
    index = torch.tensor(constrained, device=logits.device)
    return logits.index_copy(0, index, mask_logits(logits[index], masks.to(logits.device)))


def trim_chains(rows: Sequence[Any], tokens: list[list[int]], parents: list[list[int]] | None,
                sampled_q: bool = False) -> None:
    """Cut each constrained row's chain, in place, to the longest prefix its grammar accepts
    from the row's state (the matcher is left where it was). Trees are left whole, and so is a
    sampled row's chain drawn from a distribution (`sampled_q`: the proposal carries q):
    cutting at a refused token x would make that position draw from p where the rejection
    draws from the residual max(0, p - q), and the output would follow p + Q(refused) (p - r)
    instead of p. A point-mass draft (n-gram, suffix, greedy rows) loses nothing: its residual
    at a refused token is p itself."""
    for b, r in enumerate(rows):
        c, d = r.constraint, tokens[b]
        if c is None or not d or (parents is not None and list(parents[b]) != list(range(-1, len(d) - 1))):
            continue
        if sampled_q and not r.sampling.greedy:
            continue
        n = c.advance(d)
        c.rollback(n)
        if n < len(d):
            del d[n:]
            if parents is not None:
                del parents[b][n:]


def consume(constraint: TokenConstraint, tokens: Sequence[int]) -> None:
    """Advance a request's matcher by what it emitted (every one drawn under its mask)."""
    if tokens and constraint.advance(tokens) != len(tokens):
        raise RuntimeError(f"the output constraint refused emitted tokens {list(tokens)}: a mask was not applied")
