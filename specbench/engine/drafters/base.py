"""The drafter interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specbench.config import SamplingParams


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] distributions the tokens were drawn from; None = one-hot


class Drafter(Protocol):
    def propose(self, ids: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        """Up to k tokens to follow `ids` (the whole sequence: prompt + output so far)."""
        ...

    def rollback(self, valid_length: int) -> None:
        """Only the first `valid_length` tokens of the sequence survived verification."""
        ...
