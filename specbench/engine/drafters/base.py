"""The drafter interface: batch-first, one file per method; a proposal is a tree per row.

A drafter proposes draft tokens for every row of the running batch at once and keeps
whatever per-row state it needs (a draft model's KV cache, a head's features), row-aligned
with the engine's batch: row b of the drafter is row b of the engine. The engine calls

- `add_row(row, prompt_ids, features)` after the target prefilled a new request into row
  `row` (features: the target's captured hidden states over the prompt, or None);
  `add_rows(first, prompts, features)` after one prefill pass of several, into rows
  first, first + 1, ... (features [n, longest prompt, F], each row's past its prompt
  padding): one add_row each unless the drafter batches them (the draft model's one pass);
- `reserve(rows, capacity)` when a run knows every request up front: room for that many rows
  of that many positions in whatever cache the drafter keeps (a no-op for most);
- `propose(rows, ks)` once per step: a draft of depth at most ks[b] for row b (0 = none),
  with the distributions q its tokens were drawn from (a `Proposal`);
- `accept_paths(paths)` right after verification: paths[b] lists the accepted nodes of row
  b's proposal, root's child first (a chain's accepted prefix is [0, 1, .., n-1]); a drafter
  whose state does not depend on which branch won does nothing;
- `commit(accepted, valid, features)` after verification: row b accepted `accepted[b]`
  drafts (the depth of its accepted path) and only the first `valid[b]` tokens of its
  sequence survive; `features` are the target's captured hidden states of the verify pass at
  [last token, accepted path...] in sequence order ([B, 1 + max accepted, F], or None), i.e.
  what a chain holding exactly the accepted tokens would have given;
- `retain(keep)` when rows finish: new row i is old row keep[i].

And it reports what it holds, for the run's memory figures: `weight_bytes` (its own weights;
0 for none) and `kv_bytes()`, the (allocated, in use) bytes of its KV cache ((0, 0) without
one).

Rows are the engine's row objects; a drafter may read `ids` (prompt + output so far),
`sampling` and `gen` (the row's own generator) from them, never write them.

## The tree a proposal describes (one per row)

Node i of row b has token `tokens[b][i]` and parent `parents[b][i]`: -1 for a child of the
root (the row's last emitted token, which the verify pass scores first), else the index of an
earlier node (parents[b][i] < i: nodes are in topological order). `parents=None` means every
row is a chain (parent of node i is i - 1), the form a single-continuation drafter returns.
A node's depth is its parent's plus one (the root's children: depth 1); a row's deepest node
is at depth <= ks[b]. The siblings of a node (nodes with the same parent) are tried by the
verifier in node order, so a drafter puts its best candidate first; the position of a node
among its siblings is its *branch rank* (records: `step_accepted_ranks`).

`q[b, i]` is the distribution node i was drawn from, over the target vocabulary (zero
padding past a row's nodes; q is never read for greedy rows). The verifier (specbench.engine.verify,
rule in docs/engine.md) is lossless when, given the path to a node, each child was drawn
from its q[b, i] independently of its siblings and of whether it is tried, e.g.

- children drawn i.i.d. from the draft's distribution at the parent (SpecInfer): each child's
  q is that distribution; the verifier applies min(1, p/q) and the residual
  norm(max(p - q, 0)) between siblings;
- deterministic children (top-k of a draft model, EAGLE-2's dynamic tree, a Medusa sparse
  tree of head ranks, an n-gram or suffix tree's continuations): a point mass each;
  `q=None` says every node of every row is one (the verifier accepts x with probability
  p(x) and removes x from p before the next sibling).

Which children a node gets may depend on the path to it (a confidence threshold, a
cumulative-probability budget over deterministic candidates), never on the values of sampled
siblings: keeping the best of several *sampled* children biases them away from q.

Examples, in the form Medusa's sparse trees and vLLM's `speculative_token_tree` take
(paths of branch ranks, e.g. [(0,), (1,), (0, 0)]): tokens [a, b, c] with parents
[-1, -1, 0] is the root's top two children a and b, and a's best child c. A suffix/n-gram
drafter with continuations [a, c] and [b] returns the same tree. `tree_from_paths` turns
such a path list into parents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from specbench.engine.tree import Proposal, tree_from_paths

__all__ = ["Cacheless", "Drafter", "OwnCache", "Proposal", "StatelessDrafter", "tree_from_paths"]


class Drafter(Protocol):
    #: whether `add_row`/`commit` need the target's hidden states (and at which layers)
    capture_layers: Sequence[int]

    @property
    def weight_bytes(self) -> int: ...

    def kv_bytes(self) -> tuple[int, int]: ...

    def reserve(self, rows: int, capacity: int) -> None: ...

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None: ...

    def add_rows(self, first: int, prompts: Sequence[Sequence[int]], features: torch.Tensor | None) -> None: ...

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal: ...

    def accept_paths(self, paths: Sequence[Sequence[int]]) -> None: ...

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None: ...

    def retain(self, keep: Sequence[int]) -> None: ...


class RowByRow:
    """`add_rows` as one `add_row` per row, each given its own prompt's features."""

    def add_rows(self, first: int, prompts: Sequence[Sequence[int]], features: torch.Tensor | None) -> None:
        for i, prompt in enumerate(prompts):
            self.add_row(first + i, prompt,  # type: ignore[attr-defined]
                         features[i:i + 1, :len(prompt)] if features is not None else None)


class Cacheless(RowByRow):
    """Base for drafters without a KV cache (Medusa's heads, suffix trees, n-gram lookup):
    nothing to reserve, nothing to report, and a state that does not depend on which branch
    of a tree won (commit says how much survived)."""

    def kv_bytes(self) -> tuple[int, int]:
        return 0, 0

    def reserve(self, rows: int, capacity: int) -> None:
        pass

    def accept_paths(self, paths: Sequence[Sequence[int]]) -> None:
        pass


class OwnCache(RowByRow):
    """Base for drafters that keep their own KV cache: a runner `lm` (with `weight_bytes` and
    a slot `cache`) holding `lengths[b]` positions of row b (the draft model, EAGLE-3)."""

    lm: Any
    lengths: list[int]

    @property
    def weight_bytes(self) -> int:
        return self.lm.weight_bytes

    def kv_bytes(self) -> tuple[int, int]:
        return self.lm.cache.allocated_bytes, sum(self.lengths) * self.lm.cache.bytes_per_token


class StatelessDrafter(Cacheless):
    """Base for drafters that keep no per-row state (n-gram lookup, test drafters): no
    weights either, and nothing to add, move or drop."""

    capture_layers: Sequence[int] = ()
    weight_bytes: int = 0

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        pass

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        pass

    def retain(self, keep: Sequence[int]) -> None:
        pass
