"""The decode loop: one batch-first speculative step that every caller goes through.

`Engine` holds the models (target, optional draft model, optional EAGLE-3 head) and their
`ModelRunner`s. `Engine.batch()`
opens a `Batch`, the continuous batch of running requests: `admit()` prefills one request
into the next row, `step()` runs one speculative step for every row:

    draft     the drafter proposes a tree per row, at most k deep (a chain: one child per
              node), in batched passes
    verify    ONE target pass scores [last token, tree nodes...] of every row with a tree
              attention mask; rejection sampling accepts a path per row and adds one
              recovered or bonus token
    roll back each row keeps its own accepted path (its KV entries gathered into the slot's
              next positions; a chain's are there already, the slot just moves its length)
    emit      tokens are appended up to a stop id or the budget; finished rows leave

A single request is a batch of one (`Engine.generate`); `scheduler.run(engine, ...)` drives
many requests closed-loop or open-loop. The baseline (method `none`, or k = 0) is the same
step with empty drafts, so both are timed by the same code. Timestamps are taken after
synchronizing the model's device; the tokens of one step share one timestamp.

Every row has its own seeded generator, so a request's samples depend on its seed, not on
its batch mates (unless `disable_by_batch_size` or `dynamic_k` make its k depend on them).

Boundary: token ids in, token ids and timestamps out; nothing here knows text or records.
Longer than 400 lines because `Batch.step` is the one decode path, read top to bottom (draft,
verify, accept, roll back, emit), with the per-row bookkeeping it updates beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine.constraint import TokenConstraint, consume, mask_logits, mask_verify_logits, trim_chains
from specbench.engine.drafters.base import Drafter
from specbench.engine.drafters.factory import make_drafter
from specbench.engine.drafters.suffix import SuffixCache
from specbench.engine.fused import can_fuse, fuse_layers
from specbench.engine.kv import TreeAttention
from specbench.engine.model import ModelRunner, can_pack, pack_linears
from specbench.engine.rows import Admission, BatchStats, Generation, Row, RunningRows, padded
from specbench.engine.sampling import make_generator, probs_from_logits, sample
from specbench.engine.tree import Proposal, gather_paths, path_features, tree_batch
from specbench.engine.static import StaticBatch, static_reason
from specbench.engine.static_head import StaticHead
from specbench.engine.static_lm import StaticLM
from specbench.engine.static_medusa import StaticMedusa
from specbench.engine.verify import verify_tree
from specbench.types import StepEvent

__all__ = ["Batch", "BatchStats", "Engine", "Generation", "Row"]


class Engine:
    """The loaded target (and optional draft model or EAGLE-3 head), ready to decode batches.

    `pack` (CPU): reorder every linear layer's weights into oneDNN's blocked layout once, in
    place (specbench.engine.model.pack_linears), and fuse the decoder layers of the
    architectures specbench.engine.fused knows; None = wherever it applies. One batch runs
    at a time per engine: the runners' KV slots are shared.

    `static` (None: the eager step): run every batch on the static step
    (specbench.engine.static) in that mode: "static" (fixed shapes, run op by op),
    "compile" (torch.compile, fullgraph, no dynamic shapes) or "cudagraph" (captured CUDA
    graphs; `compile_backend` is torch.compile's backend, "inductor" unless a test checks
    the graphs alone, `compile_options` Inductor's options). It runs the models' own linear layers, so it excludes `pack`; a model or a
    configuration it does not run is a ValueError saying why (`static_reason`)."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None = None, *,
                 eos_token_ids: Sequence[int] = (), max_context: int | None = None,
                 pack: bool | None = None, head: torch.nn.Module | None = None, static: str | None = None,
                 compile_backend: str = "inductor", compile_options: dict[str, Any] | None = None):
        self.target = target
        self.draft = draft
        self.head = head  # an EAGLE-3 head fitted to `target` (specbench.models.eagle3), method eagle3
        self.device = next(target.parameters()).device
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context = max_context or getattr(target.config.get_text_config(), "max_position_embeddings", None)
        self._sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        self.static, self.compile_backend, self.compile_options = static, compile_backend, compile_options
        self._static_lms: dict[str, StaticLM] = {}
        self._static_head: StaticHead | None = None
        self._static_batches: dict[SpeculativeConfig, StaticBatch] = {}
        if static is not None:
            if pack:
                raise ValueError("the static step runs the models' own linear layers: prepacking is for the eager step")
            pack = False
            why = static_reason(target, draft, ())
            if why:
                raise ValueError(f"the static step does not run {why}")
        applicable, self.pack_reason = can_pack(target)
        if pack and not applicable:
            raise ValueError(f"the fast path does not apply here: {self.pack_reason}")
        self.packed = bool(applicable if pack is None else pack)
        t = time.perf_counter()
        # On the fast path, decoder layers are fused (specbench.engine.fused) where the
        # architecture allows; a model (target / draft) whose layers are not: why not.
        self.unfused: dict[str, str] = {}
        if self.packed:
            for role, model in (("target", target), ("draft", draft)):
                if model is not None:
                    fusable, why = can_fuse(model)
                    if fusable:
                        fuse_layers(model)
                    else:
                        self.unfused[role] = why
            for model in (target, draft, head):
                if model is not None:
                    pack_linears(model)
        self.setup_s = time.perf_counter() - t  # one-time conversion for the fast path
        self.target_runner = ModelRunner(target)
        self._draft_runner: ModelRunner | None = None
        self._suffix_caches: dict[SpeculativeConfig, SuffixCache] = {}

    @property
    def forward_path(self) -> str:
        """The target's forward path, as run.json names it."""
        if self.static is not None:
            return {"static": "static step, op by op", "compile": "static step, torch.compile",
                    "cudagraph": "static step, CUDA graphs"}[self.static]
        if not self.packed:
            return "transformers eager"
        return "prepacked oneDNN linears" if "target" in self.unfused else "fused oneDNN layers"

    @property
    def draft_runner(self) -> ModelRunner:
        if self.draft is None:
            raise ValueError("method draft_model needs an engine built with a draft model")
        if self._draft_runner is None:
            self._draft_runner = ModelRunner(self.draft)
        return self._draft_runner

    def suffix_cache(self, spec: SpeculativeConfig) -> SuffixCache:
        """The suffix cache of `spec` (method suffix): one per configuration, alive as long
        as this engine, so what one run served is there for the next."""
        if spec not in self._suffix_caches:
            self._suffix_caches[spec] = SuffixCache(spec.suffix_decoding_max_tree_depth,
                                                    spec.suffix_decoding_max_cached_requests)
        return self._suffix_caches[spec]

    def now(self) -> float:
        self._sync()
        return time.perf_counter()

    def limits(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> tuple[frozenset[int], int]:
        """(ids that end the request, tokens it may emit within max_new_tokens and the context)."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        stops = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stops |= self.eos_token_ids
        budget = sampling.max_new_tokens
        if self.max_context:
            budget = min(budget, self.max_context - len(prompt_ids))
        if budget < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in a "
                             f"context of {self.max_context}")
        return frozenset(stops), budget

    def batch(self, spec: SpeculativeConfig, *, drafter: Drafter | None = None) -> "Batch":
        """A new, empty continuous batch for `spec` (`drafter` replaces the one `spec.method`
        would build: custom or test drafters)."""
        if self.static is not None:
            if drafter is not None:
                raise ValueError("the static step drafts with its own draft-model chain: no custom drafter")
            return self._static_batch(spec)
        if drafter is None and spec.speculative:
            drafter = make_drafter(spec, target_runner=self.target_runner, draft_runner=lambda: self.draft_runner,
                                   head=self.head, suffix_cache=self.suffix_cache)
        return Batch(self, spec, drafter)

    def static_reason(self, spec: SpeculativeConfig) -> str:
        """Why `spec` cannot run on the static step with these models ('' when it can)."""
        return static_reason(self.target, self.draft, [spec], head=self.head)

    def _static_batch(self, spec: SpeculativeConfig) -> StaticBatch:
        """The static step of `spec`, kept for the engine's life so its graphs are built once
        (a new batch is the same step emptied)."""
        why = self.static_reason(spec)
        if why:
            raise ValueError(f"the static step does not run {spec.method}: {why}")
        if spec not in self._static_batches:
            eagle3 = spec.speculative and spec.method == "eagle3"
            medusa = spec.speculative and spec.method == "medusa"
            drafting = self.draft if spec.speculative and not (eagle3 or medusa) else None
            for role, model in (("target", self.target), ("draft", drafting)):
                if model is not None and role not in self._static_lms:
                    self._static_lms[role] = StaticLM(model)
            if eagle3 and self._static_head is None:
                self._static_head = StaticHead(self.head)
            self._static_batches[spec] = StaticBatch(self, spec, self._static_lms["target"],
                                                     self._static_lms.get("draft") if drafting is not None else None,
                                                     self.static, self.compile_backend, self.compile_options,
                                                     head=self._static_head if eagle3 else None,
                                                     medusa=StaticMedusa(self.head) if medusa else None)
        batch = self._static_batches[spec]
        batch.reset()
        return batch

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, spec: SpeculativeConfig, *,
                 seed: int | None = None, on_tokens: Callable[[list[int], float], None] | None = None,
                 drafter: Drafter | None = None, constraint: TokenConstraint | None = None) -> Generation:
        """Decode one request (a batch of one). `on_tokens(ids, t)` is called at each emission."""
        if sampling.seed is None:
            sampling = sampling.with_(seed=seed or 0)
        batch = self.batch(spec, drafter=drafter)
        g = batch.admit(prompt_ids, sampling, on_tokens=on_tokens, constraint=constraint)
        while g is None:
            finished = batch.step()
            g = finished[0] if finished else None
        return g


class Batch(RunningRows):
    """The running requests of one configuration; rows are the KV slots 0..len(rows)-1."""

    def __init__(self, engine: Engine, spec: SpeculativeConfig, drafter: Drafter | None):
        self.engine, self.spec, self.drafter = engine, spec, drafter
        self.target = engine.target_runner
        self.target.set_capture(drafter.capture_layers if drafter is not None else ())
        self.k = spec.num_speculative_tokens if drafter is not None else 0
        # slot positions a step may write past a row's context: its verify feed (a tree's
        # nodes lie at consecutive positions, then move onto the accepted path's)
        self.scratch = max(self.k, spec.draft_nodes if drafter is not None else 0) + 1
        self.rows: list[Row] = []
        self.stats = BatchStats(target_weight_bytes=self.target.weight_bytes,
                                draft_weight_bytes=drafter.weight_bytes if drafter is not None else 0)

    def reserve(self, rows: int, capacity: int, samplings: Sequence[SamplingParams] | None = None) -> None:
        """Allocate KV slots up front (`run` knows every request) so no step grows them
        (`samplings`: every request's; the static step builds its graphs from them)."""
        self.target.reserve(rows, capacity + self.scratch)
        if self.drafter is not None:
            self.drafter.reserve(rows, capacity + self.scratch)

    # ---- admission --------------------------------------------------------------------

    @torch.inference_mode()
    def admit_many(self, admissions: Sequence[Admission]) -> list[Generation]:
        """Prefill the requests of one turn into the next rows in ONE target pass (prompts
        right-padded to the longest; the draft's prefill is one pass too) and emit each its
        first token. Returns the Generations of those whose first token already ends them;
        the others run in the next steps. A request's `constraint` (specbench.engine.
        constraint) masks its tokens."""
        if not admissions:
            return []
        e = self.engine
        prompts = [list(a.prompt_ids) for a in admissions]
        limits = [e.limits(p, a.sampling) for p, a in zip(prompts, admissions)]  # refuses before any write
        b0, n = len(self.rows), len(admissions)
        start = e.now()
        rows = []
        for a, p, (stops, budget) in zip(admissions, prompts, limits):
            if a.constraint is not None:
                stops |= a.constraint.stop_ids  # a complete grammar allows nothing else
            rows.append(Row(p, a.sampling, make_generator(a.sampling.seed or 0, e.device), stops, budget, self.k,
                            start if a.arrival is None else a.arrival, start, tag=a.tag, on_tokens=a.on_tokens,
                            constraint=a.constraint))
        self.target.reserve(b0 + n, max(len(p) + budget for p, (_, budget) in zip(prompts, limits)) + self.scratch)
        # Prefill: each first token comes from its prompt's last position alone.
        lengths = [len(p) for p in prompts]
        logits, feats = self.target.forward(padded(prompts), slice(b0, b0 + n), torch.zeros(n, dtype=torch.long),
                                            positions=torch.tensor(lengths) - 1, prefill=True)
        firsts = []
        for i, r in enumerate(rows):
            last = mask_logits(logits[i], r.constraint.allowed(logits.shape[-1]).to(logits.device)
                               if r.constraint is not None else None)
            firsts.append(int(last.argmax()) if r.sampling.greedy else sample(probs_from_logits(last, r.sampling), r.gen))
            if r.constraint is not None:
                consume(r.constraint, [firsts[-1]])
        # Rows that end at their first token leave now: the others close ranks from b0 on.
        staying = self._staying(rows, firsts)
        for dst, i in enumerate(staying, start=b0):
            self.target.cache.move_row(b0 + i, dst, lengths[i])
        if self.drafter is not None and staying:  # the draft's prefill counts as prefill (TTFT)
            try:
                self.drafter.add_rows(b0, [prompts[i] for i in staying],
                                      feats[staying] if feats is not None else None)
            except BaseException:  # none of them joins: the drafter drops the rows it took
                self.drafter.retain(list(range(b0)))
                raise
        finished = self._emit_firsts(rows, firsts, start, e.now())
        self.rows += [rows[i] for i in staying]
        return finished

    # ---- the speculative step -------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Generation]:
        """One step for every row; returns the requests that finished."""
        finished = [self._generation(r, "cancelled") for r in self.rows if r.cancelled]
        if finished:
            self._compact()
        rows, spec, e = self.rows, self.spec, self.engine
        if not rows:
            return finished
        B = len(rows)
        t0 = e.now()
        # k per row: none while more than disable_by_batch_size rows run, never past the budget
        # (the verify pass emits up to k + 1 tokens).
        off = spec.disable_by_batch_size is not None and B > spec.disable_by_batch_size
        ks = [0 if off else max(0, min(r.k, r.budget - len(r.out) - 1)) for r in rows]
        prop = self.drafter.propose(rows, ks) if self.drafter is not None and any(ks) else \
            Proposal([[] for _ in rows])
        if any(r.constraint is not None for r in rows):
            # vLLM's validate_tokens: what the grammar refuses is not drafted (point-mass drafts only)
            trim_chains(rows, prop.tokens, prop.parents, sampled_q=prop.q is not None)
        t1 = e.now()
        tree = tree_batch([r.ids[-1] for r in rows], prop, ks)
        context = [len(r.ids) for r in rows]
        # One target pass verifies every row's tree: [last emitted token, nodes..., padding],
        # each node at its depth and seeing only its ancestors (a chain: plain causal).
        start = torch.tensor([c - 1 for c in context])
        attn = TreeAttention(start, start.view(B, 1) + tree.depth, tree.visible)
        logits, feats = self.target.forward(tree.feed, slice(0, B), start, tree=attn)
        logits = mask_verify_logits(logits, rows, prop.tokens, tree.parents)  # constrained rows, along every path
        paths, extra = verify_tree(tree, logits, prop.q, [r.sampling for r in rows], [r.gen for r in rows])
        t2 = e.now()
        accepted = [len(p) for p in paths]
        valid = self._roll_back_target(start + 1, paths, context)
        # The drafter rolls back too: it learns which path won and how much of each row survives.
        if self.drafter is not None:
            if feats is not None:  # the target's features along the accepted path, in sequence order
                feats = path_features(feats, paths)
            self.drafter.accept_paths(paths)
            self.drafter.commit(accepted, valid, feats)
        for b, r in enumerate(rows):
            d, path = prop.tokens[b], paths[b]
            n = len(path)
            leaf = not d or (n > 0 and not tree.has_children[b][path[-1]])  # the whole path was accepted
            emitted = r.emit([*(d[i] for i in path), extra[b]], t2)
            if r.constraint is not None:
                consume(r.constraint, r.out[-emitted:])
            r.steps.append(StepEvent(drafted=len(d), accepted=n, first_rejection=-1 if leaf else n,
                                     emitted=emitted, draft_time_s=t1 - t0, verify_time_s=t2 - t1,
                                     batch_size=B, context_tokens=context[b],
                                     draft_depth=int(tree.depth[b].max()),
                                     accepted_ranks=tuple(tree.ranks[b][i] for i in path)))
            if spec.dynamic_k and d:
                r.k = min(r.k + 2, self.k) if leaf else max(1, r.k - 1)
        done = [r for r in rows if r.done]
        if done:
            finished += [self._generation(r) for r in done]
            self._compact()
        self._account(B, sum(context) + sum(accepted), t0, t1, t2)
        return finished

    def _roll_back_target(self, first: torch.Tensor, paths: list[list[int]], context: list[int]) -> list[int]:
        """The target keeps each row's accepted path and nothing else: the path's KV entries
        move into the slot's next positions from `first` (a chain's are there already), and
        the row's valid length becomes its context plus the path; the slot past it holds the
        rejected nodes, overwritten by the next step. Returns the valid lengths."""
        gather_paths(self.target.cache, first, paths)
        return [c + len(p) for c, p in zip(context, paths)]

    # ---- bookkeeping ----------------------------------------------------------------------

    def _account(self, batch_size: int, target_tokens: int, t0: float, t1: float, t2: float) -> None:
        cache = self.target.cache
        self.stats.record_step(batch_size, t0, t1, t2,
                               target_kv=(cache.allocated_bytes, target_tokens * cache.bytes_per_token),
                               draft_kv=self.drafter.kv_bytes() if self.drafter is not None else None)

    def _compact(self) -> None:
        """Drop finished rows; survivors from the end fill their slots (one copy per move)."""
        keep = self._survivors()
        for dst, src in enumerate(keep):
            self.target.cache.move_row(src, dst, len(self.rows[src].ids) - 1)
        if self.drafter is not None:
            self.drafter.retain(keep)
        self.rows = [self.rows[i] for i in keep]
