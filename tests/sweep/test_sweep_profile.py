"""The serving profile's decisions on a synthetic study (no models): the best configuration
per concurrency, the disable_by_batch_size threshold where speculation stops paying, the
concurrency bands, the min_speedup margin, infeasible trials left out, the Pareto front of a
multi-objective study, and a YAML round trip."""

from __future__ import annotations

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from specbench.analysis import SUMMARY_COLUMNS
from specbench.runner import Configuration
from specbench.sweep import build_profile, build_spec, pareto_front, write_profile
from specbench.sweep.space import config_key, configuration

BASE_TPOT = 0.1  # s
BASE_TPS = 100.0  # total tok/s


def make_spec(**flags):
    values = {"models.target": "t", "models.draft": ["d"], "space.concurrency": ["1,4,16"],
              "space.num_speculative_tokens": ["2,4"], "study.storage": "sqlite:///unused.db"}
    values.update(flags)
    return build_spec(None, values)


def summary(p: Configuration, speedup: float) -> dict:
    s = {c: None for c in SUMMARY_COLUMNS}
    method, k = p.spec.method, p.spec.num_speculative_tokens
    s.update(config_id=f"{method}-k{k}-c{p.concurrency}", method=method,
             num_speculative_tokens=k, concurrency=p.concurrency,
             is_baseline=p.is_baseline, n=4, errors=0, tpot_p50_s=BASE_TPOT / speedup,
             tpot_p95_s=1.5 * BASE_TPOT / speedup, e2e_p50_s=3.0 / speedup,
             output_tps=BASE_TPS * p.concurrency * speedup, output_tps_per_user=10.0 * speedup,
             peak_memory_bytes=float(2**30 + k * 2**20))
    return s


def study_with(spec, speedups: dict[tuple[int, int], float], infeasible=(), attrs=None) -> optuna.Study:
    """speedups: (k, concurrency) -> TPOT p50 speedup; baselines are added at every level.
    `attrs(configuration, speedup)`, when given, adds (or replaces) user attrs of each trial."""
    study = optuna.create_study(directions=spec.directions)
    dists = {"method": CategoricalDistribution(("none", "draft_model")),
             "concurrency": CategoricalDistribution(spec.space.concurrency),
             "num_speculative_tokens": CategoricalDistribution(spec.space.num_speculative_tokens),
             "draft": CategoricalDistribution(("d",))}
    configs = [(configuration(concurrency=c), 1.0) for c in spec.space.concurrency]
    configs += [(configuration("draft_model", k, "d", c), x) for (k, c), x in speedups.items()]
    for i, (p, x) in enumerate(configs):
        s = summary(p, x)
        values = {"speedup": x, "tpot_p50": s["tpot_p50_s"], "tpot_p95": s["tpot_p95_s"],
                  "output_tps": s["output_tps"]}
        user_attrs = {"config_key": config_key(p), "run_id": f"run-{i}", "run_dir": f"runs/run-{i}", "summary": s}
        if (p.spec.num_speculative_tokens, p.concurrency) in infeasible:
            user_attrs.update(feasible=False, constraint=1.0)
        if attrs is not None:
            user_attrs.update(attrs(p, x))
        params = spec.space.params(p)
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, params=params,
            distributions={k: dists[k] for k in params},
            values=[values[o] for o in spec.objectives], user_attrs=user_attrs))
    return study


PAYS_UP_TO_4 = {(2, 1): 1.3, (4, 1): 1.5, (2, 4): 1.2, (4, 4): 1.1, (2, 16): 0.8, (4, 16): 0.7}


