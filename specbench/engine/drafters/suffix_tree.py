"""Suffix trees with counts, for suffix decoding (SuffixDecoding, arXiv:2411.04975).

Our own implementation of the data structure and of the speculation rule that vLLM's `suffix`
method runs through Snowflake's Arctic Inference, with the same knobs and meanings:

- A `SuffixTree` holds one or more token sequences. Every suffix of every sequence, cut at
  `max_depth` tokens, is a path from the root; a node's `count` is how many such suffixes pass
  through it (the root's: how many suffixes start). Sequences grow token by token (`append`,
  O(max_depth) per token) and can be removed again (`remove`), which the global cache's FIFO
  eviction needs. The tree is an uncompressed trie of plain Python nodes.
- `speculate(context)`: for every match length m = 1 .. len(context) - 1 whose last m
  context tokens occur in the tree, follow the most frequent child from the matched node,
  multiplying the running probability by count(child) / count(node), while it stays at or
  above `min_token_prob`, for at most min(max_spec_tokens, floor(m * max_spec_factor))
  tokens. Each token's estimated probability is the running product; a continuation's score
  is their sum; the best score over all match lengths wins (ties: the longer match, as in
  Arctic Inference 0.3.0). Since
  a path holds at most max_depth tokens, a match of m leaves at most max_depth - m tokens to
  propose: the depth limits match plus speculation, as vLLM documents.
- `candidates(...)` returns that best continuation as a `Candidate`; it is kept apart from
  the choice between trees (`specbench.engine.drafters.suffix`) so a tree drafter can later
  take several continuations (the top children instead of the top one) from the same code.

Boundary: token ids only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


@dataclass
class Candidate:
    """One proposed continuation: tokens with their estimated probabilities."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0  # context tokens matched before the continuation
    source: str = ""  # which tree proposed it ("prompt" = the request's own, "global")

    @property
    def score(self) -> float:
        return float(sum(self.probs))


class SuffixTree:
    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()
        self._seqs: dict[int, list[int]] = {}
        self._active: dict[int, deque[_Node]] = {}  # per sequence: the nodes its open suffixes reached

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self._seqs.values())

    def append(self, seq_id: int, token: int) -> None:
        """Extend sequence `seq_id` (created on first use) by one token."""
        seq = self._seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, deque())
        seq.append(token)
        active.append(self.root)  # a new suffix starts at this token
        if len(active) > self.max_depth:
            active.popleft()  # the oldest open suffix reached max_depth tokens
        self.root.count += 1
        for i, node in enumerate(active):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            active[i] = child

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.append(seq_id, int(t))

    def remove(self, seq_id: int) -> None:
        """Take sequence `seq_id` out of the tree (its suffixes' counts, and nodes left empty)."""
        seq = self._seqs.pop(seq_id, None)
        self._active.pop(seq_id, None)
        if not seq:
            return
        self.root.count -= len(seq)
        for start in range(len(seq)):
            node = self.root
            for tok in seq[start:start + self.max_depth]:
                child = node.children[tok]
                child.count -= 1
                if child.count == 0:
                    del node.children[tok]  # nothing else passes through: drop the subtree
                    break
                node = child

    def _match(self, pattern: Sequence[int]) -> _Node | None:
        node = self.root
        for tok in pattern:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def candidates(self, context: Sequence[int], max_spec_tokens: int, max_spec_factor: float = 1.0,
                   min_token_prob: float = 0.1) -> list[Candidate]:
        """The best continuation of `context` (the last max_depth tokens are used), as a list
        of at most one `Candidate` (empty when nothing matches or nothing passes the knobs)."""
        context = list(context)[-self.max_depth:]
        best: Candidate | None = None
        for m in range(1, len(context)):
            node = self._match(context[len(context) - m:])
            if node is None:
                # A longer pattern ending in this one cannot occur either (its own suffix would).
                break
            limit = max(0, min(max_spec_tokens, int(m * max_spec_factor + 1e-6)))
            cand = self._path(node, limit, min_token_prob)
            cand.match_len = m
            if cand.tokens and (best is None or cand.score >= best.score):  # a tie: the longer match
                best = cand
        return [best] if best is not None else []

    @staticmethod
    def _path(node: _Node, limit: int, min_token_prob: float) -> Candidate:
        """Follow the most frequent child from `node` (the first seen among equals)."""
        out = Candidate()
        prob = 1.0
        while len(out.tokens) < limit and node.children:
            tok, child = max(node.children.items(), key=lambda kv: kv[1].count)
            prob *= child.count / node.count
            if prob < min_token_prob:
                break
            out.tokens.append(tok)
            out.probs.append(prob)
            node = child
        return out
