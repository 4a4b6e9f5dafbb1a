"""`specbench.compare` on synthetic runs: a planted regression (20% slower TPOT, lower
acceptance, a changed greedy output, a failed sample) is caught; an identical rerun with fresh
timing noise is not flagged for any of 20 seeds; incomparable runs name what differs; the
threshold parsers; and every output format parses (JSON, JUnit XML, Markdown).

Synthetic frames go through the records schema (pyarrow -> pandas) so their dtypes are those
`read_run` returns, and they need no model.
"""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from specbench import compare as cmp
from specbench.errors import ConfigError
from specbench.records import SCHEMA

N_PROMPTS = 24
K = 4


def synthetic_run(*, noise_seed: int = 0, noise: float = 0.05, tpot_factor: float = 1.0,
                  acceptance_factor: float = 1.0, json_acceptance_factor: float = 1.0, n_prompts: int = N_PROMPTS,
                  configs=("baseline-c1", f"draft_model-k{K}-c1"), run_id: str = "run",
                  temperature: float = 0.0, workload: str = "synthetic",
                  change_output_of: str | None = None, fail: str | None = None,
                  invalid_output_of: str | None = None, meta_overrides: dict | None = None):
    """(samples, metadata) like `read_run` returns. Per prompt: a fixed "difficulty" (prompt
    seeds, the same in every run) times lognormal timing noise (`noise_seed`, per run).
    Deterministic columns (acceptance, outputs) depend on the prompt only. Every third prompt asks
    for JSON (scenario json) and its output is valid, except `invalid_output_of`'s in the
    speculative configuration; `json_acceptance_factor` scales acceptance on those prompts only."""
    prompt_rng = np.random.default_rng(12345)
    difficulty = prompt_rng.uniform(0.5, 2.0, size=n_prompts)
    accept_p = prompt_rng.uniform(0.3, 0.8, size=n_prompts)
    outputs = [list(map(int, prompt_rng.integers(0, 300, size=32))) for _ in range(n_prompts)]
    rng = np.random.default_rng(noise_seed)
    rows = []
    for cid in configs:
        base = cid.startswith("baseline")
        k = 0 if base else int(cid.split("-k")[1].split("-")[0])
        concurrency = int(cid.rsplit("-c", 1)[1])
        for i in range(n_prompts):
            pid = f"p{i:02d}"
            tpot = 0.010 * difficulty[i] * (1.0 if base else 0.6 * tpot_factor)
            tpot *= float(np.exp(rng.normal(0, noise)))
            ttft = 0.020 * difficulty[i] * float(np.exp(rng.normal(0, noise)))
            n_out = 32
            steps = 0 if base else 12
            drafted = steps * k
            factor = acceptance_factor * (json_acceptance_factor if i % 3 == 0 else 1.0)
            accepted = 0 if base else int(round(drafted * accept_p[i] * factor))
            out = list(outputs[i])
            if change_output_of == pid and not base:
                out[5] = (out[5] + 1) % 300
            err = "boom" if fail == f"{cid}/{pid}" else None
            rows.append({
                "run_id": run_id, "config_id": cid, "backend": "embedded",
                "method": "none" if base else "draft_model", "num_speculative_tokens": k,
                "draft_model": None if base else "draft", "concurrency": concurrency,
                "request_rate": None, "is_baseline": base, "workload": workload,
                "workload_kind": "custom", "category": "chat", "prompt_id": pid, "scenario": "json" if i % 3 == 0 else "free", "repeat": 0, "seed": 0,
                "temperature": temperature, "top_p": 1.0, "top_k": 0, "max_new_tokens": 32,
                "input_tokens": 20, "output_tokens": n_out, "arrival_s": 0.0, "sent_s": 0.0,
                "finish_s": ttft + tpot * (n_out - 1), "ttft_s": ttft, "tpot_s": tpot,
                "e2e_s": ttft + tpot * (n_out - 1), "queue_s": 0.0, "itl_s": [], "chunk_itl_s": [],
                "target_forward_passes": steps + 1, "num_steps": steps,
                "drafted_tokens": drafted, "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafted if drafted else None,
                "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
                "tokens_per_target_pass": n_out / (steps + 1),
                "accepted_per_step": [], "rejection_positions": [], "prefill_time_s": 0.001,
                "draft_time_s": 0.0, "verify_time_s": 0.0, "step_batch_size": [], "step_context_tokens": [],
                "step_drafted": [], "step_accepted": [], "step_emitted": [], "step_draft_time_s": [],
                "step_verify_time_s": [], "peak_memory_bytes": 1,
                "finish_reason": "error" if err else "length", "error": err,
                "output_token_ids": out, "token_match_rate": None if base else 1.0,
                "first_divergence": None if base else -1,
                "output_valid": (invalid_output_of != pid or base) if i % 3 == 0 else None,
                "validation_error": "not JSON" if i % 3 == 0 and invalid_output_of == pid and not base else None,
            })
    df = pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()
    meta = {"run_id": run_id, "status": "complete", "created_at": "2026-01-01T00:00:00+00:00",
            "device": "cpu (x86_64)", "git_revision": "abc", "hostname": "ci",
            "versions": {"specbench": "0.1.0", "torch": "2.13.0"},
            "config": {"target": "target", "draft": "draft", "dtype_resolved": "float32",
                       "backend": "embedded", "warmup": 1, "ignore_eos": False,
                       "chat_template": True, "truncate": False, "seed": 0}}
    for key, value in (meta_overrides or {}).items():
        if key == "config":
            meta["config"].update(value)
        else:
            meta[key] = value
    return df, meta


