"""The serving profile's decision at its edges, asserted exactly: which configuration each
concurrency band recommends (ties, drafter families, trees and the chain a vLLM server runs
instead), which rule judged it (its own paired interval, an interval from the run files of
trials measured apart, or the point gain alone), the min_speedup margin at equality, gains of
maximized and minimized objectives, the texts a user reads (band `why`, the threshold's
sentence, the progress line, the nothing-measured message) and the YAML as written."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from specbench.analysis import SUMMARY_COLUMNS
from specbench.sweep import build_profile, build_spec, pareto_front, write_profile
from specbench.sweep.profile import best_so_far, candidates, evidence, levels, nothing_measured
from specbench.sweep.space import configuration
from specbench.sweep.trials import SKIPPED_ATTR

BASE_TPOT = 0.1


def make_spec(**flags):
    values = {"models.target": "t", "models.draft": ["d"], "space.concurrency": ["1,4,16"],
              "space.num_speculative_tokens": ["2,4"], "study.storage": "sqlite:///unused.db"}
    values.update(flags)
    return build_spec(None, values)


def summary(p, speedup: float, **extra) -> dict:
    s = {c: None for c in SUMMARY_COLUMNS}
    sc = p.spec
    s.update(config_id=f"{sc.method}-k{sc.num_speculative_tokens}-c{p.concurrency}", method=sc.method,
             num_speculative_tokens=sc.num_speculative_tokens, concurrency=p.concurrency,
             is_baseline=p.is_baseline, n=8.0, errors=0.0, tpot_p50_s=BASE_TPOT / speedup,
             tpot_p95_s=1.5 * BASE_TPOT / speedup, ttft_p50_s=0.05, e2e_p50_s=3.0 / speedup,
             output_tps=100.0 * p.concurrency * speedup, output_tps_per_user=10.0 * speedup,
             acceptance_rate_tok=None if p.is_baseline else 0.7,
             mean_acceptance_length_tok=None if p.is_baseline else 2.5,
             peak_memory_bytes=float(2**30))
    s.update(extra)
    return s


def add(study, spec, p, values, state=TrialState.COMPLETE, **attrs):
    """One trial of configuration `p` with objective `values` and user attrs `attrs`."""
    params = spec.space.params(p)
    study.add_trial(create_trial(
        state=state, params=params, distributions={k: CategoricalDistribution((v,)) for k, v in params.items()},
        values=list(values) if state == TrialState.COMPLETE else None, user_attrs=attrs))
    return study.trials[-1]


def measured(study, spec, p, values, speedup=None, run=None, **attrs):
    """A measured trial (run id, run dir, summary) numbered in order of addition."""
    i = len(study.trials)
    run = run or f"run-{i}"
    if speedup is None:
        speedup = values[0] if spec.objectives[0] == "speedup" and values[0] else 1.0
    attrs = {"run_id": run, "run_dir": f"runs/{run}", "summary": summary(p, speedup), **attrs}
    return add(study, spec, p, values, **attrs)


def paired(point, lo, hi, **extra):
    """The user attrs of a trial that measured its baseline interleaved with it."""
    return {"paired": {"point": point, "lo": lo, "hi": hi, "n": 8, "planned": 24, "stopped": None, **extra}}


def fixed(prof: dict) -> dict:
    prof["generated_at"] = "2024-01-01T00:00:00+00:00"
    return prof


def tree_study(tmp_path):
    """A paired study of two drafter families where the eagle3 tree wins at concurrency 1 (so
    eagle3 is judged everywhere), a flagged tree at 4, an undecided band at 16, a band paying
    again at 64 after speculation stopped, a band with only its baseline at 128, failed,
    reused and infeasible trials, and a model-guided sampler's skipped configurations."""
    spec = make_spec(**{"space.method": ["draft_model,eagle3"], "models.head": "heads/e3",
                        "space.topk": ["1,2"], "space.concurrency": ["1,4,16,64,128"],
                        "study.out": str(tmp_path / "study"), "study.name": "edge",
                        "study.sampler": "model"})
    study = optuna.create_study(directions=spec.directions)
    study.set_user_attr(SKIPPED_ATTR, {"draft_model|k4|d|c128": 0.7})
    base = {}

    def with_base(c, **kw):
        bs = summary(configuration(concurrency=c), 1.0)
        return {"baseline_summary": bs, "host": "gpu-a", **kw}

    for c in (1, 4, 16, 64, 128):
        base[c] = measured(study, spec, configuration(concurrency=c), [1.0], host="gpu-a")
    e3 = "eagle3"
    measured(study, spec, configuration(e3, 2, "heads/e3", 1, topk=2), [1.6],
             **with_base(1, **paired(1.6, 1.4, 1.8, rule="fixed")))
    measured(study, spec, configuration(e3, 2, "heads/e3", 1), [1.3], **with_base(1, **paired(1.3, 1.1, 1.5)))
    measured(study, spec, configuration("draft_model", 2, "d", 1), [1.5], **with_base(1, **paired(1.5, 1.3, 1.7)))
    measured(study, spec, configuration(e3, 4, "heads/e3", 4), [1.2],
             **with_base(4, **paired(1.2, 1.05, 1.35, blocks=6, stopped="win")))
    measured(study, spec, configuration(e3, 4, "heads/e3", 4, topk=2), [3.0],
             inconsistent=["TPOT speedup 3.000x exceeds tokens per target pass"],
             **with_base(4, **paired(3.0, 2.8, 3.2)))
    measured(study, spec, configuration("draft_model", 2, "d", 4), [1.4], **with_base(4, **paired(1.4, 1.3, 1.5)))
    measured(study, spec, configuration("draft_model", 4, "d", 4), [1.9], feasible=False, constraint=2.0,
             **with_base(4, **paired(1.9, 1.8, 2.0)))
    measured(study, spec, configuration(e3, 2, "heads/e3", 16), [1.1],
             **with_base(16, **paired(1.1, 0.95, 1.25, blocks=4)))
    measured(study, spec, configuration(e3, 2, "heads/e3", 64), [1.3],
             **with_base(64, **paired(1.3, 1.2, 1.4, blocks=8)))
    measured(study, spec, configuration(e3, 2, "heads/e3", 1), [1.3], duplicate_of=6)  # reused, not measured
    add(study, spec, configuration("draft_model", 4, "d", 16), None, state=TrialState.FAIL,
        fail_reason="CUDA OOM → k too large")
    add(study, spec, configuration("draft_model", 2, "d", 16), None, state=TrialState.FAIL)  # interrupted
    return spec, study


