"""Boundaries of `specbench.metrics` the broader tests in test_metrics.py do not pin: the
server's own token count, latencies timed from the send, chunk ITL, tokens per target pass,
acceptance a server reported without step events, the per-step columns, structured-output
validity, pass-through extras and `meets_slo`'s edges."""

from __future__ import annotations

import pytest

from specbench.config import SamplingParams
from specbench.metrics import match_fields, meets_slo, sample_metrics
from specbench.structured import OutputConstraint
from specbench.types import ReportedAcceptance, Request, Result, StepEvent


def _req(**kw) -> Request:
    return Request(id="p0", prompt_ids=(1, 2, 3), sampling=SamplingParams(), **kw)


def _res(**kw) -> Result:
    base = dict(request_id="p0", output_ids=[7, 8, 9], arrival_time=10.0, start_time=10.5,
                token_times=[11.0, 11.5, 12.0], finish_reason="stop")
    base.update(kw)
    return Result(**base)


def _step(drafted: int, accepted: int, **kw) -> StepEvent:
    return StepEvent(drafted=drafted, accepted=accepted, first_rejection=-1 if accepted == drafted else accepted,
                     emitted=accepted + 1, draft_time_s=0.0, verify_time_s=0.0, **kw)


# --- output token count -------------------------------------------------------------------

def test_server_token_count_overrides_the_client_ids():
    """`extra["output_tokens"]` (usage.completion_tokens) is the count, not the re-tokenized ids:
    output_tokens, TPOT's denominator and tokens per target pass all use it."""
    m = sample_metrics(_req(), _res(extra={"output_tokens": 5}, target_forward_passes=2))
    assert m["output_tokens"] == 5
    assert m["tpot_s"] == pytest.approx(1.0 / 4)  # (E2E 2.0 - TTFT 1.0) / (5 - 1)
    assert m["tokens_per_target_pass"] == pytest.approx(2.5)


def test_tokens_per_target_pass_and_none_without_passes():
    """Output tokens / target forward passes; None (not a division error or 0) without passes."""
    assert sample_metrics(_req(), _res(target_forward_passes=2))["tokens_per_target_pass"] == pytest.approx(1.5)
    assert sample_metrics(_req(), _res(target_forward_passes=0))["tokens_per_target_pass"] is None


def test_tpot_is_defined_from_exactly_two_tokens():
    """TPOT needs two output tokens: two give one gap, one gives None."""
    m = sample_metrics(_req(), _res(output_ids=[7, 8], token_times=[11.0, 11.25]))
    assert m["tpot_s"] == pytest.approx(0.25)
    one = sample_metrics(_req(), _res(output_ids=[7], token_times=[11.0]))
    assert one["tpot_s"] is None


# --- latencies timed from the send -----------------------------------------------------------

def test_latencies_are_timed_from_the_send_and_the_wait_before_is_queue():
    """With `sent_time`, TTFT / E2E start at the send and queue_s is the client's wait before
    it (not the server's prefill start); sent_s is the send on the configuration's clock."""
    m = sample_metrics(_req(), _res(sent_time=10.25), config_start=9.0)
    assert m["ttft_s"] == pytest.approx(0.75) and m["e2e_s"] == pytest.approx(1.75)
    assert m["queue_s"] == pytest.approx(0.25)
    assert m["arrival_s"] == pytest.approx(1.0) and m["sent_s"] == pytest.approx(1.25)
    assert m["finish_s"] == pytest.approx(3.0)


def test_without_a_send_the_queue_ends_at_the_prefill_start():
    """No `sent_time`: latencies from arrival, sent_s is the prefill start (out of the queue)."""
    m = sample_metrics(_req(), _res(), config_start=9.0)
    assert m["ttft_s"] == pytest.approx(1.0) and m["queue_s"] == pytest.approx(0.5)
    assert m["sent_s"] == pytest.approx(1.5)
    bare = sample_metrics(_req(), _res())
    assert bare["sent_s"] is None and bare["arrival_s"] is None and bare["finish_s"] is None


def test_config_start_of_zero_still_anchors_arrival_and_finish():
    """A configuration that started at perf_counter 0.0 is a start, not a missing one."""
    m = sample_metrics(_req(), _res(), config_start=0.0)
    assert m["arrival_s"] == pytest.approx(10.0) and m["sent_s"] == pytest.approx(10.5)
    assert m["finish_s"] == pytest.approx(12.0)


def test_chunk_itl_is_the_gaps_between_distinct_emission_times():
    """Tokens that arrived together are one chunk: the gaps are between chunks, zero gaps
    dropped (ITL keeps them)."""
    times = [1.0, 1.0, 1.5, 1.5, 1.5, 2.25, 3.0, 3.0]
    m = sample_metrics(_req(), _res(output_ids=list(range(8)), token_times=times))
    assert m["chunk_itl_s"] == pytest.approx([0.5, 0.75, 0.75])
    assert m["itl_s"] == pytest.approx([0.0, 0.5, 0.0, 0.0, 0.75, 0.75, 0.0])
    single = sample_metrics(_req(), _res(output_ids=[1], token_times=[1.0]))
    assert single["chunk_itl_s"] == []
    burst = sample_metrics(_req(), _res(output_ids=[1, 2, 3], token_times=[2.0, 2.0, 2.0]))
    assert burst["chunk_itl_s"] == []


