"""`specbench.acceptance.SpecDecodingStats`: vLLM's definitions of drafts, acceptance rate,
mean acceptance length, per-position acceptance and the histogram, counted once for the
metrics, the server and the OpenAI backend."""

from __future__ import annotations

import pytest

from specbench.acceptance import PER_POSITION, PROMETHEUS, SpecDecodingStats
from specbench.types import StepEvent


def step(drafted: int, accepted: int) -> StepEvent:
    return StepEvent(drafted=drafted, accepted=accepted, first_rejection=-1 if accepted == drafted else accepted,
                     emitted=accepted + 1, draft_time_s=0.0, verify_time_s=0.0)


def test_only_steps_that_drafted_are_drafts():
    s = SpecDecodingStats().observe_steps([step(4, 2), step(0, 0), step(4, 4), step(3, 0)])
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 11, 6)
    assert s.acceptance_rate == pytest.approx(6 / 11)
    assert s.mean_acceptance_length == pytest.approx(1 + 6 / 3)  # the bonus token included
    # acceptance is a prefix: a draft that accepted a tokens accepted positions 0..a-1
    assert s.num_accepted_tokens_per_pos == [2, 2, 1, 1]
    assert s.per_position_acceptance == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert s.acceptance_histogram == [1, 0, 1, 0, 1]  # one draft each accepted 0, 2 and 4


def test_nothing_drafted_gives_no_ratios_rather_than_made_up_ones():
    s = SpecDecodingStats().observe_steps([step(0, 0), step(0, 0)])
    assert s.num_drafts == 0 and s.acceptance_rate is None and s.mean_acceptance_length is None
    assert s.per_position_acceptance == [] and s.to_dict()["num_accepted_tokens_per_pos"] == []


def test_new_k_keeps_every_position_and_grows_past_it():
    s = SpecDecodingStats.new(3)
    assert s.num_accepted_tokens_per_pos == [0, 0, 0] and s.acceptance_histogram == [0, 0, 0, 0]
    s.observe_draft(2, 1)
    assert s.num_accepted_tokens_per_pos == [1, 0, 0] and s.acceptance_histogram == [0, 1, 0, 0]
    s.observe_draft(5, 5)  # a longer draft than k widens both lists
    assert s.num_accepted_tokens_per_pos == [2, 1, 1, 1, 1] and len(s.acceptance_histogram) == 6


def test_reported_totals_and_positions_add_up_like_steps():
    by_steps = SpecDecodingStats().observe_steps([step(4, 3), step(4, 1)])
    reported = SpecDecodingStats()
    reported.add_totals(2, 8, 4)
    for a in (3, 1):
        reported.observe_accepted(a)
    reported.observe_accepted(0, 4, count=0)  # positions up to the longest draft, nothing counted
    assert reported.to_dict() == by_steps.to_dict()


def test_to_dict_has_the_run_json_shape_and_vllm_counter_names_cover_its_counts():
    d = SpecDecodingStats().observe_steps([step(2, 1)]).to_dict()
    assert list(d) == ["num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos",
                       "acceptance_rate", "mean_acceptance_length", "per_position_acceptance"]
    assert set(PROMETHEUS) == {"num_drafts", "num_draft_tokens", "num_accepted_tokens"}
    assert all(name.startswith("vllm:spec_decode_") for name, _ in [*PROMETHEUS.values(), PER_POSITION])
