"""Medusa's sparse tree, built the way the Medusa paper builds its default trees: from each
head's measured top-k accuracies, the tree of N nodes with the largest expected number of
accepted tokens.

`accuracy[d][r]` is how often head d's rank-r candidate is the right token at depth d + 1
(measured on held-out answers, `rank_hits`). Taking the heads as independent (the
paper's assumption), a node reached by branch ranks (r_1, ..., r_d) is accepted with
probability prod_j accuracy[j][r_j], and a tree's expected accepted length is the sum of that
over its nodes (one candidate per depth can be right, so the nodes' events add up). A child's
probability never exceeds its parent's, so the N most probable nodes are prefix-closed and
are the best tree of N nodes: `sparse_tree` takes them from a heap, best first.

The result is a `speculative_token_tree` (paths of branch ranks, vLLM's form), which the
engine's Medusa drafter verifies as a static tree. Medusa's published trees were built this
way for its own heads; a tree built from these heads' accuracies fits them.

Boundary: numbers in, paths out; `rank_accuracy` takes logits and token ids as tensors.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any


def _check(accuracy: Sequence[Sequence[float]]) -> None:
    if not accuracy or any(not row for row in accuracy):
        raise ValueError("accuracy needs at least one head with at least one rank")
    for d, row in enumerate(accuracy):
        for r, a in enumerate(row):
            if not (isinstance(a, (int, float)) and math.isfinite(a) and 0.0 <= a <= 1.0):
                raise ValueError(f"accuracy[{d}][{r}] = {a!r} is not a probability in [0, 1]")


def sparse_tree(accuracy: Sequence[Sequence[float]], nodes: int) -> tuple[tuple[int, ...], ...]:
    """The `nodes` paths (tuples of branch ranks) with the highest acceptance probability,
    parents before children, ties to the earlier-found (shallower, lower-rank) node."""
    _check(accuracy)
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    depth, out = len(accuracy), []
    order = 0
    heap: list[tuple[float, int, tuple[int, ...]]] = []  # (-probability, order, path)

    def push(path: tuple[int, ...], p: float) -> None:
        nonlocal order
        heapq.heappush(heap, (-p, order, path))
        order += 1

    push((0,), accuracy[0][0])
    while heap and len(out) < nodes:
        neg, _, path = heapq.heappop(heap)
        out.append(path)
        p, d, r = -neg, len(path) - 1, path[-1]
        parent = p / accuracy[d][r] if accuracy[d][r] > 0 else 0.0
        if r + 1 < len(accuracy[d]):  # the next sibling: the parent's next-ranked candidate
            push(path[:-1] + (r + 1,), parent * accuracy[d][r + 1])
        if d + 1 < depth:  # the first child
            push(path + (0,), p * accuracy[d + 1][0])
    return tuple(out)


def expected_accepted(accuracy: Sequence[Sequence[float]], tree: Sequence[Sequence[int]]) -> float:
    """The expected number of draft tokens a step accepts with `tree` (independent heads)."""
    _check(accuracy)
    return sum(math.prod(accuracy[d][r] for d, r in enumerate(path)) for path in tree)


def rank_hits(logits: Any, ids: Any, ranks: int) -> tuple[list[list[int]], list[int]]:
    """Per head d: how many times its rank-r candidate was the token d + 2 places ahead (for
    r < `ranks`), and over how many positions. `logits`: [T, K, V], the heads at positions
    0..T-1 of one sequence; `ids`: its tokens from position 0. Sum over sequences, then
    accuracy[d][r] = hits[d][r] / counts[d]."""
    import torch

    T, K, _ = logits.shape
    top = logits.topk(ranks, dim=-1).indices  # [T, K, R]
    hits, counts = [], []
    for d in range(K):
        n = max(0, min(T, len(ids) - (d + 2)))
        want = torch.as_tensor(ids[d + 2:d + 2 + n]).view(n, 1)
        hits.append([int(x) for x in (top[:n, d] == want).sum(dim=0)] if n else [0] * ranks)
        counts.append(n)
    return hits, counts
