"""End-to-end losslessness under sampling: the engine's first three output tokens, drawn with
speculation, follow the target's exact joint distribution (enumerated on a 6-token vocabulary)
under temperature, top-k and top-p, for a real draft model and adversarial drafters; and the
same test catches a deliberately wrong verifier."""


import numpy as np
import pytest
import torch

import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine, engine as engine_mod
from specbench.engine.drafters import Proposal
from specbench.engine.sampling import probs_from_logits

V = 6
PROMPT = [1, 2, 3]
N = 3000
SPEC = SpeculativeConfig(method="draft_model", num_speculative_tokens=2, draft="draft")
# Budget 4 with k=2: the first token comes from the prefill, the next two from one
# speculative step that verifies two drafts, so both draft positions are exercised.
MAX_NEW = 4


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=3)


def exact_joint(target, sp: SamplingParams) -> np.ndarray:
    """P(t1, t2, t3 | prompt) by enumeration with full (uncached) forward passes."""
    joint = np.zeros((V, V, V))
    with torch.inference_mode():
        p1 = probs_from_logits(target(torch.tensor([PROMPT])).logits[0, -1], sp)
        for a in range(V):
            if p1[a] == 0:
                continue
            p2 = probs_from_logits(target(torch.tensor([PROMPT + [a]])).logits[0, -1], sp)
            for b in range(V):
                if p2[b] == 0:
                    continue
                p3 = probs_from_logits(target(torch.tensor([PROMPT + [a, b]])).logits[0, -1], sp)
                joint[a, b] = (p1[a] * p2[b] * p3).numpy()
    return joint.ravel()


class FixedQDrafter:
    """Draws each draft token from a fixed q, whatever the context."""

    def __init__(self, q):
        self.q = q

    def propose(self, ids, k, sampling, generator):
        toks = torch.multinomial(self.q, k, replacement=True, generator=generator).tolist()
        return Proposal(toks, self.q.expand(k, V).clone())

    def rollback(self, n):
        pass


class ConstantDrafter:
    """Deterministic (one-hot q): always proposes the same token."""

    def __init__(self, token):
        self.token = token

    def propose(self, ids, k, sampling, generator):
        return Proposal([self.token] * k, None)

    def rollback(self, n):
        pass


def sample_counts(engine, sp, make_drafter) -> np.ndarray:
    counts = np.zeros(V ** 3, dtype=np.int64)
    for seed in range(N):
        g = engine.generate(PROMPT, sp.with_(seed=seed), SPEC,
                            drafter=make_drafter() if make_drafter else None)
        a, b, c = g.output_ids[:3]
        counts[(a * V + b) * V + c] += 1
    return counts


SAMPLINGS = {
    "temperature": SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, ignore_eos=True),
    "top_k": SamplingParams(temperature=0.7, top_k=3, max_new_tokens=MAX_NEW, ignore_eos=True),
    "top_p": SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=MAX_NEW, ignore_eos=True),
}

CASES = [
    ("temperature", "draft_model"),
    ("top_k", "draft_model"),
    ("top_p", "q_equals_p"),
    ("top_k", "disjoint_q"),
    ("top_p", "one_hot"),
    ("temperature", "q_with_zeros"),
]


def drafter_factory(name, target):
    if name == "draft_model":
        return None  # the engine's own draft model drafter (perturbed copy of the target)
    if name == "q_equals_p":
        return "target"
    if name == "disjoint_q":  # all mass on the two tokens the target finds least likely
        with torch.inference_mode():
            low = target(torch.tensor([PROMPT])).logits[0, -1].argsort()[:2]
        q = torch.zeros(V)
        q[low] = 0.5
        return lambda: FixedQDrafter(q)
    if name == "one_hot":
        return lambda: ConstantDrafter(4)
    if name == "q_with_zeros":
        return lambda: FixedQDrafter(torch.tensor([0.4, 0.0, 0.3, 0.0, 0.3, 0.0]))
    raise KeyError(name)


@pytest.mark.parametrize("sampling,drafter", CASES)
def test_first_three_tokens_follow_target_distribution(target, sampling, drafter):
    sp = SAMPLINGS[sampling]
    factory = drafter_factory(drafter, target)
    draft_model = target if factory == "target" else tiny.perturbed_copy(target, 0.5, seed=9)
    engine = Engine(target, draft_model)
    counts = sample_counts(engine, sp, None if factory in (None, "target") else factory)
    expected = exact_joint(target, sp)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3


def test_goodness_of_fit_catches_a_wrong_verifier(target, monkeypatch):
    """Resampling from p instead of the residual after a rejection is a classic, subtle bug:
    the same test must reject it."""
    real = engine_mod.verify_sampled

    def resample_from_p(draft, q, p, g):
        n, extra = real(draft, q, p, g)
        if n < len(draft):
            extra = int(torch.multinomial(p[n], 1, generator=g))
        return n, extra

    monkeypatch.setattr(engine_mod, "verify_sampled", resample_from_p)
    sp = SAMPLINGS["temperature"]
    engine = Engine(target, tiny.perturbed_copy(target, 0.5, seed=9))
    counts = sample_counts(engine, sp, None)
    assert gof_pvalue(counts, exact_joint(target, sp)) < 1e-3