@pytest.fixture(scope="module")
def baseline():
    return synthetic_run(run_id="base")


def result(comp: cmp.Comparison, metric: str, config: str = f"draft_model-k{K}-c1"):
    [r] = [r for r in comp.results if r.metric == metric and r.config == config]
    return r


# ---- no false alarms ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_identical_rerun_with_timing_noise_is_not_flagged(baseline, seed):
    rerun = synthetic_run(noise_seed=1000 + seed, run_id=f"rerun{seed}")
    comp = cmp.compare_runs(baseline, rerun, seed=seed)
    assert comp.comparable, comp.reasons
    assert comp.exit_code == 0, comp.summary()
    assert not [r for r in comp.results if r.verdict == "regression"], comp.summary()
    assert {r.metric for r in comp.results} == set(cmp.DEFAULT_METRICS)


def test_a_bare_threshold_on_the_point_estimate_would_have_raised_false_alarms(baseline):
    # Why the bootstrap: among the same 20 reruns, the point change alone exceeds 5% somewhere.
    worst = 0.0
    for seed in range(20):
        comp = cmp.compare_runs(baseline, synthetic_run(noise_seed=1000 + seed),
                                metrics=["tpot_p50", "ttft_p50", "e2e_p50"], seed=seed)
        worst = max(worst, *(r.change for r in comp.results))
        assert comp.exit_code == 0
    assert worst > cmp.TIMING_THRESHOLD


def test_identical_run_compares_equal_on_every_metric(baseline):
    comp = cmp.compare_runs(baseline, baseline)
    assert comp.exit_code == 0 and comp.differences == []
    for r in comp.results:
        assert r.verdict == "ok" and r.change == 0, r
    assert "no regression" in comp.summary()


def scenario_acceptance_change(base, cur) -> dict[str, float]:
    """Each scenario's relative change of the pooled acceptance rate, computed from the frames."""
    out = {}
    for kind in ("free", "json"):
        rates = []
        for df, _ in (base, cur):
            g = df[(df["scenario"] == kind) & ~df["is_baseline"]]
            rates.append(g["accepted_tokens"].sum() / g["drafted_tokens"].sum())
        out[kind] = rates[1] / rates[0] - 1.0
    return out


def test_acceptance_jitter_within_the_tolerance_passes(baseline):
    jittered = synthetic_run(acceptance_factor=0.998, noise_seed=3)
    changes = scenario_acceptance_change(baseline, jittered)
    # a real drop, and within the tolerance in every scenario (json's is at it: one token fewer)
    assert any(changes.values()) and all(0 <= -c <= cmp.ACCEPTANCE_THRESHOLD + 1e-12 for c in changes.values()), changes
    comp = cmp.compare_runs(baseline, jittered)
    assert result(comp, "acceptance_rate").verdict == "ok"
    assert comp.exit_code == 0


