"""The numbers a report states, checked against hand-computed values on small synthetic runs:
percentiles, paired speedups and their bootstrap intervals, acceptance, memory deltas, the
win/lose/even verdicts and the sentences built from them, and how runs are paired with a
baseline."""

from __future__ import annotations

import numpy as np
import pytest

from report_helpers import sample_row, write_run
from specbench import analysis
from specbench.config import BASELINE, SpeculativeConfig
from specbench.errors import ConfigError
from specbench.report import build_report, load_inputs
from specbench.report.verdict import method_sentences, recommendation, verdict_table

K2 = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
MiB = 2**20


def small_run(path, base_tpots, spec_tpots, *, spec=K2, concurrency=1, base_peak=None,
              spec_peak=None, accepted=None, workload="real", baseline=True):
    """One prompt per TPOT value: prompts p0, p1, ... under the baseline and under `spec`."""
    rows = []
    if baseline:
        rows += [sample_row(path.name, BASELINE, concurrency, f"p{i}", tpot=t, peak=base_peak,
                            workload=workload) for i, t in enumerate(base_tpots)]
    rows += [sample_row(path.name, spec, concurrency, f"p{i}", tpot=t, peak=spec_peak,
                        accepted=(accepted[i] if accepted else (1,)), workload=workload)
             for i, t in enumerate(spec_tpots)]
    return write_run(path, rows)


def row(table, label):
    got = table[table["label"] == label]
    assert len(got) == 1, (label, list(table["label"]))
    return got.iloc[0]


def test_percentiles_and_exact_speedup_match_hand_computed_values(tmp_path):
    # Baseline TPOT 10, 20, 30, 40 ms; speculative exactly half on every prompt.
    run = small_run(tmp_path / "r", [0.010, 0.020, 0.030, 0.040], [0.005, 0.010, 0.015, 0.020])
    inputs = load_inputs([run])
    t = verdict_table(inputs, n_boot=500)
    base, spec = row(t, "baseline-c1"), row(t, "ngram-k2-c1")
    # numpy linear interpolation: p50 = 25, p95 = 30 + 0.85 * 10, p99 = 30 + 0.97 * 10
    assert base["tpot_p50_s"] == pytest.approx(0.025)
    assert base["tpot_p95_s"] == pytest.approx(0.0385)
    assert base["tpot_p99_s"] == pytest.approx(0.0397)
    assert spec["tpot_p50_s"] == pytest.approx(0.0125)
    # Every resample keeps the 2:1 ratio, so the interval collapses onto the point.
    assert spec["tpot_speedup"] == pytest.approx(2.0)
    assert spec["tpot_speedup_lo"] == pytest.approx(2.0)
    assert spec["tpot_speedup_hi"] == pytest.approx(2.0)
    assert spec["paired_prompts"] == 4
    assert spec["outcome"] == "win" and base["outcome"] == "baseline"
    # E2E = ttft + 16 * tpot with ttft = 50 ms: medians 450 and 250 ms.
    assert base["e2e_p50_s"] == pytest.approx(0.05 + 16 * 0.025)
    assert spec["e2e_p50_speedup"] == pytest.approx((0.05 + 16 * 0.025) / (0.05 + 16 * 0.0125))
    page = build_report(inputs, n_boot=500)
    for text in ("25.0", "38.5", "39.7", "12.5", "2.00×", "[2.00–2.00×]"):
        assert text in page, text


def test_speedup_interval_is_the_paired_bootstrap_of_median_tpot(tmp_path):
    base = [0.010, 0.020, 0.030, 0.040, 0.050]
    spec = [0.008, 0.010, 0.020, 0.025, 0.030]
    run = small_run(tmp_path / "r", base, spec)
    inputs = load_inputs([run])
    t = verdict_table(inputs, n_boot=1000, seed=3)
    s = row(t, "ngram-k2-c1")
    assert s["tpot_speedup"] == pytest.approx(0.030 / 0.020)  # median / median, by hand
    df = inputs.frame
    point, lo, hi = analysis.paired_bootstrap_speedup(
        df[df["label"] == "baseline-c1"], df[df["label"] == "ngram-k2-c1"], n_boot=1000, seed=3)
    assert (s["tpot_speedup"], s["tpot_speedup_lo"], s["tpot_speedup_hi"]) == pytest.approx(
        (point, lo, hi))
    assert lo <= point <= hi and lo < hi


