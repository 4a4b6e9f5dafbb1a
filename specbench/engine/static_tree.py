"""The static step's trees: a static speculative_token_tree drafted and verified in fixed
shapes (specbench.engine.static runs them; specbench.engine.tree.StaticTree holds the tree's
index tables).

Drafting ranks each frontier's draft distribution once per depth and takes the ranks the tree
lists; verification walks every row's tree at once, depth by depth, trying children best
first. Both are pure functions of the step's persistent buffers (the rows' state tensors and
the models' KV), so they run op by op, compiled or captured as the chain's do; a node that
does not exist for a row (its parent missing, past the row's draft length, probability zero)
is masked, never a new shape.

Boundary: tensors and token ids; the batch's state is StaticBatch's (this is its mixin).
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.engine.sampling import SALT_ACCEPT, SALT_TOKEN, counter_uniform, row_probs, sample_inverse_cdf
from specbench.engine.verify import rejected


def step_table(drafted: torch.Tensor, n: torch.Tensor, leaf: torch.Tensor, depth: torch.Tensor,
           tokens: torch.Tensor | None, ranks: torch.Tensor | None, extra: torch.Tensor) -> torch.Tensor:
    """What a step emitted, per row, as the one tensor the host reads: [drafted nodes,
    accepted, whether the whole path was accepted (a leaf or nothing drafted), the tree's
    depth, the accepted path's tokens (K columns, the first `accepted` read), their ranks
    among their siblings (K), the extra token] (long; K = 0 when nothing was drafted)."""
    cols = [t.view(-1, 1).long() for t in (drafted, n, leaf, depth)] + \
        ([tokens, ranks] if tokens is not None else []) + [extra.view(-1, 1)]
    return torch.cat(cols, dim=1)



class TreeStep:
    """The tree functions of specbench.engine.static.StaticBatch (they read its state:
    tree, ctx, last, live, seed, greedy, temperature, top_k, top_p, ks, threshold, target,
    draft)."""

    tree: Any
    threshold: float

    def _draft_tree(self, B: int, sampled: bool, top_k: bool, top_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A static tree per row ([B, nodes] tokens and whether each is a node of the row's
        tree): the draft catches up on the row's last two tokens, then each depth's nodes are
        the ranks the tree lists of their parent's draft distribution (the draft's top tokens;
        for a sampled row, of its distribution under the row's sampling, as the eager drafter
        takes them: specbench.engine.drafters.tree_search), and the nodes with children are
        fed, each seeing the context and its fed ancestors. A node exists where its parent
        does, its depth is within the row's draft length and its probability is not zero; a
        node below the confidence threshold gets no children."""
        tree, ctx, greedy = self.tree, self.ctx[:B], self.greedy[:B]
        dist = self.draft.forward(self.last[:B], ctx - 2, last_only=True).unsqueeze(1)  # [B, 1, V]: the root
        front_ok = torch.ones(B, 1, dtype=torch.bool, device=self.dev)
        toks, oks = [], []
        ks = self.ks[:B].view(B, 1)
        for d, (_, parent, rank, c, kid_pos, fed, seen) in enumerate(tree.levels, start=1):
            logp, top = torch.log_softmax(dist.float(), dim=-1).topk(c, dim=-1)  # [B, W, c]
            if sampled:
                qv, q_top = row_probs(dist, self.temperature[:B], self.top_k[:B], self.top_p[:B],
                                      use_top_k=top_k, use_top_p=top_p).topk(c, dim=-1)
                g = greedy.view(B, 1, 1)
                logp, top = torch.where(g, logp, torch.log(qv)), torch.where(g, top, q_top)
            tok, lp = top[:, parent, rank], logp[:, parent, rank]  # [B, nodes of depth d]
            ok = front_ok[:, parent] & (d <= ks) & (lp > float("-inf"))
            toks.append(tok)
            oks.append(ok)
            if len(kid_pos):
                W = len(kid_pos)
                front_ok = ok[:, kid_pos]
                if self.threshold > 0:
                    front_ok = front_ok & (lp[:, kid_pos].exp() >= self.threshold)
                depth = torch.full((B, W), d - 1, dtype=torch.long, device=self.dev)
                dist = self.draft.forward(tok[:, kid_pos], ctx, tree=(fed, depth, seen.expand(B, W, fed + W)))
        return torch.cat(toks, dim=1), torch.cat(oks, dim=1)

    def _verify_tree(self, B: int, sampled: bool, top_k: bool, top_p: bool, nodes: torch.Tensor,
                     exists: torch.Tensor) -> torch.Tensor:
        """One target pass over [last token, tree nodes] of every row (each node at its depth,
        seeing its ancestors), the walk down the tree, the extra token and the roll-back (the
        accepted path's target and draft entries moved into the row's next positions);
        returns the step's table (`step_table`).

        The walk, all rows at once, depth by depth: at the node reached the children are tried
        best first; a greedy row accepts the child equal to the target's argmax; a sampled row
        accepts child x with probability p(x) (its draft is a point mass) and on a rejection
        tries the next child against p without x, renormalized (specbench.engine.verify's rule).
        The extra token is the argmax at the last node reached, or a draw from what p has
        become. A row's uniforms are keyed by (its seed, the position, the child's rank): no
        step reuses one a kept token depended on."""
        tree, ctx, last, greedy, live = self.tree, self.ctx[:B], self.last[:B], self.greedy[:B], self.live[:B]
        N, D, R = tree.nodes, tree.depth, tree.width
        feed = torch.cat([last[:, 1:], nodes], dim=1)  # [B, N + 1]
        real = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=self.dev), exists], dim=1)
        logits = self.target.forward(feed, ctx - 1, tree=(0, tree.feed_depth.expand(B, N + 1),
                                                          tree.visible.expand(B, N + 1, N + 1)))
        top = logits.argmax(-1)  # [B, N + 1]
        if sampled:
            probs = row_probs(logits, self.temperature[:B], self.top_k[:B], self.top_p[:B],
                              use_top_k=top_k, use_top_p=top_p)
            p = probs[:, 0]
        cur = torch.zeros(B, dtype=torch.long, device=self.dev)  # feed index of the node reached
        alive = torch.ones(B, dtype=torch.bool, device=self.dev)
        path = []
        for depth in range(D):
            moved = torch.zeros_like(alive)
            nxt = cur
            for r in range(R):
                child = tree.children[cur, r]
                at = child.clamp(min=0).view(B, 1)
                cand = alive & ~moved & (child >= 0) & real.gather(1, at).view(B)
                x = feed.gather(1, at).view(B)
                accept = x == top.gather(1, cur.view(B, 1)).view(B)
                if sampled:
                    u = counter_uniform(self.seed[:B], SALT_ACCEPT, (ctx + depth) * R + r)
                    p_x = p.gather(1, x.view(B, 1)).view(B)
                    accept = torch.where(greedy, accept, u < p_x)
                    no = cand & ~accept & ~greedy
                    p = torch.where(no.view(B, 1), rejected(p, None, x, no), p)
                accept = accept & cand
                moved = moved | accept
                nxt = torch.where(accept, child, nxt)
            path.append(torch.where(moved, nxt, -1))
            cur, alive = nxt, moved
            if sampled:
                p = torch.where(moved.view(B, 1), probs.gather(1, cur.view(B, 1, 1).expand(B, 1, p.shape[-1])).squeeze(1), p)
        path_t = torch.stack(path, dim=1)  # [B, D] feed indices, -1 past the accepted ones
        n = (path_t >= 0).long().sum(dim=1)
        extra = top.gather(1, cur.view(B, 1)).view(B)
        if sampled:
            drawn = sample_inverse_cdf(p, counter_uniform(self.seed[:B], SALT_TOKEN, ctx + n))
            extra = torch.where(greedy, extra, drawn)
        on = path_t.clamp(min=0)
        accepted_toks = feed.gather(1, on)
        # roll back: path node d moves from the feed's slot to the row's next position ctx + d;
        # the draft's fed entries of the path (every node but the last has children) likewise
        d = torch.arange(D, device=self.dev).view(1, D)
        dst = ctx.view(B, 1) + d
        self.target.move_positions(torch.where(d < n.view(B, 1), ctx.view(B, 1) - 1 + on, dst), dst)
        self.draft.move_positions(torch.where(d < n.view(B, 1) - 1, ctx.view(B, 1) + tree.fed_at[on], dst), dst)
        before = accepted_toks.gather(1, (n - 1).clamp(min=0).view(B, 1)).view(B)
        self.last[:B] = torch.stack([torch.where(n > 0, before, last[:, 1]), extra], dim=1)
        self.ctx[:B] = torch.where(live, ctx + n + 1, ctx)
        kids = tree.children[cur]  # [B, R]: the last node reached has no real child at a leaf
        leaf = ~((kids >= 0) & real.gather(1, kids.clamp(min=0))).any(dim=1)
        depth_max = (exists.long() * tree.feed_depth[1:]).amax(dim=1)
        return step_table(exists.long().sum(dim=1), n, leaf & (n > 0) | ~exists.any(dim=1), depth_max, accepted_toks,
                      tree.rank[on], extra)