def test_acceptance_lost_in_one_scenario_is_a_regression_though_the_pooled_figure_holds(baseline):
    """JSON prompts accept 6% fewer drafts while free text accepts 3% more: pooled, acceptance
    moves by less than the 1% tolerance, and a gate on the pooled figure alone would pass a
    change that costs every structured-output request."""
    shifted = synthetic_run(noise_seed=3, acceptance_factor=1.03, json_acceptance_factor=0.94 / 1.03)
    changes = scenario_acceptance_change(baseline, shifted)
    assert changes["json"] < -0.05 and changes["free"] > 0.02, changes
    comp = cmp.compare_runs(baseline, shifted, gate="deterministic")
    r = result(comp, "acceptance_rate")
    assert abs(r.change) < cmp.ACCEPTANCE_THRESHOLD, r  # the pooled figure alone would pass
    assert r.verdict == "regression" and r.failed and comp.exit_code == 1, r
    assert "regressed in json" in r.note and r.note.startswith("by scenario: free 0.594 -> "), r.note
    # one scenario only: no breakdown, the pooled verdict as before
    free_only = [synthetic_run(run_id="base"), shifted]
    for i, (df, meta) in enumerate(free_only):
        free_only[i] = (df.assign(scenario="free"), meta)
    r = result(cmp.compare_runs(*free_only, gate="deterministic"), "acceptance_rate")
    assert r.verdict == "ok" and "by scenario" not in r.note, r


# ---- planted regressions are caught ---------------------------------------------------------


def test_one_invalid_structured_output_is_a_regression(baseline):
    comp = cmp.compare_runs(baseline, synthetic_run(noise_seed=3, invalid_output_of="p03"))
    r = [x for x in comp.results if x.metric == "valid_outputs" and x.config == f"draft_model-k{K}-c1"][0]
    assert r.verdict == "regression" and comp.exit_code == 1 and r.n == N_PROMPTS // 3
    assert r.current == pytest.approx(1 - 3 / N_PROMPTS) and "1 invalid (p03)" in r.note
    back = cmp.compare_runs(synthetic_run(noise_seed=3, invalid_output_of="p03"), baseline, metrics=["valid_outputs"])
    assert {x.verdict for x in back.results} == {"ok", "improved"} and back.exit_code == 0


def test_a_20_percent_tpot_regression_is_flagged(baseline):
    slower = synthetic_run(noise_seed=7, tpot_factor=1.2)
    comp = cmp.compare_runs(baseline, slower, metrics=["tpot_p50"])
    r = result(comp, "tpot_p50")
    assert r.verdict == "regression" and r.failed and comp.exit_code == 1
    assert 0.12 < r.change < 0.28
    assert r.ci_low > 0.05 and r.ci_low < r.change < r.ci_high
    assert result(comp, "tpot_p50", "baseline-c1").verdict == "ok"  # the baseline config is fine
    assert "tpot_p50 on draft_model-k4-c1" in comp.summary()


def test_a_20_percent_regression_is_caught_for_every_bootstrap_seed(baseline):
    slower = synthetic_run(noise_seed=8, tpot_factor=1.2)
    for seed in range(5):
        comp = cmp.compare_runs(baseline, slower, metrics=["tpot_p50", "e2e_p50", "output_tps"],
                                seed=seed)
        for metric in ("tpot_p50", "e2e_p50", "output_tps"):
            assert result(comp, metric).verdict == "regression", (seed, metric)


def test_a_regression_below_the_allowed_budget_passes(baseline):
    slower = synthetic_run(noise_seed=7, tpot_factor=1.2)
    comp = cmp.compare_runs(baseline, slower, metrics=["tpot_p50"], thresholds={"tpot_p50": 0.3})
    assert result(comp, "tpot_p50").verdict == "ok" and comp.exit_code == 0


def test_a_large_but_noisy_change_is_inconclusive_not_a_failure():
    # 6 prompts with 40% timing noise: the point estimate is worse than 5%, but the interval
    # cannot rule out no change at all.
    base = synthetic_run(n_prompts=6, noise=0.4, noise_seed=1)
    for seed in range(2, 40):
        cur = synthetic_run(n_prompts=6, noise=0.4, noise_seed=seed)
        comp = cmp.compare_runs(base, cur, metrics=["tpot_p50"])
        r = result(comp, "tpot_p50")
        if r.verdict == "inconclusive":
            break
    assert r.verdict == "inconclusive", "no seed gave an inconclusive case"
    assert r.change > 0.05 and r.ci_low <= 0.01 and not r.failed and comp.exit_code == 0
    assert "not significant" in r.note


