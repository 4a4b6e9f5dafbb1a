"""The static step: every shape fixed, everything on the device, one device-to-host transfer.

The eager step (specbench.engine.engine.Batch) is honest on a CPU, where a decode step's time
is its arithmetic. On a GPU its time would be its host work: some two thousand dispatched ops
for a plain decode step of a 28-layer model, five times that for a k=4 draft-model step, and
eight host syncs, where vLLM replays one captured graph. This module is the step as a GPU
wants it, proven on the CPU:

- static shapes: KV buffers preallocated per layer (specbench.engine.static_lm), lengths
  as data, the batch padded to a bucket (1, 2, 4, ...: vLLM's capture sizes), one verify
  width (k + 1) per configuration; budget caps, `dynamic_k` and the confidence threshold are
  a per-row draft length inside that shape; a step where no row drafts runs the baseline's;
- a device-resident step: drafting, verification, rejection sampling and roll-back are
  tensor code over all rows (no loop over rows), sampling uses counter-based random numbers
  (specbench.engine.sampling.counter_uniform: a request's samples depend only on its seed),
  and the step's one device-to-host transfer is what it emitted;
- two pure functions per step (draft chain; verify and accept) run as they are, compiled or
  captured (specbench.engine.graphs); on CUDA the draft/verify split comes from CUDA events.

What it runs: the baseline, and chains, static trees (vLLM's speculative_token_tree: fixed
index tables, specbench.engine.tree.StaticTree) and dynamic (EAGLE-2) trees (fixed sizes,
per-row tables built on the device, tree.DynamicTree) drafted by a draft model, an EAGLE-3
head (its own static KV slots, specbench.engine.static_eagle3) or Medusa heads
(specbench.engine.static_medusa), greedy and sampled with temperature, top-k and top-p, mixed
in one batch, on Llama-family models (Llama, Mistral, Qwen2) with plain linear layers. N-gram
and suffix drafting (host-side lookups, as in vLLM) run on the eager step; `static_reason`
says why a configuration or a model cannot run here, for run.json.

Lossless as the eager step is (docs/engine.md, "The rule"): a greedy row accepts drafts while
they equal the target's argmax and emits the argmax; a sampled row accepts draft x with
probability min(1, p(x)/q(x)) and on the first rejection draws from norm(max(p - q, 0)) (p
where that is zero), or draws the bonus token from p after a fully accepted chain; in a tree
it tries the next sibling against that residual first.

Longer than 400 lines because, like the eager step, the step is read top to bottom in one
place: the state it keeps per slot, admission, the draft and verify functions, the step that
runs them, and the bookkeeping that compacts rows.

Boundary: token ids and tensors; the same Batch interface as the eager step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine.graphs import Graphs
from specbench.engine.rows import Admission, BatchStats, Generation, Row, RunningRows, padded
from specbench.engine.sampling import (SALT_ACCEPT, SALT_DRAFT, SALT_TOKEN, counter_uniform, row_probs,
                                       sample_inverse_cdf)
from specbench.engine.static_eagle3 import HeadStep
from specbench.engine.static_head import StaticHead
from specbench.engine.static_lm import StaticLM, model_reason
from specbench.engine.static_medusa import MedusaStep, StaticMedusa
from specbench.engine.static_tree import TreeStep, step_table
from specbench.engine.tree import DynamicTree, StaticTree, TreeShape
from specbench.types import StepEvent


# why a constrained request (structured output) cannot run here: its masks come from a matcher on the host
CONSTRAINED = ("structured output (a JSON schema, regex, grammar or tool call) is decoded on the eager step: "
               "its grammar masks are computed on the host per draft position")


def bucket(n: int) -> int:
    """The padded batch size of n rows: the next power of two (vLLM's capture sizes)."""
    return 1 << max(0, n - 1).bit_length()


def spec_reason(spec: SpeculativeConfig) -> str:
    """Why a configuration cannot run on the static step ('' when it can)."""
    if not spec.speculative:
        return ""
    if spec.method not in ("draft_model", "eagle3", "medusa"):
        return (f"method {spec.method} (the static step runs the baseline and draft_model, eagle3 and medusa "
                "chains and trees)")
    return ""


def static_reason(target: torch.nn.Module, draft: torch.nn.Module | None,
                  specs: Sequence[SpeculativeConfig], head: torch.nn.Module | None = None) -> str:
    """Why the static step cannot run `target` (and `draft`, the draft model or None, or
    `head`, the EAGLE-3 head or Medusa heads, or None) in these configurations ('' when it can)."""
    for role, model in (("target", target), ("draft", draft)):
        why = model_reason(model) if model is not None else ""
        if why:
            return f"the {role}: {why}"
    for spec in specs:
        why = spec_reason(spec)
        if why:
            return why
        if spec.speculative and spec.method == "draft_model" and draft is None:
            return "no draft model loaded"
        if spec.speculative and spec.method == "eagle3" and head is None:
            return "no EAGLE-3 head loaded"
        if spec.speculative and spec.method == "medusa" and head is None:
            return "no Medusa heads loaded"
    return ""


def sampling_flags(samplings: Sequence[SamplingParams]) -> tuple[bool, bool, bool]:
    """(any row samples, any applies top-k, any applies top-p): the sampling kind a step's
    graphs are built for (a kind that covers a row computes its result exactly)."""
    sampled = not all(sp.greedy for sp in samplings)
    return (sampled, sampled and any(0 < sp.top_k for sp in samplings),
            sampled and any(sp.top_p < 1.0 for sp in samplings))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What a row draws from after its draft x ~ q was rejected against p ([B, V] each):
    norm(max(p - q, 0)), or p where that is all zero."""
    r = torch.clamp(p - q, min=0.0)
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)


class StaticBatch(RunningRows, TreeStep, HeadStep, MedusaStep):
    """The running requests of one configuration on the static step (the interface of
    specbench.engine.engine.Batch: admit, step, cancel, rows, tags, stats, reserve)."""

    def __init__(self, engine: Any, spec: SpeculativeConfig, target: StaticLM, draft: StaticLM | None, mode: str,
                 backend: str = "inductor", options: dict[str, Any] | None = None, head: StaticHead | None = None,
                 medusa: StaticMedusa | None = None):
        self.engine, self.spec = engine, spec
        self.target, self.draft = target, draft
        self.head = head if spec.speculative and spec.method == "eagle3" else None
        self.medusa = medusa if spec.speculative and spec.method == "medusa" else None
        self.graphs = Graphs(mode, target.device, backend, options)
        self.dev = target.device
        # a static tree with more than one child somewhere (a tree of one child per node is a chain)
        self.tree = StaticTree(spec.token_tree, self.dev) \
            if spec.speculative and spec.token_tree is not None and not TreeShape.from_spec(spec).chain else None
        # a dynamic (EAGLE-2) tree: its shape is per row and per step, its sizes are fixed
        self.dtree = DynamicTree(spec.topk, spec.num_speculative_tokens, spec.draft_nodes, self.dev) \
            if spec.speculative and spec.token_tree is None and spec.topk > 1 else None
        self.k = self.tree.depth if self.tree else self.dtree.depth if self.dtree else \
            min(spec.num_speculative_tokens, spec.draft_nodes) if spec.speculative else 0
        if self.medusa is not None:  # one token per head
            self.k = min(self.k, self.medusa.num_heads)
        if self.k and self.head is None and self.medusa is None and draft is None:
            raise ValueError("method draft_model needs an engine built with a draft model")
        if self.k and self.head is None and self.medusa is None and draft.vocab_size != target.vocab_size:
            raise ValueError(f"the static step needs one vocabulary: draft {draft.vocab_size}, "
                             f"target {target.vocab_size}")
        self.threshold = spec.draft_confidence_threshold
        self.scratch = (self.tree.nodes if self.tree else max(self.dtree.nodes, self.dtree.fed) if self.dtree
                        else self.k) + 1
        if self.head is not None:  # the head's catch-up writes k + 1 entries past its length
            self.scratch += self.head_width
        self._state_rows = self._state_gen = 0
        self._alloc_state(max(1, target.rows))
        if self.dev.type == "cuda":
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            self._ks_host = torch.zeros(self._state_rows, dtype=torch.long).pin_memory()
        self.reset()

    def reset(self) -> None:
        """Empty: no rows, fresh statistics (buffers and built graphs are kept)."""
        self.rows: list[Row] = []
        self.draft_valid: list[int] = []  # per row: positions of its sequence the draft cache holds
        self.head_pending: list[int] = []  # per row: the head's pending entries (pn, as the host knows it)
        self.stats = BatchStats(target_weight_bytes=self.target.weight_bytes,
                                draft_weight_bytes=self.drafter.weight_bytes if self.k else 0,
                                step_path=f"static ({self.graphs.mode})")
        self.flags: tuple[bool, bool, bool] | None = None  # the run's sampling kind, when known
        self._built_at_reset = (self.graphs.builds, self.graphs.build_s)
        self.live.fill_(False)
        self.ctx.fill_(2)

    @property
    def drafter(self) -> StaticLM | StaticHead | StaticMedusa | None:
        """What drafts: the draft model, the EAGLE-3 head or the Medusa heads."""
        return self.head if self.head is not None else self.medusa if self.medusa is not None else self.draft

    # ---- persistent device state ----------------------------------------------------------

    def _alloc_state(self, rows: int) -> None:
        """Per-slot state the step reads and updates on the device."""
        dev, old = self.dev, self._state_rows
        state = {
            "ctx": torch.full((rows,), 2, dtype=torch.long, device=dev),  # tokens in the sequence
            "last": torch.zeros(rows, 2, dtype=torch.long, device=dev),  # its last two tokens
            "live": torch.zeros(rows, dtype=torch.bool, device=dev),
            "seed": torch.zeros(rows, dtype=torch.long, device=dev),
            "greedy": torch.ones(rows, dtype=torch.bool, device=dev),
            "temperature": torch.ones(rows, dtype=torch.float32, device=dev),
            "top_k": torch.zeros(rows, dtype=torch.long, device=dev),
            "top_p": torch.ones(rows, dtype=torch.float32, device=dev),
            "ks": torch.zeros(rows, dtype=torch.long, device=dev),  # this step's draft length per row
            **self._head_state(rows),
            **self._medusa_state(rows),
        }
        if old:
            for name, t in state.items():
                t[:old].copy_(getattr(self, name)[:old])
        for name, t in state.items():
            setattr(self, name, t)
        self._state_rows = rows
        self._state_gen += 1
        if self.dev.type == "cuda":
            self._ks_host = torch.zeros(rows, dtype=torch.long).pin_memory()

    def reserve(self, rows: int, capacity: int, samplings: Sequence[SamplingParams] | None = None) -> None:
        """Allocate KV slots and state up front (`scheduler.run` knows every request). Given
        every request's sampling, the graphs of every bucket up to `rows` and both widths are
        built here too, so no timed step ever includes a build."""
        slots = bucket(rows)
        grown = self.target.reserve(slots, capacity + self.scratch)
        if self.k:
            grown |= self.drafter.reserve(slots, capacity + self.scratch)
        if grown or slots > self._state_rows:
            self._alloc_state(max(slots, self._state_rows))
        if samplings is not None and not self.rows:
            self.flags = sampling_flags(samplings)
            if self.graphs.mode != "static":
                with torch.inference_mode():
                    for b in sorted({bucket(n) for n in range(1, rows + 1)}):
                        for K in sorted({self.k, 0}):
                            state = self._graph_state()
                            saved = [t.clone() for t in state]
                            self._run(b, K, self.flags)  # rows not live: their state is set on admission
                            for t, old in zip(state, saved):
                                t.copy_(old)

    # ---- admission --------------------------------------------------------------------------

    @torch.inference_mode()
    def admit_many(self, admissions: Sequence[Admission]) -> list[Generation]:
        """Prefill the requests of one turn into the next slots in ONE target pass (eager: its
        shape is the padded prompts'; the draft's prefill is one pass too) and emit each its
        first token. Returns the Generations of those whose first token already ends them."""
        if not admissions:
            return []
        if any(a.constraint is not None for a in admissions):
            raise ValueError(CONSTRAINED)
        e = self.engine
        prompts = [list(a.prompt_ids) for a in admissions]
        limits = [e.limits(p, a.sampling) for p, a in zip(prompts, admissions)]  # refuses before any write
        b0, n = len(self.rows), len(admissions)
        start = e.now()
        rows = [Row(p, a.sampling, None, stops, budget, self.k, start if a.arrival is None else a.arrival, start,
                    tag=a.tag, on_tokens=a.on_tokens)
                for a, p, (stops, budget) in zip(admissions, prompts, limits)]
        self.reserve(b0 + n, max(len(p) + budget for p, (_, budget) in zip(prompts, limits)))
        ids = padded(prompts, self.dev)
        sizes, tails = [len(p) for p in prompts], [p[-1] for p in prompts]  # (emit grows the prompts)
        lengths = torch.tensor(sizes, dtype=torch.long, device=self.dev)
        zero = torch.zeros(n, dtype=torch.long, device=self.dev)
        logits, feats = self._target_pass(ids, zero, row0=b0, last_only=True, last_at=lengths - 1)
        samplings = [a.sampling for a in admissions]
        firsts = logits.argmax(-1)
        if not all(sp.greedy for sp in samplings):
            probs = row_probs(logits, torch.tensor([1.0 if sp.greedy else sp.temperature for sp in samplings],
                                                   device=self.dev),
                              torch.tensor([sp.top_k for sp in samplings], device=self.dev),
                              torch.tensor([sp.top_p for sp in samplings], device=self.dev))
            u = counter_uniform(torch.tensor([sp.seed or 0 for sp in samplings], device=self.dev), SALT_TOKEN, lengths)
            greedy = torch.tensor([sp.greedy for sp in samplings], device=self.dev)
            firsts = torch.where(greedy, firsts, sample_inverse_cdf(probs, u))
        firsts = firsts.tolist()
        # Rows that end at their first token leave now: the others close ranks from b0 on.
        staying = self._staying(rows, firsts)
        moves = [(b0 + i, dst) for dst, i in enumerate(staying, start=b0) if b0 + i != dst]
        if moves:
            src, dst = (torch.tensor(x, dtype=torch.long, device=self.dev) for x in zip(*moves))
            self.target.move_rows(src, dst)
        if self.k and staying:
            if self.medusa is not None:
                for j, i in enumerate(staying, start=b0):
                    self.mstate[j] = feats[i, sizes[i] - 1]  # the state that produced the first token
            elif self.head is not None:
                for j, i in enumerate(staying, start=b0):  # the head's prefill counts as prefill
                    self._admit_head(j, prompts[i], feats[i:i + 1], firsts[i])
            else:  # the draft's prefill counts as prefill
                keep = torch.tensor(staying, dtype=torch.long, device=self.dev)
                self.draft.forward(ids.index_select(0, keep), zero[:len(staying)], row0=b0, last_only=True)
        finished = self._emit_firsts(rows, firsts, start, e.now())
        for j, i in enumerate(staying, start=b0):
            r, sp = rows[i], samplings[i]
            self.ctx[j] = sizes[i] + 1
            self.last[j, 0], self.last[j, 1] = tails[i], firsts[i]
            self.live[j] = True
            self.seed[j] = sp.seed or 0
            self.greedy[j] = sp.greedy
            self.temperature[j] = sp.temperature if not sp.greedy else 1.0
            self.top_k[j] = sp.top_k
            self.top_p[j] = sp.top_p
            self.rows.append(r)
            self.draft_valid.append(sizes[i])
            if self.head is not None:
                self.head_pending.append(1)
        return finished

    # ---- the step -----------------------------------------------------------------------------

    def _draft_chain(self, B: int, K: int, sampled: bool, top_k: bool, top_p: bool):
        """[B, K] draft tokens, their distributions q [B, K, V] (sampled batches; else None)
        and each row's draft length (ks, cut after the first node below the confidence
        threshold): the draft catches up on the row's last two tokens, then drafts K deep."""
        if self.medusa is not None:
            return self._draft_medusa(B, K, sampled)
        ctx, last, greedy = self.ctx[:B], self.last[:B], self.greedy[:B]
        if self.head is not None:  # the head catches up on what is pending, then drafts from its root
            hidden = self._head_catch_up(B)
            logits = self.head.draft_logits(hidden, self.target.vocab_size)
        else:
            logits = self.draft.forward(last, ctx - 2, last_only=True)
        toks, qs, probs = [], [], []
        for j in range(K):
            if sampled:
                q = row_probs(logits, self.temperature[:B], self.top_k[:B], self.top_p[:B],
                              use_top_k=top_k, use_top_p=top_p)
                drawn = sample_inverse_cdf(q, counter_uniform(self.seed[:B], SALT_DRAFT, ctx + j))
                tok = torch.where(greedy, logits.argmax(-1), drawn)
                qs.append(q)
            else:
                tok = logits.argmax(-1)
            if self.threshold > 0:
                conf = torch.softmax(logits.float(), -1)
                if sampled:
                    conf = torch.where(greedy.view(B, 1), conf, q)
                probs.append(conf.gather(1, tok.view(B, 1)).view(B))
            toks.append(tok)
            if j + 1 < K and self.head is not None:
                hidden = self._head_next(tok, hidden, ctx, j)
                logits = self.head.draft_logits(hidden, self.target.vocab_size)
            elif j + 1 < K:
                logits = self.draft.forward(tok.view(B, 1), ctx + j, last_only=True)
        drafts = torch.stack(toks, dim=1)
        q = torch.stack(qs, dim=1) if sampled else None
        ks = self.ks[:B]
        if self.threshold > 0:  # a node below the threshold is not expanded: the chain ends there
            low = torch.stack(probs, dim=1) < self.threshold
            low[:, -1] = True
            ks = torch.minimum(ks, low.long().argmax(dim=1) + 1)
        return drafts, q, ks

    def _verify(self, B: int, K: int, sampled: bool, top_k: bool, top_p: bool, drafts: torch.Tensor | None,
                q: torch.Tensor | None, ks: torch.Tensor) -> torch.Tensor:
        """One target pass over [last token, drafts] of every row, acceptance, the extra token
        and the cache roll-back (lengths); returns the step's table (`_table`)."""
        ctx, last, greedy, live = self.ctx[:B], self.last[:B], self.greedy[:B], self.live[:B]
        feed = last[:, 1:] if K == 0 else torch.cat([last[:, 1:], drafts], dim=1)
        logits, feats = self._target_pass(feed, ctx - 1)  # [B, K + 1, V]
        top = logits.argmax(-1)
        at = torch.arange(K, device=self.dev).view(1, K)
        ok = (drafts == top[:, :K]) & (at < ks.view(B, 1)) if K else top[:, :0].bool()
        if sampled:
            p = row_probs(logits, self.temperature[:B], self.top_k[:B], self.top_p[:B],
                          use_top_k=top_k, use_top_p=top_p)
        if sampled and K:
            p_x = p[:, :K].gather(2, drafts.unsqueeze(-1)).squeeze(-1)
            q_x = q.gather(2, drafts.unsqueeze(-1)).squeeze(-1)
            u = counter_uniform(self.seed[:B], SALT_ACCEPT, ctx.view(B, 1) + at)
            taken = (u * q_x < p_x) & (q_x > 0) & (at < ks.view(B, 1))
            ok = torch.where(greedy.view(B, 1), ok, taken)
        n = ok.long().cumprod(dim=1).sum(dim=1) if K else torch.zeros(B, dtype=torch.long, device=self.dev)
        extra = top.gather(1, n.view(B, 1)).view(B)
        if sampled:
            dist = p.gather(1, n.view(B, 1, 1).expand(B, 1, p.shape[-1])).squeeze(1)  # p at the stop
            if K:  # a rejection (n < ks): the residual norm(max(p - q, 0)), p where it is all zero
                q_n = q.gather(1, n.clamp(max=K - 1).view(B, 1, 1).expand(B, 1, q.shape[-1])).squeeze(1)
                dist = torch.where((n < ks).view(B, 1), residual(dist, q_n), dist)
            drawn = sample_inverse_cdf(dist, counter_uniform(self.seed[:B], SALT_TOKEN, ctx + n))
            extra = torch.where(greedy, extra, drawn)
        if self.head is not None:
            self._head_commit(B, K, feats, drafts, n, extra, live)
        elif self.medusa is not None:
            self._medusa_commit(B, feats, n, live)
        # roll back by length: the accepted drafts' entries are in place, the rest past the end
        before = drafts.gather(1, (n - 1).clamp(min=0).view(B, 1)).view(B) if K else last[:, 1]
        self.last[:B] = torch.stack([torch.where(n > 0, before, last[:, 1]), extra], dim=1)
        self.ctx[:B] = torch.where(live, ctx + n + 1, ctx)
        drafted = ks if K else torch.zeros_like(n)
        return step_table(drafted, n, (drafted == 0) | (n == drafted), drafted, drafts, drafts * 0 if K else None, extra)

    def _run(self, Bb: int, K: int, flags: tuple[bool, bool, bool]) -> tuple[torch.Tensor, float]:
        if K and (self.tree is not None or self.dtree is not None):
            return self._run_tree(Bb, flags)
        return self._run_chain(Bb, K, flags)

    def _run_tree(self, Bb: int, flags: tuple[bool, bool, bool]) -> tuple[torch.Tensor, float]:
        """The tree step's graphs for bucket Bb (as `_run_chain`)."""
        key = (Bb, "tree", *flags, (self.target.allocations, self.drafter.allocations, self._state_gen))
        draft = self._draft_tree if self.dtree is None else self._draft_dynamic_tree
        # nodes and whether each exists (and a dynamic tree's tables)
        tree = self.graphs.run(("draft",) + key, lambda: draft(Bb, *flags), state=self._graph_state()[2:])
        t1 = time.perf_counter()
        if self.dev.type == "cuda":
            self._events[1].record()
        out = self.graphs.run(("verify",) + key, lambda *t: self._verify_tree(Bb, *flags, *t), *tree,
                              state=self._graph_state())
        return out, t1

    def _run_chain(self, Bb: int, K: int, flags: tuple[bool, bool, bool]) -> tuple[torch.Tensor, float]:
        """The step's graphs for bucket Bb and width K: (the table of what every row emitted,
        on the device; the host time between the draft and the verify graph)."""
        sampled, top_k, top_p = flags
        key = (Bb, K, *flags, (self.target.allocations, self.drafter.allocations if self.k else 0, self._state_gen))
        drafts = q = None
        eff = self.ks[:Bb]
        if K:
            drafts, q, eff = self.graphs.run(("draft",) + key, lambda: self._draft_chain(Bb, K, sampled, top_k, top_p),
                                             state=self._graph_state()[2:])
        t1 = time.perf_counter()
        if self.dev.type == "cuda":
            self._events[1].record()
        out = self.graphs.run(("verify",) + key,
                              lambda d, q_, e: self._verify(Bb, K, sampled, top_k, top_p, d, q_, e),
                              drafts, q, eff, state=self._graph_state())
        return out, t1

    def _graph_state(self) -> list[torch.Tensor]:
        """The buffers the step's graphs update in place that decide what they compute: the
        sequence lengths and last tokens, then the head's lengths and pending counts."""
        return [self.ctx, self.last] + ([self.hlen, self.pn] if self.head is not None else []) + \
            ([self.mstate] if self.medusa is not None else [])

    def _catch_up_draft(self) -> None:
        """Rows whose draft lags more than the step's two-token catch-up (steps that did not
        draft) feed the tokens it missed, eagerly: only after a step that did not draft."""
        for b, r in enumerate(self.rows):
            lag = len(r.ids) - 2 - self.draft_valid[b]
            if lag > 0:
                toks = torch.tensor([r.ids[self.draft_valid[b]:len(r.ids) - 2]], dtype=torch.long, device=self.dev)
                start = torch.tensor([self.draft_valid[b]], dtype=torch.long, device=self.dev)
                self.draft.forward(toks, start, row0=b, last_only=True)
                self.draft_valid[b] = len(r.ids) - 2

    @torch.inference_mode()
    def step(self) -> list:
        """One step for every row; returns the requests that finished."""
        finished = [self._generation(r, "cancelled") for r in self.rows if r.cancelled]
        if finished:
            self._compact()
        rows, spec = self.rows, self.spec
        if not rows:
            return finished
        B = len(rows)
        Bb = bucket(B)
        if Bb > self._state_rows or Bb > self.target.rows:
            self.reserve(Bb, self.target.capacity - self.scratch)
        off = spec.disable_by_batch_size is not None and B > spec.disable_by_batch_size
        ks = [0 if off else max(0, min(r.k, r.budget - len(r.out) - 1)) for r in rows]
        K = self.k if any(ks) else 0
        if K and self.draft is not None and self.drafter is self.draft:
            self._catch_up_draft()
        elif not K and self.head is not None:
            self._head_flush(B)
        if K:
            host = torch.tensor(ks + [0] * (Bb - B))
            if self.dev.type == "cuda":  # from pinned memory: an asynchronous copy, no sync
                host = self._ks_host[:Bb].copy_(host)
            self.ks[:Bb].copy_(host, non_blocking=True)
        cuda = self.dev.type == "cuda"
        t0 = time.perf_counter()
        if cuda:
            self._events[0].record()
        out, t1 = self._run(Bb, K, self.flags or sampling_flags([r.sampling for r in rows]))
        table = out.tolist()  # the step's one device-to-host transfer (and its one sync)
        t2 = time.perf_counter()
        if cuda:  # the draft's time on the device's own clock (both events done: the sync above)
            t1 = t0 + self._events[0].elapsed_time(self._events[1]) / 1000 if K else t0
        context = [len(r.ids) for r in rows]
        accepted = []
        for b, r in enumerate(rows):
            drafted, n, leaf, depth = table[b][:4]
            accepted.append(n)
            emitted = r.emit([*table[b][4:4 + n], table[b][-1]], t2)
            r.steps.append(StepEvent(drafted=drafted, accepted=n, first_rejection=-1 if leaf else n,
                                     emitted=emitted, draft_time_s=t1 - t0, verify_time_s=t2 - t1,
                                     batch_size=B, context_tokens=context[b], draft_depth=depth,
                                     accepted_ranks=tuple(table[b][4 + K:4 + K + n])))
            if K:
                self.draft_valid[b] = context[b] + n - 1
            if self.head is not None:
                self.head_pending[b] = n + 1 if K else self.head_pending[b] + 1
            if spec.dynamic_k and drafted:
                r.k = min(r.k + 2, self.k) if leaf else max(1, r.k - 1)
        self.stats.padded_rows += Bb - B
        self.stats.graphs_built = self.graphs.builds - self._built_at_reset[0]
        self.stats.graph_build_s = self.graphs.build_s - self._built_at_reset[1]
        done = [r for r in rows if r.done]
        if done:
            finished += [self._generation(r) for r in done]
            self._compact()
        self._account(B, sum(context) + sum(accepted), t0, t1, t2)
        return finished

    # ---- bookkeeping ----------------------------------------------------------------------------

    def _account(self, batch_size: int, target_tokens: int, t0: float, t1: float, t2: float) -> None:
        draft = self.drafter if self.k else None
        self.stats.record_step(batch_size, t0, t1, t2,
                               target_kv=(self.target.allocated_bytes, target_tokens * self.target.bytes_per_token),
                               draft_kv=(draft.allocated_bytes, target_tokens * draft.bytes_per_token) if draft else None)

    @torch.inference_mode()
    def _compact(self) -> None:
        """Drop finished rows; survivors from the end move into the freed slots."""
        keep = self._survivors()
        n = len(keep)
        moves = [(src, dst) for dst, src in enumerate(keep) if src != dst]
        if moves:
            src, dst = (torch.tensor(x, dtype=torch.long, device=self.dev) for x in zip(*moves))
            for model in (self.target, self.drafter) if self.k else (self.target,):
                model.move_rows(src, dst)
            for name in ("ctx", "last", "seed", "greedy", "temperature", "top_k", "top_p") + \
                    (("hlen", "pn", "pend", "ptok") if self.head is not None else ()) + \
                    (("mstate",) if self.medusa is not None else ()):
                t = getattr(self, name)
                t.index_copy_(0, dst, t.index_select(0, src))
        self.live[n:] = False
        self.ctx[n:] = 2
        self.rows = [self.rows[i] for i in keep]
        self.draft_valid = [self.draft_valid[i] for i in keep]
        if self.head is not None:
            self.head_pending = [self.head_pending[i] for i in keep]