def test_profile_yaml_of_a_paired_tree_study_is_written_exactly(tmp_path):
    """Every decision and every text of the profile, as the user reads it: eagle3 (the family
    of the best paying configuration at concurrency 1) is judged at every band, the tree's
    chain is named for vLLM, the flagged tree is listed and skipped, the band that pays again
    after speculation stopped keeps the baseline and says so, blocks and the undecided hint
    are reported, failed trials carry their reason (or 'interrupted'), reused trials count as
    reused, not measured, and the YAML keeps the built key order, its unicode and 100-column
    lines. Any change here changes what a user deploys or reads."""
    spec, study = tree_study(tmp_path)
    prof = fixed(build_profile(spec, study))
    path = tmp_path / "nested" / "dir" / "profile.yaml"  # parents are created
    written = write_profile(path, prof)
    assert path.read_text(encoding="utf-8") == GOLDEN_TREE_PROFILE.replace("{tmp}", str(tmp_path))
    assert set(written) and all(Path(p).parent == path.parent for p in written.values())


def test_an_interval_reaching_exactly_1_is_still_undecided():
    """CI [0.8, 1.0] from blocks: not a loss (a loss needs the whole interval below 1), so the
    why suggests more prompts; a CI wholly below 1 would not."""
    spec = make_spec(**{"space.concurrency": ["4"]})
    study = simple_study(spec, [(configuration(concurrency=4), [1.0], {}),
                                (dm(2, 4), [0.9], paired(0.9, 0.8, 1.0, blocks=4))])
    assert build_profile(spec, study)["bands"][0]["why"] == (
        "best speculative draft_model k=2 (d) c4: speedup gain 0.900x over the baseline; speculation does "
        "not pay (paired TPOT speedup 0.900x, 95% CI [0.800, 1.000] (measured with its baseline "
        "interleaved), not wholly above 1x, from 4 blocks (undecided: more prompts, --num-prompts, buy "
        "more blocks))")


def samples(tpots) -> pd.DataFrame:
    return pd.DataFrame({"prompt_id": [f"p{i}" for i in range(len(tpots))], "tpot_s": list(tpots),
                         "error": [None] * len(tpots), "finish_reason": ["length"] * len(tpots)})


def server_study(tmp_path, monkeypatch):
    """A server sweep (trials measured apart, objective TPOT p50): at concurrency 1 both run
    files are on this host, at 4 the speculative trial's are not, at 16 no feasible baseline."""
    from specbench.errors import RecordsError

    spec = make_spec(**{"objective.name": ["tpot_p50"], "study.out": str(tmp_path)})
    study = optuna.create_study(directions=spec.directions)
    base_tpots = [0.10, 0.12, 0.14, 0.16, 0.18]
    files = {"b1": samples(base_tpots), "s1": samples([t / 1.5 for t in base_tpots]), "b4": samples(base_tpots)}

    def read_run(path):
        name = Path(path).name
        if Path(path).parent != tmp_path / "runs" or name not in files:
            raise RecordsError(f"no run at {path}")
        return files[name], {"run_id": name}

    monkeypatch.setattr("specbench.records.read_run", read_run)
    measured(study, spec, configuration(concurrency=1), [0.1], run="b1")
    measured(study, spec, configuration("draft_model", 2, "d", 1), [0.07], run="s1")
    measured(study, spec, configuration(concurrency=4), [0.1], run="b4")
    measured(study, spec, configuration("draft_model", 4, "d", 4), [0.08], run="s4")
    measured(study, spec, configuration(concurrency=16), [0.1], run="b16", feasible=False)
    measured(study, spec, configuration("draft_model", 2, "d", 16), [0.05], run="s16")
    return spec, study


def test_trials_measured_apart_are_judged_by_their_run_files_else_by_the_point_gain(tmp_path, monkeypatch):
    """A server sweep's trial has no interval of its own: with both run files here it is the
    bootstrap over shared prompts (reported as measured at another time, not interleaved);
    without them the point gain decides; with no feasible baseline there is no gain and no
    interval (nothing to read run files against)."""
    spec, study = server_study(tmp_path, monkeypatch)
    lv = levels(spec, candidates(study))
    assert [(x.concurrency, x.pays, x.paired) for x in lv] == [(1, True, False), (4, True, False),
                                                                (16, False, False)]
    assert lv[0].interval == pytest.approx((1.5, 1.5, 1.5)) and lv[1].interval is None and lv[2].interval is None
    prof = build_profile(spec, study)
    bands = prof["bands"]
    assert [b["gain"] for b in bands] == [pytest.approx(1.428571), 1.25, None]
    assert bands[0]["tpot_speedup_ci"] == [1.5, 1.5, 1.5]
    assert "tpot_speedup_ci" not in bands[1] and "tpot_speedup_ci" not in bands[2]
    assert [b["why"] for b in bands] == [
        "best speculative draft_model k=2 (d) c1: tpot_p50 gain 1.429x over the baseline; speculation pays "
        "(paired TPOT speedup 1.500x, 95% CI [1.500, 1.500] (against the baseline trial, measured at "
        "another time), wholly above 1x)",
        "best speculative draft_model k=4 (d) c4: tpot_p50 gain 1.250x over the baseline; speculation pays "
        "(no run files here for an interval: point gain vs threshold 1x)",
        "no feasible baseline measured at this concurrency"]
    assert [b["profile"] for b in bands] == ["speculative", "speculative", "baseline"]
    assert bands[2]["baseline"] is None and bands[2]["speculative"]["run_id"] == "s16"
    assert prof["disable_by_batch_size"]["why"] == (
        "speculation pays up to concurrency 4 (gain 1.250x) and not at 16 (gain n/a); the crossover "
        "lies in (4, 16]: measure concurrency values in between to narrow it")


