"""Losslessness of tree verification under sampling, end to end on the one decode path: with
draft trees (topk 2 and 4, the draft model's deterministic top-k trees, a static token tree,
SpecInfer-style trees of children drawn i.i.d. from a fixed q, and a Medusa tree of head
ranks), the engine's first three
output tokens follow the target's exact joint distribution (enumerated on an 8-token
vocabulary) and tokens 4-6 their exact marginals at concurrency 64 with ragged companions
(alone, a request draws the very tokens it draws there); and the same test rejects a verifier
that does not update p between siblings."""

from dataclasses import replace

import pytest
import torch

import test_lossless_sampling as lossless
import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine import verify as verify_mod
from specbench.engine.drafters import Proposal, StatelessDrafter
from specbench.models.medusa import MedusaConfig, MedusaHeads
from specbench.engine import scheduler

V = 8
N = 1200
MAX_NEW = 6  # >= depth + 2: the first step drafts the whole depth (3)


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=3)


@pytest.fixture(scope="module")
def engine(target):
    return Engine(target, tiny.perturbed_copy(target, 0.5, seed=9))


@pytest.fixture(scope="module")
def medusa_engine(target):
    torch.manual_seed(7)  # random heads: a deterministic tree of head ranks must keep the rule exact
    heads = MedusaHeads(MedusaConfig(num_heads=3, num_layers=1, hidden_size=16, vocab_size=V, draft_vocab_size=V))
    return Engine(target, head=heads.eval(), pack=False)


class IIDTreeDrafter(StatelessDrafter):
    """SpecInfer's proposal: every node gets `width` children drawn i.i.d. from a fixed q with
    the row's generator, `depth` levels deep (a full tree)."""

    def __init__(self, q: torch.Tensor, width: int, depth: int = 2):
        self.q, self.width, self.depth = q, width, depth

    def propose(self, rows, ks):
        tokens, parents = [], []
        for r, k in zip(rows, ks):
            t, p, frontier = [], [], [-1]
            for _ in range(min(k, self.depth)):
                nxt = []
                for f in frontier:
                    for x in torch.multinomial(self.q, self.width, replacement=True, generator=r.gen).tolist():
                        p.append(f)
                        t.append(x)
                        nxt.append(len(t) - 1)
                frontier = nxt
            tokens.append(t)
            parents.append(p)
        n = max(1, max(len(t) for t in tokens))
        return Proposal(tokens, self.q.expand(len(rows), n, V).clone(), parents)


SAMPLINGS = {
    "temperature": SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, ignore_eos=True),
    "top_k": SamplingParams(temperature=0.7, top_k=3, max_new_tokens=MAX_NEW, ignore_eos=True),
    "top_p": SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=MAX_NEW, ignore_eos=True),
    "all": SamplingParams(temperature=0.9, top_k=5, top_p=0.85, max_new_tokens=MAX_NEW, ignore_eos=True),
}
IID_Q = torch.tensor([0.3, 0.0, 0.2, 0.1, 0.15, 0.0, 0.15, 0.1])  # zeros: q(x) = 0 must reject


def tree_spec(topk: int, **tree) -> SpeculativeConfig:
    if "token_tree" in tree:
        return SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=3, **tree)
    return SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=3, topk=topk,
                             num_draft_tokens=2 * topk + 2)


def drafter_for(name: str, topk: int):
    return IIDTreeDrafter(IID_Q, topk) if name == "iid" else None


STATIC = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
BATCH = lossless.BATCH  # 64, and why: test_lossless_sampling
CASES = [  # (concurrency, sampling, drafter, topk)
    (BATCH, "temperature", "draft_model", 2),
    (BATCH, "all", "draft_model", 4),
    (BATCH, "top_p", "draft_model", 2),
    (BATCH, "temperature", "draft_model", 4),
    (BATCH, "temperature", "iid", 2),
    (BATCH, "top_k", "iid", 4),
    (BATCH, "all", "static", 0),
    (BATCH, "temperature", "medusa", 2),  # Medusa's tree: head d's top-k at every depth-d node
]


def check(outputs, target, sp):
    counts = lossless.joint_counts(outputs, V)
    expected = lossless.exact_joint(target, sp, vocab=V)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    p_joint = gof_pvalue(counts, expected)
    p_later = {i: gof_pvalue(lossless.marginal_counts(outputs, i, V), m)
               for i, m in lossless.exact_marginals(target, sp, vocab=V).items()}
    return p_joint, p_later


def run(engine, sp, spec, drafter, concurrency):
    return lossless.sample_outputs(engine, sp, spec, drafter, concurrency, n=N, vocab=V)


