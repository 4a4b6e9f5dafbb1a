"""What a running batch keeps per request and per batch, shared by the eager step
(specbench.engine.engine.Batch) and the static step (specbench.engine.static.StaticBatch):
`Row` (one running request), `Generation` (a finished one), `BatchStats` (run.json's
figures of one batch) and `RunningRows` (the row bookkeeping both steps share).

Boundary: token ids and timestamps.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.config import SamplingParams
from specbench.types import StepEvent


@dataclass
class Generation:
    output_ids: list[int]
    token_times: list[float]  # perf_counter at emission; one step's tokens share one time
    start_time: float  # perf_counter when the prefill began
    prefill_time_s: float
    finish_reason: str  # stop | length | cancelled
    steps: list[StepEvent] = field(default_factory=list)
    target_forward_passes: int = 0
    arrival_time: float = 0.0  # perf_counter when the request entered the queue
    tag: Any = None  # the caller's handle for the request


@dataclass
class Admission:
    """One request to admit (what `admit` takes): the admissions of one scheduler turn go
    to `admit_many` together and share one prefill pass."""

    prompt_ids: Sequence[int]
    sampling: SamplingParams
    arrival: float | None = None  # perf_counter when it entered the queue (None: now)
    on_tokens: Callable[[list[int], float], None] | None = None
    tag: Any = None
    constraint: Any = None  # a specbench.engine.constraint.TokenConstraint, or None


def padded(prompts: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """The prompts as one [n, longest] long tensor, each right-padded with its own last id.
    A prefill from position 0 is causal, so no real position sees the padding after it; the
    padding's KV entries lie past the row's length, where the row's next tokens overwrite them."""
    width = max(len(p) for p in prompts)
    return torch.tensor([list(p) + [p[-1]] * (width - len(p)) for p in prompts], dtype=torch.long, device=device)


@dataclass
class BatchSizeTime:
    """Where the steps of one batch size went (times in s, summed over its steps)."""

    steps: int = 0
    step_s: float = 0.0  # draft + verify + per-step bookkeeping
    draft_s: float = 0.0
    verify_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "step_s": self.step_s, "draft_s": self.draft_s, "verify_s": self.verify_s}


@dataclass
class BatchStats:
    """What one batch did, for run.json (times in s, memory in bytes)."""

    wall_s: float = 0.0
    steps: int = 0
    batch_sizes: Counter = field(default_factory=Counter)  # rows in the target pass -> steps
    step_s: float = 0.0  # sum of step wall times (draft + verify + per-step bookkeeping)
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    target_kv_allocated_bytes: int = 0
    target_kv_peak_bytes: int = 0  # max over steps of the KV positions in use, all rows
    draft_kv_allocated_bytes: int = 0
    draft_kv_peak_bytes: int = 0
    target_weight_bytes: int = 0
    draft_weight_bytes: int = 0
    # rows in the target pass -> where that batch size's time went
    by_batch_size: dict[int, BatchSizeTime] = field(default_factory=dict)
    step_path: str = "eager"  # eager | static (static | compile | cudagraph)
    padded_rows: int = 0  # static step: rows computed only to fill a bucket, summed over steps
    graphs_built: int = 0  # static step: graphs compiled or captured for this batch
    graph_build_s: float = 0.0  # and the time that took (before the steps that use them)

    def record_step(self, batch_size: int, t0: float, t1: float, t2: float, *, target_kv: tuple[int, int],
                    draft_kv: tuple[int, int] | None) -> None:
        """One step of `batch_size` rows that began at t0, drafted until t1 and verified until
        t2 (perf_counter; the step ends now); KV bytes (allocated, in use) of target and drafter."""
        step = time.perf_counter() - t0
        self.steps += 1
        self.batch_sizes[batch_size] += 1
        self.draft_s += t1 - t0
        self.verify_s += t2 - t1
        self.step_s += step
        acc = self.by_batch_size.setdefault(batch_size, BatchSizeTime())
        acc.steps += 1
        acc.step_s += step
        acc.draft_s += t1 - t0
        acc.verify_s += t2 - t1
        self.target_kv_allocated_bytes = max(self.target_kv_allocated_bytes, target_kv[0])
        self.target_kv_peak_bytes = max(self.target_kv_peak_bytes, target_kv[1])
        if draft_kv is not None:
            self.draft_kv_allocated_bytes = max(self.draft_kv_allocated_bytes, draft_kv[0])
            self.draft_kv_peak_bytes = max(self.draft_kv_peak_bytes, draft_kv[1])

    @property
    def overhead_s(self) -> float:
        return self.step_s - self.draft_s - self.verify_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s, "steps": self.steps,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "step_s": self.step_s, "draft_s": self.draft_s, "verify_s": self.verify_s,
            "overhead_s": self.overhead_s, "prefill_s": self.prefill_s, "step_path": self.step_path,
            "padded_rows": self.padded_rows, "graphs_built": self.graphs_built,
            "graph_build_s": round(self.graph_build_s, 3),
            "by_batch_size": {str(b): v.to_dict() for b, v in sorted(self.by_batch_size.items())},
            "memory": {
                "target_weight_bytes": self.target_weight_bytes,
                "draft_weight_bytes": self.draft_weight_bytes,
                "target_kv_allocated_bytes": self.target_kv_allocated_bytes,
                "target_kv_peak_bytes": self.target_kv_peak_bytes,
                "draft_kv_allocated_bytes": self.draft_kv_allocated_bytes,
                "draft_kv_peak_bytes": self.draft_kv_peak_bytes,
            },
        }


