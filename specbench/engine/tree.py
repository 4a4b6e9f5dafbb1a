"""A batch of draft trees as the one verify pass sees them (a chain is the tree with one child
per node).

Row b's verify feed is [root, node 0, node 1, ..., padding]: the root is the row's last
emitted token (feed index 0), node i sits at feed index i + 1. `TreeBatch` holds, per row,
the depth of every feed entry (the rotary position offset: the root at depth 0, a node one
deeper than its parent), which feed entries each one may attend to (its ancestors and
itself, `visible`; with the row's context that is the tree attention mask,
specbench.engine.kv.TreeAttention), and each entry's children in the order the verifier
tries them (`children`, feed indices, -1 past the last). Padding entries see only
themselves and have no children.

It also holds what a proposal is (`Proposal`: the trees a drafter hands the verifier, its
format described in specbench.engine.drafters.base) and how a drafter is asked to grow them
(`TreeShape`), so the engine core never imports the drafters.

Boundary: tensors and token ids; nothing here runs a model or samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specbench.config import tree_pool


@dataclass
class Proposal:
    # per row, the proposed node tokens (possibly fewer than asked, or none)
    tokens: list[list[int]]
    # [B, N, V] distributions the nodes were drawn from (N = most nodes of a row, zero
    # padding); None for deterministic drafters, whose q is a point mass per node.
    q: torch.Tensor | None = None
    # per row, each node's parent (-1 = the root); None = every row is a chain
    parents: list[list[int]] | None = None

    def parents_of(self, b: int) -> list[int]:
        """Row b's parent indices (a chain's when the proposal gives none)."""
        if self.parents is None:
            return list(range(-1, len(self.tokens[b]) - 1))
        return list(self.parents[b])


def tree_from_paths(paths: Sequence[Sequence[int]]) -> tuple[list[int], list[tuple[int, ...]]]:
    """(parents, paths sorted) of a static tree given as paths of branch ranks (vLLM's
    `speculative_token_tree`, Medusa's sparse trees): (0,) the root's best child, (0, 1) its
    second child, ... Nodes come out sorted by (depth, path), so parents precede children;
    every prefix of a path must be a path too (checked by specbench.config)."""
    ordered = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda t: (len(t), t))
    index = {p: i for i, p in enumerate(ordered)}
    return [index[p[:-1]] if len(p) > 1 else -1 for p in ordered], ordered


@dataclass(frozen=True)
class TreeShape:
    """How a drafter grows its tree (from the speculative configuration)."""

    topk: int = 1
    draft_nodes: int | None = None  # None: no cap beyond topk per depth
    paths: tuple[tuple[int, ...], ...] | None = None  # a static tree

    @classmethod
    def from_spec(cls, spec: Any) -> "TreeShape":
        return cls(spec.topk, spec.draft_nodes, spec.token_tree)

    @property
    def chain(self) -> bool:
        """One child per node."""
        if self.paths is not None:
            return all(p[-1] == 0 for p in self.paths) and len({len(p) for p in self.paths}) == len(self.paths)
        return self.topk == 1


@dataclass
class TreeBatch:
    feed: torch.Tensor  # [B, M] long: root token, node tokens, zero padding
    depth: torch.Tensor  # [B, M] long
    visible: torch.Tensor  # [B, M, M] bool: entry j sees entry a
    children: torch.Tensor  # [B, M, R] long: feed indices of entry j's children, -1 past the last
    nodes: list[int]  # nodes per row
    parents: list[list[int]]  # per row, node parents (-1 = root)
    ranks: list[list[int]]  # per row, each node's rank among its siblings
    has_children: list[list[bool]]  # per row, whether node i has children
    max_depth: int  # deepest node over the batch (0: nothing drafted)


def tree_batch(roots: Sequence[int], prop: Proposal, ks: Sequence[int]) -> TreeBatch:
    """The verify feed of a proposal; a row's tree may be no deeper than ks[b] (a drafter that
    breaks that, or the parent order, gets a ValueError naming the row)."""
    B = len(roots)
    nodes = [len(t) for t in prop.tokens]
    M = 1 + max(nodes, default=0)
    feed = torch.zeros(B, M, dtype=torch.long)
    depth = torch.zeros(B, M, dtype=torch.long)
    par = torch.arange(M).repeat(B, 1)  # feed index of each entry's parent (root, padding: itself)
    parents, ranks, has_children = [], [], []
    kids: list[list[list[int]]] = []
    for b in range(B):
        tok, pa = prop.tokens[b], prop.parents_of(b)
        if len(pa) != len(tok):
            raise ValueError(f"drafter proposal row {b}: {len(tok)} tokens but {len(pa)} parents")
        ch: list[list[int]] = [[] for _ in range(M)]
        d = [0] * (len(tok) + 1)
        rk = []
        for i, p in enumerate(pa):
            if not -1 <= p < i:
                raise ValueError(f"drafter proposal row {b}: node {i} has parent {p} "
                                 "(valid: -1 for the root or an earlier node)")
            d[i + 1] = d[p + 1] + 1
            rk.append(len(ch[p + 1]))
            ch[p + 1].append(i + 1)
        if len(tok) and max(d) > ks[b]:
            raise ValueError(f"drafter proposal row {b}: depth {max(d)} exceeds the {ks[b]} asked for")
        feed[b, 0] = roots[b]
        if tok:
            feed[b, 1:len(tok) + 1] = torch.tensor(tok)
            depth[b, :len(tok) + 1] = torch.tensor(d)
            par[b, 1:len(tok) + 1] = torch.tensor(pa) + 1
        parents.append(list(pa))
        ranks.append(rk)
        has_children.append([bool(ch[i + 1]) for i in range(len(tok))])
        kids.append(ch)
    R = max((len(c) for ch in kids for c in ch), default=0)
    children = torch.full((B, M, max(R, 1)), -1, dtype=torch.long)
    for b, ch in enumerate(kids):
        for j, c in enumerate(ch):
            if c:
                children[b, j, :len(c)] = torch.tensor(c)
    # ancestors: follow the parent links max_depth times from every entry
    max_depth = int(depth.max()) if B else 0
    visible = torch.zeros(B, M, M, dtype=torch.bool)
    anc = torch.arange(M).repeat(B, 1)
    visible.scatter_(2, anc.unsqueeze(-1), True)
    for _ in range(max_depth):
        anc = par.gather(1, anc)
        visible.scatter_(2, anc.unsqueeze(-1), True)
    return TreeBatch(feed, depth, visible, children[:, :, :max(R, 1)], nodes, parents, ranks, has_children,
                     max_depth)


def gather_paths(cache, first: torch.Tensor, paths: Sequence[Sequence[int]]) -> None:
    """Move row b's accepted nodes in `cache` (a SlotKV) from their feed positions
    first[b] + node to the row's next positions first[b] + depth - 1 (nothing moves for a
    chain, whose nodes are there already)."""
    moves = [(b, int(first[b]) + node, int(first[b]) + d) for b, path in enumerate(paths)
             for d, node in enumerate(path) if node != d]
    if moves:
        cache.gather(*torch.tensor(moves, dtype=torch.long).T)


def path_features(feats: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
    """The verify pass's features [B, M, F] at [root, accepted path...] in sequence order
    [B, 1 + longest path, F] (zero-index padding past a row's path)."""
    index = torch.zeros(len(paths), 1 + max((len(p) for p in paths), default=0), dtype=torch.long)
    for b, path in enumerate(paths):
        if path:
            index[b, 1:1 + len(path)] = torch.tensor(path, dtype=torch.long) + 1
    return feats.gather(1, index.to(feats.device).unsqueeze(-1).expand(-1, -1, feats.shape[-1]))


class StaticTree:
    """A static tree (paths of branch ranks, `tree_from_paths`) as the fixed index tables the
    static step (specbench.engine.static) drafts and verifies it with, every row the same
    shape. Feed index 0 is the root, node i is feed index i + 1.

    Drafting goes depth by depth: `levels[d - 1]` holds, for the nodes of depth d, (node
    indices, index of each one's parent within the previous frontier, its rank), then the
    positions among them of the frontier (the nodes that have children, fed to the drafter)
    with the offset they are fed at past the row's context and what they see of the fed
    entries (`[W, fed so far + W]`: their fed ancestors and themselves)."""

    def __init__(self, paths: Sequence[Sequence[int]], device: torch.device):
        parents, ordered = tree_from_paths(paths)
        self.nodes, self.depth = len(ordered), max(len(p) for p in ordered)
        n, dev = self.nodes, device
        has_kids = sorted({p for p in parents if p >= 0})
        kids: list[list[int]] = [[] for _ in range(n + 1)]  # per feed entry, its children's feed indices
        for i, p in enumerate(parents):
            kids[p + 1].append(i + 1)
        self.width = max(len(c) for c in kids)  # most children of one entry
        children = torch.full((n + 1, self.width), -1, dtype=torch.long)
        for j, c in enumerate(kids):
            children[j, :len(c)] = torch.tensor(c, dtype=torch.long)
        visible = torch.eye(n + 1, dtype=torch.bool)
        for i, p in enumerate(parents):  # parents precede children: a node sees its parent's view and itself
            visible[i + 1] |= visible[p + 1]
        self.children = children.to(dev)  # [n + 1, R]
        self.visible = visible.to(dev)  # [n + 1, n + 1] over the verify feed
        self.feed_depth = torch.tensor([0] + [len(p) for p in ordered], dtype=torch.long, device=dev)
        self.rank = torch.tensor([0] + [p[-1] for p in ordered], dtype=torch.long, device=dev)  # per feed entry
        fed_at = [-1] * n  # where each node was fed to the drafter, past the row's context
        self.levels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, int, torch.Tensor]] = []
        front, fed = [-1], 0
        fed_visible = torch.zeros(0, 0, dtype=torch.bool)  # what each fed entry sees of the fed entries
        for d in range(1, self.depth + 1):
            at = [i for i, p in enumerate(ordered) if len(p) == d]
            kid_pos = [j for j, i in enumerate(at) if i in has_kids]
            W = len(kid_pos)
            seen = torch.zeros(W, fed + W, dtype=torch.bool)
            for w, j in enumerate(kid_pos):
                i = at[j]
                if parents[i] >= 0:
                    seen[w, :fed] = fed_visible[fed_at[parents[i]]]
                seen[w, fed + w] = True
                fed_at[i] = fed + w
            grown = torch.zeros(fed + W, fed + W, dtype=torch.bool)
            grown[:fed, :fed], grown[fed:] = fed_visible, seen
            self.levels.append((torch.tensor(at, device=dev),
                                torch.tensor([front.index(parents[i]) for i in at], device=dev),
                                torch.tensor([ordered[i][-1] for i in at], device=dev),
                                max(ordered[i][-1] for i in at) + 1,
                                torch.tensor(kid_pos, dtype=torch.long, device=dev), fed, seen.to(dev)))
            front, fed, fed_visible = [at[j] for j in kid_pos], fed + W, grown
        self.fed_at = torch.tensor([-1] + fed_at, dtype=torch.long, device=dev)  # per feed entry


class DynamicTree:
    """EAGLE-2's dynamic tree (specbench.engine.drafters.tree_search) in the fixed shapes the
    static step drafts it in: `topk` children of the root, then per depth the `topk`
    candidates of highest cumulative draft log-probability are fed and each gets `topk`
    children, `depth` deep; of the `pool` candidates (`topk + (depth - 1) * topk²`) the `nodes`
    of highest cumulative probability are kept and verified. What each row's tree looks like
    is data (index tables built on the device per step, specbench.engine.static_tree), never a
    shape: `fed` draft entries and `nodes` verified ones per row, whatever was found."""

    def __init__(self, topk: int, depth: int, nodes: int, device: torch.device):
        self.topk, self.depth = topk, depth
        self.pool = tree_pool(depth, topk)
        self.nodes = min(nodes, self.pool)
        self.width = topk  # most children of one entry
        self.fed = topk * max(depth - 1, 0)  # draft entries fed per step (the frontiers)
        self.pool_depth = torch.tensor([1] * topk + [d for d in range(2, depth + 1) for _ in range(topk * topk)],
                                       dtype=torch.long, device=device)  # per pool index
