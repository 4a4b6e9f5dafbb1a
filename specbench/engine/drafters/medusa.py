"""Medusa drafting: K heads over the target's last hidden state propose a chain, one-hot q.

The target's hidden state at the position that produced the last emitted token (after the
final norm, what its own LM head read) goes through every head at once (specbench.models.
medusa): head i scores the token i + 1 places after that emitted token. The engine captures
the last decoder layer's output (`capture_layers = (num_layers,)`, before the final norm) on
every target pass; the drafter applies the target's own final norm to the one position per
row it needs:

    add_row   the prompt's last position (it produced the first output token)
    commit    the verify pass's position of the last accepted token: feed index
              `accepted[b]` of [last token, drafts...], whose logits gave the extra token
    propose   one batched pass of the heads over those states; `candidates` gives every
              head's top-k (ids and probabilities), `chain` takes each head's top-1 for the
              first k heads (k is capped at the number of heads)

Drafts are the heads' argmax for greedy and sampled requests alike (as vLLM's Medusa does):
q is one-hot, so the verifier's one-hot rule keeps sampling exact.

Trees (topk > 1, or a static tree of branch ranks, `speculative_token_tree`, the form
Medusa's sparse trees take): head d's top candidates are the children of every node at depth
d, whatever the path (the heads read one hidden state, not the drafted tokens), so the tree is
grown by the same search as the draft model's and EAGLE-3's (`tree_search.grow`) with head d's
scores as the distribution at depth d: topk children of the best `topk` frontier nodes per
depth, the `draft_nodes` of highest cumulative probability kept (the Cartesian tree of
top-k per head, cut to the budget), or exactly the static tree's nodes. Every child is a
point mass (q None), for sampled rows too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specbench.engine.drafters.base import Cacheless, Proposal
from specbench.engine.drafters.tree_search import grow
from specbench.engine.tree import TreeShape
from specbench.engine.model import PackedLinear


class MedusaDrafter(Cacheless):  # commit receives the state of the accepted path's last token
    def __init__(self, heads: Any, target_runner: Any, shape: TreeShape = TreeShape()):
        self.heads = heads
        self.shape = shape
        self.norm = target_runner.decoder.norm  # the target's final norm, applied as its LM head sees it
        self.capture_layers: tuple[int, ...] = (target_runner.num_layers,)
        self.states: list[torch.Tensor] = []  # per row: the pre-norm hidden state [H] the heads read next

    @property
    def weight_bytes(self) -> int:
        packed = sum(m.weight_bytes for m in self.heads.modules() if isinstance(m, PackedLinear))
        return packed + sum(p.numel() * p.element_size() for p in self.heads.parameters())

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        assert row == len(self.states), "rows join at the end of the batch"
        assert features is not None, "the target captures its last layer's output"
        self.states.append(features[0, len(prompt_ids) - 1].clone())

    @torch.inference_mode()
    def candidates(self, rows: Sequence[int], topk: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n, K, topk], probabilities [n, K, topk]) of every head for the given rows,
        best first (softmax in float32)."""
        h = self.norm(torch.stack([self.states[b] for b in rows]).unsqueeze(1))[:, 0]
        logits = self.heads(h).float()  # [n, K, V]
        probs, ids = torch.softmax(logits, dim=-1).topk(topk, dim=-1)
        return ids, probs

    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        if not self.shape.chain:
            return self._tree(rows, ks)
        drafting = [b for b, k in enumerate(ks) if k > 0]
        tokens: list[list[int]] = [[] for _ in rows]
        if drafting:
            ids, _ = self.candidates(drafting, topk=1)
            table = ids[..., 0].tolist()  # [n, K]: the one device-to-host transfer
            for i, b in enumerate(drafting):
                tokens[b] = table[i][: ks[b]]
        return Proposal(tokens)

    @torch.inference_mode()
    def _tree(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        K = self.heads.num_heads
        ks = [min(k, K) for k in ks]
        if max(ks, default=0) == 0:
            return Proposal([[] for _ in rows])
        h = self.norm(torch.stack(self.states).unsqueeze(1))[:, 0]
        logits = self.heads(h).float()  # [B, K, V]: head d scores depth d + 1
        B, V = logits.shape[0], logits.shape[-1]

        def expand(tok: torch.Tensor, parent: torch.Tensor, visible: torch.Tensor, offset: int,
                   depth: int) -> torch.Tensor:
            w = tok.shape[1]  # children of the depth-`depth` frontier: head `depth`, any path
            if depth >= K:
                return torch.full((B, w, V), float("-inf"))
            return logits[:, depth].unsqueeze(1).expand(B, w, V)

        prop, _ = grow(self.shape, logits[:, 0], ks, rows, expand)
        return prop

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        assert features is not None
        for b, n in enumerate(accepted):
            self.states[b] = features[b, n].clone()

    def retain(self, keep: Sequence[int]) -> None:
        self.states = [self.states[s] for s in keep]