def simple_study(spec, rows):
    """rows: (configuration, objective values, extra user attrs), measured in this order."""
    study = optuna.create_study(directions=spec.directions)
    for p, values, attrs in rows:
        measured(study, spec, p, values, **attrs)
    return study


def dm(k, c, **kw):
    return configuration("draft_model", k, "d", c, **kw)


def test_gain_of_a_maximized_objective_is_configuration_over_baseline():
    """output_tps is maximized: 150 tok/s against 100 is a 1.5x gain (not 0.667x, nor the
    product); the decision follows it."""
    spec = make_spec(**{"objective.name": ["output_tps"], "space.concurrency": ["1,4"]})
    study = simple_study(spec, [(configuration(concurrency=1), [100.0], {}), (dm(2, 1), [150.0], {}),
                                (configuration(concurrency=4), [400.0], {}), (dm(2, 4), [360.0], {})])
    prof = build_profile(spec, study)
    assert [b["gain"] for b in prof["bands"]] == [1.5, 0.9]
    assert [b["profile"] for b in prof["bands"]] == ["speculative", "baseline"]
    assert prof["disable_by_batch_size"]["value"] == 1


def test_a_latency_gain_uses_the_baseline_measured_with_the_trial():
    """A paired trial's gain on TPOT p50 is against the baseline samples measured interleaved
    with it (0.12 s / 0.08 s = 1.5x), not the separate baseline trial (0.1 s: 1.25x)."""
    spec = make_spec(**{"objective.name": ["tpot_p50"], "space.concurrency": ["1"]})
    bs = summary(configuration(concurrency=1), 1.0, tpot_p50_s=0.12, tpot_p95_s=0.2)
    study = simple_study(spec, [(configuration(concurrency=1), [0.1], {}),
                                (dm(2, 1), [0.08], {"baseline_summary": bs})])
    (x,) = levels(spec, candidates(study))
    assert x.gain == pytest.approx(1.5)
    assert x.pays and x.interval is None and not x.paired  # no paired interval: the point gain decided
    assert build_profile(spec, study)["bands"][0]["gain"] == 1.5


def test_a_speedup_gain_needs_no_baseline_trial():
    """With the speedup objective the trial's value is its gain, also where the baseline trial
    at that concurrency is infeasible (its own paired baseline measured it)."""
    spec = make_spec(**{"space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {"feasible": False}),
                                (dm(4, 1), [1.4], {})])
    (x,) = levels(spec, candidates(study))
    assert x.baseline is None and x.gain == 1.4 and x.pays


def test_a_zero_speedup_is_a_gain_of_zero_not_missing():
    spec = make_spec(**{"space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [2.0], {}), (dm(2, 1), [0.0], {})])
    (x,) = levels(spec, candidates(study))
    assert x.gain == 0.0 and not x.pays


def test_a_latency_gain_without_a_baseline_is_missing_not_an_error():
    """No feasible baseline (and no paired baseline summary): no gain, no verdict, no crash."""
    spec = make_spec(**{"objective.name": ["tpot_p50"], "space.concurrency": ["1,4"]})
    study = simple_study(spec, [(configuration(concurrency=1), [0.1], {}), (dm(2, 1), [0.05], {}),
                                (dm(2, 4), [0.05], {})])
    lv = levels(spec, candidates(study))
    assert [(x.concurrency, x.gain, x.pays) for x in lv] == [(1, 2.0, True), (4, None, False)]
    assert lv[1].baseline is None and lv[1].best is not None
    prof = build_profile(spec, study)
    assert prof["bands"][1]["why"] == "no feasible baseline measured at this concurrency"


def test_a_point_gain_equal_to_min_speedup_does_not_pay():
    """`gain > min_speedup`: a configuration exactly as fast as the margin is not worth it."""
    spec = make_spec(**{"space.concurrency": ["1"], "profile.min_speedup": 1.2})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}), (dm(2, 1), [1.2], {})])
    (x,) = levels(spec, candidates(study))
    assert x.gain == 1.2 and not x.pays
    assert build_profile(spec, study)["recommendation"] == "baseline"


def test_a_paired_interval_must_clear_min_speedup_not_just_1():
    """CI [1.1, 1.3] lies above 1 but not above min_speedup 1.2: it does not pay."""
    spec = make_spec(**{"space.concurrency": ["1"], "profile.min_speedup": 1.2})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}),
                                (dm(2, 1), [1.25], paired(1.25, 1.1, 1.3))])
    (x,) = levels(spec, candidates(study))
    assert not x.pays and x.paired and x.interval == (1.25, 1.1, 1.3)
    assert build_profile(spec, study)["bands"][0]["why"] == (
        "best speculative draft_model k=2 (d) c1: speedup gain 1.250x over the baseline; speculation does "
        "not pay (paired TPOT speedup 1.250x, 95% CI [1.100, 1.300] (measured with its baseline "
        "interleaved), not wholly above 1.2x)")