def test_lower_acceptance_is_a_regression_even_when_timing_noise_hides_it(baseline):
    # 5% fewer accepted tokens and timings as noisy as ever: timing passes, acceptance fails.
    worse_draft = synthetic_run(noise_seed=11, acceptance_factor=0.95)
    comp = cmp.compare_runs(baseline, worse_draft, gate="deterministic")
    assert result(comp, "tpot_p50").verdict in ("ok", "inconclusive")
    for metric in ("acceptance_rate", "mean_acceptance_length"):
        r = result(comp, metric)
        assert r.verdict == "regression" and r.failed, r
        assert r.current < r.baseline
    assert comp.exit_code == 1


@pytest.mark.parametrize("current_factor, verdict", [(0.0, "ok"), (1.0, "improved")])
def test_a_baseline_run_that_accepted_no_draft_token_compares_without_dividing_by_zero(current_factor, verdict):
    # Drafted, none accepted (a draft that never agrees: tiny random models do this): the
    # relative change of the acceptance rate has no denominator.
    none_accepted = synthetic_run(run_id="base", acceptance_factor=0.0)
    comp = cmp.compare_runs(none_accepted, synthetic_run(noise_seed=3, acceptance_factor=current_factor))
    r = result(comp, "acceptance_rate")
    assert r.baseline == 0.0 and r.verdict == verdict and not r.failed, r
    json.loads(cmp.RENDERERS["json"](comp))


def test_acceptance_is_not_computed_for_the_baseline_configuration(baseline):
    comp = cmp.compare_runs(baseline, baseline)
    metrics = {r.metric for r in comp.results if r.config == "baseline-c1"}
    assert "acceptance_rate" not in metrics and "mean_acceptance_length" not in metrics


def test_a_changed_greedy_output_is_a_regression(baseline):
    comp = cmp.compare_runs(baseline, synthetic_run(noise_seed=2, change_output_of="p03"))
    r = result(comp, "greedy_match")
    assert r.verdict == "regression" and r.failed and comp.exit_code == 1
    assert r.current == pytest.approx(1 - 1 / N_PROMPTS) and "p03" in r.note
    assert result(comp, "greedy_match", "baseline-c1").verdict == "ok"


def test_a_changed_greedy_output_is_not_gated_when_the_target_changed(baseline):
    cur = synthetic_run(noise_seed=2, change_output_of="p03",
                        meta_overrides={"config": {"target": "target-v2"}})
    comp = cmp.compare_runs(baseline, cur)
    r = result(comp, "greedy_match")
    assert r.verdict == "regression" and not r.gated and "target" in r.note
    assert comp.exit_code == 0
    assert {"field": "target", "baseline": "target", "current": "target-v2"} in comp.differences


def test_sampled_prompts_have_no_greedy_match(baseline):
    sampled = synthetic_run(temperature=0.7)
    comp = cmp.compare_runs(sampled, sampled)
    assert result(comp, "greedy_match").verdict == "n/a"


def test_a_new_failed_sample_is_a_regression(baseline):
    comp = cmp.compare_runs(baseline, synthetic_run(noise_seed=4, fail=f"draft_model-k{K}-c1/p05"))
    r = result(comp, "errors")
    assert r.failed and r.baseline == 0 and r.current == 1
    assert comp.exit_code == 1


def test_gate_deterministic_reports_timing_regressions_without_failing(baseline):
    slower = synthetic_run(noise_seed=7, tpot_factor=1.2)
    comp = cmp.compare_runs(baseline, slower, gate="deterministic")
    r = result(comp, "tpot_p50")
    assert r.verdict == "regression" and not r.gated and not r.failed
    assert comp.exit_code == 0
    assert cmp.format_verdict(r) == "regression (not gated)"
    assert cmp.compare_runs(baseline, slower, gate="none").exit_code == 0


# ---- what must match and what may differ ----------------------------------------------------


def test_allowed_differences_are_reported_not_refused(baseline):
    cur = synthetic_run(noise_seed=5, meta_overrides={
        "git_revision": "def", "versions": {"specbench": "0.2.0", "torch": "2.13.0"},
        "config": {"draft": "draft-v2", "dtype_resolved": "bfloat16"}})
    comp = cmp.compare_runs(baseline, cur)
    assert comp.comparable
    fields = {d["field"] for d in comp.differences}
    assert fields == {"git_revision", "specbench version", "draft", "dtype"}