def test_threshold_is_the_last_paying_concurrency_before_the_first_that_does_not():
    spec = make_spec()
    prof = build_profile(spec, study_with(spec, PAYS_UP_TO_4))
    assert prof["recommendation"] == "speculative"
    assert prof["speculative_config"] == {"method": "draft_model", "model": "d",
                                          "num_speculative_tokens": 4, "disable_by_batch_size": 4}
    dbs = prof["disable_by_batch_size"]
    assert dbs["value"] == 4 and "(4, 16]" in dbs["why"]
    assert dbs["last_paying"]["config"]["concurrency"] == 4
    assert dbs["first_not_paying"]["config"] == {"method": "draft_model", "num_speculative_tokens": 2,
                                                 "draft": "d", "concurrency": 16}
    bands = prof["bands"]
    assert [(b["batch_size"]["min"], b["batch_size"]["max"], b["profile"]) for b in bands] == [
        (1, 1, "speculative"), (2, 4, "speculative"), (5, None, "baseline")]
    assert [b.get("num_speculative_tokens") for b in bands] == [4, 2, None]
    assert [b["gain"] for b in bands] == [1.5, 1.2, 0.8]
    first = bands[0]["speculative"]
    assert first["speedup_tpot_p50"] == pytest.approx(1.5) and first["run_id"] == "run-4"
    assert first["speedup_output_tps"] == pytest.approx(1.5)
    assert bands[0]["baseline"]["run_id"] == "run-0" and bands[0]["baseline"]["tpot_p50_s"] == BASE_TPOT
    assert "--speculative-config" in prof["verify_with"]


def test_speculation_paying_everywhere_sets_no_threshold():
    spec = make_spec()
    prof = build_profile(spec, study_with(spec, {(2, 1): 1.4, (2, 4): 1.2, (2, 16): 1.05}))
    assert prof["disable_by_batch_size"]["value"] is None
    assert "disable_by_batch_size" not in prof["speculative_config"]
    assert [b["profile"] for b in prof["bands"]] == ["speculative"] * 3
    assert prof["bands"][-1]["batch_size"]["max"] is None


def test_speculation_paying_nowhere_recommends_the_baseline():
    spec = make_spec()
    prof = build_profile(spec, study_with(spec, {(2, 1): 0.9, (4, 4): 0.8, (2, 16): 1.3}))
    assert prof["recommendation"] == "baseline" and prof["speculative_config"] is None
    assert [b["profile"] for b in prof["bands"]] == ["baseline"] * 3
    assert "kept baseline" in prof["bands"][2]["why"]  # pays again at 16, but stopped before


def test_min_speedup_is_the_margin_speculation_must_clear():
    spec = make_spec(**{"profile.min_speedup": 1.25})
    prof = build_profile(spec, study_with(spec, PAYS_UP_TO_4))
    assert prof["disable_by_batch_size"]["value"] == 1


def test_infeasible_trials_are_never_recommended():
    spec = make_spec()
    prof = build_profile(spec, study_with(spec, PAYS_UP_TO_4, infeasible={(4, 1)}))
    assert prof["bands"][0]["num_speculative_tokens"] == 2 and prof["bands"][0]["gain"] == 1.3
    assert prof["study"]["infeasible"] == 1


def test_latency_objective_gain_is_baseline_over_configuration():
    spec = make_spec(**{"objective.name": ["tpot_p95"]})
    prof = build_profile(spec, study_with(spec, PAYS_UP_TO_4))
    assert [b["gain"] for b in prof["bands"]] == [pytest.approx(1.5), pytest.approx(1.2),
                                                  pytest.approx(0.8)]
    assert prof["disable_by_batch_size"]["value"] == 4


def test_pareto_front_of_tpot_p95_against_total_throughput(tmp_path):
    spec = make_spec(**{"objective.name": ["tpot_p95", "output_tps"]})
    study = study_with(spec, PAYS_UP_TO_4)
    front = pareto_front(spec, [t for t in study.trials])
    signs = (-1, 1)  # minimize, maximize
    for t in front:  # nothing dominates a front member
        for o in study.trials:
            assert not (all(s * a >= s * b for s, a, b in zip(signs, o.values, t.values))
                        and o.values != t.values)
    assert {t.number for t in front} == {t.number for t in study.best_trials}
    prof = build_profile(spec, study)
    write_profile(tmp_path / "p.yaml", prof)
    back = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert back["pareto_front"] == prof["pareto_front"] and len(back["pareto_front"]) == len(front)
    assert set(back["pareto_front"][0]["objective"]) == {"tpot_p95", "output_tps"}
