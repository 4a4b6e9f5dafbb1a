"""Verification rule tests on synthetic distributions, many rows in one batched call: the
token a step emits at a position must be distributed exactly as the target's p, whatever
the drafter's q, and the same test must reject deliberately wrong verifiers."""

import numpy as np
import pytest
import torch

from gof import gof_pvalue
from specbench.config import SamplingParams
from specbench.engine.sampling import probs_from_logits
from specbench.engine.tree import Proposal, tree_batch
from specbench.engine.verify import verify_tree

V = 6
N = 6000
P = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1, 0.0])
QS = {
    "q_equals_p": P.clone(),
    "disjoint_support": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
    "q_with_zeros": torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0]),
    "overconfident": torch.tensor([0.02, 0.9, 0.02, 0.02, 0.02, 0.02]),
    "uniform": torch.full((V,), 1 / V),
}
SAMPLED = SamplingParams(temperature=1.0)


def verify(draft, draft_len, logits, q, samplings, generators):
    """Chains given as a padded [B, K] draft: (accepted per row, extra token per row), through
    the engine's one verifier (a chain is the tree with one child per node)."""
    lens = [int(n) for n in draft_len]
    table = draft.tolist()
    tree = tree_batch([0] * len(lens), Proposal([table[b][:lens[b]] for b in range(len(lens))]), lens)
    paths, extra = verify_tree(tree, logits[:, :tree.feed.shape[1]], q, samplings, generators)
    return [len(p) for p in paths], extra


def logits_for(p: torch.Tensor) -> torch.Tensor:
    """Logits whose temperature-1 distribution is exactly p (zeros become -inf)."""
    return torch.log(p)


def emitted_first_tokens(q: torch.Tensor | None, one_hot_token: int | None, verifier=verify) -> np.ndarray:
    """N rows in one batch: each draws a one-token draft from q with its own generator (or
    uses a fixed token: a deterministic drafter), verifies it against p, and we count the
    token emitted at the draft's position."""
    gens = [torch.Generator().manual_seed(1234 + i) for i in range(N)]
    if q is None:
        draft = torch.full((N, 1), one_hot_token)
    else:
        draft = torch.tensor([[int(torch.multinomial(q, 1, generator=g))] for g in gens])
    p = torch.stack([P, torch.full((V,), 1 / V)])  # position 0 and the bonus position
    logits = logits_for(p).expand(N, 2, V)
    qq = None if q is None else q.expand(N, 1, V)
    n_acc, extra = verifier(draft, [1] * N, logits, qq, [SAMPLED] * N, gens)
    counts = np.zeros(V, dtype=np.int64)
    for b in range(N):
        counts[int(draft[b, 0]) if n_acc[b] == 1 else extra[b]] += 1
    return counts


@pytest.mark.parametrize("name", sorted(QS))
def test_emitted_token_follows_target_distribution(name):
    counts = emitted_first_tokens(QS[name], None)
    assert counts[5] == 0  # p(5) = 0: never emitted, even when q proposes it
    assert gof_pvalue(counts, P.numpy()) > 1e-3


@pytest.mark.parametrize("token", [1, 4, 5])
def test_one_hot_drafter_follows_target_distribution(token):
    counts = emitted_first_tokens(None, token)
    assert gof_pvalue(counts, P.numpy()) > 1e-3


def _resample_from_p(draft, lens, logits, q, samplings, gens):
    """A classic bug: on rejection, resample from p instead of the residual max(0, p - q)."""
    n_acc, extra = verify(draft, lens, logits, q, samplings, gens)
    for b, (n, m) in enumerate(zip(n_acc, lens)):
        if n < m:
            extra[b] = int(torch.multinomial(probs_from_logits(logits[b, n], samplings[b]), 1, generator=gens[b]))
    return n_acc, extra


def _accept_always(draft, lens, logits, q, samplings, gens):
    extra = [int(torch.multinomial(probs_from_logits(logits[b, m], samplings[b]), 1, generator=gens[b]))
             for b, m in enumerate(lens)]
    return list(lens), extra


@pytest.mark.parametrize("broken", [_resample_from_p, _accept_always])
def test_goodness_of_fit_rejects_a_wrong_verifier(broken):
    counts = emitted_first_tokens(QS["overconfident"], None, broken)
    assert gof_pvalue(counts, P.numpy()) < 1e-6


