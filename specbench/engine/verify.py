"""Lossless verification of every row's draft tree in one batched computation (docs/engine.md,
"The rule"), in vLLM's words: accepted draft tokens along one path of the tree, then one
recovered token (after the last sibling was rejected) or one bonus token (at a leaf). A
chain is the tree with one child per node; there is no separate chain path.

`verify_tree` takes the verify feed of the trees (specbench.engine.tree.TreeBatch), the
target's logits over it [B, M, V] (feed index 0: the root, the row's last emitted token;
node i at feed index i + 1), the distributions q the nodes were drawn from ([B, N, V], or
None for deterministic drafters: a point mass per node), and each row's sampling parameters
and generator. It walks every row's tree from the root at once, depth by depth: at a node,
the children are tried in order, child x accepted with probability min(1, p(x)/q(x)) (u * q(x)
< p(x); q(x) = 0 rejects); a rejected child turns p into the residual norm(max(p - q, 0))
before the next sibling is tried (for a point mass: p with x removed); an accepted child
becomes the node, p the target's distribution there. Where no child is accepted (or at a
leaf) the extra token is drawn from what p has become. Greedy rows accept the child equal to
the target's argmax and emit the argmax. Returns, per row, the accepted path (node indices,
depth order) and the extra token, with a single device-to-host transfer.

A row's random draws come from its own generator in a fixed order (one uniform per node, in
node order, then one categorical draw), so its samples never depend on its batch mates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.config import SamplingParams
from specbench.engine.sampling import probs_from_logits, sampling_groups
from specbench.engine.tree import TreeBatch


def rejected(p: torch.Tensor, q_node: torch.Tensor | None, x: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """p [B, V] after child x [B] (drawn from q_node [B, V]; None: a point mass) was rejected:
    norm(max(p - q, 0)), for a point mass p without x, renormalized; where that sums to zero
    (p == q up to rounding), p. `last`: x was its parent's last child (the result is then what
    the recovered token is drawn from), else the next sibling is tried against it."""
    residual = p.scatter(1, x.view(-1, 1), 0.0) if q_node is None else torch.clamp(p - q_node, min=0.0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp_min(1e-30), p)


def verify_tree(tree: TreeBatch, logits: torch.Tensor, q: torch.Tensor | None,
                samplings: Sequence[SamplingParams], generators: Sequence[torch.Generator]
                ) -> tuple[list[list[int]], list[int]]:
    """(accepted path per row, extra token per row)."""
    B, M, V = logits.shape
    dev = logits.device
    D = tree.max_depth
    feed = tree.feed.to(dev)
    children = tree.children.to(dev)
    rows = torch.arange(B, device=dev)
    greedy, sampled = sampling_groups(samplings)
    is_greedy = torch.zeros(B, dtype=torch.bool, device=dev)
    argmax = torch.zeros(B, M, dtype=torch.long, device=dev)
    if greedy:
        g = torch.tensor(greedy, device=dev)
        is_greedy[g] = True
        argmax[g] = logits[g].argmax(dim=-1)
    u = torch.ones(B, M, device=dev)  # u of node i at feed index i + 1
    for _, members in sampled:
        for b in members:
            if tree.nodes[b]:
                u[b, 1: tree.nodes[b] + 1] = torch.rand(tree.nodes[b], generator=generators[b], device=dev)
    groups = [(sp, torch.tensor(m, device=dev)) for sp, m in sampled]
    p = torch.zeros(B, V, dtype=torch.float32, device=dev)  # sampled rows: the distribution in hand
    cur = torch.zeros(B, dtype=torch.long, device=dev)  # feed index of each row's current node
    alive = torch.ones(B, dtype=torch.bool, device=dev)  # still walking down
    path = torch.full((B, max(D, 1)), -1, dtype=torch.long, device=dev)
    for depth in range(D + 1):
        for sp, s in groups:  # the target's distribution at the node reached
            p[s] = torch.where(alive[s].view(-1, 1), probs_from_logits(logits[s, cur[s]], sp), p[s])
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        nxt = cur.clone()
        for r in range(children.shape[-1] if depth < D else 0):
            child = children[rows, cur, r]
            cand = alive & ~moved & (child >= 0)
            at = child.clamp(min=0)
            x = feed[rows, at]
            accept = torch.zeros(B, dtype=torch.bool, device=dev)
            if greedy:
                accept = x == argmax[rows, cur]
            if sampled:
                p_x = p.gather(1, x.view(-1, 1)).view(-1)
                q_node = None if q is None else q[rows, (at - 1).clamp(min=0)].float()
                q_x = torch.ones_like(p_x) if q_node is None else q_node.gather(1, x.view(-1, 1)).view(-1)
                last = children[rows, cur, r + 1] < 0 if r + 1 < children.shape[-1] else torch.ones_like(cand)
                residual = rejected(p, q_node, x, last)
                accept_s = (u[rows, at] * q_x < p_x) & (q_x > 0)
                accept = torch.where(is_greedy, accept, accept_s)
                no = cand & ~accept & ~is_greedy
                p = torch.where(no.view(-1, 1), residual, p)
            accept &= cand
            moved |= accept
            nxt = torch.where(accept, child, nxt)
        if depth < D:
            path[:, depth] = torch.where(moved, nxt - 1, -1)
        cur, alive = nxt, moved
    extra = argmax[rows, cur]
    for _, members in sampled:
        for b in members:
            extra[b] = torch.multinomial(p[b], 1, generator=generators[b])[0]
    out = torch.cat([path, extra.view(-1, 1)], dim=1).tolist()  # the one device-to-host transfer
    paths = [[n for n in row[:-1] if n >= 0] for row in out]
    return paths, [row[-1] for row in out]
