"""Boundaries of `specbench.acceptance.SpecDecodingStats` the broader tests in
test_acceptance.py do not pin: the defaults of `new` and `observe_accepted`, repeated
histogram buckets, and a one-token draft."""

from __future__ import annotations

from specbench.acceptance import SpecDecodingStats


def test_new_without_k_is_the_same_as_empty_counts():
    """`new()` with no width has no positions and a histogram of just bucket 0; a default of
    one position would report a made-up position 0 for a baseline (per_pos [0], not [])."""
    s = SpecDecodingStats.new()
    assert s == SpecDecodingStats()
    assert s.num_accepted_tokens_per_pos == [] and s.acceptance_histogram == [0]


def test_observe_accepted_zero_without_proposed_adds_no_position():
    """A request that accepted nothing (and says nothing about how much it proposed) counts in
    histogram bucket 0 but must not invent a draft position: the OpenAI backend calls
    `observe_accepted(a)` for each per-step accepted count."""
    s = SpecDecodingStats()
    s.observe_accepted(0)
    assert s.num_accepted_tokens_per_pos == []
    assert s.acceptance_histogram == [1]
    assert s.to_dict()["num_accepted_tokens_per_pos"] == []


def test_histogram_counts_every_draft_that_accepted_the_same_number():
    """Drafts with the same accepted count add up in one bucket (not overwrite it), both from
    steps and from `observe_accepted(j, count=n)` batches (vLLM's per-request histogram)."""
    s = SpecDecodingStats()
    for _ in range(3):
        s.observe_draft(4, 2)
    s.observe_draft(4, 0)
    assert s.acceptance_histogram == [1, 0, 3, 0, 0]

    reported = SpecDecodingStats()
    reported.observe_accepted(1, count=2)
    reported.observe_accepted(1, count=5)
    assert reported.acceptance_histogram == [0, 7]
    assert reported.num_accepted_tokens_per_pos == [7]


def test_a_one_token_draft_is_a_draft():
    """A step that proposed exactly one token (k=1, or a short n-gram match) is a verification
    step in vLLM's sense; only a step that proposed nothing is not."""
    s = SpecDecodingStats()
    s.observe_draft(1, 1)
    s.observe_draft(1, 0)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 2, 1)
    assert s.acceptance_rate == 0.5
    assert s.mean_acceptance_length == 1.5
    assert s.num_accepted_tokens_per_pos == [1] and s.acceptance_histogram == [1, 1]
