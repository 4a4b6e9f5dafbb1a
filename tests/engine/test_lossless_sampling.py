"""End-to-end losslessness under sampling, on the one decode path: the engine's first three
output tokens, drawn with speculation, follow the target's exact joint distribution
(enumerated on a 6-token vocabulary), and tokens 4, 5 and 6 their exact marginals, under
temperature, top-k and top-p, for the draft model, n-gram lookup and adversarial drafters,
in a continuous batch at concurrency 64 with ragged companions that join and leave mid-batch,
with dynamic k; alone (concurrency 1) a request draws exactly the tokens it draws in that batch
(so, seed for seed, the same distribution); and the same test catches a deliberately wrong
verifier. (Trees: tests/engine/test_tree_sampling.py.)"""

import random
from typing import Callable

import numpy as np
import pytest
import torch

import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine import verify as verify_mod
from specbench.engine.drafters import Proposal, StatelessDrafter
from specbench.engine.sampling import probs_from_logits
from specbench.engine import scheduler

V = 6
PROMPT = [1, 2, 3]
# 1,200 draws per case: the wrong verifier below is caught at 600 (p ~ 1e-33), and the subtlest
# slip planted anywhere in the suite (once a constrained verifier handed the unmasked q; now a
# sampled draw cut at a refused token, test_constrained) at 1,200 (p ~ 1e-14 then). 2,000, until the suite outgrew its 10 minutes, bought
# power against nothing planted, at 1.7 times the cost (test_static's cases draw this N too).
N = 1200
# Budget 6: the first token comes from the prefill, the next ones from speculative steps; a
# step drafts at most (tokens left - 1), so the first step of k = 3 drafts all three (k + 2
# <= 6) and every draft position is verified; tokens 4-6 come from later steps.
MAX_NEW = 6
# The batched cases' concurrency, in every statistical module. 64 rows with ragged companions
# (half again as many requests, other prompts, lengths and samplings) join and leave at almost
# every step, so batch positions, padding and per-row k are exercised harder than at 4; and the
# step's host work is shared by the batch, so a draw costs less the wider it is: at 16 a draw
# cost about a quarter of one drawn alone (~6 ms against ~23 ms a request on a 2-core Xeon,
# which cut the six statistical modules from about 933 to 642 worker-seconds), and 64 cut
# them again from 335 to 233 (2-core EPYC, float32, run back to back). A request's draws do not
# depend on its batch (below; suffix decoding's global tree aside), so the counts, and the
# p-values, are the same at any concurrency. Alone (concurrency 1) a request draws, seed for
# seed, the very tokens it draws in the batch (its uniforms are its own: ENGINE.md), so each
# module checks that on ALONE seeds instead of drawing a distribution alone (a case alone cost
# ~25 s, as it pays a whole step per request): identical outputs have the batch's distribution.
BATCH = 64
ALONE = 64
LATER = (3, 4, 5)  # output positions (0-based) whose exact marginals are checked too


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=3)


@pytest.fixture(scope="module")
def engine(target):
    return Engine(target, tiny.perturbed_copy(target, 0.5, seed=9))


def exact_prefixes(target, sp: SamplingParams, n: int, prompt=PROMPT, vocab: int = V) -> torch.Tensor:
    """P(t1..tn | prompt) [V]*n by enumeration, one batched full (uncached) forward per length."""
    joint = torch.ones(1, dtype=torch.float64)
    seqs = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n):
            p = probs_from_logits(target(seqs).logits[:, -1], sp).double()  # [prefixes, V]
            joint = (joint.view(-1, 1) * p).view(-1)
            seqs = torch.cat([seqs.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(len(seqs)).view(-1, 1)], 1)
    return joint.view(*([vocab] * n))


def exact_joint(target, sp: SamplingParams, prompt=PROMPT, vocab: int = V) -> np.ndarray:
    """P(t1, t2, t3 | prompt)."""
    return exact_prefixes(target, sp, 3, prompt, vocab).numpy().ravel()


def exact_marginals(target, sp: SamplingParams, positions=LATER, prompt=PROMPT, vocab: int = V) -> dict:
    """P(t_i | prompt) for each 0-based output position i, summing the joint over the rest."""
    joint = exact_prefixes(target, sp, max(positions) + 1, prompt, vocab)
    dims = list(range(joint.dim()))
    return {i: joint.sum(dim=[d for d in dims if d != i]).numpy() for i in positions}


