"""EAGLE-3 drafting on the one decode path: greedy outputs equal the baseline's at concurrency 1
and 4 (reduced draft vocabularies included); rolling back after a partial acceptance leaves
the head's features and cache exactly as if the rejected tokens had never been drafted; and
sampled outputs follow the target's exact distribution (temperature, top-k, top-p), also with
a draft vocabulary that does not cover the target's support, at concurrency 64 (alone, a request
draws the very tokens it draws there), while the same test catches a drafter that hides its q
from the verifier."""

from __future__ import annotations

import random

import pytest
import torch

import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine import engine as engine_mod
from specbench.engine.drafters import Proposal
from specbench.engine.drafters.eagle3 import Eagle3Drafter
import test_lossless_sampling as lossless
from specbench.engine import scheduler
from test_lossless_sampling import BATCH, SAMPLINGS, V, exact_joint, sample_counts


def eagle3(k: int, dynamic_k: bool = False) -> SpeculativeConfig:
    return SpeculativeConfig(method="eagle3", num_speculative_tokens=k, draft="head", dynamic_k=dynamic_k)


# ---- greedy -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=300, layers=2, seed=0)


def _prompts(n: int, seed: int) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(300) for _ in range(r.randint(1, 14))] for _ in range(n)]


@pytest.mark.parametrize("draft_vocab,concurrency,k,dynamic_k", [
    (None, 1, 3, False), (60, 1, 1, False), (60, 4, 3, False), (None, 4, 4, True), (300, 4, 2, False)])
def test_greedy_output_equals_baseline(target, draft_vocab, concurrency, k, dynamic_k):
    head = tiny.make_head(target, draft_vocab_size=draft_vocab, seed=2)
    eng = Engine(target, head=head, pack=False)
    r = random.Random(5)
    reqs = [(p, SamplingParams(max_new_tokens=r.randint(1, 20), ignore_eos=True)) for p in _prompts(9, 3)]
    base, _ = scheduler.run(eng, reqs, SpeculativeConfig(), concurrency=concurrency)
    spec, stats = scheduler.run(eng, reqs, eagle3(k, dynamic_k), concurrency=concurrency)
    assert [g.output_ids for g in spec] == [g.output_ids for g in base]
    drafted = sum(s.drafted for g in spec for s in g.steps)
    assert drafted > 0 and stats.draft_weight_bytes > 0 and stats.draft_kv_peak_bytes > 0


def test_greedy_drafts_are_target_ids_of_the_draft_vocabulary(target):
    """Draft ids are mapped through d2t: every proposed token is a target id the reduced
    vocabulary covers, and greedy rows hand the verifier no q (their q is one-hot)."""
    head = tiny.make_head(target, draft_vocab_size=60, seed=4)
    batch = Engine(target, head=head, pack=False).batch(eagle3(3))
    batch.admit([1, 2, 3, 4], SamplingParams(max_new_tokens=30, ignore_eos=True))
    prop = batch.drafter.propose(batch.rows, [3])
    allowed = set(head.draft_ids.tolist())
    assert len(allowed) == 60 and allowed != set(range(60))
    assert len(prop.tokens[0]) == 3 and set(prop.tokens[0]) <= allowed and prop.q is None


# ---- rollback ---------------------------------------------------------------------------

def test_rollback_after_partial_acceptance_equals_never_drafting(target, monkeypatch):
    """One step accepts exactly 1 of 3 drafts (the verifier is forced to); the drafter's
    pending features and head cache must then equal those of a drafter that was admitted with
    the resulting sequence as its prompt (it never saw the rejected drafts), and both must
    propose the same next drafts."""
    head = tiny.make_head(target, draft_vocab_size=80, seed=6)
    eng = Engine(target, head=head, pack=False)
    real = engine_mod.verify_tree

    def accept_one(tree, logits, q, samplings, gens):
        _, extra = real(tree, logits, q, samplings, gens)
        # accept the first draft, "reject" the second with a different recovered token
        return [[0][:n] for n in tree.nodes], [(int(tree.feed[b, 2]) + 1) % 300 if tree.nodes[b] > 1 else e
                                               for b, e in enumerate(extra)]

    sp = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompt = [5, 17, 33, 2, 250, 9]
    batch = eng.batch(eagle3(3))
    batch.admit(prompt, sp)
    monkeypatch.setattr(engine_mod, "verify_tree", accept_one)
    batch.step()
    monkeypatch.setattr(engine_mod, "verify_tree", real)
    row, drafter = batch.rows[0], batch.drafter
    assert row.steps[-1].drafted == 3 and row.steps[-1].accepted == 1
    seq = list(row.ids)  # prompt + first token + 1 accepted draft + the recovered token
    assert len(seq) == len(prompt) + 3

    fresh_batch = Engine(target, head=head, pack=False).batch(eagle3(3))
    fresh_batch.admit(seq[:-1], sp)
    fresh_row, fresh = fresh_batch.rows[0], fresh_batch.drafter
    fresh_row.ids[-1] = seq[-1]  # the token the first run emitted, in place of the one sampled here
    assert fresh_row.ids == seq

    # The committed drafter has the head cache of positions 0..L-1 and pending features after.
    L = drafter.lengths[0]
    feats_a = drafter.pending[0]
    # The fresh one holds positions 0..len(seq)-3 in its cache and one pending feature.
    L_f = fresh.lengths[0]
    assert L + feats_a.shape[0] == L_f + fresh.pending[0].shape[0] == len(seq) - 1
    # Features of the same positions agree (the verify pass vs the prefill of the fresh row).
    assert torch.allclose(feats_a[-1], fresh.pending[0][-1], atol=1e-5)
    ka = drafter.lm.cache.keys[0][0, :, :L]
    kf = fresh.lm.cache.keys[0][0, :, :L]
    assert torch.allclose(ka, kf, atol=1e-5)

    pa = drafter.propose([row], [3])
    pf = fresh.propose([fresh_row], [3])
    assert pa.tokens == pf.tokens
    n = len(seq) - 1  # both caches now hold the real entries 0..n-1
    assert drafter.lengths == fresh.lengths == [n]
    for buf_a, buf_f in ((drafter.lm.cache.keys[0], fresh.lm.cache.keys[0]),
                         (drafter.lm.cache.values[0], fresh.lm.cache.values[0])):
        assert torch.allclose(buf_a[0, :, :n], buf_f[0, :, :n], atol=1e-5)


