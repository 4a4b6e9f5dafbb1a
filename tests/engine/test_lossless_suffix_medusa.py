"""Losslessness under sampling for the deterministic drafters suffix decoding and Medusa
(one-hot q): the engine's first three output tokens follow the target's exact joint
distribution (enumerated on a 6-token vocabulary), alone and at concurrency 64 with ragged
companions. Suffix decoding drafts from a global tree that fills with the earlier requests'
outputs, so its proposals depend on what came before: the rule must stay exact anyway. The
same test rejects a verifier that resamples from p (not p without the rejected token) after a
rejection. Budget 5: the first step after the prefill drafts the full k = 3."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine import verify as verify_mod
from specbench.engine.sampling import probs_from_logits
from specbench.models.medusa import MedusaConfig, MedusaHeads
from specbench.engine import scheduler
from test_lossless_sampling import BATCH

V = 6
PROMPT = [1, 2, 3]
N = 1500
MAX_NEW = 5
K = 3
SAMPLINGS = {
    "temperature": SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, ignore_eos=True),
    "all": SamplingParams(temperature=0.9, top_k=4, top_p=0.85, max_new_tokens=MAX_NEW, ignore_eos=True),
}


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=3)


def medusa_heads(target) -> MedusaHeads:
    torch.manual_seed(5)  # random heads: any deterministic proposal must keep the rule exact
    return MedusaHeads(MedusaConfig(num_heads=K, num_layers=1, hidden_size=16, vocab_size=V, draft_vocab_size=V)).eval()


def exact_joint(target, sp: SamplingParams) -> np.ndarray:
    """P(t1, t2, t3 | prompt) by enumeration with full (uncached) forward passes."""
    joint = np.zeros((V, V, V))
    with torch.inference_mode():
        p1 = probs_from_logits(target(torch.tensor([PROMPT])).logits[0, -1], sp)
        for a in range(V):
            p2 = probs_from_logits(target(torch.tensor([PROMPT + [a]])).logits[0, -1], sp)
            for b in range(V):
                p3 = probs_from_logits(target(torch.tensor([PROMPT + [a, b]])).logits[0, -1], sp)
                joint[a, b] = (p1[a] * p2[b] * p3).numpy()
    return joint.ravel()


def sample_counts(engine, sp, spec, concurrency, n: int = N) -> tuple[np.ndarray, float]:
    rng = random.Random(7)
    reqs, measured = [], []
    for seed in range(n):
        measured.append(len(reqs))
        reqs.append((PROMPT, sp.with_(seed=seed)))
        if concurrency > 1 and seed % 2 == 0:
            other = [rng.randrange(V) for _ in range(rng.randint(2, 12))]
            companion = rng.choice([sp, SamplingParams(), SamplingParams(temperature=0.6, top_p=0.9)])
            reqs.append((other, companion.with_(seed=10_000 + seed, max_new_tokens=rng.randint(1, 9),
                                                ignore_eos=True)))
    results, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency)
    counts = np.zeros(V ** 3, dtype=np.int64)
    for i in measured:
        a, b, c = results[i].output_ids[:3]
        counts[(a * V + b) * V + c] += 1
    steps = [s for i in measured for s in results[i].steps]
    return counts, sum(s.accepted for s in steps) / max(1, sum(s.drafted for s in steps))


def spec_for(method: str) -> SpeculativeConfig:
    if method == "medusa":
        return SpeculativeConfig(method="medusa", num_speculative_tokens=K, draft="heads")
    return SpeculativeConfig(method="suffix", num_speculative_tokens=K, suffix_decoding_max_spec_factor=2.0,
                             suffix_decoding_min_token_prob=0.0)


def engine_for(method: str, target) -> Engine:
    return Engine(target, head=medusa_heads(target) if method == "medusa" else None, pack=False)


@pytest.mark.parametrize("method,sampling,concurrency", [
    ("suffix", "temperature", 1), ("suffix", "all", BATCH), ("medusa", "temperature", BATCH), ("medusa", "all", BATCH),
])
def test_first_three_tokens_follow_target_distribution(target, method, sampling, concurrency):
    sp = SAMPLINGS[sampling]
    counts, rate = sample_counts(engine_for(method, target), sp, spec_for(method), concurrency)
    expected = exact_joint(target, sp)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3
    assert 0.05 < rate < 0.95, rate  # drafts are accepted and rejected: both branches ran


def test_goodness_of_fit_catches_a_wrong_one_hot_rule(target, monkeypatch):
    """After a rejected one-hot draft, resampling from p instead of p without the draft token:
    the same test must reject it (the rule lives in `verify.rejected`, which every tree and
    chain step uses)."""
    monkeypatch.setattr(verify_mod, "rejected", lambda p, q_node, x, last: p)  # the residual is p
    sp = SAMPLINGS["temperature"]
    counts, _ = sample_counts(engine_for("suffix", target), sp, spec_for("suffix"), BATCH, n=600)
    pvalue = gof_pvalue(counts, exact_joint(target, sp))
    print(f"suffix with p as the residual, 600 draws: p = {pvalue:.3g}")
    assert pvalue < 1e-3
