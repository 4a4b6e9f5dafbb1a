"""The physics checks (`specbench.analysis.physics`) at their boundaries: each flags exactly the
impossible numbers and nothing else. The sweep tests reach them only through a whole sweep in a
subprocess; these pin every comparison and every skipped input (issue 43's mutation run found
them untested in-process)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specbench.analysis import physics
from specbench.analysis.physics import SPEEDUP_TOLERANCE, median_step_s, mal_threshold, speedup_bound, step_ratio


def test_the_tolerance_is_ten_percent():
    assert SPEEDUP_TOLERANCE == 0.10


@pytest.mark.parametrize("speedup, mal, flagged", [
    (2.0, 2.0, False),                # at the MAL
    (2.2, 2.0, False),                # exactly at the tolerance (2.2 is not > 2.0 * 1.1 in floats)
    (2.2001, 2.0, True),              # just past it
    (1.5, 1.0, True),                 # a baseline-length MAL leaves 10% at most
    (1.1, 1.0, False),
    (0.5, 3.0, False),                # slower is never impossible
])
def test_speedup_bound_flags_a_speedup_past_the_mal_and_its_tolerance(speedup, mal, flagged):
    got = speedup_bound(speedup, mal)
    assert bool(got) is flagged
    if flagged:
        assert got == [f"inconsistent: TPOT speedup {speedup:.3f}x exceeds tokens per target pass "
                       f"({mal:.3f}) by more than 10%: {physics.LOAD}"]


@pytest.mark.parametrize("speedup, mal", [
    (None, 2.0), (5.0, None), (math.nan, 2.0), (5.0, math.inf), (5.0, 0.0), (5.0, -1.0), ("5", 2.0),
])
def test_speedup_bound_says_nothing_without_two_finite_numbers_and_a_positive_mal(speedup, mal):
    assert speedup_bound(speedup, mal) == []


def test_finite_wants_every_value_a_finite_number():
    assert physics._finite(1, 2.5, 0)
    assert not physics._finite(1, None)
    assert not physics._finite(math.nan)
    assert not physics._finite(-math.inf, 1)
    assert not physics._finite("1.0")
    assert physics._finite()  # nothing to check is not a failure


def samples(*rows):
    """Records with per-step verify times and drafted counts (None for a missing list)."""
    return pd.DataFrame({"step_verify_time_s": [r[0] for r in rows], "step_drafted": [r[1] for r in rows]})


def test_median_step_takes_drafting_steps_or_plain_steps_across_samples():
    frame = samples(([0.1, 0.2, 0.3], [4, 0, 4]), ([0.5, 0.7], [0, 4]), ([9.0], [0]))
    assert median_step_s(frame, drafting=True) == pytest.approx(0.3)   # 0.1, 0.3, 0.7
    assert median_step_s(frame, drafting=False) == pytest.approx(0.5)  # 0.2, 0.5, 9.0


def test_median_step_leaves_out_missing_empty_and_non_finite_times():
    frame = samples(([0.1, math.nan, 0.4], [1, 1, 1]), (None, [1]), ([0.2], None), ([], []),
                    ([math.inf, 0.3], [1, 1]))
    assert median_step_s(frame, drafting=True) == pytest.approx(0.3)  # 0.1, 0.4, 0.3
    assert median_step_s(frame, drafting=False) is None                # no plain step at all


def test_median_step_of_samples_without_any_step_list_is_none():
    """Every sample skipped (failed requests record no steps): no median, not 0 and not an error."""
    assert median_step_s(samples((None, [1]), ([0.1], None), ([], [])), drafting=True) is None
    assert median_step_s(samples((None, None)), drafting=False) is None


@pytest.mark.parametrize("frame", [None, pd.DataFrame(), pd.DataFrame({"x": [1]})])
def test_median_step_of_no_samples_or_no_step_column_is_none(frame):
    assert median_step_s(frame, drafting=True) is None


def test_step_ratio_is_the_speculative_verify_step_over_the_baseline_decode_step():
    base = samples(([0.010, 0.020, 0.030], [0, 0, 0]))
    spec = samples(([0.050, 0.030, 0.040], [4, 4, 0]), ([0.025], [2]))
    # spec drafting steps 0.050, 0.030, 0.025 -> 0.030; base plain steps -> 0.020
    assert step_ratio(base, spec) == pytest.approx(1.5)
    # the roles are not symmetric: the baseline's drafting steps and the configuration's plain
    # ones are not what is compared
    assert step_ratio(spec, base) is None


def test_step_ratio_is_none_without_both_medians_or_with_a_zero_baseline():
    spec = samples(([0.05], [4]))
    assert step_ratio(None, spec) is None
    assert step_ratio(samples(([0.02], [0])), None) is None
    assert step_ratio(samples(([0.0], [0])), spec) is None


@pytest.mark.parametrize("value, flagged", [(0.999, True), (0.0, True), (-2.0, True), (1.0, False), (1.5, False),
                                            (None, False), (math.nan, False)])
def test_a_mal_threshold_below_one_is_flagged_at_one_it_is_not(value, flagged):
    got = mal_threshold("the break-even MAL", value)
    assert bool(got) is flagged
    if flagged:
        assert got == [f"inconsistent: the break-even MAL {value:.3f} is below 1, which a mean acceptance length "
                       "never is (the target always adds its own token): the speedup it was derived from exceeds "
                       "the tokens per target pass"]