# ---- sampling: the target's exact distribution ----------------------------------------------

@pytest.fixture(scope="module")
def small_target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=2, init_range=0.5, seed=3)


def _small_head(target, draft_vocab: int, seed: int):
    return tiny.make_head(target, draft_vocab_size=draft_vocab, seed=seed, std=0.6)


CASES = [  # (concurrency, sampling, draft vocabulary, k, dynamic_k)
    (BATCH, "temperature", 3, 3, False),  # 3 of 6 tokens: the target's support is not covered
    (BATCH, "top_p", 2, 3, False),  # at concurrency 64, ragged companions join and leave
    (BATCH, "all", 3, 3, True),  # k changes per row too
    (BATCH, "top_k", V, 2, False),  # the full vocabulary
]
N = 1000  # requests per case (the n-gram and draft-model cases use lossless.N); enough for the bug below


@pytest.mark.parametrize("concurrency,sampling,draft_vocab,k,dynamic_k", CASES)
def test_first_three_tokens_follow_target_distribution(small_target, monkeypatch, concurrency, sampling,
                                                       draft_vocab, k, dynamic_k):
    monkeypatch.setattr(lossless, "N", N)
    head = _small_head(small_target, draft_vocab, seed=11 + k)
    eng = Engine(small_target, head=head, pack=False)
    sp = SAMPLINGS[sampling]
    counts = sample_counts(eng, sp, eagle3(k, dynamic_k), None, concurrency)
    expected = exact_joint(small_target, sp)
    assert counts.sum() == N
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("sampling,draft_vocab", [("temperature", 3), ("top_k", V)])
def test_a_request_alone_draws_what_it_draws_in_the_batch(small_target, sampling, draft_vocab):
    eng = Engine(small_target, head=_small_head(small_target, draft_vocab, seed=14), pack=False)
    sp = SAMPLINGS[sampling]
    lossless.assert_alone_as_in_the_batch(lambda concurrency, n: lossless.sample_outputs(eng, sp, eagle3(3), None,
                                                                                         concurrency, n=n))


def test_goodness_of_fit_catches_q_left_in_draft_id_order(small_target, monkeypatch):
    """The classic EAGLE-3 slip: the draft distribution handed to the verifier indexed by draft
    id instead of scattered through d2t to the target ids. The same test must reject it."""
    monkeypatch.setattr(lossless, "N", 600)  # fewer draws than the cases' N: p ~ 1e-48 already
    real = Eagle3Drafter.propose

    def draft_order_q(self, rows, ks):
        prop = real(self, rows, ks)
        if prop.q is None:
            return prop
        ids = self.draft_ids
        wrong = torch.zeros_like(prop.q)
        wrong[..., : ids.numel()] = prop.q[..., ids]
        return Proposal(prop.tokens, wrong)

    head = _small_head(small_target, 3, seed=14)
    assert head.draft_ids.tolist() != [0, 1, 2]  # otherwise the two orders coincide
    monkeypatch.setattr(Eagle3Drafter, "propose", draft_order_q)
    eng = Engine(small_target, head=head, pack=False)
    sp = SAMPLINGS["temperature"]
    counts = sample_counts(eng, sp, eagle3(3), None, BATCH)
    pvalue = gof_pvalue(counts, exact_joint(small_target, sp))
    print(f"EAGLE-3 q in draft-id order, 600 draws: p = {pvalue:.3g}")
    assert pvalue < 1e-3