def test_slower_configuration_loses_and_straddling_one_is_even(tmp_path):
    slow = small_run(tmp_path / "slow", [0.010, 0.020, 0.030, 0.040], [0.02, 0.04, 0.06, 0.08])
    s = row(verdict_table(load_inputs([slow]), n_boot=500), "ngram-k2-c1")
    assert s["tpot_speedup"] == pytest.approx(0.5) and s["tpot_speedup_hi"] < 1
    assert s["outcome"] == "loss"

    # Per-prompt ratios 2, 0.5, 2, 0.5, ...: resampled medians land on both sides of 1.
    base = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
    spec = [0.005, 0.04, 0.015, 0.08, 0.025, 0.12]
    even = small_run(tmp_path / "even", base, spec)
    e = row(verdict_table(load_inputs([even]), n_boot=500), "ngram-k2-c1")
    assert e["tpot_speedup_lo"] < 1 < e["tpot_speedup_hi"]
    assert e["outcome"] == "even"


def test_one_paired_prompt_gives_a_point_estimate_without_interval(tmp_path):
    run = small_run(tmp_path / "r", [0.02], [0.01])
    s = row(verdict_table(load_inputs([run]), n_boot=500), "ngram-k2-c1")
    assert s["tpot_speedup"] == pytest.approx(2.0)
    assert np.isnan(s["tpot_speedup_lo"]) and np.isnan(s["tpot_speedup_hi"])
    assert s["outcome"] == "unclear" and s["paired_prompts"] == 1


def test_acceptance_and_memory_columns(tmp_path):
    # k = 2; prompt 0 accepts 2 and 2 of 2, prompt 1 accepts 1 and 0: 5 of 8 drafted tokens,
    # 4 steps -> mean acceptance length 1 + 5/4.
    run = small_run(tmp_path / "r", [0.02, 0.02], [0.01, 0.01], accepted=[(2, 2), (1, 0)],
                    base_peak=100 * MiB, spec_peak=150 * MiB)
    inputs = load_inputs([run])
    s = row(verdict_table(inputs, n_boot=200), "ngram-k2-c1")
    assert s["acceptance_rate_tok"] == pytest.approx(5 / 8)
    assert s["mean_acceptance_length_tok"] == pytest.approx(2.25)
    assert s["peak_memory_bytes"] == 150 * MiB
    assert s["memory_delta_bytes"] == 50 * MiB and s["memory_delta_frac"] == pytest.approx(0.5)
    page = build_report(inputs, n_boot=200)
    for text in ("62.5%", "2.25", "150 MiB", "+50 MiB", "(+50%)"):
        assert text in page, text


def test_failed_samples_are_counted_and_left_out_of_percentiles(tmp_path):
    rows = [sample_row("r", BASELINE, 1, f"p{i}", tpot=t) for i, t in enumerate([0.01, 0.03])]
    rows.append(sample_row("r", BASELINE, 1, "p2", tpot=0.0, error="out of memory"))
    inputs = load_inputs([write_run(tmp_path / "r", rows)])
    b = row(verdict_table(inputs, n_boot=200), "baseline-c1")
    assert b["n"] == 3 and b["errors"] == 1
    assert b["tpot_p50_s"] == pytest.approx(0.02)
    page = build_report(inputs, n_boot=200)
    assert "(1 failed)" in page and "out of memory" in page


def test_method_sentence_names_the_concurrency_where_speculation_stops_paying(synthetic):
    t = verdict_table(load_inputs([synthetic]), n_boot=500)
    assert set(t.loc[t["concurrency"] == 1, "outcome"]) == {"baseline", "win"}
    assert set(t.loc[t["concurrency"] == 4, "outcome"]) == {"baseline", "loss"}
    sentence = method_sentences(t)["draft_model"]
    assert "pays up to concurrency 1" in sentence
    assert "stops paying from concurrency 4" in sentence
    rec = recommendation(t)
    assert rec.tone == "yes"
    assert rec.details[0].startswith("Concurrency 1: turn on draft_model-k4")
    assert rec.details[1].startswith("Concurrency 4: leave it off")


