"""Growing a draft tree for every row at once: EAGLE-2's dynamic tree, a static tree of branch
ranks (vLLM's speculative_token_tree), or a chain (topk 1), one search for all three.

The drafter supplies the distribution at the root (its catch-up pass) and `expand`, one
batched draft forward over a frontier of nodes (each attending to the row's context and its
own fed ancestors: a tree attention mask, specbench.engine.kv.TreeAttention). Per depth:

- every frontier node gets its best children: the top `topk` of its distribution (dynamic),
  the ranks the static tree lists, or one child (a chain);
- dynamic: the `topk` candidates of highest cumulative draft log-probability (sum over the
  path) become the next frontier and are fed; static: the nodes that have children in the
  tree; a chain: its one node.

At the end a dynamic tree keeps the `draft_nodes` candidates of highest cumulative
probability (a child never scores above its parent, so the kept set is a tree: EAGLE-2's
re-ranking; a node whose parent was not kept on a tie is dropped), a chain keeps its first
`draft_nodes`, a static tree all of its nodes. A row's tree is no deeper than ks[b].

Children are deterministic (a point mass each, `Proposal.q` None) except in a chain, where a
sampled row draws its child from the draft's distribution under the request's sampling
parameters with the row's own generator (q goes to the verifier), as chain drafting always
did. Picking the best of several *sampled* children would bias them away from q (see
specbench.engine.drafters.base), so trees of sampled rows take the draft's top-ranked tokens.

Nodes come out in creation order (depth by depth; siblings best first), so the verifier
tries the drafter's best child first. `scratch[b][i]` is where node i was fed: entry
`base + scratch` of the drafter's cache, -1 for leaves never fed; a drafter with its own KV
gathers the accepted path from there (`gather_moves`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specbench.engine.tree import Proposal, TreeShape, tree_from_paths
from specbench.engine.sampling import probs_from_logits, sampling_groups

# expand(tokens [B, W] target ids, parent [B, W] index into the previous frontier (0 = root
# at depth 1), visible [B, W, S] over the fed entries so far + these, offset of these
# entries, depth of these nodes) -> draft logits [B, W, V']
Expand = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def _static_levels(paths: Sequence[Sequence[int]]) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Per depth d >= 1: ((index of the parent within the frontier of depth d - 1, rank) of
    every node of depth d in tree order, the positions among them of the nodes that have
    children: the frontier of depth d)."""
    parents, ordered = tree_from_paths(paths)
    has_kids = {p for p in parents if p >= 0}
    levels: list[tuple[list[tuple[int, int]], list[int]]] = []
    front: list[int] = [-1]  # node indices of the current frontier (-1: the root)
    depth = 1
    while True:
        nodes = [i for i, p in enumerate(ordered) if len(p) == depth]
        if not nodes:
            break
        kids = [j for j, i in enumerate(nodes) if i in has_kids]
        levels.append(([(front.index(parents[i]), ordered[i][-1]) for i in nodes], kids))
        front = [nodes[j] for j in kids]
        depth += 1
    return levels


