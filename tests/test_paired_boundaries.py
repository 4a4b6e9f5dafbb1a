"""Boundaries of the paired speedup (specbench.analysis.paired): the verdict at an interval's
edge, the percentile interval's share, blocks that shrink to one when prompts are paired, zero
TPOTs (a buffered stream delivered whole), and what `speedup_verdicts` reports for a
configuration it cannot pair. Small hand-built frames, fixed seeds."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from specbench.analysis import outcome, paired_bootstrap_speedup, speedup_verdicts, where_speculation_pays
from specbench.analysis.paired import VERDICT_KEYS
from specbench.config import BASELINE, SamplingParams, SpeculativeConfig
from specbench.metrics import sample_metrics
from specbench.records import make_row
from specbench.types import Request, Result


K3 = SpeculativeConfig(method="ngram", num_speculative_tokens=3)


def _frame(tpots, blocks=None, ids=None, dtype=float) -> pd.DataFrame:
    """The columns the paired interval reads: one successful sample per prompt."""
    ids = ids if ids is not None else [f"p{i}" for i in range(len(tpots))]
    df = pd.DataFrame({"prompt_id": ids, "error": None, "finish_reason": "length",
                       "tpot_s": pd.Series(list(tpots), dtype=dtype)})
    if blocks is not None:
        df["block"] = list(blocks)
    return df


def _row(pid, spec=BASELINE, *, tpot=0.02, concurrency=1, error=None):
    """A full records row (as `specbench run` writes it) of 9 tokens at `tpot` apart."""
    req = Request(id=pid, prompt_ids=(1, 2), sampling=SamplingParams())
    if error:
        res = Result(pid, [], 0.0, 0.0, [], "error", error=error)
    else:
        res = Result(pid, list(range(9)), 0.0, 0.0, [0.1 + i * tpot for i in range(9)], "length")
    return make_row(run_id="r", config_id=f"{spec.short}-c{concurrency}", backend="embedded", spec=spec,
                    concurrency=concurrency, request_rate=None, request=req,
                    metrics=sample_metrics(req, res, config_start=0.0))


def _run(speedup=1.6, n=12, noise=0.05, seed=0):
    """A baseline and ngram-k3 at concurrency 1, the latter `speedup` times faster per prompt."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        base = 0.02 * (1 + 0.5 * rng.random())
        rows.append(_row(f"p{i}", tpot=base))
        rows.append(_row(f"p{i}", K3, tpot=base / speedup * (1 + noise * rng.standard_normal())))
    return pd.DataFrame(rows)


def _noisy(n=15, seed=4, blocks=None):
    rng = np.random.default_rng(seed)
    b = rng.uniform(0.02, 0.03, n)
    return _frame(b), _frame(b / 1.2 * rng.lognormal(0, 0.1, n), blocks)


# --- outcome at the edges --------------------------------------------------------------------


def test_an_interval_whose_lower_end_is_exactly_the_minimum_does_not_pay():
    """'Pays' needs the whole interval above the minimum: touching it is not enough."""
    assert outcome(1.2, 1.0, 1.4) == "even"
    assert outcome(1.5, 1.2, 1.8, min_speedup=1.2) == "even"


def test_an_interval_whose_upper_end_is_exactly_one_does_not_lose():
    """'Loses' needs the whole interval below 1: an interval reaching 1 is even."""
    assert outcome(0.9, 0.8, 1.0) == "even"


def test_a_configuration_identical_to_its_baseline_is_even():
    """Identical per-prompt TPOTs give the interval [1, 1] exactly: neither a win nor a loss
    (a >= / <= at the edge would call it one)."""
    df = _frame([0.02, 0.03, 0.025, 0.021])
    point, lo, hi = paired_bootstrap_speedup(df, df.copy())
    assert (point, lo, hi) == (1.0, 1.0, 1.0)
    assert outcome(point, lo, hi) == "even"


# --- the percentile bootstrap ---------------------------------------------------------------


def test_a_bad_stat_is_refused_with_the_choices_listed():
    with pytest.raises(ValueError, match=r"^stat must be one of median, mean, got 'mode'$"):
        paired_bootstrap_speedup(_frame([0.02, 0.02]), _frame([0.01, 0.01]), stat="mode")


