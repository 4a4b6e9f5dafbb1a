"""Synthetic records with planted acceptance and step costs, for the speedup model's tests.

Every configuration runs closed loop with `concurrency` rows in every step (a constant batch
size), each request drafts up to k tokens per step, accepts a prefix drawn from the planted
conditional acceptance alpha_i of its category, and each step takes the planted cost with
multiplicative noise; token timestamps follow the steps, so TPOT is what those steps cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specbench.config import BASELINE, SamplingParams, SpeculativeConfig
from specbench.metrics import sample_metrics
from specbench.records import make_row
from specbench.types import Request, Result, StepEvent


@dataclass(frozen=True)
class Planted:
    alpha: dict[str, tuple[float, ...]] = field(default_factory=lambda: {
        "code": (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2),
        "chat": (0.6, 0.5, 0.4, 0.3, 0.2, 0.2, 0.2, 0.2)})
    v: tuple[float, float, float] = (0.020, 0.001, 0.003)  # verify: per step, per row, per row x draft
    d: tuple[float, float, float] = (0.0005, 0.006, 0.0005)  # draft: per step, per draft, per row x draft
    noise: float = 0.05  # multiplicative, per step

    def verify(self, b: float, k: float) -> float:
        return self.v[0] + self.v[1] * b + self.v[2] * b * k

    def draft(self, b: float, k: float) -> float:
        return 0.0 if k == 0 else self.d[0] + self.d[1] * k + self.d[2] * b * k


def request_rows(planted: Planted, k: int, concurrency: int, *, n_prompts: int = 16,
                 n_out: int = 48, categories: tuple[str, ...] = ("code", "chat"),
                 seed: int = 0, draft: str = "tiny-draft", stall_s: float = 0.0) -> list[dict]:
    """`stall_s`: time each request waits once, after its first decode step, outside any of
    its steps (as when other requests' prefills run in between)."""
    rng = np.random.default_rng([seed, k, concurrency])
    spec = BASELINE if k == 0 else SpeculativeConfig("draft_model", k, draft=draft)
    config_id = f"{spec.short}-c{concurrency}"
    rows = []
    for i in range(n_prompts):
        cat = categories[i % len(categories)]
        req = Request(id=f"p{i:02d}", prompt_ids=tuple(range(1, 33)),
                      sampling=SamplingParams(max_new_tokens=n_out), category=cat)
        t = 0.05  # first token after the prefill
        times, out, events = [t], [1], []
        while len(out) < n_out:
            drafted = min(k, n_out - len(out) - 1)
            a = 0
            while a < drafted and rng.random() < planted.alpha[cat][a]:
                a += 1
            emitted = min(a + 1, n_out - len(out))
            dt = planted.draft(concurrency, drafted) * (1 + planted.noise * rng.standard_normal())
            vt = planted.verify(concurrency, drafted) * (1 + planted.noise * rng.standard_normal())
            t += dt + vt + (stall_s if not events else 0.0)
            out += [1] * emitted
            times += [t] * emitted
            events.append(StepEvent(drafted, a, -1 if a == drafted else a, emitted, dt, vt,
                                    batch_size=concurrency, context_tokens=32 + len(out) - emitted))
        res = Result(req.id, out, 0.0, 0.0, times, "length", steps=events,
                     target_forward_passes=1 + len(events))
        m = sample_metrics(req, res, config_start=0.0)
        rows.append(make_row(run_id="synthetic", config_id=config_id, backend="embedded",
                             spec=spec, concurrency=concurrency, request_rate=None, request=req,
                             metrics=m))
    return rows


def planted_frame(planted: Planted, ks=(1, 2, 4), concurrencies=(1, 2, 4, 8),
                  stall: dict[int, float] | None = None, **kw) -> pd.DataFrame:
    """`stall`: concurrency -> seconds each request waits outside its steps."""
    rows = []
    for c in concurrencies:
        for k in (0, *ks):
            rows += request_rows(planted, k, c, stall_s=(stall or {}).get(c, 0.0), **kw)
    df = pd.DataFrame(rows)
    df["error"] = None
    return df


def true_speedup(planted: Planted, k: int, concurrency: int, weights: dict[str, float]) -> float:
    """E_k (mixed by the given category weights) x base step / speculative step."""
    e = 0.0
    for cat, w in weights.items():
        total, s = 1.0, 1.0
        for i in range(k):
            s *= planted.alpha[cat][i]
            total += s
        e += w * total
    b = concurrency
    return e * planted.verify(b, 0) / (planted.verify(b, k) + planted.draft(b, k))
