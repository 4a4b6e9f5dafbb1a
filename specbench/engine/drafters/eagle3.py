"""EAGLE-3 drafting: a one-layer head drafts a tree (a chain at topk 1) from the target's own features.

Alignment (as in vLLM, SGLang and the EAGLE-3 training recipe): head position t reads the
target's features at position t together with the token at t + 1, at rotary position t, and
predicts the token at t + 2. So for a row whose sequence is x_0..x_{n-1} (the last token not
yet in the target cache), the head's cache holds real entries for positions 0..L-1, and the
target features of positions L..n-2 wait in `pending` until their next tokens are known:

    add_row   prompt of P tokens: entries 0..P-2 at once (one prefill), feature P-1 pending
              (its next token is the first output token, sampled after the prefill)
    propose   catch up: every pending feature with the token after it (ragged, one batched
              pass); the last of these gives the root's distribution. Then each depth of the
              tree (specbench.engine.drafters.tree_search) feeds its frontier nodes, each
              with the layer's output (before its final norm) at its parent, at its depth's
              position, seeing its ancestors: (h, d_1) -> d_2, (h', d_2) -> d_3, ...
    commit    the verify pass's features at [last token, accepted path] become pending;
              the draft steps' entries lie past L and are overwritten by the next catch-up,
              so rolling back is moving nothing: a rejected token never reached a real entry
    retain    finished rows leave; survivors' cache slots move down

Vocabulary: the head scores a reduced draft vocabulary; draft id i is target id i + d2t[i].
Greedy rows draft the head's top-ranked tokens (point masses). Sampled rows in a chain draw
from the head's logits scattered into the target vocabulary (-inf elsewhere) under the
request's temperature, top-k and top-p, with the row's own generator; that q, zero outside
the draft vocabulary, goes to the verifier, so min(1, p/q) and the residual max(0, p - q)
stay exact. In a tree they take the top-ranked tokens of that distribution (point masses).
The head's scratch entries of a tree need no gathering: the accepted tokens' entries are
rebuilt from the target's features at the next catch-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specbench.engine.drafters.base import OwnCache, Proposal
from specbench.engine.drafters.tree_search import grow
from specbench.engine.tree import TreeShape
from specbench.engine.kv import SlotKV, TreeAttention, causal_mask, slot_attention
from specbench.engine.model import PackedLinear


class HeadRunner:
    """The head with its own one-layer slot KV cache. Rows are slots 0..rows-1."""

    def __init__(self, head: Any, *, rows: int = 1, capacity: int = 256):
        self.head = head
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        attn = head.layers[0].self_attn
        self.scaling = attn.head_dim ** -0.5
        self.cache = SlotKV(1, attn.kv_heads, attn.head_dim, dtype=self.dtype, device=self.device,
                            rows=rows, capacity=capacity)

    @property
    def weight_bytes(self) -> int:
        """The head's own weights (the shared target embedding is the target's)."""
        packed = sum(m.weight_bytes for m in self.head.modules() if isinstance(m, PackedLinear))
        return packed + sum(p.numel() * p.element_size() for p in self.head.parameters())

    def reserve(self, rows: int, capacity: int) -> None:
        self.cache.reserve(rows, capacity)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, rows: slice, start: torch.Tensor,
                prefill: bool = False, tree: TreeAttention | None = None) -> torch.Tensor:
        """Write [n, M] entries (target token ids, hidden [n, M, H]) at positions
        start[b] + 0..M-1 of slots `rows` (draft-tree entries: at the positions and with the
        visibility `tree` gives); return the layer outputs [n, M, H]."""
        n, width = tokens.shape
        start = start.to(torch.long).cpu()
        self.cache.begin(rows, start, width, prefill=prefill)
        if tree is None:
            mask = causal_mask(start, width, self.cache.kv_len, self.device)
            pos = (start.view(n, 1) + torch.arange(width).view(1, width)).to(self.device)
        else:
            mask = tree.mask(self.cache.kv_len, self.device)
            pos = tree.positions.to(self.device)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = self.cache.update(k, v, 0)
            return slot_attention(None, q, keys, values, mask, scaling=self.scaling)[0]

        return self.head.decode(tokens.to(self.device), hidden, pos, attend)


class Eagle3Drafter(OwnCache):
    def __init__(self, head: Any, shape: TreeShape = TreeShape(), confidence_threshold: float = 0.0):
        self.head = head
        self.shape = shape
        self.threshold = confidence_threshold  # a node the head is less sure of is not expanded
        self.lm = HeadRunner(head)
        self.capture_layers: tuple[int, ...] = tuple(head.aux_layers)
        self.draft_ids = head.draft_ids.to(self.lm.device)  # draft id -> target id
        self.vocab_size = int(head.config.vocab_size)
        self.lengths: list[int] = []  # per row: head cache positions holding real entries
        self.pending: list[torch.Tensor] = []  # per row: features [m, F] of positions lengths..

    def reserve(self, rows: int, capacity: int) -> None:
        self.lm.reserve(rows, capacity)

    def accept_paths(self, paths: Sequence[Sequence[int]]) -> None:
        pass  # commit receives the target's features along the accepted path, in sequence order

    def add_row(self, row: int, prompt_ids: Sequence[int], features: torch.Tensor | None) -> None:
        assert row == len(self.lengths), "rows join at the end of the batch"
        assert features is not None, "the target captures the head's feature layers"
        n = len(prompt_ids)
        feats = features[0]
        if n > 1:
            hidden = self.head.project(feats[: n - 1]).unsqueeze(0)
            self.lm.forward(torch.tensor([list(prompt_ids[1:])]), hidden, slice(row, row + 1),
                            torch.zeros(1, dtype=torch.long), prefill=True)
        self.lengths.append(n - 1)
        self.pending.append(feats[n - 1:].clone())

    @torch.inference_mode()
    def propose(self, rows: Sequence[Any], ks: Sequence[int]) -> Proposal:
        B, K = len(rows), max(ks, default=0)
        if K == 0:
            return Proposal([[] for _ in rows])
        dev = self.lm.device
        # Catch up: each drafting row feeds its pending features with the tokens that followed
        # them (rows not drafting ride along on a dummy entry past their length, never read).
        ms = [self.pending[b].shape[0] if ks[b] > 0 else 1 for b in range(B)]
        width, feat_dim = max(ms), self.pending[0].shape[-1]
        feats = torch.zeros(B, width, feat_dim, dtype=self.pending[0].dtype, device=dev)
        toks = torch.zeros(B, width, dtype=torch.long)
        for b, r in enumerate(rows):
            if ks[b] > 0:
                nxt = r.ids[self.lengths[b] + 1:]
                assert len(nxt) == ms[b], (len(nxt), ms[b])
                feats[b, : ms[b]] = self.pending[b]
                toks[b, : ms[b]] = torch.tensor(nxt)
        out = self.lm.forward(toks, self.head.project(feats), slice(0, B), torch.tensor(self.lengths))
        hidden = out[torch.arange(B, device=dev), torch.tensor(ms, device=dev) - 1]  # [B, H]
        for b in range(B):
            if ks[b] > 0:
                self.lengths[b] += ms[b]
                self.pending[b] = self.pending[b][:0]

        base = torch.tensor(self.lengths, dtype=torch.long)
        outputs = hidden.unsqueeze(1)  # [B, W, H]: the layer outputs of the frontier (the root's)

        def expand(tok: torch.Tensor, parent: torch.Tensor, visible: torch.Tensor, offset: int,
                   depth: int) -> torch.Tensor:
            # each node with the hidden state it was drafted from (its parent's), at its depth's
            # position (entries past each row's length: scratch until the next catch-up)
            nonlocal outputs
            w = tok.shape[1]
            h = outputs.gather(1, parent.unsqueeze(-1).expand(B, w, outputs.shape[-1]))
            tree = TreeAttention(base, (base + depth - 1).view(B, 1).expand(B, w), visible.cpu())
            outputs = self.lm.forward(tok, h, slice(0, B), base + offset, tree=tree)
            return self.head.logits(outputs)

        prop, _ = grow(self.shape, self.head.logits(hidden), ks, rows, expand, draft_ids=self.draft_ids,
                       vocab_size=self.vocab_size, threshold=self.threshold)
        return prop

    def commit(self, accepted: Sequence[int], valid: Sequence[int], features: torch.Tensor | None) -> None:
        assert features is not None
        # The verify pass scored [last token, drafts...]: its features at the last token and the
        # accepted drafts are real positions of the sequence; the rest are dropped here.
        for b, n in enumerate(accepted):
            self.pending[b] = torch.cat([self.pending[b], features[b, : n + 1]])
            assert self.lengths[b] + self.pending[b].shape[0] == valid[b], "head and target disagree"

    def retain(self, keep: Sequence[int]) -> None:
        for dst, src in enumerate(keep):
            self.lm.cache.move_row(src, dst, self.lengths[src])
        self.lengths = [self.lengths[s] for s in keep]
        self.pending = [self.pending[s] for s in keep]