def test_a_paired_interval_without_bounds_is_undecided_not_a_crash():
    """A paired result with no lo/hi (too few prompts for an interval) reads as nan bounds:
    it cannot pay, and the why says so."""
    spec = make_spec(**{"space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}),
                                (dm(2, 1), [1.5], paired(1.5, None, None))])
    (x,) = levels(spec, candidates(study))
    assert not x.pays and x.paired
    assert x.interval[0] == 1.5 and math.isnan(x.interval[1]) and math.isnan(x.interval[2])
    band = build_profile(spec, study)["bands"][0]
    assert band["why"] == (
        "best speculative draft_model k=2 (d) c1: speedup gain 1.500x over the baseline; speculation does "
        "not pay (paired TPOT speedup 1.500x, 95% CI [nan, nan] (measured with its baseline interleaved), "
        "not wholly above 1x)")


def test_a_paired_trial_without_its_interval_falls_back_to_the_point_gain():
    """A trial with its paired baseline summary but no paired point is judged by the point
    gain against that summary (latency objective)."""
    spec = make_spec(**{"objective.name": ["tpot_p50"], "space.concurrency": ["1"]})
    bs = summary(configuration(concurrency=1), 1.0)
    study = simple_study(spec, [(configuration(concurrency=1), [0.1], {}),
                                (dm(2, 1), [0.05], {"baseline_summary": bs, "paired": {"point": None}})])
    (x,) = levels(spec, candidates(study))
    assert x.pays and x.gain == pytest.approx(2.0) and x.interval is None and not x.paired


def test_the_best_paying_configuration_wins_over_a_faster_one_that_does_not_pay():
    """k=4 has the higher point speedup but its interval reaches below 1; k=2 pays: the band
    recommends k=2."""
    spec = make_spec(**{"space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}),
                                (dm(4, 1), [1.3], paired(1.3, 0.9, 1.7)),
                                (dm(2, 1), [1.2], paired(1.2, 1.1, 1.3))])
    band = build_profile(spec, study)["bands"][0]
    assert band["num_speculative_tokens"] == 2 and band["pays"] and band["gain"] == 1.2


def test_ties_keep_the_first_measured_configuration():
    """Equal objective values: the configuration measured first stays the recommendation
    (maximized speedup and minimized TPOT alike), and the progress line names it."""
    spec = make_spec(**{"space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}), (dm(2, 1), [1.5], {}),
                                (dm(4, 1), [1.5], {})])
    assert build_profile(spec, study)["bands"][0]["num_speculative_tokens"] == 2
    assert best_so_far(spec, study) == "best speedup 1.5: draft_model k=2 (d) c1"
    spec = make_spec(**{"space.concurrency": ["1"], "objective.name": ["tpot_p50"]})
    study = simple_study(spec, [(dm(4, 1), [0.05], {}), (dm(2, 1), [0.05], {}),
                                (configuration(concurrency=1), [0.1], {})])
    assert build_profile(spec, study)["bands"][0]["num_speculative_tokens"] == 4
    assert best_so_far(spec, study) == "best tpot_p50 0.05: draft_model k=4 (d) c1"


def test_one_drafter_family_is_judged_at_every_concurrency():
    """The server runs one drafter: eagle3 pays best at concurrency 1, so at 4 the band shows
    eagle3's best, not the draft model that is faster there (point gains, no intervals)."""
    spec = make_spec(**{"space.method": ["draft_model,eagle3"], "models.head": "heads/e3",
                        "space.concurrency": ["1,4"]})
    e3 = lambda k, c: configuration("eagle3", k, "heads/e3", c)  # noqa: E731
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}), (dm(2, 1), [1.3], {}),
                                (e3(2, 1), [1.5], {}), (configuration(concurrency=4), [1.0], {}),
                                (dm(2, 4), [1.4], {}), (e3(2, 4), [1.1], {})])
    prof = build_profile(spec, study)
    assert [(b["method"], b["gain"]) for b in prof["bands"]] == [("eagle3", 1.5), ("eagle3", 1.1)]
    assert prof["speculative_config"] == {"method": "eagle3", "model": "heads/e3", "num_speculative_tokens": 2}


def test_where_nothing_pays_each_band_still_shows_its_best_configuration():
    """No family pays anywhere: every band reports its best speculative configuration and its
    (losing) gain, so the user sees by how much it lost."""
    spec = make_spec()
    study = simple_study(spec, [(configuration(concurrency=c), [1.0], {}) for c in (1, 4, 16)]
                         + [(dm(2, 1), [0.9], {}), (dm(4, 4), [0.8], {}), (dm(2, 16), [0.7], {})])
    prof = build_profile(spec, study)
    assert [b["gain"] for b in prof["bands"]] == [0.9, 0.8, 0.7]
    assert [b["speculative"]["config"]["num_speculative_tokens"] for b in prof["bands"]] == [2, 4, 2]
    assert prof["disable_by_batch_size"]["why"] == (
        "speculation does not pay at the lowest concurrency measured (1): serve without it")
    assert prof["bands"][0]["why"].endswith(
        "speculation does not pay (no run files here for an interval: point gain vs threshold 1x)")


def test_paying_at_every_concurrency_says_to_measure_higher():
    spec = make_spec()
    study = simple_study(spec, [(configuration(concurrency=c), [1.0], {}) for c in (1, 4, 16)]
                         + [(dm(2, 1), [1.3], {}), (dm(2, 4), [1.2], {}), (dm(2, 16), [1.1], {})])
    prof = build_profile(spec, study)
    assert prof["disable_by_batch_size"] == {
        "value": None, "why": "speculation pays at every concurrency measured (up to 16); measure higher "
                              "concurrency to find where it stops",
        "last_paying": prof["bands"][2]["speculative"], "first_not_paying": None}


