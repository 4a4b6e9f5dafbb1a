"""Level batches (`[budget] batch = "level"`, the model sampler's default): a trial measures
every configuration of its concurrency level still to measure in ONE run, in rotation with
one baseline, and each configuration still becomes its own trial, whose speedup recomputes
from that run's Parquet against the baseline rows measured in the same blocks. The baseline
is measured once per level, never as a trial of its own before; the profile reads the same
as with trial batches; a rerun measures nothing; two workers on one storage never measure a
configuration twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from cli_harness import specbench
from specbench.records import read_run
from specbench.sweep.space import config_key, configuration

PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "code", "category": "code", "prompt": "def add(a, b):\n    return"},
]
FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "8"]
KS, CONCS = (1, 2, 4), (1, 2)


def sweep_args(models, where: Path, *extra) -> list:
    prompts = where / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return ["sweep", "--target", models[0], "--draft", models[1], "--workload", prompts, *FAST,
            "--storage", f"sqlite:///{where / 'study.db'}", "--out", where / "study", "--study-name", "lv",
            "--sampler", "grid", "--batch", "level", "--method", "draft_model",
            "-k", ",".join(map(str, KS)), "--concurrency", ",".join(map(str, CONCS)), "--no-sequential", *extra]


def load(where: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="lv", storage=f"sqlite:///{where / 'study.db'}").trials


def measured(trials) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]


@pytest.fixture(scope="module")
def level_sweep(tiny_pair, tmp_path_factory):
    where = tmp_path_factory.mktemp("level")
    res = specbench(*sweep_args(tiny_pair, where))
    return where, res


def test_one_run_per_level_one_trial_per_configuration(level_sweep):
    where, res = level_sweep
    assert res.code == 0, res.output
    trials = measured(load(where))
    keys = [config_key(configuration(**t.params)) for t in trials]
    assert len(keys) == len(set(keys)) == len(CONCS) * (len(KS) + 1)  # every configuration once
    # the console names every configuration measured with the level's trial
    assert res.output.count("(with trial ") == len(keys) - len(CONCS), res.output
    runs = sorted((where / "study" / "runs").iterdir())
    assert len(runs) == len(CONCS)  # one run per level: the baseline never measured on its own
    for run in runs:
        df, meta = read_run(run)
        c = int(df["concurrency"].iloc[0])
        assert set(df["concurrency"]) == {c}
        # every configuration and ONE baseline, each on every prompt
        assert set(df["num_speculative_tokens"]) == {0, *KS}
        assert (df.groupby("config_id").size() == len(PROMPTS)).all()
        assert set(meta["config"]["sweep"]["level_batch"]["configurations"]) == set(df["config_id"])
        owners = {t.user_attrs.get("batch_of", t.number) for t in trials if t.user_attrs["run_dir"].endswith(run.name)}
        assert len(owners) == 1  # the trial that measured the level


def test_each_trials_speedup_recomputes_from_the_shared_parquet(level_sweep):
    where, _ = level_sweep
    for t in measured(load(where)):
        p = configuration(**t.params)
        df, _ = read_run(where / "study" / t.user_attrs["run_dir"])
        rows = df[df["config_id"] == t.user_attrs["config_id"]]
        assert len(rows) == len(PROMPTS) and set(rows["num_speculative_tokens"]) == {p.spec.num_speculative_tokens}
        if p.is_baseline:
            assert t.values[0] == 1.0
            continue
        # against the baseline rows of the same run (the same blocks), prompt by prompt
        base = df[df["method"] == "none"].set_index("prompt_id")["tpot_s"]
        ratio = base / rows.set_index("prompt_id")["tpot_s"]
        assert t.values[0] == pytest.approx(float(np.exp(np.log(ratio).mean())), rel=1e-9)
        assert t.user_attrs["paired"]["point"] == pytest.approx(t.values[0], rel=1e-9)
        assert t.user_attrs["baseline_summary"]["n"] == len(PROMPTS)


def test_the_profile_and_a_rerun(level_sweep, tiny_pair):
    where, res = level_sweep
    prof = yaml.safe_load((where / "study" / "profile.yaml").read_text())
    assert [b["measured_at_concurrency"] for b in prof["bands"]] == list(CONCS)
    for band in prof["bands"]:
        assert band["speculative"]["run_dir"] == band["baseline"]["run_dir"]  # measured together
    n = len(load(where))
    again = specbench(*sweep_args(tiny_pair, where))
    assert again.code == 0, again.output
    assert len(load(where)) == n and len(list((where / "study" / "runs").iterdir())) == len(CONCS)


def test_two_workers_never_measure_a_configuration_twice(tiny_pair, tmp_path):
    args = [str(a) for a in sweep_args(tiny_pair, tmp_path)]
    procs = [subprocess.Popen([sys.executable, "-m", "specbench", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    trials = measured(load(tmp_path))
    keys = [config_key(configuration(**t.params)) for t in trials]
    assert len(keys) == len(set(keys)) == len(CONCS) * (len(KS) + 1), keys
    # each configuration's rows come from one run only
    counts: dict[str, int] = {}
    for run in (tmp_path / "study" / "runs").iterdir():
        for cid in read_run(run)[0].query("method != 'none'")["config_id"].unique():
            counts[cid] = counts.get(cid, 0) + 1
    assert set(counts.values()) == {1}, counts


def test_an_interrupted_level_is_measured_again_whole_and_nothing_before_it_twice(tiny_pair, tmp_path, monkeypatch):
    import specbench.runner as runner

    real = runner.run_plan
    calls = []

    def interrupt_second_level(backend, requests, configs, **kw):
        calls.append(configs[0].concurrency)
        if len(calls) == 2:  # Ctrl-C after the first finished request of the second level
            on_result = kw["on_result"]

            def ctrl_c(req, res):
                on_result(req, res)
                raise KeyboardInterrupt

            kw["on_result"] = ctrl_c
        return real(backend, requests, configs, **kw)

    monkeypatch.setattr(runner, "run_plan", interrupt_second_level)
    first = specbench(*sweep_args(tiny_pair, tmp_path))
    assert first.code == 130, first.output
    before = {config_key(configuration(**t.params)): t.user_attrs["run_id"] for t in measured(load(tmp_path))}
    assert len(before) == len(KS) + 1  # the first level, whole; nothing of the second
    (cut,) = [t for t in load(tmp_path) if t.state == TrialState.FAIL]
    assert cut.user_attrs["interrupted"] is True

    monkeypatch.setattr(runner, "run_plan", real)
    second = specbench(*sweep_args(tiny_pair, tmp_path))
    assert second.code == 0, second.output
    ok = measured(load(tmp_path))
    keys = [config_key(configuration(**t.params)) for t in ok]
    assert len(keys) == len(set(keys)) == len(CONCS) * (len(KS) + 1)
    for k, run_id in before.items():  # the first level is not measured again
        assert [t.user_attrs["run_id"] for t in ok if config_key(configuration(**t.params)) == k] == [run_id]
    assert all(t.state != TrialState.RUNNING for t in load(tmp_path))
