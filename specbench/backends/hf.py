"""The reference backend: transformers' own `generate()` (plain, `assistant_model=`,
`prompt_lookup_num_tokens=`) on the same loaded models.

It is the yardstick the embedded engine is measured against and a correctness cross-check
(greedy outputs should agree). Token timestamps come from a streamer, which transformers
calls once per target forward pass with the tokens that pass emitted; transformers does not
expose per-step draft counts, so the rows carry forward passes but no acceptance events.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from specbench.backends.embedded import describe_device
from specbench.config import SpeculativeConfig
from specbench.memory import peak_bytes, reset_peak
from specbench.types import Request, Result, StepEvent


class _TimingStreamer(BaseStreamer):
    """Records when each emitted token arrived; the first put() is the prompt itself."""

    def __init__(self, sync):
        self.sync = sync
        self.seen_prompt = False
        self.times: list[float] = []
        self.bursts: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.sync()
        now = time.perf_counter()
        n = int(value.numel())
        self.times.extend([now] * n)
        self.bursts.append(n)

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _assisting(draft_model: Any, spec: SpeculativeConfig) -> Iterator[None]:
    """transformers reads assisted generation's settings from the assistant model's own
    generation_config: give it a copy with this request's k for the call only, so the draft
    model shared with the rest of the process is left as it was loaded."""
    loaded = draft_model.generation_config
    gc = copy.deepcopy(loaded)
    gc.num_assistant_tokens = spec.num_speculative_tokens
    gc.num_assistant_tokens_schedule = "constant"
    # transformers stops drafting below this draft confidence (its default is 0.4).
    gc.assistant_confidence_threshold = spec.draft_confidence_threshold or None
    draft_model.generation_config = gc
    try:
        yield
    finally:
        draft_model.generation_config = loaded


class HFBackend:
    name = "hf"

    def __init__(self, target, draft=None):
        self.target = target
        self.draft = draft
        self.device = target.device
        self.device_name = describe_device(self.device)
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def generate(self, request: Request, spec: SpeculativeConfig, *, arrival_time: float) -> Result:
        sp = request.sampling
        # transformers fills every generation knob left unset from the checkpoint's
        # generation_config.json (Qwen instruct ships repetition_penalty, top_k=20, ...): set
        # each one the engine does not apply to its neutral value, so both backends sample
        # from the same distribution.
        kwargs: dict = {"max_new_tokens": sp.max_new_tokens, "do_sample": not sp.greedy,
                        "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                        "min_new_tokens": 0}
        if not sp.greedy:
            kwargs.update(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k)
        else:
            kwargs.update(temperature=1.0, top_p=1.0, top_k=0)
        eos = [] if sp.ignore_eos else list(self.target.eos_token_ids)
        eos += [i for i in sp.stop_token_ids if i not in eos]
        kwargs["eos_token_id"] = eos or None
        kwargs["pad_token_id"] = self.target.eos_token_ids[0]
        if spec.speculative and spec.method == "draft_model":
            if self.draft is None:
                raise ValueError("the hf backend needs a draft model for method draft_model")
            kwargs["assistant_model"] = self.draft.model
        elif spec.speculative and spec.method == "ngram":
            kwargs["prompt_lookup_num_tokens"] = spec.num_speculative_tokens
            kwargs["max_matching_ngram_size"] = spec.ngram_max
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        streamer = _TimingStreamer(self._sync)
        ids = torch.tensor([request.prompt_ids], device=self.device)
        reset_peak(self.device)
        self._sync()
        start = time.perf_counter()
        assisting = (_assisting(self.draft.model, spec) if "assistant_model" in kwargs
                     else contextlib.nullcontext())
        with torch.inference_mode(), assisting:
            out = self.target.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), streamer=streamer, **kwargs
            )
        output = out[0, len(request.prompt_ids):].tolist()
        stops = set(eos)
        finish = "stop" if output and output[-1] in stops else "length"
        steps = [StepEvent(drafted=0, accepted=0, first_rejection=-1, emitted=n,
                           draft_time_s=0.0, verify_time_s=0.0) for n in streamer.bursts[1:]]
        return Result(
            request_id=request.id, output_ids=output, arrival_time=arrival_time,
            start_time=start, token_times=streamer.times[: len(output)], finish_reason=finish,
            steps=steps, target_forward_passes=len(streamer.bursts),
            prefill_time_s=(streamer.times[0] - start) if streamer.times else 0.0,
            peak_memory_bytes=peak_bytes(self.device),
            extra={"transformers_generate": True},
        )