class FixedQDrafter(StatelessDrafter):
    """Draws each draft token from a fixed q, whatever the context, with the row's generator."""

    def __init__(self, q):
        self.q = q

    def propose(self, rows, ks):
        tokens = [torch.multinomial(self.q, k, replacement=True, generator=r.gen).tolist() if k else []
                  for r, k in zip(rows, ks)]
        return Proposal(tokens, self.q.expand(len(rows), max(ks), V).clone())


class ConstantDrafter(StatelessDrafter):
    """Deterministic (one-hot q): always proposes the same token."""

    def __init__(self, token):
        self.token = token

    def propose(self, rows, ks):
        return Proposal([[self.token] * k for k in ks])


SAMPLINGS = {
    "temperature": SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, ignore_eos=True),
    "top_k": SamplingParams(temperature=0.7, top_k=3, max_new_tokens=MAX_NEW, ignore_eos=True),
    "top_p": SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=MAX_NEW, ignore_eos=True),
    "all": SamplingParams(temperature=0.9, top_k=4, top_p=0.85, max_new_tokens=MAX_NEW, ignore_eos=True),
}


def drafter_for(name, target):
    if name in ("draft_model", "ngram"):
        return None  # the engine's own drafter for the method
    if name == "disjoint_q":  # all mass on the two tokens the target finds least likely
        with torch.inference_mode():
            low = target(torch.tensor([PROMPT])).logits[0, -1].argsort()[:2]
        q = torch.zeros(V)
        q[low] = 0.5
        return FixedQDrafter(q)
    if name == "one_hot":
        return ConstantDrafter(4)
    if name == "q_with_zeros":
        return FixedQDrafter(torch.tensor([0.4, 0.0, 0.3, 0.0, 0.3, 0.0]))
    raise KeyError(name)


def spec_for(drafter: str, k: int, dynamic_k: bool = False) -> SpeculativeConfig:
    if drafter == "ngram":
        return SpeculativeConfig(method="ngram", num_speculative_tokens=k, dynamic_k=dynamic_k)
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft="draft", dynamic_k=dynamic_k)


def sample_outputs(engine, sp, spec, drafter, concurrency, n=None, vocab: int = V) -> list[list[int]]:
    """N seeded requests of PROMPT; at concurrency > 1 each shares its batch with ragged
    companions (other prompts, lengths, budgets and samplings, greedy included) that join and
    leave while it runs. The outputs of the N measured requests."""
    rng = random.Random(7)
    reqs, measured = [], []
    for seed in range(n or N):
        measured.append(len(reqs))
        reqs.append((PROMPT, sp.with_(seed=seed)))
        if concurrency > 1 and seed % 2 == 0:
            other = [rng.randrange(vocab) for _ in range(rng.randint(2, 12))]
            companion = rng.choice([sp, SamplingParams(), SamplingParams(temperature=0.6, top_p=0.9)])
            reqs.append((other, companion.with_(seed=10_000 + seed, max_new_tokens=rng.randint(1, 9),
                                                ignore_eos=True)))
    results, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency, drafter=drafter)
    return [results[i].output_ids for i in measured]


def joint_counts(outputs, vocab: int = V) -> np.ndarray:
    """Counts of the first three output tokens."""
    counts = np.zeros(vocab ** 3, dtype=np.int64)
    for out in outputs:
        a, b, c = out[:3]
        counts[(a * vocab + b) * vocab + c] += 1
    return counts


def marginal_counts(outputs, i: int, vocab: int = V) -> np.ndarray:
    return np.bincount([out[i] for out in outputs], minlength=vocab)


def sample_counts(engine, sp, spec, drafter, concurrency) -> np.ndarray:
    return joint_counts(sample_outputs(engine, sp, spec, drafter, concurrency))


CASES = [  # (concurrency, sampling, drafter, k, dynamic_k)
    (BATCH, "temperature", "draft_model", 3, False),
    (BATCH, "top_k", "draft_model", 3, False),
    (BATCH, "top_p", "ngram", 3, False),
    (BATCH, "top_k", "disjoint_q", 3, False),
    (BATCH, "top_p", "one_hot", 3, False),
    (BATCH, "temperature", "q_with_zeros", 3, False),
    (BATCH, "temperature", "draft_model", 1, True),
    (BATCH, "all", "draft_model", 3, True),
    (BATCH, "temperature", "ngram", 3, True),
    (BATCH, "all", "ngram", 1, True),
    (BATCH, "all", "q_with_zeros", 3, False),
    (BATCH, "top_k", "one_hot", 1, False),
]


