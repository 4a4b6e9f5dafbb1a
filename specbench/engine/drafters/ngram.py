"""Prompt lookup (n-gram) drafting: no model, one-hot q.

Match the sequence's last n tokens (n from ngram_max down to ngram_min, longest first)
against earlier text (prompt and output so far) and propose the up-to-k tokens that followed
its earliest occurrence, as vLLM's n-gram proposer does (tests/engine/test_ngram_vllm.py). Outputs that quote or edit their prompt (code, JSON
rewrites, summaries) accept long stretches; free text accepts little.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specbench.engine.drafters.base import Proposal, StatelessDrafter


class NgramDrafter(StatelessDrafter):
    def __init__(self, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        return Proposal([lookup(r.ids, k, self.ngram_min, self.ngram_max) for r, k in zip(rows, ks)])


def lookup(ids: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Tokens that followed the earliest occurrence of the longest matching suffix."""
    length = len(ids)
    if k <= 0 or length < ngram_min + 1:
        return []
    seq = np.asarray(ids, dtype=np.int64)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        suffix = seq[length - n:]
        # Windows starting at 0 .. length-n-1: every earlier position with a continuation.
        windows = np.lib.stride_tricks.sliding_window_view(seq[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return seq[start:start + k].tolist()
    return []