def test_the_interval_is_the_central_share_of_replicates_that_resample_every_prompt():
    """Two prompts, ratios 1 and 2 (mean stat): a replicate is 1 (prompt 0 twice, 1/4), 4/3
    (one of each, 1/2) or 2 (prompt 1 twice, 1/4). The 95% interval spans [1, 2]; a 40%
    interval takes the central 40% of the replicates, all 4/3 (cutting 1/3 of alpha off each
    side instead of half would reach 1 and 2; a resampler that never draws prompt 0 gives
    [2, 2])."""
    base, spec = _frame([0.02, 0.02]), _frame([0.02, 0.01])
    assert paired_bootstrap_speedup(base, spec, stat="mean") == pytest.approx((4 / 3, 1.0, 2.0))
    assert paired_bootstrap_speedup(base, spec, stat="mean", confidence=0.4) == pytest.approx((4 / 3, 4 / 3, 4 / 3))


def test_the_interval_is_the_percentile_interval_of_exactly_n_boot_replicates():
    """The percentile interval of `n_boot` replicates, each a resample of whole prompts drawn
    from numpy's default_rng(seed): reproducible from the seed, and every replicate counts
    (a replicate left out, or an unfilled slot, moves the ends of a 2-replicate interval)."""
    rng = np.random.default_rng(11)
    b = rng.uniform(0.02, 0.03, 7)
    s = b / 1.3 * rng.lognormal(0, 0.2, 7)
    got = paired_bootstrap_speedup(_frame(b), _frame(s), n_boot=2, seed=5)
    idx = np.random.default_rng(5).integers(0, 7, size=(2, 7))
    reps = np.median(b[idx], axis=1) / np.median(s[idx], axis=1)
    assert reps[0] != reps[1]
    assert got == (np.median(b) / np.median(s), *np.nanquantile(reps, [0.025, 0.975]))


def test_the_defaults_are_2000_replicates_from_seed_0():
    """`specbench run`'s verdicts and the sweep profile call with the defaults: their intervals
    must be the ones a report stating 2000 replicates and seed 0 reproduces."""
    base, spec = _noisy()  # the mean: replicates all distinct, so any other n_boot or seed moves the ends
    assert paired_bootstrap_speedup(base, spec, stat="mean") == \
        paired_bootstrap_speedup(base, spec, stat="mean", n_boot=2000, seed=0)
    df = _run(noise=0.2)
    pd.testing.assert_frame_equal(speedup_verdicts(df), speedup_verdicts(df, n_boot=2000, seed=0))


def test_a_large_prompt_set_resampled_in_chunks_gives_the_interval_of_its_ratios():
    """2500 prompts: the replicates are drawn in bounded-memory chunks; every prompt exactly
    1.25x faster must still give [1.25, 1.25]."""
    b = np.random.default_rng(2).uniform(0.02, 0.03, 2500)
    point, lo, hi = paired_bootstrap_speedup(_frame(b), _frame(b / 1.25))
    assert (point, lo, hi) == pytest.approx((1.25, 1.25, 1.25), rel=1e-12)


