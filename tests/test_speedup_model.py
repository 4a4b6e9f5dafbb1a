"""The fitted speedup model on synthetic records with planted acceptance and step costs
(tests/model_helpers.py): it recovers the planted parameters, predicts points it never saw,
and its held-out error is honest: small for the right cost model, large for a deliberately
wrong one (verify cost that ignores batch size and k)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from model_helpers import Planted, planted_frame, true_speedup
from specbench import speedup_model as sm

FAMILY = "draft_model (tiny-draft)"
P = Planted()


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return planted_frame(P)


@pytest.fixture(scope="module")
def steps(frame) -> pd.DataFrame:
    return sm.model_steps(frame)


@pytest.fixture(scope="module")
def measured(frame) -> pd.DataFrame:
    return sm.measured_points(frame, n_boot=300)


# A verify cost that is the same at every batch size and k: blind to the concurrency cliff.
WRONG = sm.CostForm(
    "constant-verify",
    verify=lambda b, k: np.ones((len(b), 1)),
    draft=sm.LINEAR.draft,
    verify_terms=("v0",), draft_terms=sm.LINEAR.draft_terms)


def test_expected_tokens_is_the_closed_form_for_constant_acceptance():
    a = 0.7
    acc = sm.Acceptance(np.full(8, a), np.full(8, 100.0))
    for k in range(1, 9):
        assert acc.expected_tokens(k) == pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-12)
    assert acc.survival(3) == pytest.approx([a, a * a, a ** 3])


def test_short_drafts_near_the_end_are_not_counted_as_rejections():
    # a step that drafted 2 tokens and accepted both says nothing about position 3
    steps = pd.DataFrame({"drafted": [4, 2, 4], "accepted": [1, 2, 4], "category": ["x"] * 3})
    acc = sm.fit_acceptance(steps)
    assert acc.at_risk.tolist() == [3, 3, 1, 1]
    assert acc.alpha.tolist() == pytest.approx([1.0, 2 / 3, 1.0, 1.0])


def test_fit_recovers_planted_acceptance_per_category(steps):
    model = sm.fit(steps)
    acc = model.acceptance[FAMILY]
    for cat, planted in P.alpha.items():
        got = acc.by_category[cat]
        r = sm._counts(*(lambda d: (d["drafted"].to_numpy(int), d["accepted"].to_numpy(int)))(
            steps[(steps["drafted"] > 0) & (steps["category"] == cat)]), got.size)[0]
        for i in range(got.size):
            if r[i] < 200:  # too few steps at risk there for a tight estimate
                continue
            # binomial standard error at 200+ trials is <= 0.035; allow 3 of them
            assert got[i] == pytest.approx(planted[i], abs=0.1 if r[i] < 800 else 0.05), (cat, i, r[i])
    assert set(acc.weights) == {"code", "chat"} and sum(acc.weights.values()) == pytest.approx(1)


def test_fit_recovers_planted_step_costs(steps):
    cost = sm.fit(steps).cost
    # verify: v0 (per step), v1 (per row), v2 (per row and draft token); 5% noise per step
    assert cost.verify_coef == pytest.approx(P.v, rel=0.05)
    d = cost.draft_coef[FAMILY]
    assert d[1] == pytest.approx(P.d[1], rel=0.05)  # per draft token: the dominant term
    assert d[2] == pytest.approx(P.d[2], abs=2e-4)
    assert d[0] == pytest.approx(P.d[0], abs=1e-3)
    assert cost.r2 > 0.95 and cost.max_batch == 8 and cost.max_k[FAMILY] == 4


def test_a_weak_fit_says_why_and_a_good_one_says_nothing(steps):
    assert sm.fit(steps).cost.weak() == []  # planted costs, 5% noise: R² > 0.95
    noisy = steps.copy()
    rng = np.random.default_rng(0)
    noisy["verify_s"] = rng.permutation(noisy["verify_s"].to_numpy())  # times unrelated to b and k
    why = sm.fit(noisy).cost.weak()
    assert why and "R²" in why[0] and f"< {sm.WEAK_FIT_R2}" in why[0], why
    from specbench.report.model_view import parameter_rows
    assert any("(weak: below 0.5)" in row[3] for row in parameter_rows(sm.fit(noisy)))
    assert not any("weak" in row[3] for row in parameter_rows(sm.fit(steps)))
    flat = steps.copy()
    flat["verify_s"] = 0.02 + 0.001 * flat["batch_size"] + rng.normal(0, 1e-5, len(flat))  # no k term
    why = sm.fit(flat).cost.weak()
    assert any("v2" in w and "zero" in w for w in why), why


def test_held_out_error_is_small_for_the_right_model_and_large_for_a_wrong_one(steps, measured):
    right = sm.evaluate(steps, measured)
    wrong = sm.evaluate(steps, measured, form=WRONG)
    assert len(right.points) == 12 and right.points["heldout"].notna().all()
    # the measurement itself scatters by a few percent (medians over 16 prompts, noisy steps)
    assert right.heldout_error < 0.07 and right.fit_error < 0.07
    # blind to batch size, the wrong model misses the cliff by far, and the error says so
    assert wrong.heldout_error > 0.2
    assert wrong.heldout_error > 4 * right.heldout_error
    worst = wrong.points.loc[wrong.points["heldout_error"].abs().idxmax()]
    assert worst["concurrency"] in (1, 8)  # the ends of the batch-size range


def test_predicts_points_that_were_never_measured():
    frame = planted_frame(P, ks=(1, 4), concurrencies=(1, 8), seed=3)
    model = sm.fit(sm.model_steps(frame))
    acc = model.acceptance[FAMILY]
    for k, c in ((2, 4), (3, 2), (2, 8), (3, 1)):
        assert not model.extrapolated(FAMILY, k, c)
        assert model.predict(FAMILY, k, c) == pytest.approx(true_speedup(P, k, c, acc.weights), rel=0.05)
    assert model.extrapolated(FAMILY, 6, 1) and model.extrapolated(FAMILY, 2, 16)


def test_goodput_picks_k_zero_where_speculation_does_not_pay(steps):
    model = sm.fit(steps)
    assert model.best_k(FAMILY, 1, 8) >= 1
    assert model.best_k(FAMILY, 8, 8) == 0  # the planted cliff: at batch 8 every k loses
    assert model.goodput(FAMILY, 1, 2) > model.goodput(None, 1, 0)


def test_next_points_are_unmeasured_and_closest_to_break_even(steps, measured):
    model = sm.fit(steps)
    nxt = sm.next_points(model, measured, ks=[1, 2, 3, 4], concurrencies=[1, 2, 4, 8], n=3)
    assert len(nxt) == 3 and set(nxt["k"]) == {3}  # k = 1, 2, 4 were all measured
    dist = np.abs(np.log(nxt["predicted"]))
    assert list(dist) == sorted(dist)


def test_stalls_outside_the_steps_are_measured_on_the_baseline_and_dilute_the_speedup():
    planted_stall = {1: 0.0, 2: 0.2, 4: 0.6, 8: 1.4}  # s per request, e.g. others' prefills
    frame = planted_frame(P, stall=planted_stall, seed=5)
    steps = sm.model_steps(frame)
    got = sm.stalls(frame)
    for c, total in planted_stall.items():
        assert got[c] == pytest.approx(total / 47, abs=1e-9 + 1e-3 * total)  # per output token
    measured = sm.measured_points(frame, n_boot=200)
    with_stall = sm.evaluate(steps, measured, stall=got)
    without = sm.evaluate(steps, measured)
    assert with_stall.heldout_error < 0.07
    assert without.heldout_error > 2 * with_stall.heldout_error