def test_identical_distributions_accept_everything():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(200, 4, V), -1)
    gens = [torch.Generator().manual_seed(i) for i in range(200)]
    draft = torch.stack([torch.stack([torch.multinomial(p[b, i], 1, generator=gens[b])[0] for i in range(3)])
                         for b in range(200)])
    n_acc, _ = verify(draft, [3] * 200, torch.log(p), p[:, :3], [SAMPLED] * 200, gens)
    assert n_acc == [3] * 200


def zero_residual_rejections() -> list[int]:
    """The extra tokens of the rows that rejected their draft where the residual is all zero:
    q = [0.6, 0.6, 0] (a drafter's q that sums past 1) against p = [0.5, 0.5, 0], so draft 0
    is rejected with probability 1/6 and max(p - q, 0) is zero everywhere."""
    B = 300
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]).expand(B, 2, 3)
    q = torch.tensor([[0.6, 0.6, 0.0]]).expand(B, 1, 3)
    gens = [torch.Generator().manual_seed(i) for i in range(B)]
    n_acc, extra = verify(torch.zeros(B, 1, dtype=torch.long), [1] * B, torch.log(p), q, [SAMPLED] * B, gens)
    return [e for n, e in zip(n_acc, extra) if n == 0]


def test_zero_residual_falls_back_to_p(monkeypatch):
    rejected = zero_residual_rejections()
    assert 25 <= len(rejected) <= 75  # ~1/6 of 300 rows reach the fallback
    assert set(rejected) <= {0, 1} and len(set(rejected)) == 2  # drawn from p = [0.5, 0.5, 0]
    # the same check fails on a fallback to the uniform distribution instead of p
    from specbench.engine import verify as verify_mod

    def uniform_fallback(p, q_node, x, last):
        residual = p.scatter(1, x.view(-1, 1), 0.0) if q_node is None else torch.clamp(p - q_node, min=0.0)
        total = residual.sum(dim=-1, keepdim=True)
        return torch.where(total > 0, residual / total.clamp_min(1e-30), torch.full_like(p, 1 / p.shape[-1]))

    monkeypatch.setattr(verify_mod, "rejected", uniform_fallback)
    assert 2 in zero_residual_rejections()


def test_rows_of_one_batch_verify_independently():
    """Greedy and sampled rows with different draft lengths in one call give each row what it
    gets alone: a row's result never depends on its batch mates."""
    torch.manual_seed(3)
    B, K = 40, 4  # enough sampled rows that treating them as greedy would change some result
    logits = torch.randn(B, K + 1, V) * 3
    draft = torch.randint(0, V, (B, K))
    lens = [[4, 0, 2, 3, 1][b % 5] for b in range(B)]
    samplings = [[SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=1.2, top_k=3),
                  SamplingParams(), SamplingParams(temperature=0.8, top_p=0.7)][b % 5] for b in range(B)]
    q = torch.softmax(torch.randn(B, K, V), -1)
    together = verify(draft, lens, logits, q, samplings, [torch.Generator().manual_seed(b) for b in range(B)])
    for b in range(B):
        alone = verify(draft[b:b + 1, : max(lens[b], 0)], [lens[b]], logits[b:b + 1, : lens[b] + 1],
                       q[b:b + 1, : lens[b]], [samplings[b]], [torch.Generator().manual_seed(b)])
        assert (together[0][b], together[1][b]) == (alone[0][0], alone[1][0]), f"row {b}"


def test_greedy_accepts_matching_prefix_then_emits_target_argmax():
    logits = torch.full((4, 4, V), -10.0)
    for pos, tok in enumerate([2, 3, 1, 4]):
        logits[:, pos, tok] = 10.0
    draft = torch.tensor([[2, 3, 5], [2, 3, 1], [0, 0, 0], [0, 0, 0]])
    n_acc, extra = verify(draft, [3, 3, 1, 0], logits, None, [SamplingParams()] * 4,
                          [torch.Generator() for _ in range(4)])
    # third draft wrong: correction 1; all accepted: bonus 4; first wrong: 2; no draft: 2
    assert list(zip(n_acc, extra)) == [(2, 1), (3, 4), (0, 2), (0, 2)]