def test_a_band_with_only_its_baseline_does_not_pay():
    """Concurrency 4 has a baseline but no speculative trial: the band is baseline and stops
    speculation there (threshold 1)."""
    spec = make_spec(**{"space.concurrency": ["1,4"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}), (dm(2, 1), [1.3], {}),
                                (configuration(concurrency=4), [1.0], {})])
    lv = levels(spec, candidates(study))
    assert [(x.concurrency, x.pays, x.best is None) for x in lv] == [(1, True, False), (4, False, True)]
    prof = build_profile(spec, study)
    assert prof["disable_by_batch_size"]["value"] == 1
    assert prof["disable_by_batch_size"]["first_not_paying"] is None


def test_pareto_front_keeps_ties_and_drops_what_is_only_equalled_on_one_objective():
    """(tpot_p95 0.1, 200 tok/s) dominates (0.1, 150 tok/s): equal on one objective, better on
    the other. Two trials with identical values both stay (neither beats the other)."""
    spec = make_spec(**{"objective.name": ["tpot_p95", "output_tps"], "space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [0.1, 150.0], {}),
                                (dm(2, 1), [0.1, 200.0], {}), (dm(4, 1), [0.1, 200.0], {}),
                                (dm(4, 1), [0.2, 100.0], {"feasible": False})])
    front = pareto_front(spec, list(reversed(candidates(study))))
    assert [t.number for t in front] == [1, 2]  # sorted by trial number
    assert best_so_far(spec, study) == "Pareto front: 2 configuration(s)"
    prof = build_profile(spec, study)
    assert [e["trial"] for e in prof["pareto_front"]] == [1, 2]
    assert prof["pareto_front"][0]["speedup_output_tps"] == 1.0  # against the baseline at its concurrency
    assert prof["pareto_front"][0]["objective"] == {"tpot_p95": 0.1, "output_tps": 200.0}


def test_progress_line_before_anything_feasible_was_measured():
    spec = make_spec()
    study = optuna.create_study(directions=spec.directions)
    assert best_so_far(spec, study) == "no measured trial yet"
    measured(study, spec, dm(2, 1), [1.5], feasible=False)
    assert best_so_far(spec, study) == "no feasible trial yet"
    measured(study, spec, dm(4, 1), [1.2])
    measured(study, spec, dm(2, 4), [1.4])
    measured(study, spec, dm(4, 4), [1.3])
    assert best_so_far(spec, study) == "best speedup 1.4: draft_model k=2 (d) c4"


def test_progress_line_names_a_tree_and_a_drafter_without_a_draft_model():
    spec = make_spec(**{"space.method": ["eagle3"], "models.head": "heads/e3", "space.topk": ["1,2"]})
    study = simple_study(spec, [(configuration("eagle3", 2, "heads/e3", 4, topk=2), [1.5], {})])
    assert best_so_far(spec, study) == "best speedup 1.5: eagle3 k=2 topk=2 n=5 c4"
    study = simple_study(spec, [(configuration("eagle3", 2, "heads/e3", 4), [1.5], {})])
    assert best_so_far(spec, study) == "best speedup 1.5: eagle3 k=2 c4"


def test_nothing_measured_names_the_first_failure():
    spec = make_spec()
    study = optuna.create_study(directions=spec.directions)
    assert nothing_measured(study) == ("no configuration was measured: 0 trial(s) failed; no profile written. "
                                       "Fix the cause, then rerun with --retry-failed")
    add(study, spec, dm(2, 1), None, state=TrialState.FAIL)  # interrupted: no reason
    add(study, spec, dm(4, 1), None, state=TrialState.FAIL, fail_reason="server did not start")
    add(study, spec, dm(2, 4), None, state=TrialState.FAIL, fail_reason="OOM")
    # a complete trial that reused another's measurement is not a measurement
    add(study, spec, dm(4, 4), [1.2], run_id="r", duplicate_of=0, summary=summary(dm(4, 4), 1.2))
    assert nothing_measured(study) == ("no configuration was measured: 2 trial(s) failed (first: trial 1: "
                                       "server did not start); no profile written. Fix the cause, then "
                                       "rerun with --retry-failed")
    measured(study, spec, dm(2, 16), [1.1])
    assert nothing_measured(study) is None


def test_only_complete_trials_with_their_own_run_are_candidates():
    """A failed trial that got as far as a run id, and a reused trial, are never measured
    configurations."""
    spec = make_spec()
    study = optuna.create_study(directions=spec.directions)
    add(study, spec, dm(2, 1), None, state=TrialState.FAIL, run_id="r0", fail_reason="crash")
    add(study, spec, dm(4, 1), [1.2], run_id="r1", duplicate_of=3, summary=summary(dm(4, 1), 1.2))
    measured(study, spec, dm(2, 4), [1.1])
    assert [t.number for t in candidates(study)] == [2]


def test_an_empty_study_builds_a_profile_that_says_nothing_was_measured():
    spec = make_spec(**{"study.sampler": "grid"})
    study = optuna.create_study(directions=spec.directions)
    prof = build_profile(spec, study)
    assert prof["recommendation"] == "baseline" and prof["bands"] == [] and prof["speculative_config"] is None
    assert prof["disable_by_batch_size"] == {"value": None, "why": "nothing measured yet",
                                             "last_paying": None, "first_not_paying": None}
    assert "skipped_by_model" not in prof["study"] and "verify_with" not in prof


def test_model_sampler_without_skips_reports_none_skipped():
    spec = make_spec(**{"study.sampler": "model"})
    study = optuna.create_study(directions=spec.directions)
    assert build_profile(spec, study)["study"]["skipped_by_model"] == {}