def _children(dist: torch.Tensor, c: int, depth: int, ks: Sequence[int], rows: Sequence[Any],
              front_ok: torch.Tensor, sample_chain: bool, draft_ids: torch.Tensor | None, V: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The best `c` children of every frontier node ([B, W, V'] draft logits `dist`): their
    target ids and draft log-probabilities [B, W, c] (-inf: none), and for a sampled chain the
    distributions [B, V] its children were drawn from (each sampled row draws one child with
    its own generator while its chain still grows). The draft never sees a row's output
    constraint, as vLLM's and SGLang's drafts do not (specbench.engine.constraint)."""
    B, W = dist.shape[:2]
    dev = dist.device
    greedy, sampled = sampling_groups([r.sampling for r in rows])
    tok = torch.zeros(B, W, c, dtype=torch.long, device=dev)
    logp = torch.full((B, W, c), float("-inf"), device=dev)
    if greedy:
        g = torch.tensor(greedy, device=dev)
        lp, idx = torch.log_softmax(dist[g].float(), dim=-1).topk(c, dim=-1)
        tok[g] = idx if draft_ids is None else draft_ids[idx]
        logp[g] = lp
    q_level = torch.zeros(B, V, device=dev) if sample_chain else None
    for sp, members in sampled:
        full = dist[members].float()
        if draft_ids is not None:  # the draft's distribution over the target vocabulary
            full = torch.full((len(members), W, V), float("-inf"), device=dev).index_copy_(2, draft_ids, full)
        q = probs_from_logits(full, sp)  # [S, W, V]
        if sample_chain:
            active = front_ok[members, 0].tolist()  # rows whose chain still grows draw
            for i, b in enumerate(members):
                if active[i] and depth <= ks[b]:
                    x = torch.multinomial(q[i, 0], 1, generator=rows[b].gen)[0]
                    tok[b, 0, 0] = x
                    logp[b, 0, 0] = torch.log(q[i, 0, x])
            q_level[members] = q[:, 0]
        else:
            qv, idx = q.topk(c, dim=-1)
            tok[members], logp[members] = idx, torch.log(qv)
    return tok, logp, q_level


class _Pool:
    """Every candidate node drafted so far, depth by depth ([B, n] each: target id, cumulative
    log-probability (-inf: not a node), parent's pool index (-1: the root), whether it is a
    node, where it was fed (-1: never)), and which of them the proposal keeps."""

    def __init__(self) -> None:
        self.tok: list[torch.Tensor] = []
        self.score: list[torch.Tensor] = []
        self.parent: list[torch.Tensor] = []
        self.valid: list[torch.Tensor] = []
        self.fed: list[torch.Tensor] = []
        self.size = 0  # candidates before the latest depth

    def add(self, tok: torch.Tensor, score: torch.Tensor, parent: torch.Tensor, valid: torch.Tensor) -> None:
        if self.tok:
            self.size += self.tok[-1].shape[1]
        self.tok.append(tok)
        self.score.append(score)
        self.parent.append(parent)
        self.valid.append(valid)
        self.fed.append(torch.full_like(tok, -1))

    def proposal(self, B: int, budget: int | None, qs: list[torch.Tensor], chain: bool
                 ) -> tuple[Proposal, list[list[int]]]:
        """The kept nodes of every row as a Proposal (with their fed positions, `scratch`): all
        valid ones, or the `budget` of highest cumulative probability (EAGLE-2's re-ranking;
        a child never outscores its parent, so that is a tree; a node whose parent was not kept
        on a tie is dropped)."""
        if not self.tok:
            return Proposal([[] for _ in range(B)]), [[] for _ in range(B)]
        toks, scores = torch.cat(self.tok, 1), torch.cat(self.score, 1)
        parents, valid, fed_at = torch.cat(self.parent, 1), torch.cat(self.valid, 1), torch.cat(self.fed, 1)
        P = toks.shape[1]
        keep = valid.clone()
        if budget is not None and budget < P:
            keep = torch.zeros_like(valid).scatter_(1, scores.topk(budget, dim=-1).indices, True) & valid
        table = torch.stack([toks, parents, keep.long(), fed_at], dim=0).tolist()  # one device-to-host transfer
        tokens, parents_out, scratch = [], [], []
        for b in range(B):
            t_b, p_b, k_b, f_b = (table[i][b] for i in range(4))
            index: dict[int, int] = {}
            tt, pp, ss = [], [], []
            for i in range(P):
                if not k_b[i] or (p_b[i] >= 0 and p_b[i] not in index):
                    continue
                index[i] = len(tt)
                tt.append(t_b[i])
                pp.append(index[p_b[i]] if p_b[i] >= 0 else -1)
                ss.append(f_b[i])
            tokens.append(tt)
            parents_out.append(pp)
            scratch.append(ss)
        q = None
        if qs:  # a chain: node i is depth i + 1
            n = max(len(t) for t in tokens)
            q = torch.stack(qs, dim=1)[:, :n] if n else None
        return Proposal(tokens, q, None if chain else parents_out), scratch


def _next_frontier(shape: TreeShape, level: Any, c: int, score: torch.Tensor) -> torch.Tensor | None:
    """Pool indices (within the latest depth, [B, W']) of the candidates fed and expanded at the
    next depth: a static tree's nodes that have children, a chain's one node, or a dynamic
    tree's `topk` best by cumulative probability; None: a static tree ends here."""
    B = score.shape[0]
    if level is not None:
        spec_nodes, with_kids = level
        flat_idx = [spec_nodes[j][0] * c + spec_nodes[j][1] for j in with_kids]
        return torch.tensor(flat_idx, device=score.device).repeat(B, 1) if flat_idx else None
    if shape.chain:
        return torch.zeros(B, 1, dtype=torch.long, device=score.device)
    return score.topk(min(shape.topk, score.shape[1]), dim=-1).indices


def grow(shape: TreeShape, root_logits: torch.Tensor, ks: Sequence[int], rows: Sequence[Any],
         expand: Expand, draft_ids: torch.Tensor | None = None, vocab_size: int | None = None,
         threshold: float = 0.0) -> tuple[Proposal, list[list[int]]]:
    """(proposal, scratch) for every row. root_logits [B, V'] over the draft vocabulary;
    draft_ids maps draft id -> target id (None: the same vocabulary), vocab_size the
    target's. A frontier node whose own probability is below `threshold` is not expanded."""
    B, dev = len(ks), root_logits.device
    static = _static_levels(shape.paths) if shape.paths is not None else None
    D = max(ks, default=0)
    if static is not None:
        D = min(D, len(static))
    if shape.chain and shape.draft_nodes is not None:
        D = min(D, shape.draft_nodes)
    V = vocab_size or root_logits.shape[-1]
    sample_chain = shape.chain and any(not r.sampling.greedy for r in rows)
    kcap = torch.tensor(list(ks), device=dev).view(B, 1, 1)
    return _grow_levels(shape, static, D, V, ks, rows, expand, draft_ids, threshold, sample_chain, root_logits, kcap)


def _grow_levels(shape: TreeShape, static: Any, D: int, V: int, ks: Sequence[int], rows: Sequence[Any],
                 expand: Expand, draft_ids: torch.Tensor | None, threshold: float,
                 sample_chain: bool, root_logits: torch.Tensor, kcap: torch.Tensor
                 ) -> tuple[Proposal, list[list[int]]]:
    """`grow`'s search, depth by depth, from the root's distribution."""
    B, dev = len(ks), root_logits.device
    pool, qs = _Pool(), []
    dist = root_logits.unsqueeze(1)  # [B, W, V'] at the frontier (W = 1: the root)
    front_idx = torch.full((B, 1), -1, dtype=torch.long, device=dev)  # pool index of frontier nodes
    front_score = torch.zeros(B, 1, device=dev)
    front_ok = torch.ones(B, 1, dtype=torch.bool, device=dev)
    front_vis = torch.zeros(B, 1, 0, dtype=torch.bool, device=dev)
    fed = 0
    for depth in range(1, D + 1):
        W = dist.shape[1]
        level = static[depth - 1] if static is not None else None
        c = max(r for _, r in level[0]) + 1 if level is not None else 1 if shape.chain else shape.topk
        tok, logp, q_level = _children(dist, c, depth, ks, rows, front_ok, sample_chain, draft_ids, V)
        exists = torch.ones(W, c, dtype=torch.bool, device=dev)
        if level is not None:
            exists = torch.zeros(W, c, dtype=torch.bool, device=dev)
            for w, r in level[0]:
                exists[w, r] = True
        ok = front_ok.unsqueeze(-1) & exists & (depth <= kcap) & (logp > float("-inf"))
        flat = W * c
        score = torch.where(ok, front_score.unsqueeze(-1) + logp, float("-inf")).view(B, flat)
        pool.add(tok.view(B, flat), score, front_idx.unsqueeze(-1).expand(B, W, c).reshape(B, flat), ok.view(B, flat))
        if q_level is not None:
            qs.append(q_level)
        if depth == D:
            break
        sel = _next_frontier(shape, level, c, score)  # fed now, expanded at the next depth
        if sel is None:
            break
        W2 = sel.shape[1]
        f_ok = ok.view(B, flat).gather(1, sel)
        if threshold > 0:
            f_ok &= logp.view(B, flat).gather(1, sel).exp() >= threshold
            if not bool(f_ok.any()):
                break
        parent_w = sel // c
        vis = torch.zeros(B, W2, fed + W2, dtype=torch.bool, device=dev)
        vis[:, :, :fed] = front_vis.gather(1, parent_w.unsqueeze(-1).expand(B, W2, fed))
        vis[:, :, fed:] = torch.eye(W2, dtype=torch.bool, device=dev)
        pool.fed[-1].scatter_(1, sel, torch.arange(fed, fed + W2, device=dev).repeat(B, 1))
        dist = expand(tok.view(B, flat).gather(1, sel), parent_w, vis, fed, depth)
        front_idx, front_score, front_ok, front_vis = pool.size + sel, score.gather(1, sel), f_ok, vis
        fed += W2
    budget = shape.draft_nodes if static is None and not shape.chain else None
    return pool.proposal(B, budget, qs, shape.chain)


def gather_moves(base: Sequence[int], scratch: Sequence[Sequence[int]], paths: Sequence[Sequence[int]]
                 ) -> tuple[list[int], list[tuple[int, int, int]]]:
    """(entries kept per row, (row, src, dst) moves): row b's accepted nodes that were fed move
    from base + scratch to base + depth - 1, up to the first that was not."""
    kept, moves = [], []
    for b, path in enumerate(paths):
        n = 0
        for d, node in enumerate(path):
            s = scratch[b][node] if node < len(scratch[b]) else -1
            if s < 0:
                break
            if s != d:
                moves.append((b, base[b] + s, base[b] + d))
            n += 1
        kept.append(n)
    return kept, moves
