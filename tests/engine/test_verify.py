"""Verification rule tests on synthetic distributions: the token a step emits at a position
must be distributed exactly as the target's p, whatever the drafter's q."""

import numpy as np
import pytest
import torch

from gof import gof_pvalue
from specbench.engine.verify import verify_greedy, verify_sampled

V = 6


P = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1, 0.0])
QS = {
    "q_equals_p": P.clone(),
    "disjoint_support": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
    "q_with_zeros": torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0]),
    "overconfident": torch.tensor([0.02, 0.9, 0.02, 0.02, 0.02, 0.02]),
    "uniform": torch.full((V,), 1 / V),
}


def emitted_first_tokens(q: torch.Tensor | None, one_hot_token: int | None, n: int, verifier) -> np.ndarray:
    """Draw a draft from q (or use a fixed token: a deterministic drafter), verify it against
    p, and count the token emitted at the draft's position."""
    g = torch.Generator().manual_seed(1234)
    p = torch.stack([P, torch.full((V,), 1 / V)])  # p for position 0 and the bonus position
    counts = np.zeros(V, dtype=np.int64)
    for _ in range(n):
        if q is None:
            draft, qq = [one_hot_token], None
        else:
            draft, qq = [int(torch.multinomial(q, 1, generator=g))], q[None]
        n_acc, extra = verifier(draft, qq, p, g)
        counts[draft[0] if n_acc == 1 else extra] += 1
    return counts


@pytest.mark.parametrize("name", sorted(QS))
def test_emitted_token_follows_target_distribution(name):
    counts = emitted_first_tokens(QS[name], None, 6000, verify_sampled)
    assert counts[5] == 0  # p(5) = 0: never emitted, even when q proposes it
    assert gof_pvalue(counts, P.numpy()) > 1e-3


@pytest.mark.parametrize("token", [1, 4, 5])
def test_one_hot_drafter_follows_target_distribution(token):
    counts = emitted_first_tokens(None, token, 6000, verify_sampled)
    assert gof_pvalue(counts, P.numpy()) > 1e-3


def _resample_from_p(draft, q, p, g):
    """A classic bug: on rejection, resample from p instead of the residual max(0, p - q)."""
    n, extra = verify_sampled(draft, q, p, g)
    if n < len(draft):
        extra = int(torch.multinomial(p[n], 1, generator=g))
    return n, extra


def _accept_always(draft, q, p, g):
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=g))


@pytest.mark.parametrize("broken", [_resample_from_p, _accept_always])
def test_goodness_of_fit_rejects_a_wrong_verifier(broken):
    counts = emitted_first_tokens(QS["overconfident"], None, 6000, broken)
    assert gof_pvalue(counts, P.numpy()) < 1e-6


def test_identical_distributions_accept_everything():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, V), -1)
    accepted = 0
    for _ in range(200):
        draft = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(3)]
        n, _ = verify_sampled(draft, p[:3], p, g)
        accepted += n
    assert accepted == 600


def test_zero_residual_falls_back_to_p():
    # q puts more mass than p everywhere it matters only through rounding: residual sums to 0.
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.5, 0.5, 0.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        n, extra = verify_sampled([0], q, p, g)
        assert n == 1 or extra in (0, 1)


def test_greedy_accepts_matching_prefix_then_emits_target_argmax():
    logits = torch.full((4, V), -10.0)
    for pos, tok in enumerate([2, 3, 1, 4]):
        logits[pos, tok] = 10.0
    assert verify_greedy([2, 3, 5], logits) == (2, 1)  # third draft wrong: correction is 1
    assert verify_greedy([2, 3, 1], logits) == (3, 4)  # all accepted: bonus is 4
    assert verify_greedy([0], logits) == (0, 2)
    assert verify_greedy([], logits) == (0, 2)
