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
- draft: a chain drafts under the mask (`Lookahead`): each depth's draft logits are masked by
  the state after the tokens drafted before it, and a sampled row hands the verifier the
  masked q it drew from (q must be what the token was drawn from: verifying the draw against
  the unmasked q would accept too often). Trees draft unmasked; their refused nodes are
  rejected as above;
- chains are cut first (`trim_chains`): a constrained row's chain keeps only the prefix its
  grammar accepts, as vLLM's scheduler cuts drafts (`validate_tokens`) before it verifies them,
  so drafted and accepted counts are vLLM's (a refused token would be rejected anyway: the
  outputs are the same either way);
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


def trim_chains(rows: Sequence[Any], tokens: list[list[int]], parents: list[list[int]] | None) -> None:
    """Cut each constrained row's chain, in place, to the longest prefix its grammar accepts
    from the row's state (the matcher is left where it was). Trees are left whole."""
    for b, r in enumerate(rows):
        c, d = r.constraint, tokens[b]
        if c is None or not d or (parents is not None and list(parents[b]) != list(range(-1, len(d) - 1))):
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


class Lookahead:
    """Chain drafting under the rows' constraints: `masks()` is each row's mask at the next
    draft depth (all True for a free row), `advance(tokens, drafted)` moves the
    constrained rows that drafted along, `close()` rolls every row back to its emitted state."""

    def __init__(self, rows: Sequence[Any], vocab_size: int, device: torch.device):
        # rows of any kind (a drafter's caller may pass its own): those without a constraint are free
        self.rows = [(b, c) for b, r in enumerate(rows) if (c := getattr(r, "constraint", None)) is not None]
        self.B, self.V, self.device = len(rows), vocab_size, device
        self.moved = [0] * len(rows)
        self.stuck = [False] * len(rows)  # a draft the grammar refused (a tree never reaches past it)

    def masks(self) -> torch.Tensor:
        out = torch.ones(self.B, self.V, dtype=torch.bool)
        for b, c in self.rows:
            if not self.stuck[b]:
                out[b] = c.allowed(self.V)
        return out.to(self.device)

    def advance(self, tokens: torch.Tensor, drafted: torch.Tensor) -> None:
        """tokens [B] this depth's draft per row, drafted [B] bool whether the row drafted it."""
        tok, ok = tokens.tolist(), drafted.tolist()
        for b, c in self.rows:
            if ok[b] and not self.stuck[b]:
                n = c.advance([tok[b]])
                self.moved[b] += n
                self.stuck[b] = n == 0

    def close(self) -> None:
        for b, c in self.rows:
            if self.moved[b]:
                c.rollback(self.moved[b])
        self.moved = [0] * self.B
