"""`specbench compare` (specbench.compare.gate) at its edges: the exact boundaries of the
regression / inconclusive / improved / ok verdicts, the figures a user reads (baseline, current,
change, interval) checked against an independent computation, the n/a paths with their notes,
the repeats and tpot_speedup intervals, what each result row carries, and the notes and refusals
under the table. Small frames and few bootstrap resamples keep it fast."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from specbench import analysis
from specbench import compare as cmp
from specbench.compare import gate
from specbench.compare.catalog import GATES, METRICS
from specbench.errors import ConfigError

from test_compare import result, synthetic_run

SPEC = "draft_model-k4-c1"
BASE = "baseline-c1"
N = 6  # prompts per small run

PROMPTS_NOTE = (
    "timing intervals resample prompts (count blocks above concurrency 1) and cover prompt-to-prompt "
    "noise only: the two runs were measured at different times, so a drift of the machine between them "
    "(other jobs, clocks, thermal state) is not in them and can pass for a regression; gate a timing "
    "change with both configurations in one interleaved run (docs/ci.md); across runs, gate -m "
    "tpot_speedup (each run's speedup over its own interleaved baseline, which such drift does not "
    "move), or measure both runs with --repeats N (N >= 3) and compare with --interval repeats")
REPEATS_NOTE = (
    "timing intervals come from the spread between repeats within each run, which covers drift inside "
    "a run but not necessarily between the two: the two runs were measured at different times, so a "
    "drift of the machine between them (other jobs, clocks, thermal state) is not in them and can pass "
    "for a regression; gate a timing change with both configurations in one interleaved run (docs/ci.md)")


def small(run_id: str, **kw):
    return synthetic_run(run_id=run_id, n_prompts=kw.pop("n_prompts", N), **kw)


def rows(df: pd.DataFrame, config: str) -> pd.Series:
    return df["config_id"] == config


# ---- _decide: the verdict boundaries -------------------------------------------------------------
# Exact binary fractions (0.25, 0.5) so "equal to the threshold" is exactly equal.

TPOT = METRICS["tpot_p50"]  # lower is better
TPS = METRICS["output_tps"]  # higher is better


def decide(point, lo, hi, metric=TPOT, threshold=0.25, min_effect=0.01):
    return gate._decide(point, lo, hi, metric, threshold, min_effect, {"n": 3})


def test_a_change_exactly_at_the_allowed_regression_is_ok_not_a_regression():
    # "worse than the allowed regression" is strict: 25% slower under a 25% budget passes,
    # whether the interval is clearly worse (would be "regression") or not ("inconclusive")
    r = decide(1.25, 1.2, 1.3)
    assert (r["verdict"], r["note"]) == ("ok", "")
    r = decide(1.25, 1.0, 1.5)
    assert (r["verdict"], r["note"]) == ("ok", "")
    assert r["change"] == 0.25 and (r["ci_low"], r["ci_high"]) == (0.0, 0.5) and r["n"] == 3


def test_a_regression_whose_better_end_is_exactly_the_min_effect_is_inconclusive():
    r = decide(1.5, 1.25, 1.75, min_effect=0.25)
    assert r["verdict"] == "inconclusive"
    assert r["note"] == "not significant: at the CI's better end +25.0% worse, under the 25% min effect"
    r = decide(1.5, 1.2, 1.75, min_effect=0.25)  # the better end 20% worse: the note says so
    assert r["note"] == "not significant: at the CI's better end +20.0% worse, under the 25% min effect"


def test_a_clear_regression_has_no_note():
    assert decide(1.5, 1.3, 1.7) == {"n": 3, "change": 0.5, "ci_low": pytest.approx(0.3),
                                     "ci_high": pytest.approx(0.7), "verdict": "regression", "note": ""}


def test_a_clear_improvement_is_improved_with_no_note():
    for metric, point, lo, hi in ((TPOT, 0.5, 0.4, 0.6), (TPS, 1.5, 1.4, 1.6)):
        r = decide(point, lo, hi, metric=metric)
        assert (r["verdict"], r["note"]) == ("improved", ""), metric.name


def test_an_improvement_within_the_allowed_change_is_ok():
    # 10% faster, the interval wholly faster, but not more than the 25% allowed change
    r = decide(0.9, 0.85, 0.95)
    assert (r["verdict"], r["note"]) == ("ok", "")


def test_an_improvement_exactly_at_the_threshold_or_the_min_effect_is_ok():
    assert decide(0.75, 0.7, 0.8)["verdict"] == "ok"  # -25% change, 25% threshold
    assert decide(0.5, 0.25, 0.75, min_effect=0.25)["verdict"] == "ok"  # worse end exactly -25%


def test_an_improvement_needs_the_worse_end_of_the_interval_better_than_the_min_effect():
    # output_tps: higher is better; +50% point, but the interval reaches 0% (no change): not shown
    # as an improvement (the worse end is the low one for a higher-is-better metric)
    r = decide(1.5, 1.0, 2.0, metric=TPS)
    assert (r["verdict"], r["note"]) == ("ok", "")


# ---- _timing: the figures against the bootstrap they come from ------------------------------------

@pytest.fixture(scope="module")
def pair():
    return small("base", noise_seed=1, noise=0.1), small("cur", noise_seed=2, noise=0.1, tpot_factor=1.03)


def test_timing_figures_are_the_statistic_of_the_shared_prompts_and_the_requested_bootstrap(pair):
    (bdf, _), (cdf, _) = pair
    comp = cmp.compare_runs(*pair, metrics=["tpot_p50", "tpot_mean"], n_boot=200, seed=7,
                            confidence=0.8)
    b, c = bdf[rows(bdf, SPEC)], cdf[rows(cdf, SPEC)]
    for name, stat, f in (("tpot_p50", "median", np.median), ("tpot_mean", "mean", np.mean)):
        r = result(comp, name)
        assert r.baseline == pytest.approx(f(b["tpot_s"])), name
        assert r.current == pytest.approx(f(c["tpot_s"])), name
        assert r.n == N
        # the seed, resample count, confidence and statistic asked for reach the bootstrap
        point, lo, hi = analysis.paired_bootstrap_speedup(c, b, metric="tpot_s", stat=stat, n_boot=200,
                                                          seed=7, confidence=0.8)
        assert (r.change, r.ci_low, r.ci_high) == pytest.approx((point - 1, lo - 1, hi - 1), abs=1e-12)


def test_the_default_bootstrap_seed_is_0_and_recorded(pair):
    (bdf, _), (cdf, _) = pair
    comp = cmp.compare_runs(*pair, metrics=["tpot_p50"], n_boot=200)
    assert comp.settings["seed"] == 0
    _, lo, hi = analysis.paired_bootstrap_speedup(cdf[rows(cdf, SPEC)], bdf[rows(bdf, SPEC)], n_boot=200,
                                                  seed=0)
    r = result(comp, "tpot_p50")
    assert (r.ci_low, r.ci_high) == pytest.approx((lo - 1, hi - 1), abs=1e-12)


def test_output_tps_leaves_out_a_sample_with_zero_latency():
    # a zero E2E has no throughput: the prompt drops out, it does not become an infinite one
    (bdf, bm), (cdf, cm) = small("base", noise_seed=1), small("cur", noise_seed=2)
    for df in (bdf, cdf):
        df.loc[rows(df, SPEC) & (df["prompt_id"] == "p00"), "e2e_s"] = 0.0
    r = result(cmp.compare_runs((bdf, bm), (cdf, cm), metrics=["output_tps"], n_boot=200), "output_tps")
    b = bdf[rows(bdf, SPEC) & (bdf["prompt_id"] != "p00")]
    assert r.n == N - 1
    assert r.baseline == pytest.approx(np.mean(b["output_tokens"] / b["e2e_s"]))


def test_a_timing_metric_with_no_shared_values_is_na_without_numpy_warnings():
    (bdf, bm), (cdf, cm) = small("base"), small("cur")
    cdf.loc[rows(cdf, SPEC), "tpot_s"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mean of empty slice" on the user's terminal
        comp = cmp.compare_runs((bdf, bm), (cdf, cm), metrics=["tpot_p50"], n_boot=200)
    r = result(comp, "tpot_p50")
    assert (r.verdict, r.baseline, r.current, r.change, r.n) == ("n/a", None, None, None, 0)
    assert r.note == "needs >= 2 prompts with a value in both runs, found 0"
    assert comp.exit_code == 0


def test_a_zero_baseline_timing_is_na_not_an_infinite_regression():
    (bdf, bm), (cdf, cm) = small("base"), small("cur")
    bdf.loc[rows(bdf, SPEC), "tpot_s"] = 0.0
    comp = cmp.compare_runs((bdf, bm), (cdf, cm), metrics=["tpot_p50"], n_boot=200)
    r = result(comp, "tpot_p50")
    assert (r.verdict, r.baseline, r.n) == ("n/a", 0.0, N)
    assert r.current == pytest.approx(np.median(cdf.loc[rows(cdf, SPEC), "tpot_s"]))
    assert r.note == "not finite (zero or missing baseline values)"
    assert comp.exit_code == 0


# ---- --interval repeats -------------------------------------------------------------------------

def repeats_run(run_id: str, drifts: list[float], n_prompts: int = 4):
    """A run with --repeats len(drifts), noise-free: repeat r's timings are the prompt's times
    drifts[r]."""
    frames = []
    for r, drift in enumerate(drifts):
        df, meta = synthetic_run(run_id=run_id, n_prompts=n_prompts, noise=0.0)
        for col in ("tpot_s", "ttft_s", "e2e_s", "finish_s"):
            df[col] = df[col] * drift
        df["repeat"] = r
        frames.append(df)
    return pd.concat(frames, ignore_index=True), meta


def per_repeat(df: pd.DataFrame, stat: str) -> np.ndarray:
    return df[rows(df, SPEC)].groupby("repeat")["tpot_s"].agg(stat).to_numpy()


def test_repeat_interval_is_the_welch_interval_of_the_log_statistics():
    a = repeats_run("a", [1.0, 1.1, 0.95])
    b = repeats_run("b", [1.2, 1.0, 1.3, 1.15])
    comp = cmp.compare_runs(a, b, metrics=["tpot_p50", "tpot_mean"], interval="repeats", confidence=0.9)
    for name, stat in (("tpot_p50", "median"), ("tpot_mean", "mean")):
        bs, cs = per_repeat(a[0], stat), per_repeat(b[0], stat)
        r = result(comp, name)
        assert (r.baseline, r.current, r.n) == (pytest.approx(bs.mean()), pytest.approx(cs.mean()), 3)
        lb, lc = np.log(bs), np.log(cs)
        ci = stats.ttest_ind(lc, lb, equal_var=False).confidence_interval(0.9)
        assert r.change == pytest.approx(np.exp(lc.mean() - lb.mean()) - 1)
        assert (r.ci_low, r.ci_high) == pytest.approx((np.exp(ci.low) - 1, np.exp(ci.high) - 1))
    assert comp.notes == [REPEATS_NOTE]


def test_repeats_that_do_not_move_give_a_zero_width_interval():
    # every repeat measured the same: no spread, the interval is the point (a clear regression)
    a = repeats_run("a", [1.0, 1.0, 1.0])
    b = repeats_run("b", [1.2, 1.2, 1.2])
    r = result(cmp.compare_runs(a, b, metrics=["tpot_p50"], interval="repeats"), "tpot_p50")
    assert r.verdict == "regression"
    assert r.ci_low == r.change == r.ci_high == pytest.approx(0.2)


def test_two_repeats_in_each_run_are_enough():
    r = result(cmp.compare_runs(repeats_run("a", [1.0, 1.1]), repeats_run("b", [1.0, 1.05]),
                                metrics=["tpot_p50"], interval="repeats"), "tpot_p50")
    assert r.verdict != "n/a" and r.n == 2 and r.note == ""


@pytest.mark.parametrize("base_drifts, cur_drifts, counts", [
    ([1.0], [1.0, 1.1, 1.2], "baseline 1, current 3"),
    ([1.0, 1.1, 1.2], [1.0], "baseline 3, current 1"),
    ([1.0, 0.0, 1.2], [1.0, 1.1, 1.2], "baseline 3, current 3"),  # a repeat with zero timings
    ([1.0, 1.1, 1.2], [1.0, 1.1, 0.0], "baseline 3, current 3"),
])
def test_repeat_interval_needs_two_positive_repeat_statistics_in_each_run(base_drifts, cur_drifts, counts):
    comp = cmp.compare_runs(repeats_run("a", base_drifts), repeats_run("b", cur_drifts),
                            metrics=["tpot_p50", "errors"], interval="repeats", gate="deterministic")
    r = result(comp, "tpot_p50")
    assert r.verdict == "n/a"
    assert r.note == (f"--interval repeats needs >= 2 repeats with values in each run ({counts}): "
                      "measure with --repeats N")
    assert comp.exit_code == 0


@pytest.mark.parametrize("empty", ["baseline", "current"])
def test_repeat_interval_with_no_values_in_a_run_reports_no_figure(empty):
    runs = {"baseline": repeats_run("a", [1.0, 1.1]), "current": repeats_run("b", [1.0, 1.1])}
    df = runs[empty][0]
    df.loc[rows(df, SPEC), "tpot_s"] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mean of empty slice" on the user's terminal
        comp = cmp.compare_runs(runs["baseline"], runs["current"], metrics=["tpot_p50", "errors"],
                                interval="repeats", gate="deterministic")
    r = result(comp, "tpot_p50")
    other = "current" if empty == "baseline" else "baseline"
    assert (r.verdict, getattr(r, empty), r.n) == ("n/a", None, 0)
    assert getattr(r, other) == pytest.approx(per_repeat(runs[other][0], "median").mean())
    assert f"({empty} 0, {other} 2)" in r.note or f"({other} 2, {empty} 0)" in r.note


def test_repeats_refusal_names_the_gated_timings_and_the_first_ones_reason():
    # no repeats anywhere: two gated timings, nothing to gate them on -> not comparable (exit 2);
    # the reason quotes the first result's note (baseline config, where current ttft is missing)
    (bdf, bm), (cdf, cm) = small("base"), small("cur")
    cdf.loc[rows(cdf, BASE), "ttft_s"] = np.nan
    comp = cmp.compare_runs((bdf, bm), (cdf, cm), metrics=["tpot_p50", "ttft_p50"], interval="repeats")
    assert comp.exit_code == 2 and comp.results == []
    assert comp.reasons == [
        "--interval repeats gates tpot_p50, ttft_p50 from each run's repeats, but no configuration has "
        "them (--interval repeats needs >= 2 repeats with values in each run (baseline 1, current 1): "
        "measure with --repeats N); measure both runs with --repeats N (N >= 3), or use --interval prompts"]


def test_repeats_refusal_is_not_lifted_by_a_deterministic_metric_or_tpot_speedup():
    # acceptance and tpot_speedup do not use the repeats: the timings asked for still cannot be gated
    for extra in ("acceptance_rate", "tpot_speedup"):
        comp = cmp.compare_runs(small("base"), small("cur"), metrics=["tpot_p50", extra], interval="repeats")
        assert comp.exit_code == 2, extra
        assert comp.reasons[0].startswith("--interval repeats gates tpot_p50 from each run's repeats"), extra


# ---- tpot_speedup -------------------------------------------------------------------------------

def log_speedup(df: pd.DataFrame) -> pd.Series:
    ok = df[analysis.ok_mask(df)]
    base = ok[ok["is_baseline"]].groupby("prompt_id")["tpot_s"].mean()
    spec = ok[rows(ok, SPEC)].groupby("prompt_id")["tpot_s"].mean()
    return np.log(base / spec).dropna()


def test_tpot_speedup_change_is_the_paired_t_interval_over_prompts_both_runs_measured():
    # the current run's baseline failed on p00: that prompt has no speedup there and is left out;
    # the others stay paired by prompt id
    a = small("a", noise_seed=1, noise=0.1)
    b = small("b", noise_seed=2, noise=0.1, tpot_factor=1.1, fail=f"{BASE}/p00")
    r = result(cmp.compare_runs(a, b, metrics=["tpot_speedup"], confidence=0.9), "tpot_speedup")
    db, dc = log_speedup(a[0]), log_speedup(b[0])
    e = (dc - db).dropna()
    assert list(e.index) == [f"p{i:02d}" for i in range(1, N)]
    ci = stats.ttest_1samp(e.to_numpy(), 0.0).confidence_interval(0.9)
    assert r.n == N - 1
    assert r.baseline == pytest.approx(np.exp(db.mean())) and r.current == pytest.approx(np.exp(dc.mean()))
    assert r.change == pytest.approx(np.exp(e.mean()) - 1)
    assert (r.ci_low, r.ci_high) == pytest.approx((np.exp(ci.low) - 1, np.exp(ci.high) - 1))
    assert r.better == "higher" and r.gated is True


def test_tpot_speedup_with_two_prompts_is_computed():
    r = result(cmp.compare_runs(small("a", n_prompts=2, noise_seed=1), small("b", n_prompts=2, noise_seed=2),
                                metrics=["tpot_speedup"]), "tpot_speedup")
    assert r.verdict != "n/a" and r.n == 2 and r.ci_low < r.change < r.ci_high


def test_tpot_speedup_with_one_prompt_is_na():
    comp = cmp.compare_runs(small("a", n_prompts=1), small("b", n_prompts=1), metrics=["tpot_speedup", "errors"])
    r = result(comp, "tpot_speedup")
    assert (r.verdict, r.n) == ("n/a", 1)
    assert r.note == "needs >= 2 prompts measured by the configuration and its own run's baseline in both runs"
    assert comp.exit_code == 0


def test_tpot_speedup_without_baseline_timings_reports_no_figure():
    runs = []
    for run_id in ("a", "b"):
        df, meta = small(run_id)
        df.loc[rows(df, BASE), "tpot_s"] = np.nan
        runs.append((df, meta))
    r = result(cmp.compare_runs(*runs, metrics=["tpot_speedup"]), "tpot_speedup")
    assert (r.verdict, r.baseline, r.current, r.n) == ("n/a", None, None, 0)


def test_tpot_speedup_finds_its_own_baseline_at_the_same_request_rate():
    runs = []
    for run_id, seed in (("a", 1), ("b", 2)):
        df, meta = small(run_id, noise_seed=seed)
        df["request_rate"] = 2.0
        runs.append((df, meta))
    r = result(cmp.compare_runs(*runs, metrics=["tpot_speedup"]), "tpot_speedup")
    assert r.verdict == "ok" and r.n == N
    assert r.baseline == pytest.approx(np.exp(log_speedup(runs[0][0]).mean()))


# ---- result rows --------------------------------------------------------------------------------

def test_a_prompt_failed_in_one_run_is_left_out_of_the_deterministic_comparisons():
    comp = cmp.compare_runs(small("a"), small("b", fail=f"{SPEC}/p01"),
                            metrics=["acceptance_rate", "greedy_match", "errors"])
    assert result(comp, "greedy_match").n == N - 1
    assert result(comp, "acceptance_rate").n == N - 1
    r = result(comp, "errors")
    assert (r.verdict, r.change, r.n, r.note) == ("regression", 1.0, N, "")


def test_greedy_note_keeps_the_differing_prompts_and_says_why_it_is_not_gated():
    cur = small("b", change_output_of="p02", meta_overrides={"config": {"target": "t2", "dtype_resolved": "bf16"}})
    comp = cmp.compare_runs(small("a"), cur, metrics=["greedy_match"])
    r = result(comp, "greedy_match")
    assert r.verdict == "regression" and r.gated is False and comp.exit_code == 0
    assert r.note == "1 differ (p02); not gated: target and dtype differ"


def test_a_paired_change_of_k_names_both_configurations_and_the_metric():
    cur = small("b", configs=(BASE, "draft_model-k5-c1"))
    comp = cmp.compare_runs(small("a"), cur, metrics=["acceptance_rate"], allow_config_diff=True,
                            thresholds={"acceptance_rate": 0.5})
    r = result(comp, "acceptance_rate", config=f"{SPEC} -> draft_model-k5-c1")
    assert (r.baseline_config, r.current_config) == (SPEC, "draft_model-k5-c1")
    assert (r.better, r.threshold, r.kind) == ("higher", 0.5, "deterministic")


def test_compare_records_its_settings_paths_and_run_ids():
    # a run whose metadata lacks its id is named by its records' run_id
    (bdf, bm), (cdf, cm) = small("from-df"), small("cur-df")
    bm, cm = {**bm, "run_id": None}, {**cm, "run_id": None}
    comp = cmp.compare_runs((bdf, bm), (cdf, cm), metrics=["errors"], n_boot=300,
                            paths=("runs/a", "runs/b"))
    assert comp.settings == {"metrics": ["errors"], "thresholds": {"errors": 0.0}, "min_effect": 0.01,
                             "gate": "all", "n_boot": 300, "seed": 0, "confidence": 0.95,
                             "allow_config_diff": False, "interval": "prompts"}
    assert (comp.baseline["path"], comp.current["path"]) == ("runs/a", "runs/b")
    assert (comp.baseline["run_id"], comp.current["run_id"]) == ("from-df", "cur-df")
    comp = cmp.compare_runs(small("a"), small("b"), metrics=["errors"])
    assert (comp.baseline["path"], comp.current["path"]) == ("", "")


def test_a_runs_identity_comes_from_its_metadata_first():
    # metadata that names the run (as run.json does) wins over the records' run_id
    (bdf, bm), cur = small("in-records"), small("cur")
    bm = {**bm, "run_id": "in-run-json", "created_at": "2026-12-01T10:00:00+00:00", "status": "complete"}
    comp = cmp.compare_runs((bdf, bm), cur, metrics=["errors"], paths=("runs/a", "runs/b"))
    assert comp.baseline == {"path": "runs/a", "run_id": "in-run-json", "created_at": "2026-12-01T10:00:00+00:00",
                             "status": "complete"}
    # without metadata: the first record's run_id (a run of one record too), else none
    assert gate._run_info(bdf.head(1), {}, "p") == {"path": "p", "run_id": "in-records", "created_at": None,
                                                     "status": None}
    assert gate._run_info(bdf.head(0), {}, "")["run_id"] is None


@pytest.mark.parametrize("kw, message", [
    ({"n_boot": 99}, "--n-boot must be >= 100 bootstrap resamples, got 99"),
    ({"confidence": 1.0}, "--confidence must be in [0.5, 1), got 1.0"),
    ({"confidence": 1.5}, "--confidence must be in [0.5, 1), got 1.5"),
    ({"confidence": 0.4999}, "--confidence must be in [0.5, 1), got 0.4999"),
    ({"min_effect": -0.001}, "--min-effect must be >= 0, got -0.001"),
    ({"gate": "some"}, f"--gate must be one of {', '.join(GATES)}, got 'some'"),
    ({"metrics": ["tpot_p50", "nope"]}, f"--metric: unknown metric 'nope'; valid: {', '.join(METRICS)}"),
    ({"interval": "blocks"}, "--interval must be one of prompts, repeats, got 'blocks'"),
])
def test_each_setting_is_refused_past_its_bound_naming_the_flag(kw, message):
    with pytest.raises(ConfigError) as err:
        cmp.compare_runs(small("a"), small("b"), **{"metrics": ["errors"], **kw})
    assert str(err.value) == message


def test_each_setting_is_accepted_at_its_bound():
    comp = cmp.compare_runs(small("a"), small("b"), metrics=["tpot_p50", "errors"], n_boot=100, confidence=0.5,
                            min_effect=0.0, gate="deterministic")
    assert comp.comparable and len(comp.results) == 4
    assert cmp.compare_runs(small("a"), small("b"), metrics=["errors"], confidence=0.999).comparable


# ---- notes under the table ----------------------------------------------------------------------

def test_the_cross_run_note_is_given_for_absolute_timings_only():
    comp = cmp.compare_runs(small("a"), small("b"), metrics=["tpot_p50"], n_boot=200)
    assert comp.notes == [PROMPTS_NOTE]
    # speedups and deterministic metrics are not moved by a drift between runs: no note
    for metrics in (["tpot_speedup"], ["acceptance_rate", "errors"]):
        assert cmp.compare_runs(small("a"), small("b"), metrics=metrics).notes == [], metrics