@pytest.mark.parametrize("name, change, needles", [
    ("workload", dict(workload="other"), ["workload differs", "'synthetic'", "'other'"]),
    ("prompt ids", dict(n_prompts=N_PROMPTS - 2), ["prompt ids differ", "2 only in baseline",
                                                   "p22", "p23"]),
    ("sampling", dict(temperature=0.7), ["sampling differs", "temperature", f"{N_PROMPTS} prompt"]),
    ("configs", dict(configs=("baseline-c1", "draft_model-k5-c1")),
     ["configurations differ", "only in baseline: draft_model-k4-c1",
      "only in current: draft_model-k5-c1", "--allow-config-diff"]),
    ("ignore_eos", dict(meta_overrides={"config": {"ignore_eos": True}}),
     ["ignore_eos differs"]),
])
def test_incomparable_runs_name_the_difference(baseline, name, change, needles):
    comp = cmp.compare_runs(baseline, synthetic_run(**change))
    assert not comp.comparable and comp.exit_code == 2 and comp.results == []
    text = comp.summary()
    assert text.startswith("not comparable: ")
    for needle in needles:
        assert needle in text, (needle, text)


def test_allow_config_diff_pairs_a_change_of_k_by_concurrency(baseline):
    cur = synthetic_run(configs=("baseline-c1", "draft_model-k5-c1"), noise_seed=6,
                        acceptance_factor=0.8)
    comp = cmp.compare_runs(baseline, cur, allow_config_diff=True)
    assert comp.comparable, comp.reasons
    assert {r.config for r in comp.results} == {"baseline-c1",
                                                "draft_model-k4-c1 -> draft_model-k5-c1"}
    assert result(comp, "acceptance_rate", "draft_model-k4-c1 -> draft_model-k5-c1").failed


def test_allow_config_diff_leaves_ambiguous_configs_unmatched(baseline):
    cur = synthetic_run(configs=("baseline-c1", "draft_model-k2-c1", "draft_model-k8-c1"))
    comp = cmp.compare_runs(baseline, cur, allow_config_diff=True)
    assert comp.comparable
    assert {r.config for r in comp.results} == {"baseline-c1"}
    assert sorted(comp.unmatched) == ["draft_model-k2-c1 (current only)",
                                      "draft_model-k4-c1 (baseline only)",
                                      "draft_model-k8-c1 (current only)"]


def test_no_shared_configuration_is_incomparable_even_when_allowed(baseline):
    cur = synthetic_run(configs=("draft_model-k4-c4",))
    comp = cmp.compare_runs(baseline, cur, allow_config_diff=True)
    assert not comp.comparable and "no configuration in common" in comp.summary()


def test_derived_seeds_make_the_run_seed_part_of_the_setup(baseline):
    b = copy.deepcopy(baseline)
    c = synthetic_run(meta_overrides={"config": {"seed": 1}})
    assert cmp.compare_runs(b, c).comparable  # explicit per-request seeds: run seed irrelevant
    b[0]["seed"] = None
    c[0]["seed"] = None
    comp = cmp.compare_runs(b, c)
    assert not comp.comparable and "seed differs" in comp.summary()


# ---- flags ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125),
                                         ("0", 0.0), ("1", 1.0), (".5", 0.5)])
def test_parse_fraction(text, value):
    assert cmp.parse_fraction(text, "--max-regression") == pytest.approx(value)


@pytest.mark.parametrize("text, needle", [("abc", "not a fraction"), ("5", "ambiguous"),
                                          ("-5%", "not a fraction"), ("5%%", "not a fraction"),
                                          ("", "not a fraction"), ("1e400%", "not a finite fraction")])
def test_parse_fraction_refuses_malformed_values(text, needle):
    with pytest.raises(ConfigError, match=needle):
        cmp.parse_fraction(text, "--max-regression")


def test_parse_thresholds_bare_sets_timing_named_sets_one():
    metrics = list(cmp.DEFAULT_METRICS)
    thr = cmp.parse_thresholds(["10%", "acceptance_rate=2%", "errors=1"], metrics)
    assert thr["tpot_p50"] == thr["output_tps"] == pytest.approx(0.10)
    assert thr["acceptance_rate"] == pytest.approx(0.02)
    assert thr["mean_acceptance_length"] == pytest.approx(cmp.ACCEPTANCE_THRESHOLD)
    assert thr["errors"] == 1 and thr["greedy_match"] == 0
    assert cmp.parse_thresholds(["tpot_p50=1%", "20%"], metrics)["tpot_p50"] == pytest.approx(0.01)