# --- acceptance -----------------------------------------------------------------------------

def test_a_one_token_draft_step_is_a_verification_step():
    """Steps that proposed a single draft token (k=1, a short n-gram match) count as
    verification steps; dropping them would leave the sample with no acceptance at all."""
    m = sample_metrics(_req(), _res(steps=[_step(1, 1), _step(0, 0), _step(1, 0)]))
    assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (2, 2, 1)
    assert m["acceptance_rate"] == 0.5 and m["mean_acceptance_length"] == 1.5
    assert m["accepted_per_step"] == [1, 0] and m["rejection_positions"] == [-1, 0]


def test_reported_acceptance_fills_totals_and_per_step_lists():
    """Without step events the server's per-request figures are the acceptance; per-step
    arrays give accepted_per_step and rejection positions (-1 where all drafts were accepted,
    including an accepted count at or past the drafted one)."""
    ra = ReportedAcceptance(source="vllm", num_steps=3, drafted=9, accepted=5,
                            accepted_per_step=(3, 2, 0), drafted_per_step=(3, 3, 3))
    m = sample_metrics(_req(), _res(reported_acceptance=ra))
    assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (3, 9, 5)
    assert m["acceptance_rate"] == pytest.approx(5 / 9)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 5 / 3)
    assert m["accepted_per_step"] == [3, 2, 0]
    assert m["rejection_positions"] == [-1, 2, 0]
    assert m["step_drafted"] == []  # the server does not say which target steps drafted nothing


def test_reported_per_step_lists_are_used_only_when_they_pair_up():
    """Per-step arrays missing or of different lengths give empty lists, never a misaligned
    pairing; the totals are still used."""
    for acc, dr in (((2, 1), None), (None, (3, 3)), ((2, 1), (3, 3, 3))):
        ra = ReportedAcceptance(source="vllm", num_steps=2, drafted=6, accepted=3,
                                accepted_per_step=acc, drafted_per_step=dr)
        m = sample_metrics(_req(), _res(reported_acceptance=ra))
        assert m["accepted_per_step"] == [] and m["rejection_positions"] == []
        assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (2, 6, 3)


def test_reported_acceptance_without_drafts_reads_length_one():
    """A server that reported zero drafting steps: no rate, mean acceptance length 1.0."""
    ra = ReportedAcceptance(source="sglang", num_steps=0, drafted=0, accepted=0)
    m = sample_metrics(_req(), _res(reported_acceptance=ra))
    assert m["acceptance_rate"] is None and m["mean_acceptance_length"] == 1.0


def test_step_events_win_over_reported_acceptance():
    """A sample with drafting steps of its own counts them, not what a server reported."""
    ra = ReportedAcceptance(source="vllm", num_steps=9, drafted=99, accepted=50,
                            accepted_per_step=(1,), drafted_per_step=(2,))
    m = sample_metrics(_req(), _res(steps=[_step(2, 2), _step(0, 0)], reported_acceptance=ra))
    assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (1, 2, 2)
    assert m["accepted_per_step"] == [2] and m["rejection_positions"] == [-1]


def test_reported_acceptance_used_when_the_steps_drafted_nothing():
    """Plain decode steps only (no drafts) leave the server's figures in charge."""
    ra = ReportedAcceptance(source="vllm", num_steps=1, drafted=4, accepted=4,
                            accepted_per_step=(4,), drafted_per_step=(4,))
    m = sample_metrics(_req(), _res(steps=[_step(0, 0)], reported_acceptance=ra))
    assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (1, 4, 4)
    assert m["accepted_per_step"] == [4] and m["rejection_positions"] == [-1]


# --- per-step columns and pass-through fields ---------------------------------------------------

def test_step_columns_hold_one_entry_per_step_in_order():
    steps = [
        StepEvent(drafted=3, accepted=1, first_rejection=1, emitted=2, draft_time_s=0.5, verify_time_s=0.25,
                  batch_size=4, context_tokens=10, draft_depth=3, accepted_ranks=(0,)),
        StepEvent(drafted=0, accepted=0, first_rejection=-1, emitted=1, draft_time_s=0.0, verify_time_s=0.125),
    ]
    m = sample_metrics(_req(), _res(steps=steps, prefill_time_s=0.75))
    assert m["step_batch_size"] == [4, None]
    assert m["step_context_tokens"] == [10, None]
    assert m["step_drafted"] == [3, 0]
    assert m["step_accepted"] == [1, 0]
    assert m["step_emitted"] == [2, 1]
    assert m["step_draft_depth"] == [3, None]
    assert m["step_accepted_ranks"] == [[0], None]
    assert m["step_draft_time_s"] == [0.5, 0.0]
    assert m["step_verify_time_s"] == [0.25, 0.125]
    assert m["draft_time_s"] == pytest.approx(0.5) and m["verify_time_s"] == pytest.approx(0.375)
    assert m["prefill_time_s"] == 0.75