@dataclass
class Row:
    ids: list[int]  # prompt + output so far; the target cache holds all but the last
    sampling: SamplingParams
    gen: torch.Generator
    stops: frozenset[int]
    budget: int
    k: int  # draft length this row asks for next (changes with dynamic_k)
    arrival: float
    start: float
    tag: Any = None
    on_tokens: Callable[[list[int], float], None] | None = None
    prefill_s: float = 0.0
    out: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)
    done: bool = False
    finish: str = "length"
    cancelled: bool = False
    constraint: Any = None  # its output constraint (specbench.engine.constraint.TokenConstraint), or None

    def emit(self, tokens: list[int], t: float) -> int:
        """Append tokens, stopping at a stop id or the budget; returns how many were kept."""
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
        if self.on_tokens is not None and kept:
            self.on_tokens(tokens[:kept], t)
        return kept


class RunningRows:
    """What the eager and the static step share about their running requests (`rows`, in
    slot order): how many run, their tags, cancelling one, and a finished row's Generation."""

    rows: list[Row]
    stats: BatchStats

    def __len__(self) -> int:
        """Rows running (admitted, not yet finished)."""
        return len(self.rows)

    @property
    def tags(self) -> list[Any]:
        """The `tag` of every running row (what `admit` was given), in row order."""
        return [r.tag for r in self.rows]

    def cancel(self, tag: Any) -> None:
        """The request `tag` ends (finish reason `cancelled`) at the next step."""
        for r in self.rows:
            if r.tag is tag:
                r.cancelled = True

    def admit(self, prompt_ids: Sequence[int], sampling: SamplingParams, *, arrival: float | None = None,
              on_tokens: Callable[[list[int], float], None] | None = None, tag: Any = None,
              constraint: Any = None) -> Generation | None:
        """Prefill one request into the next row and emit its first token (`admit_many` of
        one). Returns its Generation when that token already ends it, else None."""
        done = self.admit_many([Admission(prompt_ids, sampling, arrival, on_tokens, tag, constraint)])
        return done[0] if done else None

    def admit_many(self, admissions: Sequence[Admission]) -> list[Generation]:
        raise NotImplementedError

    @staticmethod
    def _staying(rows: Sequence[Row], firsts: Sequence[int]) -> list[int]:
        """Which of a pass's new rows its first token does not end (a stop id, or a budget
        of one): they take slots, in order; the others leave at once."""
        return [i for i, (r, f) in enumerate(zip(rows, firsts)) if not (f in r.stops or r.budget <= 1)]

    def _emit_firsts(self, rows: Sequence[Row], firsts: Sequence[int], start: float, t: float) -> list[Generation]:
        """Every new row of a pass emits its first token at `t` (the pass began at `start`);
        returns the Generations of those it ends."""
        self.stats.prefill_s += t - start
        finished = []
        for r, first in zip(rows, firsts):
            r.prefill_s = t - start
            r.emit([first], t)  # (row.ids is its prompt: it grows here)
            if r.done:
                finished.append(self._generation(r))
        return finished

    def _survivors(self) -> list[int]:
        """The slots the running rows keep after finished ones leave: new row i is old row
        keep[i], survivors from the end filling the freed slots (one move each)."""
        alive = [not (r.done or r.cancelled) for r in self.rows]
        n = sum(alive)
        movers = iter([i for i in range(n, len(self.rows)) if alive[i]])
        return [i if alive[i] else next(movers) for i in range(n)]

    def _generation(self, r: Row, reason: str | None = None) -> Generation:
        return Generation(r.out, r.times, r.start, r.prefill_s, reason or r.finish, r.steps,
                          target_forward_passes=1 + len(r.steps), arrival_time=r.arrival, tag=r.tag)
