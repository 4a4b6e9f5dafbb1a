"""The drafter interface: batch-first, one file per method.

A drafter proposes up to k tokens for every row of the running batch at once and keeps
whatever per-row state it needs (a draft model's KV cache, a head's features), row-aligned
with the engine's batch: row b of the drafter is row b of the engine. The engine calls

- `add_row(row, prompt_ids, features)` after the target prefilled a new request into row
  `row` (features: the target's captured hidden states over the prompt, or None);
- `propose(rows, ks)` once per step: up to ks[b] tokens for row b (0 = none), with the
  distributions q they were drawn from;
- `commit(accepted, valid, features)` after verification: row b accepted `accepted[b]`
  drafts and only the first `valid[b]` tokens of its sequence survive; `features` are the
  target's captured hidden states of the verify pass ([B, K+1, F], or None);
- `retain(keep)` when rows finish: new row i is old row keep[i].

Rows are the engine's row objects; a drafter may read `ids` (prompt + output so far),
`sampling` and `gen` (the row's own generator) from them, never write them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class Proposal:
    tokens: list[list[int]]  # per row, the proposed ids (possibly fewer than asked, or none)
    # [B, K, V] distributions the tokens were drawn from (K = longest proposal, zero padding);
    # None for a deterministic drafter, whose q is one-hot.
    q: torch.Tensor | None = None


class Drafter(Protocol):
    #: whether `add_row`/`commit` need the target's hidden states (and at which layers)
    capture_layers: Sequence[int]

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None: ...

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal: ...

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None: ...

    def retain(self, keep: Sequence[int]) -> None: ...


class StatelessDrafter:
    """Base for drafters that keep no per-row state (n-gram lookup, test drafters)."""

    capture_layers: Sequence[int] = ()

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        pass

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        pass

    def retain(self, keep: Sequence[int]) -> None:
        pass
