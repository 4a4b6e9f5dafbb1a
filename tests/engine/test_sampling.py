"""`specbench.engine.sampling` on hand-made logits: temperature, then top-k, then top-p, as
transformers and vLLM order them; top-k keeps ties with the k-th logit; top-p keeps the
smallest prefix whose mass reaches p and always the most likely token; rows are independent;
the probabilities are float32 whatever the logits' dtype."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.config import SamplingParams
from specbench.engine.sampling import make_generator, probs_from_logits, sample, sampling_groups


def logits_of(*probs: float) -> torch.Tensor:
    return torch.log(torch.tensor(probs, dtype=torch.float64)).float()


def kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs > 0).flatten().tolist()


def sp(**kw) -> SamplingParams:
    return SamplingParams(temperature=kw.pop("temperature", 1.0), **kw)


def test_temperature_divides_the_logits_before_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    for t in (0.5, 1.0, 2.0):
        assert torch.allclose(probs_from_logits(logits, sp(temperature=t)), torch.softmax(logits / t, -1))


@pytest.mark.parametrize("top_k", [0, 4, 50])
def test_top_k_zero_or_at_least_the_vocabulary_is_off(top_k):
    logits = logits_of(0.4, 0.3, 0.2, 0.1)
    assert torch.allclose(probs_from_logits(logits, sp(top_k=top_k)), torch.tensor([0.4, 0.3, 0.2, 0.1]))


def test_top_k_keeps_the_k_most_likely_renormalized():
    probs = probs_from_logits(logits_of(0.1, 0.4, 0.2, 0.3), sp(top_k=2))
    assert kept(probs) == [1, 3]
    assert torch.allclose(probs, torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))


def test_top_k_one_is_the_argmax():
    probs = probs_from_logits(logits_of(0.1, 0.2, 0.6, 0.1), sp(top_k=1))
    assert probs.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_top_k_keeps_every_token_tied_with_the_kth():
    # as transformers' TopKLogitsWarper: what is strictly below the k-th logit goes
    probs = probs_from_logits(torch.tensor([1.0, 3.0, 1.0, 1.0, 0.0]), sp(top_k=2))
    assert kept(probs) == [0, 1, 2, 3]


def test_top_p_one_is_off():
    logits = logits_of(0.5, 0.25, 0.125, 0.125)
    assert torch.allclose(probs_from_logits(logits, sp(top_p=1.0)), torch.tensor([0.5, 0.25, 0.125, 0.125]))


def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_p():
    logits = logits_of(0.25, 0.5, 0.125, 0.125)  # sorted: 0.5, 0.25, 0.125, 0.125
    two = probs_from_logits(logits, sp(top_p=0.74))  # 0.5 alone falls short, 0.5 + 0.25 reaches it
    assert kept(two) == [0, 1] and torch.allclose(two, torch.tensor([1 / 3, 2 / 3, 0.0, 0.0]))
    three = probs_from_logits(logits, sp(top_p=0.76))  # one more token is needed
    assert len(kept(three)) == 3 and math.isclose(float(three.sum()), 1.0, rel_tol=1e-6)


def test_top_p_below_the_most_likely_token_keeps_it_alone():
    probs = probs_from_logits(logits_of(0.2, 0.7, 0.1), sp(top_p=0.01))
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_top_p_applies_to_the_top_k_distribution():
    # top-k first: {0.4, 0.3} renormalizes to {4/7, 3/7}, and 4/7 alone reaches p = 0.5;
    # top-p first would keep both tokens (0.4 < 0.5)
    probs = probs_from_logits(logits_of(0.4, 0.3, 0.2, 0.1), sp(top_k=2, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_rows_are_filtered_independently():
    logits = torch.stack([logits_of(0.5, 0.25, 0.125, 0.125), logits_of(0.125, 0.125, 0.25, 0.5)])
    probs = probs_from_logits(logits, sp(top_p=0.74))
    assert kept(probs[0]) == [0, 1] and kept(probs[1]) == [2, 3]
    assert torch.allclose(probs.sum(-1), torch.ones(2))


def test_probabilities_are_float32_from_bfloat16_logits():
    probs = probs_from_logits(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16), sp(top_p=0.9))
    assert probs.dtype == torch.float32 and math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)


def test_greedy_requests_have_no_distribution():
    with pytest.raises(AssertionError, match=r"^greedy requests use argmax, not a distribution$"):
        probs_from_logits(torch.zeros(3), SamplingParams())


def test_sampling_groups_split_greedy_rows_and_group_the_rest_by_filter():
    rows = [SamplingParams(), sp(top_k=5, seed=1), SamplingParams(max_new_tokens=3), sp(top_k=5, seed=2),
            sp(top_p=0.9)]
    greedy, groups = sampling_groups(rows)
    assert greedy == [0, 2]
    assert [(g.top_k, g.top_p, idx) for g, idx in groups] == [(5, 1.0, [1, 3]), (0, 0.9, [4])]


def test_a_request_generator_reproduces_its_draws():
    probs = torch.full((50,), 1 / 50)
    draws = [[sample(probs, g) for _ in range(20)] for g in (make_generator(7, torch.device("cpu")),
                                                             make_generator(7, torch.device("cpu")))]
    assert draws[0] == draws[1]
    other = make_generator(8, torch.device("cpu"))
    assert [sample(probs, other) for _ in range(20)] != draws[0]
