"""Boundaries of the group-sequential rule (specbench.analysis.sequential): the settings it
refuses, the error each look spends (first, interim, last, repeated), the fewest prompts and
blocks a look decides on, the interval's exact form, and the per-prompt log ratios it reads.
Hand-built arrays; no simulation."""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from specbench.analysis.sequential import Look, Monitor, SequentialRule, log_ratios

# per-prompt log ratios around 0 (no effect), too noisy to decide at any look below
UNDECIDED = np.array([0.15, -0.2, 0.05, -0.1, 0.25, -0.15, 0.1, -0.05, 0.2, -0.25, 0.0, 0.12])
# a clear 1.65x speedup
CLEAR = np.array([0.5, 0.52, 0.48, 0.51, 0.5, 0.49])


def _expected_interval(d, level):
    """exp(mean(d) -+ t_{1 - level / 2, n - 1} * sd(d) / sqrt(n)), the module docstring's look."""
    d = np.asarray(d, dtype=float)
    half = stats.t.ppf(1 - level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return math.exp(d.mean() - half), math.exp(d.mean() + half)


# --- settings -------------------------------------------------------------------------------


def test_a_bad_spending_function_is_refused_with_the_choices_listed():
    with pytest.raises(ValueError, match=r"^spending must be one of pocock, obrien-fleming, got 'bonferroni'$"):
        SequentialRule(planned=4, spending="bonferroni")


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_alpha_must_lie_strictly_between_0_and_1(alpha):
    """alpha 0 would never spend anything (no look could decide), alpha 1 every interval."""
    with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\)"):
        SequentialRule(planned=4, alpha=alpha)


def test_one_planned_prompt_is_a_valid_plan_and_zero_is_refused():
    rule = SequentialRule(planned=1)
    assert rule.spent(1) == pytest.approx(0.05)
    with pytest.raises(ValueError, match=r"^planned must be >= 1, got 0$"):
        SequentialRule(planned=0)


# --- error spending -------------------------------------------------------------------------


def test_each_spending_function_spends_its_documented_share_halfway():
    """At t = 1/2: Pocock's type alpha * ln(1 + (e - 1) / 2), O'Brien-Fleming's type
    2 - 2 Phi(z_{1 - alpha/2} / sqrt(1/2)); they must not be swapped."""
    pocock = SequentialRule(planned=24, spending="pocock")
    obf = SequentialRule(planned=24, spending="obrien-fleming")
    assert pocock.spent(12) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))
    z = NormalDist().inv_cdf(0.975)
    assert obf.spent(12) == pytest.approx(2 - 2 * NormalDist().cdf(z / math.sqrt(0.5)))
    assert obf.spent(12) < pocock.spent(12)


@pytest.mark.parametrize("spending", ["pocock", "obrien-fleming"])
def test_more_prompts_than_planned_spend_no_more_than_alpha(spending):
    """A trial that measured more prompts than planned still spends alpha in all, never more."""
    rule = SequentialRule(planned=24, spending=spending)
    assert rule.spent(48) == pytest.approx(0.05)


def test_the_first_look_spends_its_share_from_nothing():
    """The first look (no previous look: 0 prompts) spends A(n / planned), not A(n) - A(1)."""
    rule = SequentialRule(planned=24)
    assert rule.look(UNDECIDED[:6], final=False).level == pytest.approx(rule.spent(6))
    assert Monitor(rule).update(UNDECIDED[:6]).level == pytest.approx(rule.spent(6))


def test_an_interim_look_spends_its_increment_and_a_last_look_before_the_plan_the_rest():
    rule = SequentialRule(planned=24)
    interim = rule.look(UNDECIDED[:8], previous=4, final=False)
    assert interim.level == pytest.approx(rule.spent(8) - rule.spent(4)) and interim.outcome == "continue"
    last = rule.look(UNDECIDED[:8], previous=4, final=True)  # the trial ended after 8 of 24
    assert last.level == pytest.approx(0.05 - rule.spent(4)) and last.outcome == "even"
    # a Monitor passes `final` on
    monitor = Monitor(rule)
    monitor.update(UNDECIDED[:4])
    last = monitor.update(UNDECIDED[:8], final=True)
    assert last.level == pytest.approx(0.05 - rule.spent(4)) and last.outcome == "even"


def test_the_look_at_the_planned_count_is_the_last_and_ends_even():
    """Without `final`, the look at the planned prompt count is the last: it spends what is
    left and an undecided interval is 'even' (stopped), not 'continue'."""
    rule = SequentialRule(planned=12)
    look = rule.look(UNDECIDED, previous=8)
    assert look.outcome == "even" and look.stopped
    assert look.level == pytest.approx(0.05 - rule.spent(8))


def test_a_look_that_spent_nothing_leaves_the_budget_and_every_look_is_kept():
    """A look before `min_prompts` spends nothing, so the next look spends from 0, not from
    that look's count; the Monitor keeps every look."""
    rule = SequentialRule(planned=24)
    monitor = Monitor(rule)
    early = monitor.update(UNDECIDED[:2])
    later = monitor.update(UNDECIDED[:6])
    assert early.level == 0.0 and later.level == pytest.approx(rule.spent(6))
    assert monitor.looks == [early, later]


def test_a_repeated_look_without_new_prompts_spends_nothing_and_spans_zero_to_infinity():
    """Looking again at the same prompts has no error left to spend: the interval is [0, inf]
    and cannot decide, even when every ratio is the same (a zero standard error must not turn
    into NaN)."""
    monitor = Monitor(SequentialRule(planned=24))
    first = monitor.update(np.zeros(6))
    assert (first.lo, first.hi, first.outcome) == (1.0, 1.0, "continue")
    again = monitor.update(np.zeros(6))
    assert (again.level, again.lo, again.hi, again.outcome) == (0.0, 0.0, math.inf, "continue")