def test_sentences_for_one_concurrency_and_for_no_win(tmp_path):
    win = small_run(tmp_path / "win", [0.010, 0.020, 0.030], [0.005, 0.010, 0.015])
    sentence = method_sentences(verdict_table(load_inputs([win]), n_boot=200))["ngram"]
    assert "ngram pays at concurrency 1" in sentence and "--concurrency" in sentence

    rows = [sample_row("lose", spec, c, f"p{i}", tpot=t * (1 if spec is BASELINE else 2),
                       accepted=(0,) if spec.speculative else ())
            for c in (1, 2) for spec in (BASELINE, K2)
            for i, t in enumerate([0.01, 0.02, 0.03])]
    t = verdict_table(load_inputs([write_run(tmp_path / "lose", rows)]), n_boot=200)
    assert set(t.loc[~t["is_baseline"], "outcome"]) == {"loss"}
    assert "ngram does not pay at any concurrency measured" in method_sentences(t)["ngram"]
    rec = recommendation(t)
    assert rec.tone == "no" and len(rec.details) == 2


def test_baseline_only_run_has_no_verdict(tmp_path):
    rows = [sample_row("r", BASELINE, 1, f"p{i}", tpot=0.01) for i in range(3)]
    t = verdict_table(load_inputs([write_run(tmp_path / "r", rows)]), n_boot=200)
    assert recommendation(t).tone == "unknown"
    assert method_sentences(t) == {}


# ---- pairing configurations with a baseline ---------------------------------------------


def test_each_run_is_paired_with_its_own_baseline(tmp_path):
    a = small_run(tmp_path / "a", [0.02, 0.02], [0.01, 0.01])
    b = small_run(tmp_path / "b", [0.04, 0.04], [0.01, 0.01])
    inputs = load_inputs([a, b])
    assert inputs.pairs == {"a · ngram-k2-c1": "a · baseline-c1",
                            "b · ngram-k2-c1": "b · baseline-c1"}
    t = verdict_table(inputs, n_boot=200)
    assert row(t, "a · ngram-k2-c1")["tpot_speedup"] == pytest.approx(2.0)
    assert row(t, "b · ngram-k2-c1")["tpot_speedup"] == pytest.approx(4.0)


def test_baseline_option_makes_one_run_the_reference(tmp_path):
    a = small_run(tmp_path / "a", [0.02, 0.02], [0.01, 0.01])
    b = small_run(tmp_path / "b", [0.04, 0.04], [0.01, 0.01])
    inputs = load_inputs([a, b], baseline=b)
    assert set(inputs.pairs.values()) == {"baseline-c1"}  # the only baseline left: no prefix
    base = inputs.frame[inputs.frame["is_baseline"]]
    assert set(base["source"]) == {"b"} and set(base["label"]) == {"baseline-c1"}
    assert any("baseline rows of run a left out" in n for n in inputs.notes)
    t = verdict_table(inputs, n_boot=200)
    assert row(t, "a · ngram-k2-c1")["tpot_speedup"] == pytest.approx(4.0)


def test_run_without_baseline_borrows_the_only_other_baseline(tmp_path):
    base = small_run(tmp_path / "base", [0.03, 0.03], [], baseline=True)
    spec = small_run(tmp_path / "spec", [], [0.01, 0.01], baseline=False)
    inputs = load_inputs([base, spec])
    assert inputs.pairs == {"ngram-k2-c1": "baseline-c1"}
    assert row(verdict_table(inputs, n_boot=200), "ngram-k2-c1")["tpot_speedup"] == \
        pytest.approx(3.0)


def test_run_without_baseline_and_two_candidates_asks_for_baseline_option(tmp_path):
    a = small_run(tmp_path / "a", [0.02, 0.02], [0.01, 0.01])
    b = small_run(tmp_path / "b", [0.04, 0.04], [0.01, 0.01])
    c = small_run(tmp_path / "c", [], [0.01, 0.01], baseline=False)
    with pytest.raises(ConfigError, match="--baseline"):
        load_inputs([a, b, c])
    assert load_inputs([a, b, c], baseline=a).pairs["c · ngram-k2-c1"] == "baseline-c1"


def test_configuration_without_baseline_at_its_concurrency_is_noted(tmp_path):
    rows = [sample_row("r", BASELINE, 1, f"p{i}", tpot=0.02) for i in range(2)]
    rows += [sample_row("r", K2, c, f"p{i}", tpot=0.01, accepted=(1,))
             for c in (1, 4) for i in range(2)]
    inputs = load_inputs([write_run(tmp_path / "r", rows)])
    assert inputs.pairs["ngram-k2-c4"] is None
    assert any("ngram-k2-c4" in n for n in inputs.notes)
    t = verdict_table(inputs, n_boot=200)
    assert row(t, "ngram-k2-c4")["outcome"] == "no-baseline"
    assert np.isnan(row(t, "ngram-k2-c4")["tpot_speedup"])