def test_replicates_whose_stat_divides_by_zero_are_dropped_without_warnings():
    """A speculative TPOT of 0 (an answer delivered in one burst) makes some replicates x / 0
    or 0 / 0: they are dropped from the percentiles silently, not sprayed as RuntimeWarnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # four prompts, one with TPOT 0: the replicates of prompt 0 only are inf (1 in 256)
        point, lo, hi = paired_bootstrap_speedup(_frame([0.02] * 4), _frame([0.0, 0.01, 0.012, 0.011]),
                                                 stat="mean")
        assert np.isfinite([point, lo, hi]).all() and lo < point < hi
        # prompt 0 at TPOT 0 in both runs: its replicates are 0 / 0, the others 2
        assert paired_bootstrap_speedup(_frame([0.0, 0.02]), _frame([0.0, 0.01]), stat="mean") == (2.0, 2.0, 2.0)


# --- blocks as the unit ---------------------------------------------------------------------


def test_the_block_interval_is_the_cr1_t_interval_of_the_log_ratios():
    """Three blocks of three prompts: the interval is point * exp(-+ t_{0.975, G-1} * se) with
    the CR1 standard error over blocks of d = log(base / spec) (module docstring)."""
    base = np.array([0.020, 0.025, 0.030, 0.022, 0.027, 0.021, 0.026, 0.024, 0.028])
    ratios = np.array([1.10, 1.20, 1.15, 1.40, 1.35, 1.30, 1.05, 1.12, 1.08])
    groups = np.repeat([0, 1, 2], 3)
    point, lo, hi = paired_bootstrap_speedup(_frame(base), _frame(base / ratios, groups))
    d = np.log(ratios)
    resid = np.array([np.sum(d[groups == k] - d.mean()) for k in range(3)])
    se = math.sqrt(3 / 2 * np.sum(resid ** 2)) / 9
    half = stats.t.ppf(0.975, 2) * se
    assert point == pytest.approx(np.median(base) / np.median(base / ratios))
    assert (lo, hi) == pytest.approx((point * math.exp(-half), point * math.exp(half)))


def test_the_same_ratio_in_every_block_gives_a_zero_width_block_interval():
    b = np.random.default_rng(8).uniform(0.02, 0.03, 9)
    point, lo, hi = paired_bootstrap_speedup(_frame(b), _frame(b / 1.25, np.arange(9) // 3))
    assert (point, lo, hi) == pytest.approx((1.25, 1.25, 1.25), rel=1e-9)


def test_a_slower_configuration_measured_in_blocks_loses():
    """Blocks as the unit must give a slower configuration an interval below 1 too, not only
    a faster one an interval above it."""
    rng = np.random.default_rng(9)
    b = rng.uniform(0.02, 0.03, 12)
    point, lo, hi = paired_bootstrap_speedup(_frame(b), _frame(b / 0.7 * rng.lognormal(0, 0.02, 12),
                                                               np.arange(12) // 4))
    assert lo < point < hi < 1.0 and np.isfinite(lo)
    assert outcome(point, lo, hi) == "loss"


@pytest.mark.parametrize("side", ["base", "spec"])
def test_an_object_dtype_tpot_column_gives_the_float_interval(side):
    """pd.concat of a frame whose tpot_s is all None with another leaves the column of object
    dtype: the values must be read as floats (np.log of an object array raises)."""
    rng = np.random.default_rng(1)
    b = rng.uniform(0.02, 0.03, 9)
    s = b / 1.2 * rng.lognormal(0, 0.05, 9)
    blocks = np.arange(9) // 3
    expected = paired_bootstrap_speedup(_frame(b), _frame(s, blocks))
    base = _frame(b, dtype=object if side == "base" else float)
    spec = _frame(s, blocks, dtype=object if side == "spec" else float)
    assert paired_bootstrap_speedup(base, spec) == pytest.approx(expected, rel=1e-12)


def test_prompts_with_a_zero_tpot_are_left_out_of_the_block_interval_silently():
    """Prompt 0's speculative TPOT is 0 (x / 0) and prompt 1's is 0 in both runs (0 / 0): their
    log ratios are not finite and drop out of the block interval, with no RuntimeWarning; the
    interval's width is that of the other prompts."""
    b = [0.02, 0.0, 0.021, 0.022, 0.019, 0.02]
    s = [0.0, 0.0, 0.016, 0.017, 0.015, 0.017]
    blocks = [0, 0, 0, 1, 1, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        point, lo, hi = paired_bootstrap_speedup(_frame(b), _frame(s, blocks))
    ids = [f"p{i}" for i in range(2, 6)]
    p2, lo2, hi2 = paired_bootstrap_speedup(_frame(b[2:], ids=ids), _frame(s[2:], blocks[2:], ids=ids))
    assert np.isfinite([lo, hi]).all()
    assert (lo / point, hi / point) == pytest.approx((lo2 / p2, hi2 / p2))


def test_a_zero_baseline_median_gives_no_block_interval_not_a_loss():
    """The baseline's median TPOT is 0 (buffered streams): the point 0 measures nothing, so the
    interval is NaN and the verdict unclear, not a confident loss at [0, 0]."""
    b = [0.0, 0.0, 0.02, 0.0, 0.0, 0.02]
    s = [0.015, 0.016, 0.015, 0.017, 0.016, 0.015]
    point, lo, hi = paired_bootstrap_speedup(_frame(b), _frame(s, [0, 0, 0, 1, 1, 1]))
    assert point == 0.0 and math.isnan(lo) and math.isnan(hi)
    assert outcome(point, lo, hi) == "unclear"


def test_blocks_left_with_no_finite_ratio_leave_too_few_blocks_for_an_interval():
    """Every prompt of block 1 has speculative TPOT 0: one block keeps finite ratios, and one
    block cannot tell a burst from the effect, so no interval (not a division by G - 1 = 0)."""
    b = [0.02, 0.021, 0.022, 0.02, 0.021, 0.019]
    s = [0.015, 0.016, 0.017, 0.0, 0.0, 0.0]
    point, lo, hi = paired_bootstrap_speedup(_frame(b), _frame(s, [0, 0, 0, 1, 1, 1]))
    assert np.isfinite(point) and math.isnan(lo) and math.isnan(hi)


def test_a_prompt_only_the_speculative_run_measured_stays_out_of_the_blocks():
    """The blocks are those of the shared prompts: a prompt the baseline failed must not enter
    the block interval (its block would no longer line up with the ratios)."""
    base, spec = _noisy(n=9, seed=6, blocks=np.arange(9) // 3)
    spec_extra = pd.concat([spec, _frame([0.015], [2], ids=["extra"])], ignore_index=True)
    assert paired_bootstrap_speedup(base, spec_extra) == paired_bootstrap_speedup(base, spec)


@pytest.mark.parametrize("kept", [["p0", "p1", "p2", "p3"], ["p0", "p4"]],
                         ids=["all-in-one-block", "one-prompt-per-block"])
def test_shared_prompts_in_one_block_or_one_per_block_keep_the_prompt_as_the_unit(kept):
    """The speculative run measured 8 prompts in 2 blocks of 4, but the baseline has only
    `kept`: in one block there is no second block to tell a burst from the effect, and with a
    block per prompt the blocks are the prompts; either way the prompt bootstrap (as without
    blocks), not an undefined or a df-1 block interval."""
    base, spec = _noisy(n=8, seed=7, blocks=np.arange(8) // 4)
    base = base[base["prompt_id"].isin(kept)]
    without_blocks = paired_bootstrap_speedup(base, spec.drop(columns="block"))
    got = paired_bootstrap_speedup(base, spec)
    assert np.isfinite(got[1]) and got == without_blocks


# --- speedup_verdicts -----------------------------------------------------------------------


def test_a_verdict_carries_its_paired_prompt_count_and_the_intervals_settings():
    """The verdict is paired_bootstrap_speedup's for the given n_boot, seed and confidence, and
    counts the prompts paired."""
    df = _run(noise=0.2)
    v = speedup_verdicts(df, n_boot=500, seed=3, confidence=0.5)
    base, spec = df[df["method"] == "none"], df[df["method"] == "ngram"]
    expected = paired_bootstrap_speedup(base, spec, n_boot=500, seed=3, confidence=0.5)
    r = v.iloc[0]
    assert (r["tpot_speedup"], r["tpot_speedup_lo"], r["tpot_speedup_hi"]) == expected
    assert r["paired_prompts"] == 12 and pd.isna(r["paired_blocks"])


def test_a_stated_minimum_speedup_reaches_the_verdict():
    df = _run(speedup=1.6)
    assert speedup_verdicts(df)["outcome"].iloc[0] == "win"
    v = speedup_verdicts(df, min_speedup=2.0)
    assert v["outcome"].iloc[0] == "even" and 1.0 < v["tpot_speedup_lo"].iloc[0] < 2.0


def test_a_run_without_a_baseline_gets_nan_speedups_and_says_so():
    """No baseline at the configuration's concurrency: NaN speedups (floats the sentence can
    format), no pairs, unclear; the sentence says 'no baseline'."""
    df = pd.DataFrame([_row(f"p{i}", K3, tpot=0.01, concurrency=2) for i in range(3)])
    v = speedup_verdicts(df)
    r = v.iloc[0]
    assert math.isnan(r["tpot_speedup"]) and math.isnan(r["tpot_speedup_lo"]) and math.isnan(r["tpot_speedup_hi"])
    assert r["paired_prompts"] == 0 and r["outcome"] == "unclear"
    assert where_speculation_pays(v) == [
        "ngram k=3: does not pay at any concurrency measured (TPOT speedup vs baseline, 95% CI: c2 no baseline)"]
    # beside a configuration that has one, the missing baseline id reads as NaN, not None
    df = pd.concat([df, _run(speedup=1.6)], ignore_index=True)
    v = speedup_verdicts(df).set_index("concurrency")
    assert v.loc[1, "outcome"] == "win" and v.loc[1, "paired_prompts"] == 12
    assert v.loc[2, "outcome"] == "unclear" and v.loc[2, "paired_prompts"] == 0 and math.isnan(v.loc[2, "tpot_speedup"])


def test_a_configuration_with_one_paired_prompt_falls_back_to_the_median_ratio():
    """One prompt in both runs cannot carry an interval: the point is the summary's TPOT p50
    ratio, with no interval and an unclear verdict."""
    df = pd.DataFrame([_row("p0", tpot=0.02), _row("p1", tpot=0.03),
                       _row("p0", K3, tpot=0.01), _row("p1", K3, error="boom")])
    r = speedup_verdicts(df).iloc[0]
    assert r["tpot_speedup"] == pytest.approx(0.025 / 0.01)
    assert math.isnan(r["tpot_speedup_lo"]) and math.isnan(r["tpot_speedup_hi"])
    assert r["paired_prompts"] == 1 and r["outcome"] == "unclear"


def test_a_baseline_only_run_has_an_empty_verdict_table_with_its_columns():
    """No speculative configuration: no verdicts, but the columns are there (the console
    sentences read them) and no sentence is written."""
    v = speedup_verdicts(pd.DataFrame([_row("p0"), _row("p1")]))
    assert len(v) == 0 and list(v.columns) == VERDICT_KEYS
    assert where_speculation_pays(v) == []