def test_generated_at_is_utc():
    spec = make_spec()
    prof = build_profile(spec, optuna.create_study(directions=spec.directions))
    assert prof["generated_at"].endswith("+00:00") and len(prof["generated_at"]) == 25


GOLDEN_TREE_PROFILE = """\
# Recommended serving profile written by `specbench sweep`.
# Every number is measured: trial = Optuna trial number, run_id/run_dir = the run
# (samples.parquet) under the study directory it was computed from. Times in s.
specbench_profile: 1
generated_at: '2024-01-01T00:00:00+00:00'
study:
  name: edge
  storage: sqlite:///unused.db
  directory: {tmp}/study
  trials: 17
  measured: 14
  reused: 1
  failed: 2
  infeasible: 1
  skipped_by_model:
    draft_model|k4|d|c128: 0.7
models:
  target: t
  drafts:
  - d
workload:
  source: real
  num_prompts: null
  chat_template: true
sampling:
  seed: 0
  ignore_eos: false
objective:
  primary: speedup
  direction: maximize
  all:
  - speedup
  min_speedup: 1.0
  max_peak_memory_bytes: null
recommendation: speculative
speculative_config:
  method: eagle3
  model: heads/e3
  num_speculative_tokens: 2
  topk: 2
  num_draft_tokens: 5
  disable_by_batch_size: 4
disable_by_batch_size:
  value: 4
  why: 'speculation pays up to concurrency 4 (gain 1.200x) and not at 16 (gain 1.100x); the crossover
    lies in (4, 16]: measure concurrency values in between to narrow it'
  last_paying:
    trial: 8
    run_id: run-8
    run_dir: runs/run-8
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 4
      draft: null
      concurrency: 4
    speedup_tpot_p50: 1.2
    speedup_output_tps: 1.2
    speedup_output_tps_per_user: 1.2
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 400.0
      n: 8.0
    paired:
      speedup_tpot: 1.2
      ci:
      - 1.05
      - 1.35
      prompts: 8
      planned: 24
      blocks: 6
      stopped: win
      rule: null
    tpot_p50_s: 0.0833333
    tpot_p95_s: 0.125
    ttft_p50_s: 0.05
    e2e_p50_s: 2.5
    output_tps: 480.0
    output_tps_per_user: 12.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.2
  first_not_paying:
    trial: 12
    run_id: run-12
    run_dir: runs/run-12
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 2
      draft: null
      concurrency: 16
    speedup_tpot_p50: 1.1
    speedup_output_tps: 1.1
    speedup_output_tps_per_user: 1.1
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 1600.0
      n: 8.0
    paired:
      speedup_tpot: 1.1
      ci:
      - 0.95
      - 1.25
      prompts: 8
      planned: 24
      blocks: 4
      stopped: null
      rule: null
    tpot_p50_s: 0.0909091
    tpot_p95_s: 0.136364
    ttft_p50_s: 0.05
    e2e_p50_s: 2.72727
    output_tps: 1760.0
    output_tps_per_user: 11.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.1
bands:
- batch_size:
    min: 1
    max: 1
  measured_at_concurrency: 1
  profile: speculative
  pays: true
  method: eagle3
  num_speculative_tokens: 2
  draft: null
  topk: 2
  num_draft_tokens: 5
  gain: 1.6
  tpot_speedup_ci:
  - 1.6
  - 1.4
  - 1.8
  why: 'best speculative eagle3 k=2 topk=2 n=5 c1: speedup gain 1.600x over the baseline; speculation
    pays (paired TPOT speedup 1.600x, 95% CI [1.400, 1.800] (measured with its baseline interleaved),
    wholly above 1x)'
  speculative:
    trial: 5
    run_id: run-5
    run_dir: runs/run-5
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 2
      draft: null
      concurrency: 1
      topk: 2
      num_draft_tokens: 5
    speedup_tpot_p50: 1.6
    speedup_output_tps: 1.6
    speedup_output_tps_per_user: 1.6
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 100.0
      n: 8.0
    paired:
      speedup_tpot: 1.6
      ci:
      - 1.4
      - 1.8
      prompts: 8
      planned: 24
      blocks: null
      stopped: null
      rule: fixed
    tpot_p50_s: 0.0625
    tpot_p95_s: 0.09375
    ttft_p50_s: 0.05
    e2e_p50_s: 1.875
    output_tps: 160.0
    output_tps_per_user: 16.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.6
  baseline:
    trial: 0
    run_id: run-0
    run_dir: runs/run-0
    host: gpu-a
    config:
      method: none
      num_speculative_tokens: 0
      draft: null
      concurrency: 1
    tpot_p50_s: 0.1
    tpot_p95_s: 0.15
    ttft_p50_s: 0.05
    e2e_p50_s: 3.0
    output_tps: 100.0
    output_tps_per_user: 10.0
    acceptance_rate_tok: null
    mean_acceptance_length_tok: null
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.0
  chain:
    trial: 6
    run_id: run-6
    run_dir: runs/run-6
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 2
      draft: null
      concurrency: 1
    speedup_tpot_p50: 1.3
    speedup_output_tps: 1.3
    speedup_output_tps_per_user: 1.3
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 100.0
      n: 8.0
    paired:
      speedup_tpot: 1.3
      ci:
      - 1.1
      - 1.5
      prompts: 8
      planned: 24
      blocks: null
      stopped: null
      rule: null
    tpot_p50_s: 0.0769231
    tpot_p95_s: 0.115385
    ttft_p50_s: 0.05
    e2e_p50_s: 2.30769
    output_tps: 130.0
    output_tps_per_user: 13.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.3
    pays: true
- batch_size:
    min: 2
    max: 4
  measured_at_concurrency: 4
  profile: speculative
  pays: true
  method: eagle3
  num_speculative_tokens: 4
  draft: null
  gain: 1.2
  tpot_speedup_ci:
  - 1.2
  - 1.05
  - 1.35
  why: 'best speculative eagle3 k=4 c4: speedup gain 1.200x over the baseline; speculation pays (paired
    TPOT speedup 1.200x, 95% CI [1.050, 1.350] (measured with its baseline interleaved), wholly above
    1x, from 6 blocks)'
  speculative:
    trial: 8
    run_id: run-8
    run_dir: runs/run-8
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 4
      draft: null
      concurrency: 4
    speedup_tpot_p50: 1.2
    speedup_output_tps: 1.2
    speedup_output_tps_per_user: 1.2
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 400.0
      n: 8.0
    paired:
      speedup_tpot: 1.2
      ci:
      - 1.05
      - 1.35
      prompts: 8
      planned: 24
      blocks: 6
      stopped: win
      rule: null
    tpot_p50_s: 0.0833333
    tpot_p95_s: 0.125
    ttft_p50_s: 0.05
    e2e_p50_s: 2.5
    output_tps: 480.0
    output_tps_per_user: 12.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.2
  baseline:
    trial: 1
    run_id: run-1
    run_dir: runs/run-1
    host: gpu-a
    config:
      method: none
      num_speculative_tokens: 0
      draft: null
      concurrency: 4
    tpot_p50_s: 0.1
    tpot_p95_s: 0.15
    ttft_p50_s: 0.05
    e2e_p50_s: 3.0
    output_tps: 400.0
    output_tps_per_user: 10.0
    acceptance_rate_tok: null
    mean_acceptance_length_tok: null
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.0
  flagged:
  - trial: 9
    config: eagle3|k4|-|c4|t2n9
    why:
    - TPOT speedup 3.000x exceeds tokens per target pass
- batch_size:
    min: 5
    max: 16
  measured_at_concurrency: 16
  profile: baseline
  pays: false
  gain: 1.1
  tpot_speedup_ci:
  - 1.1
  - 0.95
  - 1.25
  why: 'best speculative eagle3 k=2 c16: speedup gain 1.100x over the baseline; speculation does not pay
    (paired TPOT speedup 1.100x, 95% CI [0.950, 1.250] (measured with its baseline interleaved), not wholly
    above 1x, from 4 blocks (undecided: more prompts, --num-prompts, buy more blocks))'
  speculative:
    trial: 12
    run_id: run-12
    run_dir: runs/run-12
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 2
      draft: null
      concurrency: 16
    speedup_tpot_p50: 1.1
    speedup_output_tps: 1.1
    speedup_output_tps_per_user: 1.1
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 1600.0
      n: 8.0
    paired:
      speedup_tpot: 1.1
      ci:
      - 0.95
      - 1.25
      prompts: 8
      planned: 24
      blocks: 4
      stopped: null
      rule: null
    tpot_p50_s: 0.0909091
    tpot_p95_s: 0.136364
    ttft_p50_s: 0.05
    e2e_p50_s: 2.72727
    output_tps: 1760.0
    output_tps_per_user: 11.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.1
  baseline:
    trial: 2
    run_id: run-2
    run_dir: runs/run-2
    host: gpu-a
    config:
      method: none
      num_speculative_tokens: 0
      draft: null
      concurrency: 16
    tpot_p50_s: 0.1
    tpot_p95_s: 0.15
    ttft_p50_s: 0.05
    e2e_p50_s: 3.0
    output_tps: 1600.0
    output_tps_per_user: 10.0
    acceptance_rate_tok: null
    mean_acceptance_length_tok: null
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.0
- batch_size:
    min: 17
    max: 64
  measured_at_concurrency: 64
  profile: baseline
  pays: true
  gain: 1.3
  tpot_speedup_ci:
  - 1.3
  - 1.2
  - 1.4
  why: 'best speculative eagle3 k=2 c64: speedup gain 1.300x over the baseline; speculation pays (paired
    TPOT speedup 1.300x, 95% CI [1.200, 1.400] (measured with its baseline interleaved), wholly above
    1x, from 8 blocks); kept baseline: speculation already stopped paying at a lower concurrency'
  speculative:
    trial: 13
    run_id: run-13
    run_dir: runs/run-13
    host: gpu-a
    config:
      method: eagle3
      num_speculative_tokens: 2
      draft: null
      concurrency: 64
    speedup_tpot_p50: 1.3
    speedup_output_tps: 1.3
    speedup_output_tps_per_user: 1.3
    paired_baseline:
      tpot_p50_s: 0.1
      output_tps: 6400.0
      n: 8.0
    paired:
      speedup_tpot: 1.3
      ci:
      - 1.2
      - 1.4
      prompts: 8
      planned: 24
      blocks: 8
      stopped: null
      rule: null
    tpot_p50_s: 0.0769231
    tpot_p95_s: 0.115385
    ttft_p50_s: 0.05
    e2e_p50_s: 2.30769
    output_tps: 8320.0
    output_tps_per_user: 13.0
    acceptance_rate_tok: 0.7
    mean_acceptance_length_tok: 2.5
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.3
  baseline:
    trial: 3
    run_id: run-3
    run_dir: runs/run-3
    host: gpu-a
    config:
      method: none
      num_speculative_tokens: 0
      draft: null
      concurrency: 64
    tpot_p50_s: 0.1
    tpot_p95_s: 0.15
    ttft_p50_s: 0.05
    e2e_p50_s: 3.0
    output_tps: 6400.0
    output_tps_per_user: 10.0
    acceptance_rate_tok: null
    mean_acceptance_length_tok: null
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.0
- batch_size:
    min: 65
    max: null
  measured_at_concurrency: 128
  profile: baseline
  pays: false
  gain: null
  why: no feasible speculative configuration measured at this concurrency
  speculative: null
  baseline:
    trial: 4
    run_id: run-4
    run_dir: runs/run-4
    host: gpu-a
    config:
      method: none
      num_speculative_tokens: 0
      draft: null
      concurrency: 128
    tpot_p50_s: 0.1
    tpot_p95_s: 0.15
    ttft_p50_s: 0.05
    e2e_p50_s: 3.0
    output_tps: 12800.0
    output_tps_per_user: 10.0
    acceptance_rate_tok: null
    mean_acceptance_length_tok: null
    peak_memory_bytes: 1073741824
    n: 8
    errors: 0
    objective:
      speedup: 1.0
verify_with: 'specbench run --target t --workload real --speculative-config ''{"method": "eagle3", "model":
  "heads/e3", "num_speculative_tokens": 2, "topk": 2, "num_draft_tokens": 5, "disable_by_batch_size":
  4}'' --concurrency 1,4,16,64,128'
failed_trials:
- trial: 15
  config: draft_model|k4|d|c16
  reason: CUDA OOM → k too large
- trial: 16
  config: draft_model|k2|d|c16
  reason: interrupted
"""