@pytest.mark.parametrize("values, metrics, needle", [
    (["nosuch=5%"], ["tpot_p50"], "unknown metric 'nosuch'"),
    (["e2e_p50=5%"], ["tpot_p50"], "not among the compared"),
    (["5%"], ["acceptance_rate"], "none is compared"),
    (["errors=1.5"], ["errors"], "whole number"),
    ([""], ["tpot_p50"], "--max-regression: empty item"), (["5%,,errors=1"], ["tpot_p50", "errors"], "empty item"),
])
def test_parse_thresholds_refusals(values, metrics, needle):
    with pytest.raises(ConfigError, match=needle):
        cmp.parse_thresholds(values, metrics)


def test_unknown_metric_lists_the_valid_ones():
    with pytest.raises(ConfigError) as exc:
        cmp.parse_metrics(["tpot_p50,latency"])
    msg = str(exc.value)
    assert "'latency'" in msg and all(name in msg for name in cmp.METRICS)
    assert cmp.parse_metrics(None) == list(cmp.DEFAULT_METRICS)
    assert cmp.parse_metrics(["e2e_p50, tpot_p50", "e2e_p50"]) == ["e2e_p50", "tpot_p50"]
    for empty in (["tpot_p50,,ttft_p50"], [","], [""]):
        with pytest.raises(ConfigError, match="--metric: empty item"):
            cmp.parse_metrics(empty)


# ---- output formats -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing(baseline):
    return cmp.compare_runs(baseline, synthetic_run(noise_seed=7, tpot_factor=1.2,
                                                    acceptance_factor=0.9))


def test_json_report_parses_and_carries_every_result(failing):
    doc = json.loads(cmp.to_json(failing))
    assert doc["outcome"] == "regression" and doc["exit_code"] == 1 and doc["comparable"]
    assert len(doc["results"]) == len(failing.results)
    [tpot] = [r for r in doc["results"]
              if r["metric"] == "tpot_p50" and r["config"] == f"draft_model-k{K}-c1"]
    assert tpot["verdict"] == "regression" and tpot["failed"] is True
    assert tpot["ci_low"] > 0 and doc["settings"]["n_boot"] == 2000


def test_junit_report_has_one_test_case_per_metric_and_config(failing):
    root = ET.fromstring(cmp.to_junit(failing))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(failing.results)
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == len(failing.failures) == int(root.find("testsuite").get("failures"))
    names = {(c.get("classname"), c.get("name")) for c in failed}
    assert ("specbench.compare.draft_model-k4-c1", "tpot_p50") in names
    assert ("specbench.compare.draft_model-k4-c1", "acceptance_rate") in names
    assert root.find("testsuite").get("tests") == str(len(cases))


def test_markdown_report_has_a_table(failing):
    md = cmp.to_markdown(failing)
    lines = md.splitlines()
    assert lines[0].startswith("### specbench compare:") and "regression" in lines[0]
    header = [i for i, line in enumerate(lines) if line.startswith("| config | metric |")]
    assert len(header) == 1 and set(lines[header[0] + 1]) <= set("|-: ")
    rows = [line for line in lines if line.startswith("| ") and line.count("|") == 9]
    assert len(rows) == len(failing.results) + 1  # + the header
    assert "**regression**" in md


def test_reports_of_incomparable_runs_say_why(baseline):
    comp = cmp.compare_runs(baseline, synthetic_run(workload="other"))
    doc = json.loads(cmp.to_json(comp))
    assert doc["comparable"] is False and doc["exit_code"] == 2 and doc["results"] == []
    assert "workload differs" in doc["reasons"][0]
    root = ET.fromstring(cmp.to_junit(comp))
    [case] = root.findall("./testsuite/testcase")
    assert case.get("name") == "comparable"
    assert "workload differs" in case.find("error").get("message")
    md = cmp.to_markdown(comp)
    assert "not comparable" in md.splitlines()[0] and "workload differs" in md


def test_rich_table_renders_every_result(failing):
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(cmp.rich_table(failing))
    text = console.export_text()
    assert "regression" in text and "draft_model-k4-c1" in text
    assert text.count("tpot_p50") == 2


