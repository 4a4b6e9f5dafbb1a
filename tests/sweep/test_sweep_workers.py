"""Two worker processes (`python -m specbench sweep ...`) on one SQLite study at once: each
runs its --n-trials, no trial is lost or left running, and no configuration is measured
twice. Both workers use the random sampler with the same seed, so they propose the same
configurations at the same moments: the cross-process dedupe is what keeps the measurements
unique (a colliding trial waits and reuses the other's value)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
from optuna.trial import TrialState

from specbench.records import read_run
from specbench.sweep.space import config_key, configuration

ENTRY = ["-m", "specbench", "sweep"]

PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
]


def test_two_workers_share_one_study_without_losing_or_repeating_trials(tiny_pair, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    args = [sys.executable, *ENTRY, "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
            "--workload", str(prompts), "--dtype", "float32", "--device", "cpu", "--warmup", "0",
            "--max-new-tokens", "6", "--method", "draft_model,ngram", "-k", "2,4",
            "--concurrency", "1,2", "--sampler", "random", "--sampler-seed", "7",
            "--study-name", "shared", "--storage", storage, "--out", str(tmp_path / "study"),
            "--n-trials", "4"]
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    workers = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=240) for w in workers]
    for w, (out, err) in zip(workers, outputs):
        assert w.returncode == 0, err
        assert "Traceback" not in out + err

    trials = optuna.load_study(study_name="shared", storage=storage).trials
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) == 8  # 4 per worker: nothing lost
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert all(t.state == TrialState.COMPLETE for t in finished), [t.user_attrs for t in finished]

    measured = [t for t in finished if "duplicate_of" not in t.user_attrs]
    keys = [config_key(configuration(**t.params)) for t in measured]
    assert len(keys) == len(set(keys)), keys  # no configuration measured twice
    by_number = {t.number: t for t in measured}
    for t in finished:
        if "duplicate_of" in t.user_attrs:  # a reused trial points at the measurement it reused
            source = by_number[t.user_attrs["duplicate_of"]]
            assert config_key(configuration(**source.params)) == config_key(configuration(**t.params))
            assert t.values == source.values and t.user_attrs["run_id"] == source.user_attrs["run_id"]

    runs = sorted((tmp_path / "study" / "runs").iterdir())
    assert len(runs) == len(measured)
    for t in measured:
        df, meta = read_run(tmp_path / "study" / t.user_attrs["run_dir"])
        assert set(df["run_id"]) == {t.user_attrs["run_id"]} and meta["config"]["sweep"]["trial"] == t.number
        # a speculative trial also holds the baseline samples measured with it
        assert len(df) == len(PROMPTS) * (1 if t.params["method"] == "none" else 2)