def test_a_tree_band_names_the_chain_a_vllm_server_would_run_the_best_paying_one():
    """The tree pays; of the chains, k=4 has the higher speedup but its interval reaches below
    1, k=2 pays on its point gain (measured apart, no run files): the band's chain is k=2, said
    to pay, its speedup read against the band's baseline. Without k=2 the chain is k=4, said
    not to pay."""
    spec = make_spec(**{"space.concurrency": ["1"], "space.topk": ["1,2"]})
    rows = [(configuration(concurrency=1), [1.0], {}), (dm(2, 1, topk=2), [1.8], paired(1.8, 1.6, 2.0)),
            (dm(4, 1), [1.7], paired(1.7, 0.9, 2.5)), (dm(2, 1), [1.3], {})]
    study = simple_study(spec, rows)
    (x,) = levels(spec, candidates(study))
    assert (x.best.number, x.chain.number, x.chain_pays) == (1, 3, True)
    chain = build_profile(spec, study)["bands"][0]["chain"]
    assert (chain["trial"], chain["pays"], chain["speedup_tpot_p50"]) == (3, True, 1.3)
    study = simple_study(spec, rows[:3])
    (x,) = levels(spec, candidates(study))
    assert (x.best.number, x.chain.number, x.chain_pays) == (1, 2, False)
    assert build_profile(spec, study)["bands"][0]["chain"]["pays"] is False


