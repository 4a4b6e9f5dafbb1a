"""How the static step's functions run: as they are, compiled, or captured as CUDA graphs.

`Graphs.run(key, fn, *args)` runs one of the static step's pure functions (the draft chain, or
the verify pass with acceptance; specbench.engine.static) for a shape key (bucket, width,
sampling kind, and the allocation of the buffers it reads):

- "static": fn(*args), op by op: the reference;
- "compile": `torch.compile(fn, fullgraph=True, dynamic=False)`, built by its first call: a
  graph break is an error, and since lengths are data, a KV length never recompiles
  (`options`: Inductor's, e.g. {"cpp_wrapper": True}, which on a CPU takes a third off the
  host time of a step and multiplies its build time: minutes of C++ per graph);
- "cudagraph": fn captured once as a `torch.cuda.CUDAGraph` over static copies of its tensor
  arguments, then replayed (its warm-up runs fn; the buffers fn updates are put back).

`built` holds one entry per live key, `builds` counts every graph built (those dropped when
their buffers were reallocated included) and `build_s` the time spent building them, for
run.json and the host-overhead benchmark.

Boundary: callables and tensors; nothing here knows requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

MODES = ("static", "compile", "cudagraph")


class Graphs:
    """The step's functions per shape key, run as `mode` says; counts what it compiled or
    captured (`built`) and how long that took (`build_s`)."""

    def __init__(self, mode: str, device: torch.device, backend: str = "inductor",
                 options: dict[str, Any] | None = None):
        if mode not in MODES:
            raise ValueError(f"static mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "cudagraph" and device.type != "cuda":
            raise ValueError(f"cudagraph capture needs a CUDA device, the models are on {device.type}")
        self.mode, self.device, self.backend, self.options = mode, device, backend, options
        self.built: dict[tuple, Any] = {}
        self._outputs: dict[tuple, list[torch.Tensor]] = {}  # each captured graph's (static) outputs
        self.builds = 0  # graphs built, those since dropped with their buffers included
        self.build_s = 0.0
        if mode == "compile":
            # one compiled graph per (bucket, width, sampling kind) of each step function: more
            # than dynamo's default of 8 recompiles per function (each is counted in `built`)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)

    def run(self, key: tuple, fn: Callable[..., Any], *args: Any, state: Sequence[torch.Tensor] = ()) -> Any:
        """fn(*args) for this shape key: fn reads persistent buffers, Python constants that the
        key names and the tensors `args` (a built graph's inputs, so never closed over);
        the key's last item names the buffers' allocation, so a graph over buffers that were
        since reallocated is never replayed. `state`: the buffers fn updates in place that
        decide what it computes (a capture's warm-up runs fn, then puts them back)."""
        if self.mode == "static":
            return fn(*args)
        if key in self.built:
            return self.built[key](*args)
        for stale in [k for k in self.built if k[-1] != key[-1]]:
            del self.built[stale]
            self._outputs.pop(stale, None)
        t = time.perf_counter()
        self.builds += 1
        if self.mode == "compile":  # compiled by its first call, which is this step's
            self.built[key] = torch.compile(fn, fullgraph=True, dynamic=False, backend=self.backend,
                                            options=self.options)
            out = self.built[key](*args)
            self.build_s += time.perf_counter() - t
            return out
        saved = [s.clone() for s in state]
        self.built[key] = self._capture(key, fn, args)
        for s, old in zip(state, saved):
            s.copy_(old)
        self.build_s += time.perf_counter() - t
        return self.built[key](*args)

    def _capture(self, key: tuple, fn: Callable[..., Any], args: Sequence[Any]) -> Callable[..., Any]:
        """A CUDA graph of fn over static copies of its tensor arguments; replaying copies the
        arguments in (nothing when they are the tensors captured, e.g. an earlier graph's
        outputs)."""
        # an earlier graph's output is static already: read it in place (no copy per replay)
        static = [t for outs in self._outputs.values() for t in outs]
        inputs = [a.clone() if isinstance(a, torch.Tensor) and not any(a is t for t in static) else a for a in args]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, library handles)
                fn(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*inputs)
        self._outputs[key] = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]

        def replay(*now: Any) -> Any:
            for static, a in zip(inputs, now):
                if isinstance(a, torch.Tensor) and a is not static:
                    static.copy_(a)
            graph.replay()
            return out
        return replay
