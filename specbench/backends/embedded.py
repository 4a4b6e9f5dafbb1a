"""The embedded backend: specbench's own engine on locally loaded models.

`make_engine` is the one place an `Engine` is built from loaded models (the backend and
`specbench serve` use it), so `--onednn on` and `--capture` fail the same way everywhere."""

from __future__ import annotations

import platform

import torch

from specbench.config import SpeculativeConfig
from specbench.backends.grammar import Compiler
from specbench.engine import Engine, scheduler
from specbench.engine.static import CONSTRAINED
from specbench.engine.static import static_reason as models_static_reason
from specbench.errors import ConfigError
from specbench.memory import peak_bytes, reset_peak
from specbench.types import Request, Result


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def make_engine(target, draft=None, *, head=None, pack: bool | None = None, static: str | None = None) -> Engine:
    """The engine for `target` (and `draft`, or an EAGLE-3 `head`), `specbench.models`
    `LoadedModel`s. The engine converts the models for its fast path in place (see
    specbench.engine.model); where `pack=True` (--onednn on) cannot apply, or a model's
    attention is of a kind the engine does not run, a ConfigError. `static`: the static
    step's mode (--capture, resolved: `EngineConfig.static_mode`), None for the eager step."""
    try:
        return Engine(target.model, draft.model if draft is not None else None,
                      eos_token_ids=target.eos_token_ids, max_context=target.max_context, pack=pack, head=head,
                      static=static)
    except ValueError as exc:
        flag = f"--capture {static}" if static else "--onednn on" if pack else ""
        raise ConfigError(f"{flag}: {exc}" if flag else str(exc)) from None


def static_reason(target, draft, specs, head=None) -> str:
    """Why the static step cannot run these `LoadedModel`s (`draft` for method draft_model, or
    None; `head`, the EAGLE-3 head module for method eagle3, or None) in these
    `SpeculativeConfig`s ('' when it can): specbench.engine.static.static_reason."""
    return models_static_reason(target.model, draft.model if draft is not None else None, specs, head=head)


class EmbeddedBackend:
    name = "embedded"

    def __init__(self, target, draft=None, *, head=None, pack: bool | None = None, static: str | None = None,
                 static_why: str = ""):
        """`target`/`draft`: `specbench.models.LoadedModel`s (draft optional); `head`: an
        EAGLE-3 head fitted to the target (specbench.models.eagle3.load_head), for method
        eagle3 (see `make_engine`)."""
        self.target = target
        self.draft = draft
        self.head = head
        self.engine = make_engine(target, draft, head=head, pack=pack, static=static)
        self.static_why = static_why
        self.device = self.engine.device
        self.device_name = describe_device(self.device)
        self._compiler: Compiler | None = None

    def check_requests(self, requests: list[Request]) -> None:
        """Before measuring: the static step refuses structured output (one line), and every
        constraint compiles (a grammar llguidance refuses is one line naming its prompt)."""
        constrained = [(r.constraint, r.id) for r in requests if r.constraint is not None]
        if constrained:
            self._constraint(next(r for r in requests if r.constraint is not None))
            self._compiler.check(constrained)

    def _constraint(self, request: Request):
        """The request's output constraint as a fresh matcher for the engine (None: free)."""
        if request.constraint is None:
            return None
        if self.engine.static is not None:
            raise ConfigError(f"--capture {self.engine.static}: {CONSTRAINED}; pass --capture off "
                              f"(prompt {request.id!r} asks for {request.scenario} output)")
        if self._compiler is None:
            self._compiler = Compiler(self.target.tokenizer, self.target.vocab_size, set(self.target.eos_token_ids))
        return self._compiler.matcher(request.constraint, request.id)

    def describe(self) -> dict:
        """How the engine runs the models (for run.json): the forward path and why."""
        e = self.engine
        why = ({"fast_path_unavailable": e.pack_reason} if not e.packed and e.pack_reason else
               {"layers_unfused": e.unfused} if e.unfused else {})
        step = {"capture": e.static or "off"}
        if self.static_why:
            step["capture_off_reason"] = self.static_why
        return {"forward_path": e.forward_path, "fast_path_setup_s": round(e.setup_s, 3), **step, **why}

    def _result(self, request: Request, g) -> Result:
        return Result(
            request_id=request.id, output_ids=g.output_ids, arrival_time=g.arrival_time,
            start_time=g.start_time, token_times=g.token_times, finish_reason=g.finish_reason,
            steps=g.steps, target_forward_passes=g.target_forward_passes,
            prefill_time_s=g.prefill_time_s, peak_memory_bytes=peak_bytes(self.device),
            output_text=self.target.tokenizer.decode(g.output_ids, skip_special_tokens=True)
            if request.constraint is not None else None,
        )

    def run(self, requests: list[Request], spec: SpeculativeConfig, *, concurrency: int = 1,
            request_rate: float | None = None, rate_seed: int = 0,
            on_results=None, schedule=None) -> tuple[list[Result], dict]:
        """All requests through the continuous-batching engine at `concurrency` rows in flight
        (closed loop), or arriving as a seeded Poisson process at `request_rate`, or at the
        `schedule` given (seconds after the start, one per request: a replayed trace).
        `on_results([(request, result)])` is called as each request finishes (and the
        results are not returned)."""
        reset_peak(self.device)
        done: dict[int, Result] = {}

        def finished(i: int, g) -> None:
            res = self._result(requests[i], g)
            if on_results is not None:
                on_results([(requests[i], res)])
            else:
                done[i] = res

        constrained = [(r.prompt_ids, r.sampling, self._constraint(r)) for r in requests]
        _, stats = scheduler.run(self.engine, constrained, spec,
                                   concurrency=concurrency, request_rate=request_rate,
                                   rate_seed=rate_seed, on_finish=finished, schedule=schedule)
        info = {**stats.to_dict(), "peak_memory_bytes": peak_bytes(self.device)}
        return ([done[i] for i in range(len(requests))] if on_results is None else []), info

    def generate(self, request: Request, spec: SpeculativeConfig, *, arrival_time: float) -> Result:
        """One request on its own (a batch of one)."""
        reset_peak(self.device)
        try:
            g = self.engine.generate(request.prompt_ids, request.sampling, spec, constraint=self._constraint(request))
        except torch.OutOfMemoryError as exc:
            return Result(request.id, [], arrival_time, arrival_time, [], "error",
                          error=f"out of memory: {str(exc).splitlines()[0]}")
        g.arrival_time = arrival_time
        return self._result(request, g)
