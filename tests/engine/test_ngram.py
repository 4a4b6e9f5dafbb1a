"""Prompt lookup (`specbench.engine.drafters.ngram`): the longest matching suffix (from
ngram_max down to ngram_min) wins, its earliest occurrence is used (as vLLM's proposer:
tests/engine/test_ngram_vllm.py compares the two on random sequences), the proposal
stops at k tokens or at the end of the text, and nothing is proposed without a match."""

from __future__ import annotations

from types import SimpleNamespace

from specbench.engine.drafters.ngram import NgramDrafter, lookup


def test_the_tokens_after_the_earlier_occurrence_are_proposed():
    assert lookup([5, 6, 7, 8, 9, 5, 6], k=3, ngram_min=1, ngram_max=4) == [7, 8, 9]


def test_the_longest_matching_suffix_wins_over_an_earlier_shorter_match():
    # suffix (1, 2): the 2-gram occurs at 2 (then 30); the 1-gram 2 occurs earlier, at 0 (then 40)
    ids = [2, 40, 1, 2, 30, 9, 1, 2]
    assert lookup(ids, k=1, ngram_min=1, ngram_max=2) == [30]
    assert lookup(ids, k=1, ngram_min=1, ngram_max=1) == [40]


def test_the_earliest_occurrence_is_used():
    assert lookup([3, 10, 3, 20, 3], k=1, ngram_min=1, ngram_max=1) == [10]


def test_the_proposal_stops_at_k_and_at_the_end_of_the_text():
    ids = [1, 2, 3, 4, 5, 1]
    assert lookup(ids, k=2, ngram_min=1, ngram_max=3) == [2, 3]
    assert lookup([7, 8, 7], k=5, ngram_min=1, ngram_max=3) == [8, 7]


def test_no_match_no_proposal():
    assert lookup([1, 2, 3, 4], k=3, ngram_min=1, ngram_max=4) == []


def test_matches_shorter_than_ngram_min_do_not_count():
    ids = [9, 2, 50, 8, 2]  # only the 1-gram 2 recurs
    assert lookup(ids, k=1, ngram_min=2, ngram_max=3) == []
    assert lookup(ids, k=1, ngram_min=1, ngram_max=3) == [50]


def test_nothing_for_k_zero_or_too_short_a_text():
    assert lookup([4, 4, 4], k=0, ngram_min=1, ngram_max=4) == []
    assert lookup([4], k=3, ngram_min=1, ngram_max=4) == []
    assert lookup([4, 4], k=3, ngram_min=2, ngram_max=4) == []


def test_the_drafter_proposes_per_row_with_each_rows_k_and_a_one_hot_q():
    drafter = NgramDrafter(ngram_min=1, ngram_max=2)
    rows = [SimpleNamespace(ids=[5, 6, 7, 5]), SimpleNamespace(ids=[1, 2, 3, 1]), SimpleNamespace(ids=[8, 9])]
    proposal = drafter.propose(rows, [2, 0, 3])
    assert proposal.tokens == [[6, 7], [], []]
    assert proposal.q is None