def test_a_trials_speedups_are_against_the_baseline_measured_with_it():
    """Evidence of a paired trial: its speedups use the baseline samples interleaved with it
    (TPOT 0.2 s against its 0.0667 s: 3x), not the baseline trial's (0.1 s: 1.5x)."""
    spec = make_spec(**{"space.concurrency": ["1"]})
    bs = summary(configuration(concurrency=1), 0.5)
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}),
                                (dm(2, 1), [1.5], {"baseline_summary": bs, **paired(1.5, 1.4, 1.6)})])
    ev = build_profile(spec, study)["bands"][0]["speculative"]
    assert ev["speedup_tpot_p50"] == 3.0 and ev["paired_baseline"]["tpot_p50_s"] == 0.2


def test_a_flagged_trials_evidence_names_the_checks_it_failed():
    spec = make_spec(**{"space.concurrency": ["1"]})
    why = ["TPOT speedup 3.000x exceeds tokens per target pass"]
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}), (dm(2, 1), [3.0], {"inconsistent": why}),
                                (dm(4, 1), [1.2], {})])
    flagged_t, clean = study.trials[1], study.trials[2]
    assert evidence(flagged_t, spec.space, study.trials[0])["inconsistent"] == why
    assert "inconsistent" not in evidence(clean, spec.space, study.trials[0])


def test_where_speculation_stops_paying_both_sides_are_read_against_their_bands_baselines():
    """Trials measured apart (no baseline of their own): the threshold's evidence on each side
    carries its speedup against the baseline trial of its own concurrency, and a draft-model
    band names its draft."""
    spec = make_spec(**{"space.concurrency": ["1,4"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}), (dm(2, 1), [1.5], {}),
                                (configuration(concurrency=4), [1.0], {}), (dm(2, 4), [0.9], {})])
    prof = build_profile(spec, study)
    th = prof["disable_by_batch_size"]
    assert th["value"] == 1
    assert th["last_paying"]["speedup_tpot_p50"] == 1.5 and th["first_not_paying"]["speedup_tpot_p50"] == 0.9
    assert prof["bands"][0]["draft"] == "d" and prof["bands"][0]["method"] == "draft_model"


def test_blocks_are_named_only_for_an_interval_measured_interleaved(monkeypatch):
    """A trial that recorded paired blocks but no paired point is judged by the interval from
    the run files, measured apart: its `why` says so and does not count blocks."""
    from specbench.sweep import profile as profile_mod

    monkeypatch.setattr(profile_mod, "tpot_interval", lambda spec, best, base: (1.5, 1.4, 1.6))
    spec = make_spec(**{"space.concurrency": ["1"]})
    study = simple_study(spec, [(configuration(concurrency=1), [1.0], {}),
                                (dm(2, 1), [1.5], {"paired": {"point": None, "blocks": 4}})])
    why = build_profile(spec, study)["bands"][0]["why"]
    assert why.endswith("(paired TPOT speedup 1.500x, 95% CI [1.400, 1.600] (against the baseline trial, "
                        "measured at another time), wholly above 1x)"), why