@pytest.mark.parametrize("concurrency,sampling,drafter,k,dynamic_k", CASES)
def test_first_three_tokens_follow_target_distribution(engine, target, concurrency, sampling, drafter, k, dynamic_k):
    sp = SAMPLINGS[sampling]
    outputs = sample_outputs(engine, sp, spec_for(drafter, k, dynamic_k), drafter_for(drafter, target), concurrency)
    counts, expected = joint_counts(outputs), exact_joint(target, sp)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3
    for i, marginal in exact_marginals(target, sp).items():
        assert gof_pvalue(marginal_counts(outputs, i), marginal) > 1e-3, f"token {i + 1}"


def assert_same_draws(first: list[list[int]], second: list[list[int]], how: str) -> None:
    """Two draws of the same seeds are identical, and they vary with the seed (identical outputs
    of a constant would prove nothing). `how` names what the second draw did differently."""
    assert len(first) == len(second)
    assert len({tuple(o) for o in first}) > ALONE // 4, "the outputs hardly depend on the seed"
    differ = [i for i, (a, b) in enumerate(zip(first, second)) if a != b]
    assert not differ, f"seeds {differ[:5]} drew other tokens {how}: {first[differ[0]]} vs {second[differ[0]]}"


def assert_alone_as_in_the_batch(draw: Callable[[int, int], list[list[int]]]) -> None:
    """`draw(concurrency, n)`: the outputs of the requests seeded 0..n-1 (with ragged companions
    above concurrency 1). Drawn alone, ALONE seeds emit what they emit in a batch of BATCH."""
    batched = draw(BATCH, ALONE)
    assert len(batched) == ALONE
    assert_same_draws(batched, draw(1, ALONE), "alone")


@pytest.mark.parametrize("drafter,k,sampling", [("draft_model", 3, "temperature"), ("ngram", 3, "top_p"),
                                                ("q_with_zeros", 3, "all")])
def test_a_request_alone_draws_what_it_draws_in_the_batch(engine, target, drafter, k, sampling):
    sp, spec, d = SAMPLINGS[sampling], spec_for(drafter, k), drafter_for(drafter, target)
    assert_alone_as_in_the_batch(lambda concurrency, n: sample_outputs(engine, sp, spec, d, concurrency, n=n))


def test_alone_as_in_the_batch_catches_a_generator_shared_by_the_batch(engine, monkeypatch):
    """Rows that draw from one generator, restarted for each run (their draws interleave with
    their batch mates'), sample the right distribution, but a request's tokens then depend on
    its batch: caught. Run alone twice, the same variant passes: it is the batch that tells."""
    from specbench.engine import engine as engine_mod

    shared = torch.Generator()
    monkeypatch.setattr(engine_mod, "make_generator", lambda seed, device: shared)
    sp, spec = SAMPLINGS["temperature"], spec_for("draft_model", 3)

    def outputs(concurrency, n):
        shared.manual_seed(0)
        return sample_outputs(engine, sp, spec, None, concurrency, n=n)

    assert_alone_as_in_the_batch(lambda concurrency, n: outputs(1, n))  # the batch taken away
    with pytest.raises(AssertionError, match="drew other tokens alone"):
        assert_alone_as_in_the_batch(outputs)


def test_goodness_of_fit_catches_a_wrong_verifier(engine, target, monkeypatch):
    """Resampling from p instead of the residual after a rejection is a classic, subtle bug:
    the same test, on the same batched path, must reject it."""
    monkeypatch.setattr(verify_mod, "rejected", lambda p, q_node, x, last: p)  # the residual is p
    sp = SAMPLINGS["temperature"]
    # 600 draws, not N: p ~ 1e-33 already (more draws only lower it), so the cases' N can catch it
    counts = joint_counts(sample_outputs(engine, sp, spec_for("draft_model", 3), None, BATCH, n=600))
    assert gof_pvalue(counts, exact_joint(target, sp)) < 1e-3
