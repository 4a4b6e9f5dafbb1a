"""A smaller model of the same tokenizer drafts a tree (a chain at topk 1), for every row at once.

The first forward of a step catches each row up on the tokens the target emitted since the
draft last saw it (one or two, ragged); its last position gives the root's distribution.
Then each depth of the tree is one batched forward of the draft model over every row's
frontier (specbench.engine.drafters.tree_search: EAGLE-2's dynamic tree, a static tree, or
a chain), the frontier entries written past the row's context at the positions of their
depth, each attending to the context and its own ancestors (a tree attention mask). Rows
that need no more tokens ride along on entries that are never read, so the batch keeps one
shape.

Greedy requests draft the draft model's top-ranked tokens (a point mass each). Sampled
requests in a chain draw each draft token from the draft's own distribution with the
request's temperature/top-k/top-p, from the row's own generator, and hand those
distributions to the verifier as q; in a tree they take the top-ranked tokens of that
distribution. Optionally a node whose own draft probability falls below a threshold is not
expanded: that only shortens the proposal, so it stays lossless.

After verification the accepted path's draft entries (those that were fed) are gathered
into the row's next positions (`accept_paths`), so the draft cache holds exactly what it
would after drafting the accepted chain; what the draft never fed is caught up next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specbench.engine.drafters.base import OwnCache, Proposal
from specbench.engine.drafters.tree_search import gather_moves, grow
from specbench.engine.tree import TreeShape
from specbench.engine.kv import TreeAttention
from specbench.engine.model import ModelRunner
from specbench.engine.rows import padded


class DraftModelDrafter(OwnCache):
    capture_layers: Sequence[int] = ()

    def __init__(self, runner: ModelRunner, confidence_threshold: float = 0.0, shape: TreeShape = TreeShape()):
        self.lm = runner
        self.threshold = confidence_threshold
        self.shape = shape
        self.lengths: list[int] = []  # positions of each row's sequence the draft cache holds
        self._scratch: list[list[int]] = []  # per row, where each node of the last proposal was fed

    def reserve(self, rows: int, capacity: int) -> None:
        pass  # the draft's cache grows as rows join (as it always has; the target's is reserved)

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        assert row == len(self.lengths), "rows join at the end of the batch"
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        self.lm.forward(ids, slice(row, row + 1), torch.zeros(1, dtype=torch.long), positions=None, prefill=True)
        self.lengths.append(len(prompt_ids))

    def add_rows(self, first: int, prompts: Sequence[Sequence[int]], features: torch.Tensor | None) -> None:
        """The draft's prefill of rows first.. in one pass, as the target's was."""
        assert first == len(self.lengths), "rows join at the end of the batch"
        self.lm.forward(padded(prompts), slice(first, first + len(prompts)), torch.zeros(len(prompts), dtype=torch.long),
                        positions=None, prefill=True)
        self.lengths += [len(p) for p in prompts]

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        B, K = len(rows), max(ks, default=0)
        self._scratch = [[] for _ in rows]
        if K == 0:
            return Proposal([[] for _ in rows])
        # Catch up on what the draft has not seen (rows not drafting feed a dummy, unread).
        feeds = [r.ids[self.lengths[b]:] if ks[b] > 0 else [r.ids[-1]] for b, r in enumerate(rows)]
        width = max(len(f) for f in feeds)
        tokens = torch.tensor([f + [0] * (width - len(f)) for f in feeds], dtype=torch.long)
        start = torch.tensor(self.lengths, dtype=torch.long)
        last = torch.tensor([len(f) - 1 for f in feeds], dtype=torch.long)
        logits, _ = self.lm.forward(tokens, slice(0, B), start, positions=last)
        for b in range(B):
            if ks[b] > 0:
                self.lengths[b] += len(feeds[b])
        base = torch.tensor(self.lengths, dtype=torch.long)

        def expand(tok: torch.Tensor, parent: torch.Tensor, visible: torch.Tensor, offset: int,
                   depth: int) -> torch.Tensor:
            w = tok.shape[1]
            tree = TreeAttention(base, (base + depth - 1).view(B, 1).expand(B, w), visible.cpu())
            out, _ = self.lm.forward(tok, slice(0, B), base + offset, tree=tree)
            return out

        prop, self._scratch = grow(self.shape, logits, ks, rows, expand, threshold=self.threshold)
        return prop

    def accept_paths(self, paths: Sequence[Sequence[int]]) -> None:
        """Move the accepted nodes' draft entries into place; the rest are dropped."""
        kept, moves = gather_moves(self.lengths, self._scratch, paths)
        if moves:
            self.lm.cache.gather(*torch.tensor(moves, dtype=torch.long).T)
        self.lengths = [n + k for n, k in zip(self.lengths, kept)]

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        # The draft cache keeps only what survived: the rejected drafts' positions are reused.
        self.lengths = [min(d, v) for d, v in zip(self.lengths, valid)]

    def retain(self, keep: Sequence[int]) -> None:
        for dst, src in enumerate(keep):
            self.lm.cache.move_row(src, dst, self.lengths[src])
        self.lengths = [self.lengths[s] for s in keep]
