"""`specbench sweep` end to end on tiny float32 models, in-process through `main()`: a grid
sweep of 2 baselines + 4 speculative configurations finishes; the baseline is the first trial
at each concurrency; every trial is linked to its run directory and the profile's numbers are
recomputed from those Parquet files; an interrupted sweep resumes without measuring anything
twice; a failing configuration is recorded and the sweep goes on; the memory constraint marks
trials infeasible.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from specbench import analysis
from specbench.analysis.paired import block_groups
from specbench.analysis.sequential import SequentialRule, log_ratios
from specbench.records import RUN_FILE, read_run
from specbench.sweep.space import config_key, configuration

PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "code", "category": "code", "prompt": "def add(a, b):\n    return"},
]
FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "8"]


from cli_harness import specbench  # noqa: E402


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def sweep_args(models, prompts_file, where: Path, *extra) -> list:
    return ["sweep", "--target", models[0], "--draft", models[1], "--workload", prompts_file,
            *FAST, "--storage", f"sqlite:///{where / 'study.db'}", "--out", where / "study",
            "--study-name", "tiny", *extra]


GRID = ["--sampler", "grid", "--batch", "trial", "--method", "draft_model", "-k", "2,4", "--concurrency", "1,2"]  # level batches: test_sweep_level.py


def load(where: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{where / 'study.db'}").trials


def measured(trials) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]


def key(t) -> str:
    return config_key(configuration(**t.params))


@pytest.fixture(scope="module")
def grid_sweep(tiny_pair, prompts_file, tmp_path_factory):
    where = tmp_path_factory.mktemp("grid")
    res = specbench(*sweep_args(tiny_pair, prompts_file, where, *GRID))
    return where, res


def test_grid_sweep_measures_every_configuration_once(grid_sweep):
    where, res = grid_sweep
    assert res.code == 0, res.output
    assert "Traceback" not in res.output
    trials = load(where)
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    keys = [key(t) for t in trials]
    assert len(set(keys)) == 6
    assert {configuration(**t.params).spec.num_speculative_tokens for t in trials} == {0, 2, 4}
    assert "Best configuration per concurrency" in res.out and "profile:" in res.out


def test_baseline_is_the_first_trial_at_each_concurrency(grid_sweep):
    where, _ = grid_sweep
    trials = load(where)
    for c in (1, 2):
        at_c = [t for t in trials if t.params["concurrency"] == c]
        first = min(at_c, key=lambda t: t.number)
        assert first.params["method"] == "none" and "num_speculative_tokens" not in first.params
        assert first.values == [1.0]  # speedup of the baseline over itself


def test_each_trial_links_to_its_own_run_directory(grid_sweep):
    where, _ = grid_sweep
    runs = sorted((where / "study" / "runs").iterdir())
    assert len(runs) == 6
    for t in load(where):
        run_dir = where / "study" / t.user_attrs["run_dir"]
        df, meta = read_run(run_dir)
        assert set(df["run_id"]) == {t.user_attrs["run_id"]} == {run_dir.name}
        assert meta["status"] == "complete" and meta["config"]["sweep"]["trial"] == t.number
        assert json.loads((run_dir / RUN_FILE).read_text())["run_id"] == run_dir.name
        p = configuration(**t.params)
        assert set(df["concurrency"]) == {p.concurrency}
        if p.is_baseline:
            assert set(df["method"]) == {"none"} and len(df) == len(PROMPTS)
            continue
        # a speculative trial measured its own baseline, interleaved with it (ABBA blocks)
        assert set(df["method"]) == {"none", p.spec.method}
        assert set(df["num_speculative_tokens"]) == {0, p.spec.num_speculative_tokens}
        assert (df.groupby("config_id").size() == len(PROMPTS)).all()
        assert meta["config"]["sweep"]["pairing"].startswith("each speculative trial measures the baseline")
        # the objective value is the paired speedup recomputed from the trial's own Parquet:
        # the geometric mean over prompts of baseline TPOT / configuration TPOT
        spec_rows, base_rows = df[df["method"] != "none"], df[df["method"] == "none"]
        ratio = (base_rows.set_index("prompt_id")["tpot_s"] / spec_rows.set_index("prompt_id")["tpot_s"])
        assert t.values[0] == pytest.approx(float(np.exp(np.log(ratio).mean())), rel=1e-9)
        assert t.user_attrs["paired"]["point"] == pytest.approx(t.values[0], rel=1e-9)
        assert t.user_attrs["paired"]["planned"] == len(PROMPTS)



def _check_evidence(study_dir: Path, ev: dict, baseline: dict | None) -> None:
    df, _ = read_run(study_dir / ev["run_dir"])
    assert set(df["run_id"]) == {ev["run_id"]}
    if baseline is not None:  # a paired trial: its own baseline rows are what it is compared with
        bdf, df = df[df["method"] == "none"], df[df["method"] != "none"]
    s = analysis.summarize(df).iloc[0]
    for col in ("tpot_p50_s", "tpot_p95_s", "ttft_p50_s", "e2e_p50_s", "output_tps",
                "output_tps_per_user"):
        assert ev[col] == pytest.approx(s[col], rel=1e-5), col
    assert ev["peak_memory_bytes"] == s["peak_memory_bytes"] and ev["n"] == s["n"]
    if baseline is not None:
        sp = analysis.speedups(analysis.summarize(pd.concat([bdf, df]))).iloc[0]
        assert ev["speedup_tpot_p50"] == pytest.approx(sp["tpot_p50_speedup"], rel=1e-5)
        assert ev["speedup_output_tps"] == pytest.approx(sp["output_tps_speedup"], rel=1e-5)


def test_profile_is_yaml_whose_numbers_match_the_trials_parquet(grid_sweep):
    where, _ = grid_sweep
    study_dir = where / "study"
    prof = yaml.safe_load((study_dir / "profile.yaml").read_text())
    assert prof["specbench_profile"] == 1 and prof["recommendation"] in ("speculative", "baseline")
    assert [b["measured_at_concurrency"] for b in prof["bands"]] == [1, 2]
    assert prof["bands"][0]["batch_size"]["min"] == 1 and prof["bands"][-1]["batch_size"]["max"] is None
    for band in prof["bands"]:
        _check_evidence(study_dir, band["baseline"], None)
        _check_evidence(study_dir, band["speculative"], band["baseline"])
        assert band["gain"] == pytest.approx(band["speculative"]["paired"]["speedup_tpot"], rel=1e-5)
    # Whether a band pays is the one rule (analysis.outcome): the paired TPOT interval from the
    # trial's own Parquet (its baseline rows measured with it; with 3 prompts no interim look,
    # so the whole 95% at the end) lies wholly above min_speedup.
    leading = 0  # bands paying from batch size 1 up: those speculate, the rest do not
    for band in prof["bands"]:
        df = read_run(study_dir / band["speculative"]["run_dir"])[0]
        base, spec = df[df["method"] == "none"], df[df["method"] != "none"]
        b, s = analysis.per_prompt(base, "tpot_s"), analysis.per_prompt(spec, "tpot_s")
        d = log_ratios(b, s)
        # above concurrency 1 the blocks are the unit (one wave of 2 here: 2 blocks of 3 prompts)
        blocks = block_groups(spec, b.index.intersection(s.index))
        assert (blocks is None) == (band["measured_at_concurrency"] == 1)
        look = SequentialRule(planned=len(PROMPTS)).look(d, final=True, clusters=blocks)
        interval = (look.point, look.lo, look.hi)
        assert all(np.isfinite(interval))
        assert band["tpot_speedup_ci"] == pytest.approx(list(interval), rel=1e-5)
        assert ("does not pay" not in band["why"]) == (analysis.outcome(*interval) == "win")
    for band in prof["bands"]:
        if analysis.outcome(*band["tpot_speedup_ci"]) != "win":
            break
        leading += 1
    for i, band in enumerate(prof["bands"]):
        assert band["profile"] == ("speculative" if i < leading else "baseline")
    threshold = prof["disable_by_batch_size"]["value"]
    if leading in (0, len(prof["bands"])):
        assert threshold is None
    else:
        assert threshold == prof["bands"][leading - 1]["measured_at_concurrency"] == 1
        assert prof["speculative_config"]["disable_by_batch_size"] == threshold
    if prof["recommendation"] == "speculative":
        first = prof["bands"][0]
        assert prof["speculative_config"]["num_speculative_tokens"] == first["num_speculative_tokens"]
        assert prof["speculative_config"]["method"] == "draft_model"


@pytest.mark.parametrize("expect", ["speculative", "baseline"])
def test_the_profile_of_the_measured_study_follows_the_threshold(grid_sweep, tiny_pair, expect):
    """The same measured trials under a threshold below every measured interval (and one above
    them all): every band must speculate (and none), whatever the tiny models' timings came to,
    so a profile that always said one thing cannot pass. The thresholds come from the trials'
    own intervals and points: at concurrency 2 the interval rests on two blocks, and on a noisy
    machine its lower end has fallen below any fixed small number (0.001 once)."""
    from specbench.sweep import build_profile, build_spec
    from specbench.sweep.profile import flagged

    where, _ = grid_sweep
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{where / 'study.db'}")
    measured = [t for t in study.get_trials(deepcopy=False)
                if t.params["method"] != "none" and not flagged(t)]
    assert {t.params["concurrency"] for t in measured} == {1, 2}  # a band to judge at each level
    ends = [t.user_attrs["paired"][side] for t in measured for side in ("lo", "hi")]
    assert all(e is not None and np.isfinite(e) and e > 0 for e in ends)
    # a band speculates where its interval's lower end (or, without one, its point) is above
    # the threshold: below every lower end, all do; above every point, none. Not above every
    # upper end: resting on two blocks, one was once 889x, past --min-speedup's 1000 when doubled
    points = [t.value for t in measured]
    min_speedup = min(ends) / 2 if expect == "speculative" else min(2 * max(points), 1000)
    spec = build_spec(None, {"models.target": str(tiny_pair[0]), "models.draft": [str(tiny_pair[1])],
                             "space.method": ["draft_model"], "space.num_speculative_tokens": ["2,4"],
                             "space.concurrency": ["1,2"], "study.storage": "sqlite:///unused.db",
                             "study.out": str(where / "study"), "profile.min_speedup": min_speedup})
    prof = build_profile(spec, study)
    assert prof["recommendation"] == expect
    assert [b["profile"] for b in prof["bands"]] == [expect, expect]
    assert prof["disable_by_batch_size"]["value"] is None
    if expect == "speculative":
        first = prof["bands"][0]
        assert prof["speculative_config"] == {"method": "draft_model", "model": str(tiny_pair[1]),
                                              "num_speculative_tokens": first["num_speculative_tokens"]}
    else:
        assert prof["speculative_config"] is None


def test_a_finished_study_is_not_measured_again(grid_sweep, tiny_pair, prompts_file):
    where, _ = grid_sweep
    before = sorted(p.name for p in (where / "study" / "runs").iterdir())
    res = specbench(*sweep_args(tiny_pair, prompts_file, where, *GRID))
    assert res.code == 0, res.output
    assert "every configuration is measured" in res.err and "loading target" not in res.err
    assert sorted(p.name for p in (where / "study" / "runs").iterdir()) == before
    assert len(load(where)) == 6


# ---- interruption and resume ------------------------------------------------------------------


def test_interrupted_sweep_resumes_without_repeating_trials(tiny_pair, prompts_file, tmp_path,
                                                             monkeypatch):
    import specbench.runner as runner

    real = runner.run_plan  # a speculative trial runs its configuration and its baseline
    calls = []

    def interrupt_third_speculative(backend, requests, configs, **kw):
        calls.append(configs[-1].config_id)
        if len(calls) == 3:
            on_result = kw["on_result"]

            def ctrl_c(req, res):  # Ctrl-C after the first finished request of this trial
                on_result(req, res)
                raise KeyboardInterrupt

            kw["on_result"] = ctrl_c
        return real(backend, requests, configs, **kw)

    monkeypatch.setattr(runner, "run_plan", interrupt_third_speculative)
    first = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, *GRID))
    assert first.code == 130, first.output
    assert "interrupted" in first.err and "Traceback" not in first.output
    trials = load(tmp_path)
    done_before = {key(t): t.user_attrs["run_id"] for t in measured(trials)}
    assert len(done_before) == 4  # two baselines and two speculative configurations
    (cut,) = [t for t in trials if t.state == TrialState.FAIL]
    assert cut.user_attrs["interrupted"] is True and "fail_reason" not in cut.user_attrs

    monkeypatch.setattr(runner, "run_plan", real)
    second = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, *GRID))
    assert second.code == 0, second.output
    trials = load(tmp_path)
    ok = measured(trials)
    assert sorted(key(t) for t in ok) == sorted(set(key(t) for t in ok)) and len(ok) == 6
    for k, run_id in done_before.items():  # nothing measured before was measured again
        assert [t.user_attrs["run_id"] for t in ok if key(t) == k] == [run_id]
    redo = [t for t in ok if key(t) == key(cut)]
    assert len(redo) == 1 and redo[0].number > cut.number
    assert all(t.state != TrialState.RUNNING for t in trials)


# ---- failures and constraints -----------------------------------------------------------------


@pytest.mark.parametrize("batch", ["trial", "level"])
def test_failing_configuration_is_recorded_and_the_sweep_goes_on(tiny_pair, prompts_file, tmp_path, batch):
    # level: the draft that cannot load fails its own configuration only, whichever trial held the level
    missing = tmp_path / "no-such-draft"
    res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, "--draft", missing,
                                "--sampler", "grid", "--batch", batch, "--method", "draft_model", "-k", "2",
                                "--concurrency", "1"))
    assert res.code == 0, res.output
    assert "Traceback" not in res.output
    trials = load(tmp_path)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.params.get("draft") for t in failed] == [str(missing)]
    reason = failed[0].user_attrs["fail_reason"]
    assert "no-such-draft" in reason and "\n" not in reason
    assert "failed" in res.err and "no-such-draft" in res.err
    good = measured(trials)
    assert {t.params.get("draft") for t in good} == {None, str(tiny_pair[1])}  # baseline + good draft
    prof = yaml.safe_load((tmp_path / "study" / "profile.yaml").read_text())
    assert prof["study"]["failed"] == 1
    assert prof["failed_trials"][0]["reason"] == reason


def test_memory_budget_marks_trials_infeasible(tiny_pair, prompts_file, tmp_path):
    res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, "--sampler", "tpe",
                                "--n-trials", "3", "--method", "ngram", "-k", "2..3",
                                "--concurrency", "1", "--objective", "tpot_p50,output_tps",
                                "--max-peak-memory-gb", "0.001"))
    assert res.code == 0, res.output
    trials = load(tmp_path)
    assert len(trials) == 3 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        assert t.user_attrs["feasible"] is False and t.user_attrs["constraint"] > 0
        assert len(t.values) == 2
    for t in trials:  # Optuna's own constraint, which its samplers and best_trials use
        assert t.constraints == {"peak_memory_over_budget_gib": t.user_attrs["constraint"]}
    prof = yaml.safe_load((tmp_path / "study" / "profile.yaml").read_text())
    assert prof["study"]["infeasible"] == len(measured(trials))
    assert prof["recommendation"] == "baseline" and prof["pareto_front"] == []
    assert "infeasible" in res.err


def test_a_sweep_where_every_trial_failed_exits_1_without_a_profile_and_retry_failed_measures_again(
        tiny_pair, prompts_file, tmp_path, monkeypatch):
    from specbench.sweep import measure as measure_mod  # the objective looks measure up per trial

    real = measure_mod.measure

    def broken(*args, **kwargs):
        raise RuntimeError("the machine ran out of disk")

    args = sweep_args(tiny_pair, prompts_file, tmp_path, "--sampler", "grid", "--batch", "trial", "--method", "ngram",
                      "-k", "2", "--concurrency", "1")
    monkeypatch.setattr(measure_mod, "measure", broken)
    res = specbench(*args)
    assert res.code == 1 and "Traceback" not in res.output
    text = " ".join(res.err.split())
    assert "no configuration was measured: 2 trial(s) failed" in text and "ran out of disk" in text
    assert "--retry-failed" in text and not (tmp_path / "study" / "profile.yaml").exists()
    # A rerun skips what failed (its outcome stands) ...
    res = specbench(*args)
    assert res.code == 1 and len(load(tmp_path)) == 2
    # ... unless asked to measure it again; once the cause is gone, the profile is written.
    monkeypatch.setattr(measure_mod, "measure", real)
    res = specbench(*args, "--retry-failed")
    assert res.code == 0, res.output
    assert "2 failed configuration(s) will be measured again" in " ".join(res.err.split())
    assert len(measured(load(tmp_path))) == 2
    assert (tmp_path / "study" / "profile.yaml").is_file()


@pytest.mark.parametrize("flag,value", [("--min-speedup", "nan"), ("--timeout", "inf"),
                                        ("--max-peak-memory-gb", "nan")])
def test_non_finite_numbers_are_refused_before_anything_loads(tiny_pair, prompts_file, tmp_path, flag, value):
    res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, flag, value))
    assert res.code == 2 and "Traceback" not in res.output
    assert len(res.error_lines) == 1 and flag in res.error_lines[0] and "finite" in res.error_lines[0]
    assert "loading target" not in res.err


def test_a_speedup_beyond_tokens_per_pass_is_flagged_and_never_recommended(tiny_pair, prompts_file, tmp_path,
                                                                           monkeypatch):
    """The baseline's samples are made 8x slower than they ran (as a baseline measured under
    another load would read): every speculative trial then 'beats' it by more than its tokens
    per target pass allow, is flagged, and the profile recommends none of them."""
    import specbench.runner as runner

    real = runner.sample_metrics

    def slow_baseline(request, result, **kw):
        m = real(request, result, **kw)
        if not result.steps or not any(s.drafted for s in result.steps):
            m = {**m, "tpot_s": m["tpot_s"] * 8 if m.get("tpot_s") else m.get("tpot_s")}
        return m

    monkeypatch.setattr(runner, "sample_metrics", slow_baseline)
    res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, "--sampler", "grid", "--method",
                                "draft_model", "-k", "2", "--concurrency", "1"))
    assert res.code == 0, res.output
    (t,) = [t for t in measured(load(tmp_path)) if t.params["method"] != "none"]
    mal = t.user_attrs["summary"]["mean_acceptance_length_tok"]
    assert t.values[0] > 1.1 * mal
    assert t.user_attrs["inconsistent"][0].startswith("inconsistent: TPOT speedup")
    assert "flagged: trial" in res.out
    prof = yaml.safe_load((tmp_path / "study" / "profile.yaml").read_text())
    assert prof["recommendation"] == "baseline" and prof["bands"][0]["flagged"][0]["trial"] == t.number


def test_goodput_is_an_objective_recomputed_from_each_trials_own_records(tiny_pair, prompts_file, tmp_path):
    """`--objective goodput --goodput ttft:MS`: every trial's rows carry meets_slo, and its
    objective value is its configuration's samples meeting the SLO per second of the
    configuration's own measuring time (vLLM's goodput), recomputed here from its Parquet. An
    SLO nothing can meet gives 0; the objective without SLOs is refused in one line."""
    from specbench.analysis.serving import goodput

    res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path, "--sampler", "grid", "--method", "draft_model",
                                "-k", "2", "--concurrency", "1", "--objective", "goodput",
                                "--goodput", "ttft:60000"))
    assert res.code == 0, res.output
    trials = measured(load(tmp_path))
    assert len(trials) == 2
    for t in trials:
        df, meta = read_run(tmp_path / "study" / t.user_attrs["run_dir"])
        cid = t.user_attrs["config_id"]
        mine = df[df["config_id"] == cid]
        assert mine["meets_slo"].notna().all() and mine["meets_slo"].all()  # a minute: all meet it
        wall = meta["config"]["configuration_stats"][cid]["wall_s"]
        assert t.value == pytest.approx(len(mine) / wall)
        assert t.value == pytest.approx(goodput(mine, {cid: wall})["goodput_rps"].iloc[0])
    strict = tmp_path / "strict"
    res = specbench(*sweep_args(tiny_pair, prompts_file, strict, "--sampler", "grid", "--method", "draft_model",
                                "-k", "2", "--concurrency", "1", "--objective", "goodput", "--goodput", "ttft:0"))
    assert res.code == 0, res.output
    assert [t.value for t in measured(load(strict))] == [0.0, 0.0]
    res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path / "none", "--objective", "goodput"))
    assert res.code == 2 and "[objective] name = goodput needs the SLOs" in res.output, res.output
    assert "Traceback" not in res.output
    for bad, says in (("ttft", "'ttft' is not NAME:MS"), ("ttft:abc", "ttft: 'abc' is not a number"),
                      ("ttft:5,ttft:6", "ttft given twice")):
        res = specbench(*sweep_args(tiny_pair, prompts_file, tmp_path / "bad", "--objective", "goodput",
                                    "--goodput", bad))
        assert res.code == 2 and "objective.goodput (--goodput)" in res.output and says in res.output, res.output
        assert "Traceback" not in res.output and len(res.error_lines) == 1, res.output
    assert not (tmp_path / "bad").exists()  # refused before anything is written
