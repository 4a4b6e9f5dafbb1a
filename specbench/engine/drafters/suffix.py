"""Suffix decoding (vLLM's `suffix` method): model-free drafting from suffix trees, one-hot q.

Two kinds of tree, as in Arctic Inference's `SuffixDecodingCache` that vLLM uses:

- per request, a tree over its own prompt and everything it generated so far;
- one GLOBAL tree over the outputs of earlier (and running) requests, kept across batches
  for the engine's lifetime (one cache per engine and speculative configuration, so the blocks
  of a configuration share it and a `specbench serve` process fills it as it serves),
  holding at most `suffix_decoding_max_cached_requests` outputs (FIFO eviction; 0 = no
  global tree, only the request's own).

Each step a row's last `suffix_decoding_max_tree_depth` tokens are matched in both trees
(specbench.engine.drafters.suffix_tree); the continuation with the higher score wins (the
request's own tree on a tie). That global tree is what sets it apart from n-gram lookup: a
workload that repeats earlier answers is drafted from them, so acceptance rises with the
request index as the tree fills.

Drafts are deterministic (one-hot q), so sampled requests stay lossless through the
verifier's one-hot rule. Candidate generation (`SuffixCache.candidates`) is kept apart from
the choice of one (`choose`), so a tree verifier can take several later.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from specbench.engine.drafters.base import Cacheless, Proposal
from specbench.engine.drafters.suffix_tree import Candidate, SuffixTree


class SuffixCache:
    """The global tree of outputs, with FIFO eviction beyond `max_cached_requests`."""

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000):
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.tree = SuffixTree(max_tree_depth)
        self._order: OrderedDict[int, None] = OrderedDict()  # cached outputs, oldest first
        self._next = 0
        self.requests_seen = 0

    def start(self) -> int:
        """A new output sequence (its id); evicts the oldest beyond the limit."""
        seq = self._next
        self._next += 1
        self.requests_seen += 1
        if self.max_cached_requests != 0:
            self._order[seq] = None
            while len(self._order) > self.max_cached_requests:
                old, _ = self._order.popitem(last=False)
                self.tree.remove(old)
        return seq

    def add(self, seq: int, tokens: Sequence[int]) -> None:
        if seq in self._order:  # an evicted (or never cached) output is not extended
            self.tree.extend(seq, tokens)


def choose(cands: Sequence[Candidate]) -> Candidate | None:
    """The continuation to propose: the highest score, the first among equals."""
    best = None
    for c in cands:
        if c.tokens and (best is None or c.score > best.score):
            best = c
    return best


class SuffixDrafter(Cacheless):  # the trees learn from the tokens emitted, not from the branch
    capture_layers: Sequence[int] = ()
    weight_bytes: int = 0  # suffix trees, no weights (their memory is the cache's, outside the batch)

    def __init__(self, cache: SuffixCache, max_spec_factor: float = 1.0, min_token_prob: float = 0.1):
        self.cache = cache
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.local: list[SuffixTree] = []  # per row: the tree over its prompt and output
        self.seq: list[int] = []  # per row: its output's id in the global tree
        self.seen: list[int] = []  # per row: tokens of row.ids already in its trees
        self.prompt_len: list[int] = []
        self.rows: list[Any] = []  # per row: the engine's row object, once seen (read only)

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        assert row == len(self.local), "rows join at the end of the batch"
        tree = SuffixTree(self.cache.max_tree_depth)
        tree.extend(0, prompt_ids)
        self.local.append(tree)
        self.seq.append(self.cache.start())
        self.seen.append(len(prompt_ids))
        self.prompt_len.append(len(prompt_ids))
        self.rows.append(None)

    def _sync(self, b: int, ids: Sequence[int]) -> None:
        """Feed row b's tokens emitted since it was last seen into its tree and the global one."""
        new = ids[self.seen[b]:]
        if new:
            self.local[b].extend(0, new)
            self.cache.add(self.seq[b], new)
            self.seen[b] = len(ids)

    def candidates(self, b: int, ids: Sequence[int], k: int) -> list[Candidate]:
        """Row b's best continuation from its own tree and from the global one."""
        context = ids[-self.cache.max_tree_depth:]
        out = []
        for source, tree in (("prompt", self.local[b]), ("global", self.cache.tree)):
            for c in tree.candidates(context, k, self.max_spec_factor, self.min_token_prob):
                c.source = source
                out.append(c)
        return out

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        tokens: list[list[int]] = []
        for b, r in enumerate(rows):
            self.rows[b] = r
            self._sync(b, r.ids)
            best = choose(self.candidates(b, r.ids, ks[b])) if ks[b] > 0 else None
            tokens.append(best.tokens[: ks[b]] if best is not None else [])
        return Proposal(tokens)

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        pass

    def retain(self, keep: Sequence[int]) -> None:
        kept = set(keep)
        for b in range(len(self.local)):
            if b not in kept and self.rows[b] is not None:
                self._sync(b, self.rows[b].ids)  # a finished row's last tokens reach the global tree
        for name in ("local", "seq", "seen", "prompt_len", "rows"):
            old = getattr(self, name)
            setattr(self, name, [old[s] for s in keep])