# --- when a look may decide -----------------------------------------------------------------


def test_an_interim_look_at_exactly_min_prompts_and_min_blocks_decides():
    """4 prompts (`min_prompts`) and, with blocks, 3 blocks (`min_blocks`) are enough for an
    interim look to spend error and stop a clear win."""
    rule = SequentialRule(planned=24)
    look = rule.look(CLEAR[:4], final=False)
    assert look.outcome == "win" and look.level == pytest.approx(rule.spent(4))
    look = rule.look(CLEAR, final=False, clusters=[0, 0, 1, 1, 2, 2])
    assert look.outcome == "win" and look.level == pytest.approx(rule.spent(6))


def test_the_last_look_needs_only_two_prompts_and_two_blocks():
    """The last look decides on two prompts (1 degree of freedom) or two blocks."""
    rule = SequentialRule(planned=24)
    two = rule.look(CLEAR[:2], final=True)
    assert two.outcome == "win" and (two.lo, two.hi) == pytest.approx(_expected_interval(CLEAR[:2], 0.05))
    blocks = rule.look(CLEAR[:4], final=True, clusters=[0, 0, 1, 1])
    assert blocks.outcome == "win" and blocks.level == pytest.approx(0.05) and np.isfinite(blocks.lo)


def test_a_look_too_early_reports_its_count_and_geometric_mean_without_an_interval():
    look = SequentialRule(planned=24).look([0.1, 0.3], final=False)
    assert look.n == 2 and look.point == pytest.approx(math.exp(0.2))
    assert math.isnan(look.lo) and math.isnan(look.hi)
    assert (look.level, look.outcome) == (0.0, "continue")


def test_a_look_with_no_finite_ratio_is_nan_and_silent():
    """Every ratio infinite or NaN (TPOT 0 on a side): nothing to average, a NaN point, no
    'Mean of empty slice' warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        look = SequentialRule(planned=24).look([math.inf, -math.inf, math.nan], final=False)
    assert look.n == 0 and math.isnan(look.point) and math.isnan(look.lo) and look.outcome == "continue"


def test_missing_ratios_given_as_none_are_dropped_like_nan():
    rule = SequentialRule(planned=24)
    with_none = rule.look([0.5, None, 0.52, 0.48, 0.51], final=False)
    assert with_none == rule.look([0.5, 0.52, 0.48, 0.51], final=False)


# --- the interval ---------------------------------------------------------------------------


def test_the_interval_is_the_t_interval_at_the_error_the_look_spends():
    rule = SequentialRule(planned=24)
    look = rule.look(UNDECIDED[:8], previous=4, final=False)
    assert look.point == pytest.approx(math.exp(UNDECIDED[:8].mean()))
    assert (look.lo, look.hi) == pytest.approx(_expected_interval(UNDECIDED[:8], look.level))


def test_ratios_of_exactly_one_are_even_neither_a_win_nor_a_loss():
    """A configuration identical to its baseline: the interval is [1, 1] exactly, which is not
    wholly above 1 nor wholly below it."""
    look = SequentialRule(planned=8).look(np.zeros(8))
    assert (look.point, look.lo, look.hi, look.outcome) == (1.0, 1.0, 1.0, "even")


def test_a_look_as_a_dict_names_its_fields():
    """The sweep stores the trial's last look with `as_dict` (its keys are the trial record's)."""
    look = Look(n=8, point=1.3, lo=1.1, hi=1.5, level=0.02, outcome="win")
    assert look.as_dict() == {"n": 8, "point": 1.3, "lo": 1.1, "hi": 1.5, "level": 0.02, "outcome": "win"}


# --- log_ratios -----------------------------------------------------------------------------


def test_log_ratios_pair_the_shared_prompts_in_the_baselines_order():
    base = pd.Series([0.02, 0.03, 0.04, 0.05], index=["p0", "p1", "p2", "p3"])
    spec = pd.Series([0.01, 0.02, 0.015, 0.5], index=["p2", "p1", "p3", "only_spec"])
    got = log_ratios(base, spec)
    assert got == pytest.approx(np.log([0.03 / 0.02, 0.04 / 0.01, 0.05 / 0.015]))


def test_log_ratios_read_object_dtype_series_as_floats():
    """pd.concat beside an all-None column leaves TPOTs of object dtype: np.log of an object
    array raises, so the values must be read as floats."""
    base = pd.Series([0.02, 0.03], index=["a", "b"], dtype=object)
    spec = pd.Series([0.01, 0.02], index=["a", "b"], dtype=object)
    assert log_ratios(base, spec) == pytest.approx(np.log([2.0, 1.5]))
    assert log_ratios(base.astype(float), spec) == pytest.approx(np.log([2.0, 1.5]))


def test_log_ratios_of_zero_tpots_are_not_finite_and_silent():
    """A TPOT of 0 (an answer in one burst) gives +inf, -inf or NaN, which a look drops,
    without RuntimeWarnings."""
    base = pd.Series([0.02, 0.0, 0.0, 0.02], index=list("abcd"))
    spec = pd.Series([0.0, 0.01, 0.0, 0.01], index=list("abcd"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = log_ratios(base, spec)
    assert got[0] == math.inf and got[1] == -math.inf and math.isnan(got[2]) and got[3] == pytest.approx(math.log(2))