# ---- runs made at different times -------------------------------------------------------------

def drifting_run(run_id: str, drifts: list[float], tpot_factor: float = 1.0, seed: int = 0):
    """A run measured with --repeats len(drifts): repeat r's timings all scaled by drifts[r], as
    a machine that is busier or quieter at the time of that repeat makes them."""
    frames = []
    for r, drift in enumerate(drifts):
        df, meta = synthetic_run(run_id=run_id, noise_seed=seed * 100 + r, tpot_factor=tpot_factor)
        for col in ("tpot_s", "ttft_s", "e2e_s", "finish_s"):
            df[col] = df[col] * drift
        df["repeat"] = r
        frames.append(df)
    return pd.concat(frames, ignore_index=True), meta


def test_a_drift_between_two_runs_passes_for_a_regression_with_prompt_intervals_not_repeat_ones():
    # the same configuration, measured twice on a machine whose load moves by +-15% from one
    # repeat to the next; the second run happened to meet the busier minutes (+10% on average)
    a = drifting_run("a", [1.00, 1.20, 0.90, 1.10], seed=1)
    b = drifting_run("b", [1.10, 1.30, 0.95, 1.25], seed=2)
    by_prompts = cmp.compare_runs(a, b, metrics=["tpot_p50"])
    assert result(by_prompts, "tpot_p50").verdict == "regression"  # the reported false alarm
    assert any("prompt-to-prompt noise only" in n for n in by_prompts.notes)
    by_repeats = cmp.compare_runs(a, b, metrics=["tpot_p50"], interval="repeats")
    r = result(by_repeats, "tpot_p50")
    assert r.verdict == "inconclusive" and r.n == 4
    assert r.ci_low < 0.01 < 0.10 < r.ci_high
    # a real regression (1.6x) is still caught from the repeats
    c = drifting_run("c", [1.6 * x for x in (1.10, 1.30, 0.95, 1.25)], seed=3)
    assert result(cmp.compare_runs(a, c, metrics=["tpot_p50"], interval="repeats"), "tpot_p50").verdict \
        == "regression"


def test_repeat_intervals_need_repeats_and_a_known_interval_name(baseline):
    # gated, timings without repeats are not a pass: nothing timed could be gated (exit 2)
    comp = cmp.compare_runs(baseline, synthetic_run(run_id="cur"), metrics=["tpot_p50"], interval="repeats")
    assert comp.exit_code == 2 and "--interval repeats gates tpot_p50" in comp.reasons[0]
    assert "--repeats N" in comp.reasons[0] and "\n" not in comp.reasons[0]
    # reported beside a deterministic gate, they stay n/a, with the reason in the note
    comp = cmp.compare_runs(baseline, synthetic_run(run_id="cur"), metrics=["tpot_p50", "acceptance_rate"],
                            interval="repeats", gate="deterministic")
    r = result(comp, "tpot_p50")
    assert comp.exit_code == 0 and r.verdict == "n/a" and "--repeats" in r.note
    with pytest.raises(ConfigError, match="--interval must be one of prompts, repeats"):
        cmp.compare_runs(baseline, baseline, interval="bootstrap")


def test_tpot_speedup_over_each_runs_own_baseline_is_not_moved_by_drift_between_runs():
    a = drifting_run("a", [1.00, 1.20, 0.90, 1.10], seed=1)
    b = drifting_run("b", [1.25, 1.45, 1.15, 1.35], seed=2)  # a busier machine, every row alike
    comp = cmp.compare_runs(a, b, metrics=["tpot_p50", "tpot_speedup"])
    assert result(comp, "tpot_p50").verdict == "regression"
    r = result(comp, "tpot_speedup")
    assert r.verdict == "ok" and abs(r.change) < 0.03 and r.n == N_PROMPTS
    assert not any(x.metric == "tpot_speedup" and x.config.startswith("baseline") for x in comp.results)
    # a drafter that got 20% slower per token is caught by the same metric on the same drift
    c = drifting_run("c", [1.25, 1.45, 1.15, 1.35], tpot_factor=1.2, seed=3)
    r = result(cmp.compare_runs(a, c, metrics=["tpot_speedup"]), "tpot_speedup")
    assert r.verdict == "regression" and r.change == pytest.approx(1 / 1.2 - 1, abs=0.03)
