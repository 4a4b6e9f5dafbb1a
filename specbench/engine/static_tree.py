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
    tree or dtree, ctx, last, live, seed, greedy, temperature, top_k, top_p, ks, threshold, target,
    and the drafter: draft, head or medusa)."""

    tree: Any
    dtree: Any
    threshold: float
    medusa: Any
    head: Any

    def _tree_root(self, B: int, heads: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The draft distribution at every row's root [B, 1, V] (in target ids) and what its
        children are fed with: the draft model after catching up on the row's last two tokens
        (None), the EAGLE-3 head after catching up on what is pending (its layer output [B, 1,
        H]), or Medusa's first head (`heads`: all heads' logits; None)."""
        if heads is not None:
            return heads[:, :1], None
        if self.head is not None:
            hidden = self._head_catch_up(B).unsqueeze(1)
            return self.head.draft_logits(hidden, self.target.vocab_size), hidden
        return self.draft.forward(self.last[:B], self.ctx[:B] - 2, last_only=True).unsqueeze(1), None

    def _tree_feed(self, tok: torch.Tensor, parent: torch.Tensor, hidden: torch.Tensor | None, fed: int,
                   depth: int, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed the frontier nodes of depth `depth` (tokens [B, W]; `parent` [B, W]: each one's
        parent within the previous frontier, whose layer outputs `hidden` are) to the drafter
        as tree entries `fed`.. past its context, each seeing the context and `visible` [B, W,
        fed + W] of the fed entries; returns their children's draft distribution [B, W, V] and
        the layer outputs they feed their own children (EAGLE-3's; None for a draft model).
        The draft model's context ends at ctx - 1, the head's at ctx - 2 (its entry t reads
        the target's features at t), so the head's nodes sit one position lower, as on the
        eager step (specbench.engine.drafters.eagle3)."""
        B, W = tok.shape
        at = torch.full((B, W), depth - 1, dtype=torch.long, device=self.dev)
        ctx = self.ctx[:B]
        if self.head is None:
            return self.draft.forward(tok, ctx, tree=(fed, at, visible)), None
        h = hidden.gather(1, parent.unsqueeze(-1).expand(B, W, hidden.shape[-1]))  # each node with its parent's
        out = self.head.forward(tok, h, ctx - 1, tree=(fed, at, visible))
        return self.head.draft_logits(out, self.target.vocab_size), out

    def _ranked(self, dist: torch.Tensor, c: int, B: int, sampled: bool, top_k: bool, top_p: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The `c` best children of every frontier node ([B, W, V] draft logits): their draft
        log-probabilities and tokens [B, W, c], the draft's top tokens (for a sampled row, of
        its distribution under the row's sampling, as the eager drafter takes them:
        specbench.engine.drafters.tree_search)."""
        logp, top = torch.log_softmax(dist.float(), dim=-1).topk(c, dim=-1)  # [B, W, c]
        if sampled:
            qv, q_top = row_probs(dist, self.temperature[:B], self.top_k[:B], self.top_p[:B],
                                  use_top_k=top_k, use_top_p=top_p).topk(c, dim=-1)
            g = self.greedy[:B].view(B, 1, 1)
            logp, top = torch.where(g, logp, torch.log(qv)), torch.where(g, top, q_top)
        return logp, top

    def _draft_tree(self, B: int, sampled: bool, top_k: bool, top_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A static tree per row ([B, nodes] tokens and whether each is a node of the row's
        tree): the draft catches up on the row's last two tokens, then each depth's nodes are
        the ranks the tree lists of their parent's draft distribution (the draft's top tokens;
        for a sampled row, of its distribution under the row's sampling, as the eager drafter
        takes them: specbench.engine.drafters.tree_search), and the nodes with children are
        fed, each seeing the context and its fed ancestors. A node exists where its parent
        does, its depth is within the row's draft length and its probability is not zero; a
        node below the confidence threshold gets no children."""
        tree = self.tree
        heads = self._medusa_logits(B) if self.medusa is not None else None  # [B, heads, V]: every depth's
        dist, hidden = self._tree_root(B, heads)  # [B, 1, V]
        front_ok = torch.ones(B, 1, dtype=torch.bool, device=self.dev)
        toks, oks = [], []
        ks = self.ks[:B].view(B, 1)
        for d, (_, parent, rank, c, kid_pos, fed, seen) in enumerate(tree.levels, start=1):
            logp, top = self._ranked(dist, c, B, sampled, top_k, top_p)  # [B, W, c]
            tok, lp = top[:, parent, rank], logp[:, parent, rank]  # [B, nodes of depth d]
            ok = front_ok[:, parent] & (d <= ks) & (lp > float("-inf"))
            toks.append(tok)
            oks.append(ok)
            if len(kid_pos):
                W = len(kid_pos)
                front_ok = ok[:, kid_pos]
                if self.threshold > 0:
                    front_ok = front_ok & (lp[:, kid_pos].exp() >= self.threshold)
                if heads is not None:  # Medusa: head d scores depth d + 1, whatever the path
                    dist = self._medusa_level(heads, d, W)
                    continue
                dist, hidden = self._tree_feed(tok[:, kid_pos], parent[kid_pos].expand(B, W), hidden, fed, d,
                                               seen.expand(B, W, fed + W))
        return torch.cat(toks, dim=1), torch.cat(oks, dim=1)

    def _draft_dynamic_tree(self, B: int, sampled: bool, top_k: bool, top_p: bool) -> tuple[torch.Tensor, ...]:
        """A dynamic tree per row, grown as the eager drafter grows it (the same candidates,
        scores and choices; specbench.engine.drafters.tree_search), in fixed shapes: the draft
        catches up on the row's last two tokens, then per depth every frontier node gets its
        `topk` best children and the `topk` candidates of highest cumulative log-probability
        are fed (each seeing the context and its fed ancestors) as the next frontier. A
        candidate exists where its parent does, within the row's draft length, with a non-zero
        probability; a frontier node below the confidence threshold gets none. Returns the
        kept nodes and their index tables (`_keep_nodes`)."""
        dt, dev = self.dtree, self.dev
        c = dt.topk
        ks = self.ks[:B].view(B, 1, 1)
        heads = self._medusa_logits(B) if self.medusa is not None else None
        dist, hidden = self._tree_root(B, heads)  # [B, 1, V]
        front_score = torch.zeros(B, 1, device=dev)
        front_ok = torch.ones(B, 1, dtype=torch.bool, device=dev)
        front_idx = torch.full((B, 1), -1, dtype=torch.long, device=dev)  # pool index (-1: the root)
        front_vis = torch.zeros(B, 1, 0, dtype=torch.bool, device=dev)  # what each sees of the fed entries
        pool: list[list[torch.Tensor]] = [[], [], [], [], []]  # tokens, scores, parents, valid, fed at
        size = fed = 0
        for d in range(1, dt.depth + 1):
            W = dist.shape[1]
            logp, top = self._ranked(dist, c, B, sampled, top_k, top_p)  # [B, W, c]
            ok = front_ok.unsqueeze(-1) & (d <= ks) & (logp > float("-inf"))
            flat = W * c
            score = torch.where(ok, front_score.unsqueeze(-1) + logp, float("-inf")).view(B, flat)
            tok = top.reshape(B, flat)
            parent = front_idx.unsqueeze(-1).expand(B, W, c).reshape(B, flat)
            slots = torch.full((B, flat), -1, dtype=torch.long, device=dev)
            if d < dt.depth:
                sel = score.topk(c, dim=-1).indices  # [B, c]: the next frontier, fed now
                f_ok = ok.view(B, flat).gather(1, sel)
                if self.threshold > 0:
                    f_ok = f_ok & (logp.reshape(B, flat).gather(1, sel).exp() >= self.threshold)
                parent_w = sel // c
                vis = torch.cat([front_vis.gather(1, parent_w.unsqueeze(-1).expand(B, c, fed)),
                                 torch.eye(c, dtype=torch.bool, device=dev).expand(B, c, c)], dim=2)
                slots = slots.scatter(1, sel, torch.arange(fed, fed + c, device=dev).expand(B, c))
                if heads is not None:  # Medusa: nothing is fed, the next depth's head scores every path
                    dist = self._medusa_level(heads, d, c)
                else:
                    dist, hidden = self._tree_feed(tok.gather(1, sel), parent_w, hidden, fed, d, vis)
                front_idx, front_score, front_ok, front_vis = size + sel, score.gather(1, sel), f_ok, vis
                fed += c
            for col, t in zip(pool, (tok, score, parent, ok.view(B, flat), slots)):
                col.append(t)
            size += flat
        return self._keep_nodes(B, *(torch.cat(col, dim=1) for col in pool))

    def _keep_nodes(self, B: int, toks: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor,
                    valid: torch.Tensor, fed_at: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The `nodes` candidates of highest cumulative probability of every row's pool ([B,
        pool] each; EAGLE-2's re-ranking: a child never outscores its parent, so that is a
        tree; a node whose parent was not kept on a tie is dropped), in pool order (depth by
        depth, siblings best first: the order the verifier tries them), as the verify pass's
        tables: (tokens [B, N], exists [B, N], then per feed entry (0: the root, node i: i + 1)
        its children [B, N + 1, topk] (-1 past the last), depth [B, N + 1], what it sees
        [B, N + 1, N + 1] (its ancestors and itself), rank among its siblings [B, N + 1] and
        where it was fed to the draft [B, N + 1] (-1: never))."""
        dt, dev = self.dtree, self.dev
        P, N, R = dt.pool, dt.nodes, dt.width
        keep = valid
        if N < P:
            keep = torch.zeros_like(valid).scatter(1, scores.topk(N, dim=-1).indices, True) & valid
        for _ in range(dt.depth - 1):
            keep = keep & ((parents < 0) | keep.gather(1, parents.clamp(min=0)))
        idx = torch.arange(P, device=dev).expand(B, P)
        order = torch.where(keep, idx, idx + P).argsort(dim=1)[:, :N]  # the kept ones first, in pool order
        exists = keep.gather(1, order)
        node = torch.arange(N, device=dev).expand(B, N)
        compact = torch.full((B, P), -1, dtype=torch.long, device=dev).scatter(1, order, torch.where(exists, node, -1))
        up = parents.gather(1, order)
        parent = torch.where(exists & (up >= 0), compact.gather(1, up.clamp(min=0)) + 1, 0)  # feed index
        # siblings: nodes of one parent, ranked in pool order
        same = (parent.unsqueeze(2) == parent.unsqueeze(1)) & exists.unsqueeze(1) & exists.unsqueeze(2)
        rank = (same & torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)).long().sum(dim=2)
        slot = torch.where(exists, parent * R + rank, (N + 1) * R)  # past the table: a node that is not one
        children = torch.full((B, (N + 1) * R + 1), -1, dtype=torch.long, device=dev).scatter(
            1, slot, torch.where(exists, node + 1, -1))[:, :-1].view(B, N + 1, R)
        # what each feed entry sees: itself and its parent's view (a padding entry: itself)
        up_feed = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), torch.where(exists, parent, node + 1)], 1)
        eye = torch.eye(N + 1, dtype=torch.bool, device=dev).expand(B, N + 1, N + 1)
        visible = eye
        for _ in range(dt.depth):
            visible = eye | visible.gather(1, up_feed.unsqueeze(-1).expand(B, N + 1, N + 1))
        zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
        depth = torch.cat([zero, dt.pool_depth.expand(B, P).gather(1, order)], dim=1)
        return (toks.gather(1, order), exists, children, depth, visible, torch.cat([zero, rank], dim=1),
                torch.cat([zero - 1, fed_at.gather(1, order)], dim=1))

    def _verify_tree(self, B: int, sampled: bool, top_k: bool, top_p: bool, nodes: torch.Tensor,
                     exists: torch.Tensor, *tables: torch.Tensor) -> torch.Tensor:
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
        step reuses one a kept token depended on.

        `tables`: a dynamic tree's per-row tables (`_keep_nodes`); a static tree's are the
        same for every row (specbench.engine.tree.StaticTree)."""
        ctx, last, greedy, live = self.ctx[:B], self.last[:B], self.greedy[:B], self.live[:B]
        if not tables:
            t = self.tree
            tables = tuple(x.expand(B, *x.shape) for x in (t.children, t.feed_depth, t.visible, t.rank, t.fed_at))
        children, feed_depth, visible, rank, fed_at = tables
        D, R = self.k, children.shape[-1]

        def kids_of(at: torch.Tensor) -> torch.Tensor:  # [B, R]: the children of each row's entry `at`
            return children.gather(1, at.view(B, 1, 1).expand(B, 1, R)).view(B, R)

        feed = torch.cat([last[:, 1:], nodes], dim=1)  # [B, N + 1]
        real = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=self.dev), exists], dim=1)
        logits, feats = self._target_pass(feed, ctx - 1, tree=(0, feed_depth, visible))
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
            kids = kids_of(cur)
            for r in range(R):
                child = kids[:, r]
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
        if self.medusa is not None:  # the heads read the state at the last accepted node (the root: `last`)
            self._medusa_commit(B, feats, cur, live)
        elif self.head is not None:  # the features along the accepted path wait for the head's catch-up
            along = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=self.dev), on], dim=1)  # [B, D + 1]
            self._head_commit(B, D, feats.gather(1, along.unsqueeze(-1).expand(B, D + 1, feats.shape[-1])),
                              accepted_toks, n, extra, live)
        else:
            self.draft.move_positions(torch.where(d < n.view(B, 1) - 1, ctx.view(B, 1) + fed_at.gather(1, on), dst),
                                      dst)
        before = accepted_toks.gather(1, (n - 1).clamp(min=0).view(B, 1)).view(B)
        self.last[:B] = torch.stack([torch.where(n > 0, before, last[:, 1]), extra], dim=1)
        self.ctx[:B] = torch.where(live, ctx + n + 1, ctx)
        kids = kids_of(cur)  # none real at a leaf
        leaf = ~((kids >= 0) & real.gather(1, kids.clamp(min=0))).any(dim=1)
        depth_max = (exists.long() * feed_depth[:, 1:]).amax(dim=1)
        return step_table(exists.long().sum(dim=1), n, leaf & (n > 0) | ~exists.any(dim=1), depth_max, accepted_toks,
                      rank.gather(1, on), extra)