@pytest.fixture(scope="module")
def correct_outputs(engine, medusa_engine):
    """The outputs of the correct verifier for (sampling, drafter, topk, concurrency), drawn
    once per module: the draw is a function of the case (seeds 0..N-1, the same companions), so
    the broken-verifier test's correct half reuses the draw a distribution case already made
    (and checked) instead of drawing it again. Never call it with the verifier patched."""
    drawn = {}

    def outputs(sampling, drafter, topk, concurrency):
        key = (sampling, drafter, topk, concurrency)
        if key not in drawn:
            spec, eng = case(engine, medusa_engine, drafter, topk)
            drawn[key] = run(eng, SAMPLINGS[sampling], spec, drafter_for(drafter, topk), concurrency)
        return drawn[key]
    return outputs


def case(engine, medusa_engine, drafter: str, topk: int):
    """(configuration, engine) of a case's drafter."""
    spec = tree_spec(topk, token_tree=STATIC) if drafter == "static" else tree_spec(max(topk, 1))
    if drafter == "medusa":
        return replace(spec, method="medusa", draft="h"), medusa_engine
    return spec, engine


@pytest.mark.parametrize("sampling,drafter,topk", [("temperature", "draft_model", 2), ("top_k", "iid", 4),
                                                   ("all", "static", 0), ("temperature", "medusa", 2)])
def test_a_request_alone_draws_what_it_draws_in_the_batch(engine, medusa_engine, sampling, drafter, topk):
    spec, eng = case(engine, medusa_engine, drafter, topk)
    sp, d = SAMPLINGS[sampling], drafter_for(drafter, topk)
    lossless.assert_alone_as_in_the_batch(lambda concurrency, n: lossless.sample_outputs(eng, sp, spec, d, concurrency,
                                                                                         n=n, vocab=V))


@pytest.mark.parametrize("concurrency,sampling,drafter,topk", CASES)
def test_tree_outputs_follow_target_distribution(correct_outputs, target, concurrency, sampling, drafter, topk):
    sp = SAMPLINGS[sampling]
    outputs = correct_outputs(sampling, drafter, topk, concurrency)
    p_joint, p_later = check(outputs, target, sp)
    print(f"c{concurrency} {sampling} {drafter} topk {topk}: joint p = {p_joint:.3g}, tokens 4-6 p = "
          + ", ".join(f"{p:.3g}" for p in p_later.values()))
    assert p_joint > 1e-3
    for i, p in p_later.items():
        assert p > 1e-3, f"token {i + 1}: p = {p:.2g}"


def test_trees_branch_and_reach_full_depth(engine):
    """The trees the cases above verify are trees: the first step drafts the whole node budget,
    the budget lets it reach the full depth (it does where the draft is confident), and some
    step accepts a branch other than the first."""
    sp = SAMPLINGS["temperature"]
    spec = tree_spec(4)
    results, _ = scheduler.run(engine, [(lossless.PROMPT, sp.with_(seed=s)) for s in range(200)], spec)
    first = [g.steps[0] for g in results]
    assert all(s.drafted == spec.draft_nodes == 9 for s in first)
    assert max(s.draft_depth for g in results for s in g.steps) == 3
    ranks = [r for g in results for s in g.steps for r in (s.accepted_ranks or ())]
    assert any(r > 0 for r in ranks) and any(r == 0 for r in ranks)


def no_update_between_siblings(real):
    """The broken verifier: after a rejected child, the next sibling is tried against the
    same p (the residual is taken only after the last child)."""
    def rejected(p, q_node, x, last):
        return torch.where(last.view(-1, 1), real(p, q_node, x, last), p)
    return rejected


@pytest.mark.parametrize("drafter,topk,concurrency", [("iid", 2, BATCH), ("draft_model", 4, BATCH)])
def test_goodness_of_fit_catches_no_residual_between_siblings(engine, target, correct_outputs, monkeypatch, drafter,
                                                               topk, concurrency):
    """Both cases are also distribution cases (CASES): the correct half is their draw."""
    sp = SAMPLINGS["temperature"]
    spec = tree_spec(topk)
    ok_joint, _ = check(correct_outputs("temperature", drafter, topk, concurrency), target, sp)
    monkeypatch.setattr(verify_mod, "rejected", no_update_between_siblings(verify_mod.rejected))
    bad_joint, _ = check(run(engine, sp, spec, drafter_for(drafter, topk), concurrency), target, sp)
    print(f"{drafter} topk {topk} c{concurrency}: correct p = {ok_joint:.3g}, broken p = {bad_joint:.3g}")
    assert ok_joint > 1e-3 and bad_joint < 1e-3
