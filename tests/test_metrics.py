import math

import pytest

from specbench.config import SamplingParams
from specbench.metrics import METRIC_COLUMNS, match_fields, sample_metrics
from specbench.types import Request, Result, StepEvent


def _req(**kw) -> Request:
    return Request(id="p0", prompt_ids=(1, 2, 3, 4), sampling=SamplingParams(), **kw)


def _step(drafted: int, accepted: int, emitted: int | None = None) -> StepEvent:
    first = -1 if accepted == drafted else accepted
    return StepEvent(drafted=drafted, accepted=accepted, first_rejection=first,
                     emitted=accepted + 1 if emitted is None else emitted,
                     draft_time_s=0.01 * drafted, verify_time_s=0.02)


def _spec_result() -> Result:
    # Arrival at 10.0, prefill starts at 10.5, first token (from prefill) at 11.0.
    # Step 1: k=3, 2 accepted -> 3 tokens at 11.2; step 2: 3 accepted -> 4 tokens at 11.5;
    # step 3: 0 accepted -> 1 token at 11.6. 9 tokens total.
    times = [11.0] + [11.2] * 3 + [11.5] * 4 + [11.6]
    return Result(
        request_id="p0", output_ids=list(range(100, 109)), arrival_time=10.0, start_time=10.5,
        token_times=times, finish_reason="length",
        steps=[_step(3, 2), _step(3, 3), _step(3, 0)],
        target_forward_passes=4, prefill_time_s=0.4, peak_memory_bytes=12345,
    )


def test_latencies_from_known_timestamps():
    m = sample_metrics(_req(), _spec_result(), config_start=9.0)
    assert m["ttft_s"] == pytest.approx(1.0)
    assert m["queue_s"] == pytest.approx(0.5)
    assert m["e2e_s"] == pytest.approx(1.6)
    assert m["tpot_s"] == pytest.approx(0.6 / 8)
    assert m["arrival_s"] == pytest.approx(1.0)
    assert m["finish_s"] == pytest.approx(2.6)
    assert m["input_tokens"] == 4 and m["output_tokens"] == 9


def test_itl_keeps_zero_gaps_inside_accepted_bursts():
    m = sample_metrics(_req(), _spec_result())
    assert m["itl_s"] == pytest.approx([0.2, 0, 0, 0.3, 0, 0, 0, 0.1])
    assert len(m["itl_s"]) == m["output_tokens"] - 1
    # TPOT is the mean ITL by construction
    assert sum(m["itl_s"]) / len(m["itl_s"]) == pytest.approx(m["tpot_s"])


def test_acceptance_counts_rate_and_mean_length():
    m = sample_metrics(_req(), _spec_result())
    assert m["drafted_tokens"] == 9
    assert m["accepted_tokens"] == 5
    assert m["num_steps"] == 3
    assert m["acceptance_rate"] == pytest.approx(5 / 9)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 5 / 3)
    assert m["accepted_per_step"] == [2, 3, 0]
    assert m["rejection_positions"] == [2, -1, 0]
    assert m["draft_time_s"] == pytest.approx(0.09)
    assert m["verify_time_s"] == pytest.approx(0.06)
    assert m["target_forward_passes"] == 4
    assert m["peak_memory_bytes"] == 12345
    assert m["finish_reason"] == "length" and m["error"] is None
    assert m["output_token_ids"] == list(range(100, 109))


def test_steps_without_drafts_do_not_count_as_verification_steps():
    r = _spec_result()
    r.steps = [_step(0, 0, emitted=1), _step(3, 2), _step(0, 0, emitted=1)]
    m = sample_metrics(_req(), r)
    assert m["num_steps"] == 1
    assert m["accepted_per_step"] == [2]
    assert m["mean_acceptance_length"] == pytest.approx(3.0)


def test_baseline_has_no_acceptance_and_length_one():
    r = Result(request_id="p0", output_ids=[5, 6, 7], arrival_time=0.0, start_time=0.0,
               token_times=[0.1, 0.2, 0.3], finish_reason="stop",
               steps=[_step(0, 0, emitted=1)] * 2, target_forward_passes=3)
    m = sample_metrics(_req(), r)
    assert m["drafted_tokens"] == 0 and m["accepted_tokens"] == 0 and m["num_steps"] == 0
    assert m["acceptance_rate"] is None
    assert m["mean_acceptance_length"] == 1.0
    assert m["accepted_per_step"] == [] and m["rejection_positions"] == []
    assert m["tpot_s"] == pytest.approx(0.1)
    assert m["arrival_s"] is None and m["finish_s"] is None  # no config_start given


def test_error_result_with_zero_tokens():
    r = Result(request_id="p0", output_ids=[], arrival_time=1.0, start_time=1.2,
               token_times=[], finish_reason="error", error="boom")
    m = sample_metrics(_req(), r, config_start=0.0)
    assert m["output_tokens"] == 0
    assert m["ttft_s"] is None and m["e2e_s"] is None and m["tpot_s"] is None
    assert m["itl_s"] == []
    assert m["queue_s"] == pytest.approx(0.2)
    assert m["arrival_s"] == pytest.approx(1.0) and m["finish_s"] is None
    assert m["error"] == "boom" and m["finish_reason"] == "error"


def test_single_token_has_no_tpot():
    r = Result(request_id="p0", output_ids=[5], arrival_time=0.0, start_time=0.0,
               token_times=[0.25], finish_reason="stop")
    m = sample_metrics(_req(), r)
    assert m["ttft_s"] == pytest.approx(0.25) and m["e2e_s"] == pytest.approx(0.25)
    assert m["tpot_s"] is None and m["itl_s"] == []


def test_returns_exactly_the_metric_columns():
    assert set(sample_metrics(_req(), _spec_result())) == set(METRIC_COLUMNS)


@pytest.mark.parametrize(
    "out, ref, rate, first",
    [
        ([1, 2, 3], [1, 2, 3], 1.0, -1),
        ([1, 2, 9], [1, 2, 3], 2 / 3, 2),
        ([1, 2], [1, 2, 3, 4], 2 / 4, 2),  # prefix: the length difference counts
        ([1, 2, 3, 4], [1, 2], 2 / 4, 2),
        ([9, 2, 3], [1, 2, 3], 2 / 3, 0),  # later positions still count towards the rate
        ([], [], 1.0, -1),
        ([], [1], 0.0, 0),
    ],
)
def test_match_fields(out, ref, rate, first):
    got_rate, got_first = match_fields(out, ref)
    assert got_rate == pytest.approx(rate)
    assert got_first == first


def test_reference_from_argument_or_expected_ids():
    r = _spec_result()
    none = sample_metrics(_req(), r)
    assert none["token_match_rate"] is None and none["first_divergence"] is None
    ref = list(range(100, 109))
    ref[4] = 0
    m = sample_metrics(_req(), r, reference_ids=ref)
    assert m["token_match_rate"] == pytest.approx(8 / 9) and m["first_divergence"] == 4
    m2 = sample_metrics(_req(expected_ids=tuple(range(100, 109))), r)
    assert m2["token_match_rate"] == 1.0 and m2["first_divergence"] == -1
    assert not math.isnan(m2["token_match_rate"])
