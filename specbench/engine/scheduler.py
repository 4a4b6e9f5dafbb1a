"""Continuous batching: many requests in flight, one batched target pass per step.

`BatchEngine.run` admits requests closed-loop (at most `concurrency` in flight; the next one
joins when a row finishes, as `vllm bench serve --max-concurrency`) or open-loop (seeded
Poisson arrivals at `request_rate`). A joining request is prefilled on its own and then
added to the running batch. Each step drafts for every row in batched draft passes (one per
draft position), verifies all rows' drafts in one target pass, and rolls each row back by
its own acceptance (`BatchKV`), never clamping the batch to its shortest row.

Every row keeps its own RNG, so a request's samples depend on its seed, not on its batch
mates (unless `disable_by_batch_size` or `dynamic_k` make its k depend on them).
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine.engine import Engine, Generation
from specbench.engine.kv import BatchKV, CachedModel
from specbench.engine.drafters.draft_model import draft_token
from specbench.engine.drafters.ngram import lookup
from specbench.engine.sampling import make_generator, probs_from_logits, sample
from specbench.engine.verify import verify_greedy, verify_sampled
from specbench.types import StepEvent


@dataclass
class BatchGeneration(Generation):
    arrival_time: float = 0.0  # perf_counter when the request entered the queue


@dataclass
class BatchStats:
    wall_s: float = 0.0
    steps: int = 0
    batch_sizes: Counter = field(default_factory=Counter)  # rows in flight -> steps


@dataclass
class _Row:
    index: int
    ids: list[int]
    sampling: SamplingParams
    gen: torch.Generator
    stops: set[int]
    budget: int
    k: int
    arrival: float
    start: float
    prefill_s: float
    out: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    done: bool = False
    finish: str = "length"
    draft_len: int = 0  # tokens of `ids` the draft model has seen

    def emit(self, tokens: list[int], t: float) -> int:
        kept = 0
        for tok in tokens:
            self.out.append(tok)
            self.ids.append(tok)
            self.times.append(t)
            kept += 1
            if tok in self.stops:
                self.done, self.finish = True, "stop"
                break
            if len(self.out) >= self.budget:
                self.done, self.finish = True, "length"
                break
        return kept


class BatchEngine(Engine):
    """The engine with a scheduler: `run` decodes many requests with continuous batching."""

    @torch.inference_mode()
    def run(self, requests: Sequence[tuple[Sequence[int], SamplingParams]], spec: SpeculativeConfig, *,
            concurrency: int = 1, request_rate: float | None = None, rate_seed: int = 0,
            on_finish: Callable[[int, BatchGeneration], None] | None = None,
            ) -> tuple[list[BatchGeneration], BatchStats]:
        """Decode every (prompt_ids, sampling) pair; returns results in input order."""
        if spec.speculative and spec.method == "draft_model" and self.draft is None:
            raise ValueError("method draft_model needs an engine built with a draft model")
        use_draft = spec.speculative and spec.method == "draft_model"
        tkv = BatchKV(self.target, self.device)
        dkv = BatchKV(self.draft, self.device) if use_draft else None
        start = self._now()
        if request_rate:
            rng = random.Random(rate_seed)
            t, arrivals = start, []
            for _ in requests:
                arrivals.append(t)
                t += rng.expovariate(request_rate)
        else:
            arrivals = [None] * len(requests)  # closed loop: a request arrives when admitted
        queue = deque(range(len(requests)))
        rows: list[_Row] = []
        results: list[BatchGeneration | None] = [None] * len(requests)
        stats = BatchStats()

        def finish(row: _Row) -> None:
            g = BatchGeneration(row.out, row.times, row.start, row.prefill_s, row.finish, row.steps,
                                target_forward_passes=1 + len(row.steps), arrival_time=row.arrival)
            results[row.index] = g
            if on_finish is not None:
                on_finish(row.index, g)

        while queue or rows:
            now = time.perf_counter()
            while queue and len(rows) < concurrency and (arrivals[queue[0]] is None or arrivals[queue[0]] <= now):
                i = queue.popleft()
                row = self._admit(i, requests[i], spec, arrivals[i], tkv, dkv)
                if row.done:
                    finish(row)
                else:
                    rows.append(row)
                now = time.perf_counter()
            if not rows:
                if queue:  # open loop: idle until the next arrival
                    time.sleep(max(0.0, arrivals[queue[0]] - time.perf_counter()))
                continue
            stats.batch_sizes[len(rows)] += 1
            stats.steps += 1
            self._step(rows, spec, tkv, dkv)
            if any(r.done for r in rows):
                keep = [b for b, r in enumerate(rows) if not r.done]
                for r in rows:
                    if r.done:
                        finish(r)
                rows = [rows[b] for b in keep]
                tkv.remove_rows(keep)
                if dkv is not None:
                    dkv.remove_rows(keep)
        stats.wall_s = self._now() - start
        return results, stats  # type: ignore[return-value]

    def _admit(self, index: int, request: tuple[Sequence[int], SamplingParams], spec: SpeculativeConfig,
               arrival: float | None, tkv: BatchKV, dkv: BatchKV | None) -> _Row:
        """Prefill one request on its own, emit its first token, join it to the batch."""
        prompt, sp = list(request[0]), request[1]
        stops, budget = self._limits(prompt, sp)
        start = self._now()
        arrival = start if arrival is None else arrival
        row = _Row(index, prompt, sp, make_generator(sp.seed or 0, self.device), stops, budget,
                   spec.num_speculative_tokens if spec.speculative else 0, arrival, start, 0.0)
        single = CachedModel(self.target, self.device)
        logits = single.forward(prompt, last_only=True)[-1]
        first = int(logits.argmax()) if sp.greedy else sample(probs_from_logits(logits, sp), row.gen)
        if dkv is not None:
            dsingle = CachedModel(self.draft, self.device)
            dsingle.forward(prompt, last_only=True)
            row.draft_len = len(prompt)
        row.prefill_s = time.perf_counter() - start
        row.emit([first], self._now())
        if not row.done:
            tkv.add_row(single)
            if dkv is not None:
                dkv.add_row(dsingle)
        return row

    def _step(self, rows: list[_Row], spec: SpeculativeConfig, tkv: BatchKV, dkv: BatchKV | None) -> None:
        """One batched step: draft for every row, verify all in one target pass, roll back."""
        off = spec.disable_by_batch_size is not None and len(rows) > spec.disable_by_batch_size
        ks = [0 if off else min(r.k, r.budget - len(r.out) - 1) for r in rows]
        t0 = self._now()
        drafts, qs = self._propose(rows, ks, spec, dkv)
        t1 = self._now()
        n_valid = [len(r.ids) for r in rows]
        logits = tkv.forward([[r.ids[-1], *d] for r, d in zip(rows, drafts)])  # [B, M, V]
        verdicts = []
        for b, (r, d) in enumerate(zip(rows, drafts)):
            row_logits = logits[b, : len(d) + 1]
            if r.sampling.greedy:
                verdicts.append(verify_greedy(d, row_logits))
            else:
                verdicts.append(verify_sampled(d, qs[b], probs_from_logits(row_logits, r.sampling), r.gen))
        t2 = self._now()
        for b, (r, d, (n_acc, extra)) in enumerate(zip(rows, drafts, verdicts)):
            tkv.truncate(b, n_valid[b] + n_acc)
            if dkv is not None:
                dkv.truncate(b, min(dkv.lengths[b], n_valid[b] + n_acc))
                r.draft_len = dkv.lengths[b]
            emitted = r.emit([*d[:n_acc], extra], t2)
            r.steps.append(StepEvent(drafted=len(d), accepted=n_acc,
                                     first_rejection=-1 if n_acc == len(d) else n_acc,
                                     emitted=emitted, draft_time_s=t1 - t0, verify_time_s=t2 - t1))
            if spec.dynamic_k and d:
                full = spec.num_speculative_tokens
                r.k = min(r.k + 2, full) if n_acc == len(d) else max(1, r.k - 1)
        tkv.settle()
        if dkv is not None:
            dkv.settle()

    def _propose(self, rows: list[_Row], ks: list[int], spec: SpeculativeConfig,
                 dkv: BatchKV | None) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        drafts: list[list[int]] = [[] for _ in rows]
        qs: list[list[torch.Tensor]] = [[] for _ in rows]
        if not any(ks):
            return drafts, [None] * len(rows)
        if spec.method == "ngram":
            for b, (r, k) in enumerate(zip(rows, ks)):
                drafts[b] = lookup(r.ids, k, spec.ngram_min, spec.ngram_max) if k > 0 else []
            return drafts, [None] * len(rows)
        assert dkv is not None
        # Catch each drafting row up on the tokens its draft cache has not seen (1-2 usually).
        feed = [r.ids[r.draft_len:] if k > 0 else [] for r, k in zip(rows, ks)]
        logits = dkv.forward(feed)
        last = [max(len(f) - 1, 0) for f in feed]
        active = [k > 0 for k in ks]
        for i in range(max(ks)):
            nxt: list[list[int]] = [[] for _ in rows]
            for b, r in enumerate(rows):
                if not active[b]:
                    continue
                tok, conf, q = draft_token(logits[b, last[b]], r.sampling, r.gen,
                                           spec.draft_confidence_threshold > 0)
                if q is not None:
                    qs[b].append(q)
                drafts[b].append(tok)
                if len(drafts[b]) >= ks[b] or conf < spec.draft_confidence_threshold:
                    active[b] = False
                else:
                    nxt[b] = [tok]
            if not any(active):
                break
            logits = dkv.forward(nxt)
            last = [0] * len(rows)
        for b, r in enumerate(rows):
            r.draft_len = dkv.lengths[b]
        return drafts, [torch.stack(q) if q else None for q in qs]