def test_backend_extras_pass_through():
    """token_count_delta, the client's loop lag and attempts come from `Result.extra`, None
    when the backend did not record them."""
    m = sample_metrics(_req(), _res(extra={"token_count_delta": -2, "loop_lag_s": 0.003, "attempts": 2}))
    assert (m["token_count_delta"], m["client_loop_lag_s"], m["attempts"]) == (-2, 0.003, 2)
    bare = sample_metrics(_req(), _res())
    assert (bare["token_count_delta"], bare["client_loop_lag_s"], bare["attempts"]) == (None, None, None)


def test_an_explicit_reference_wins_over_expected_ids():
    """`reference_ids` (the baseline's output) is compared against, not the prompt's own."""
    m = sample_metrics(_req(expected_ids=(1, 1, 1)), _res(), reference_ids=[7, 8, 9])
    assert m["token_match_rate"] == 1.0 and m["first_divergence"] == -1


def test_match_fields_rate_counts_only_agreeing_positions():
    assert match_fields([1, 5, 3, 5], [1, 2, 3, 4]) == (0.5, 1)
    assert match_fields((4,), (4,)) == (1.0, -1)


# --- structured-output validity ---------------------------------------------------------------

JSON_OBJ = OutputConstraint("json_object", "{}", "json")


def test_valid_and_invalid_structured_output():
    ok = sample_metrics(_req(constraint=JSON_OBJ), _res(output_text='{"a": 1}'))
    assert ok["output_valid"] is True and ok["validation_error"] is None
    bad = sample_metrics(_req(constraint=JSON_OBJ), _res(output_text="[1]"))
    assert bad["output_valid"] is False and bad["validation_error"] == "a JSON list, not an object"


def test_an_invalid_output_cut_at_the_length_limit_says_so():
    """The message tells a truncated output from a wrong one; a valid one cut at the limit
    has no error to annotate."""
    cut = sample_metrics(_req(constraint=JSON_OBJ), _res(output_text='{"a": ', finish_reason="length"))
    assert cut["output_valid"] is False
    assert cut["validation_error"].endswith(" (the output was cut at max_new_tokens)")
    assert cut["validation_error"].startswith("not JSON: ")
    stopped = sample_metrics(_req(constraint=JSON_OBJ), _res(output_text='{"a": ', finish_reason="stop"))
    assert "cut at max_new_tokens" not in stopped["validation_error"]
    fine = sample_metrics(_req(constraint=JSON_OBJ), _res(output_text="{}", finish_reason="length"))
    assert fine["output_valid"] is True and fine["validation_error"] is None


@pytest.mark.parametrize("constraint, kw", [
    (None, {"output_text": "anything"}),  # a free prompt
    (OutputConstraint("grammar", "start: /x/", "grammar"), {"output_text": "not x"}),  # checked by the decoder
    (JSON_OBJ, {"output_text": "[", "error": "boom", "finish_reason": "error"}),  # a failed request
    (JSON_OBJ, {"output_text": None}),  # a backend that gave no text
])
def test_validity_is_null_where_it_cannot_be_judged(constraint, kw):
    m = sample_metrics(_req(constraint=constraint), _res(**kw))
    assert m["output_valid"] is None and m["validation_error"] is None


# --- meets_slo ----------------------------------------------------------------------------------

ROW = {"finish_reason": "stop", "ttft_s": 0.1, "tpot_s": 0.02, "e2e_s": 1.0}


def test_meets_slo_is_none_without_slos():
    assert meets_slo(ROW, None) is None and meets_slo(ROW, {}) is None


def test_meets_slo_each_bound_in_ms_and_inclusive():
    assert meets_slo(ROW, {"ttft": 100, "tpot": 20, "e2el": 1000}) is True
    assert meets_slo(ROW, {"tpot": 19.9}) is False
    assert meets_slo(ROW, {"e2el": 999}) is False
    assert meets_slo(ROW, {"ttft": 99}) is False


def test_meets_slo_single_token_tpot_counts_as_zero():
    """A one-token answer has no TPOT (None); vLLM counts it as 0, which meets any bound."""
    row = dict(ROW, tpot_s=None)
    assert meets_slo(row, {"tpot": 0}) is True
    assert meets_slo(dict(ROW, tpot_s=0.0), {"tpot": 0}) is True


def test_meets_slo_fails_a_failed_or_tokenless_request():
    assert meets_slo(dict(ROW, finish_reason="error"), {"ttft": 1e9}) is False
    assert meets_slo(dict(ROW, ttft_s=None), {"e2el": 1e9}) is False
    assert meets_slo({"ttft_s": 0.1, "tpot_s": 0.0}, {"ttft": 100}) is True  # no finish_reason: not a failure
    assert meets_slo(dict(ROW, e2e_s=None), {"e2el": 1e9}) is False  # no E2E cannot meet an E2E bound