def test_the_residual_is_normalized_per_row():
    """After a rejection the next sibling in a tree is tried against the residual itself
    (min(1, r(x) / q(x))), so it must be a distribution, row by row: a chain only draws from it
    with multinomial, which normalizes anything, and would not notice (mutation testing found
    an unnormalized residual, and one normalized over the whole batch, alive)."""
    from specbench.engine.verify import rejected
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])
    q = torch.tensor([[0.2, 0.5, 0.1, 0.2], [0.4, 0.0, 0.1, 0.5]])
    last = torch.tensor([False, False])
    r = rejected(p, q, torch.tensor([1, 0]), last)
    # max(p - q, 0): [0.3, 0, 0.1, 0] -> /0.4 ; [0, 0.1, 0, 0.2] -> /0.3
    assert torch.allclose(r, torch.tensor([[0.75, 0.0, 0.25, 0.0], [0.0, 1 / 3, 0.0, 2 / 3]]))
    # a point mass: p without x, renormalized
    r = rejected(p, None, torch.tensor([0, 3]), last)
    assert torch.allclose(r, torch.tensor([[0.0, 0.6, 0.4, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0]]))


def tree_of(children_tokens: list[list[int]], parents: list[list[int]]):
    return tree_batch([0] * len(parents), Proposal(children_tokens, parents=parents),
                      [max(1, len(t)) for t in children_tokens])


def test_a_node_moves_to_one_child_and_tries_no_sibling_after_it():
    """Both children of the root would be accepted (q <= p at each): the first is taken and
    the second is never tried, so the path is [0], whatever the seed."""
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0])
    logits = logits_for(p).expand(1, 3, V).clone()
    q = torch.tensor([[0.0, 0.5, 0.5, 0, 0, 0], [0.0, 0.5, 0.5, 0, 0, 0]]).view(1, 2, V)
    tree = tree_of([[1, 2]], [[-1, -1]])
    for seed in range(20):
        paths, _ = verify_tree(tree, logits, q, [SAMPLED], [torch.Generator().manual_seed(seed)])
        assert paths == [[0]]


def test_a_child_the_draft_gave_no_probability_is_rejected():
    """q(x) = 0 rejects x even where p(x) > 0 (a tree's top-k child past the draft's support):
    min(1, p/q) is not a probability there. The recovered token comes from max(p - q, 0)."""
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0])
    logits = logits_for(p).expand(1, 2, V).clone()
    q = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]).view(1, 1, V)  # x = 1 has q(x) = 0
    tree = tree_of([[1]], [[-1]])
    for seed in range(20):
        paths, extra = verify_tree(tree, logits, q, [SAMPLED], [torch.Generator().manual_seed(seed)])
        assert paths == [[]] and extra == [1]  # max(p - q, 0) = [0, 0.5, 0, ...]


def test_a_row_with_fewer_children_than_the_widest_draws_its_recovered_token_from_its_own_residual():
    """Row 0's root has two children, row 1's one (its second slot is padding). Row 1 rejects its
    only child (p(x) = 0); the padding slot is no candidate and must leave its p as it is,
    [0.5, 0.5] over tokens 0 and 1, so both come out over the seeds."""
    p1 = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    logits = torch.stack([logits_for(torch.full((V,), 1 / V)).expand(3, V), logits_for(p1).expand(3, V)])
    tree = tree_of([[3, 4], [2]], [[-1, -1], [-1]])
    extras = set()
    for seed in range(40):
        gens = [torch.Generator().manual_seed(1000 + seed), torch.Generator().manual_seed(seed)]
        paths, extra = verify_tree(tree, logits, None, [SAMPLED, SAMPLED], gens)
        assert paths[1] == []
        extras.add(extra[1])
    assert extras == {0, 1}


def test_a_draft_whose_uniform_equals_p_over_q_exactly_is_rejected():
    """Accept x when u * q(x) < p(x), strictly: u is a float32 uniform on a grid of 2**-24 in
    [0, 1), and P(u < a) is exactly a for a on that grid, where `<=` would accept one grid
    point too many (and a token with p(x) = 0 when u is 0). A seed is chosen whose first
    uniform equals the target's p(x) bit for bit (q(x) = 1: a deterministic drafter)."""
    for seed in range(100):
        u = torch.rand(1, generator=torch.Generator().manual_seed(seed))[0]
        row = torch.log(torch.tensor([float(u), 1 - float(u), 0, 0, 0, 0], dtype=torch.float64)).float()
        if probs_from_logits(row, SAMPLED)[0] == u:
            break
    else:
        pytest.fail("no seed whose uniform is exactly representable as p(x)")
    logits = row.expand(1, 2, V).clone()
    n_acc, extra = verify(torch.tensor([[0]]), [1], logits, None, [SAMPLED], [torch.Generator().manual_seed(seed)])
    assert n_acc == [0] and extra == [1]  # rejected at equality; the residual is p without x
