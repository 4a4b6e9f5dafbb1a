"""The decode loop: prefill, then draft → verify → accept/resample → roll back, per step.

`Engine.generate` runs one request (token ids in) to completion and returns its output ids
with a timestamp per emitted token and one `StepEvent` per target forward pass. The baseline
(method `none`, or k = 0) is the same loop with empty drafts, so both are timed by the same
code. Timestamps are taken after synchronizing the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine.drafters import Drafter, DraftModelDrafter, NgramDrafter, Proposal
from specbench.engine.kv import CachedModel
from specbench.engine.sampling import make_generator, probs_from_logits, sample
from specbench.engine.verify import verify_greedy, verify_sampled
from specbench.types import StepEvent


@dataclass
class Generation:
    output_ids: list[int]
    token_times: list[float]  # perf_counter at emission; one accepted burst shares one time
    start_time: float  # perf_counter when the prefill began
    prefill_time_s: float
    finish_reason: str  # stop | length
    steps: list[StepEvent] = field(default_factory=list)
    target_forward_passes: int = 0


class Engine:
    """Holds the loaded target (and optional draft) model; generates one request at a time."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None = None, *,
                 eos_token_ids: Sequence[int] = (), max_context: int | None = None):
        self.target = target
        self.draft = draft
        self.device = next(target.parameters()).device
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context = max_context or getattr(target.config, "max_position_embeddings", None)
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def _drafter(self, spec: SpeculativeConfig):
        if not spec.speculative:
            return None
        if spec.method == "ngram":
            return NgramDrafter(spec.ngram_min, spec.ngram_max)
        if self.draft is None:
            raise ValueError("method draft_model needs an engine built with a draft model")
        return DraftModelDrafter(self.draft, self.device, spec.draft_confidence_threshold)

    def _now(self) -> float:
        self._sync()
        return time.perf_counter()

    def _limits(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> tuple[set[int], int]:
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
        return stops, budget

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams,
                 spec: SpeculativeConfig, *, seed: int | None = None,
                 on_tokens: Callable[[list[int], float], None] | None = None,
                 drafter: Drafter | None = None) -> Generation:
        """Decode one request. `on_tokens(ids, t)` is called at each emission (streaming);
        `drafter` replaces the one `spec.method` would build (custom or test drafters)."""
        stops, budget = self._limits(prompt_ids, sampling)
        seed = sampling.seed if sampling.seed is not None else (seed or 0)
        gen = make_generator(seed, self.device)
        drafter = drafter if drafter is not None else self._drafter(spec)
        k = spec.num_speculative_tokens if drafter else 0

        target = CachedModel(self.target, self.device)
        ids = list(prompt_ids)
        out: list[int] = []
        times: list[float] = []
        steps: list[StepEvent] = []

        def emit(tokens: list[int]) -> bool:
            """Append tokens, stopping at a stop id or the budget; True when finished."""
            finished = False
            kept: list[int] = []
            for tok in tokens:
                kept.append(tok)
                if tok in stops or len(out) + len(kept) >= budget:
                    finished = True
                    break
            t = self._now()
            out.extend(kept)
            ids.extend(kept)
            times.extend([t] * len(kept))
            if on_tokens is not None:
                on_tokens(kept, t)
            return finished

        start = self._now()
        # Prefill: the first token comes from the prompt's last position alone.
        logits = target.forward(ids, last_only=True)[-1]
        first = int(logits.argmax()) if sampling.greedy else sample(probs_from_logits(logits, sampling), gen)
        prefill_s = time.perf_counter() - start
        done = emit([first])
        finish = "stop" if out[-1] in stops else "length"

        while not done:
            # Never draft past the budget: the verify pass emits at most k+1 tokens.
            room = budget - len(out) - 1
            t0 = self._now()
            if drafter and min(k, room) > 0:
                prop = drafter.propose(ids, min(k, room), sampling, gen)
            else:
                prop = Proposal([], None)
            t1 = self._now()
            draft = prop.tokens
            n_valid = len(ids)  # the target cache holds ids[:-1]; ids[-1] is fed below
            logits = target.forward([ids[-1], *draft])  # [m+1, V]: one pass verifies all drafts
            if sampling.greedy:
                n_acc, extra = verify_greedy(draft, logits)
            else:
                n_acc, extra = verify_sampled(draft, prop.q, probs_from_logits(logits, sampling), gen)
            # Roll back rejected drafts: keep the prefix plus the accepted drafts.
            target.truncate(n_valid + n_acc)
            if drafter:
                drafter.rollback(n_valid + n_acc)
            before = len(out)
            done = emit([*draft[:n_acc], extra])
            t2 = times[-1]
            steps.append(StepEvent(
                drafted=len(draft), accepted=n_acc,
                first_rejection=-1 if n_acc == len(draft) else n_acc,
                emitted=len(out) - before, draft_time_s=t1 - t0, verify_time_s=t2 - t1,
            ))
            if done:
                finish = "stop" if out[-1] in stops else "length"
        return Generation(out, times, start, prefill_s, finish, steps,
                          target_forward_passes=1 + len(steps))
