"""`specbench report STUDY` on a real tiny-model sweep: the study is found from its directory,
its .db or --storage/--study-name; the heatmap's numbers are `analysis.summarize` of the
trials' own Parquet files; the importance figure is Optuna's get_param_importances; every
trial links to its run's section; infeasible and failed trials are marked; the profile's
values carry their trials; the paste-ready serving configurations are on the page."""

from __future__ import annotations

import dataclasses
import math
import re
import warnings

import numpy as np
import optuna
import pandas as pd
import pytest

from report_helpers import specbench
from specbench import analysis
from specbench.analysis.sequential import log_ratios
from specbench.records import read_run
from specbench.report import build_report, load_inputs
from specbench.report import study_tables, study_view, verdict


@pytest.fixture(scope="module")
def inputs(tiny_study):
    return load_inputs([tiny_study / "studies" / "tiny"])


@pytest.fixture(scope="module")
def table(inputs):
    return verdict.verdict_table(inputs, n_boot=300)


@pytest.fixture(scope="module")
def page(inputs):
    return build_report(inputs, n_boot=300)


def test_study_directory_db_file_and_storage_url_load_the_same_study(tiny_study, inputs):
    (st,) = inputs.studies
    # the sweep's default for the grid: one run per concurrency level, shared by its trials
    assert st.name == "tiny" and len(st.trials) == 6 and len(st.runs) == 2
    assert len({t.user_attrs["run_dir"] for t in st.study.trials}) == 2
    assert st.objectives == ["speedup"] and st.directions == ["maximize"]
    assert st.profile is not None and st.profile["study"]["name"] == "tiny"
    by_db = load_inputs([tiny_study / "tiny.db"])
    by_url = load_inputs([], storage=f"sqlite:///{tiny_study / 'tiny.db'}", study_name="tiny")
    for other in (by_db, by_url):
        assert sorted(other.run_ids) == sorted(inputs.run_ids)
        assert other.studies[0].study_dir == tiny_study / "studies" / "tiny"


def test_each_trial_is_paired_with_the_baseline_measured_in_its_own_run(inputs):
    assert len(inputs.pairs) == 4
    for spec_label, base_label in inputs.pairs.items():
        source = inputs.frame.loc[inputs.frame["label"] == spec_label, "source"].iloc[0]
        c = spec_label.rsplit("-c", 1)[1]
        assert base_label.endswith(f"baseline-c{c}")
        # the baseline measured in its own run, in the same blocks
        assert set(inputs.frame.loc[inputs.frame["label"] == base_label, "source"]) == {source}


def trial_parquet(tiny_study, trial) -> pd.DataFrame:
    return read_run(tiny_study / "studies" / "tiny" / trial.user_attrs["run_dir"])[0]


def test_heatmap_numbers_equal_summaries_of_the_trials_parquet(tiny_study, inputs, table):
    st = inputs.studies[0]
    plot = study_view.trial_heatmap(st, inputs, table)
    (hm,) = [t for t in plot.figure.data if t.type == "heatmap"]
    trials = st.study.trials
    checked = 0
    for t in trials:
        if t.params["method"] == "none":
            continue
        k, c = t.params["num_speculative_tokens"], t.params["concurrency"]
        df = trial_parquet(tiny_study, t)  # the trial and the baseline measured with it (and its level's)
        d = log_ratios(analysis.per_prompt(df[df["method"] == "none"], "tpot_s"),
                       analysis.per_prompt(df[df["config_id"] == t.user_attrs["config_id"]], "tpot_s"))
        want = float(np.exp(d.mean()))  # the paired speedup its profile decided on
        z = hm.z[list(hm.y).index(f"c={c}")][list(hm.x).index(f"k={k}")]
        assert math.exp(z) == pytest.approx(want, rel=1e-9)
        text = hm.text[list(hm.y).index(f"c={c}")][list(hm.x).index(f"k={k}")]
        assert f"n=4 · #{t.number}" in text and "[" in text  # the CI and the prompts behind it
        checked += 1
    assert checked == 4


def test_importances_from_too_few_trials_are_not_ranked(inputs):
    st = inputs.studies[0]  # 4 speculative trials, 2 varying parameters: 10 would be needed
    plot = study_view.param_importance(st)
    assert plot.figure is None
    assert plot.note.startswith("Not ranked: 4 measured speculative trial(s) for 2 varying parameters")


def test_importance_figure_equals_optunas_get_param_importances(inputs):
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    src = inputs.studies[0]
    synthetic = optuna.create_study(directions=["maximize"])
    dists = {"method": CategoricalDistribution(("none", "draft_model")),
             "num_speculative_tokens": CategoricalDistribution((1, 2, 3, 4)),
             "concurrency": CategoricalDistribution((1, 2, 4))}
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 4):
        for c in (1, 2, 4):
            synthetic.add_trial(create_trial(
                state=TrialState.COMPLETE, distributions=dists,
                params={"method": "draft_model", "num_speculative_tokens": k, "concurrency": c},
                values=[1.5 - 0.1 * c + 0.02 * k + 0.01 * rng.standard_normal()]))
    st = dataclasses.replace(src, study=synthetic)
    plot = study_view.param_importance(st)
    (bar,) = plot.figure.data
    got = dict(zip(bar.y, bar.x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = optuna.importance.get_param_importances(
            synthetic, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
            params=["num_speculative_tokens", "concurrency"], target=lambda t: -t.values[0])
    assert set(got) == {"num_speculative_tokens", "concurrency"}
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-12)
    assert sum(got.values()) == pytest.approx(1.0)


def test_trial_table_rows_say_what_each_trial_measured(inputs):
    st = inputs.studies[0]
    rows = {r["number"]: r for r in study_tables.trial_rows(st, inputs)}
    for t in st.study.trials:
        r = rows[t.number]
        assert r["state"] == "COMPLETE" and r["objective"] == f"speedup {t.values[0]:.4g}"
        p = t.params
        want = (f"baseline c={p['concurrency']}" if p["method"] == "none" else
                f"draft_model (draft) k={p['num_speculative_tokens']} c={p['concurrency']}")
        assert r["config"] == want and r["anchor"] == study_tables.run_anchor(t.user_attrs["run_id"])


def test_every_trial_links_to_its_runs_section(page, inputs):
    st = inputs.studies[0]
    links = re.findall(r'<a class="trial-run" href="#(run-[^"]+)">([^<]+)</a>', page)
    assert len(links) == 6
    ids = set(re.findall(r'<details class="run" id="(run-[^"]+)"', page))
    assert {a for a, _ in links} <= ids
    assert sorted(r for _, r in links) == sorted(st.trials["run_id"])


def test_page_has_the_search_the_profile_and_paste_ready_configs(page, inputs):
    for text in ("Optimization history", "Parameter importances", "Speedup heatmap from the trials",
                 "Recommended profile", "Ready to paste", "Rollout and what to monitor",
                 "mal_alert_below", "A single-objective study has no Pareto front"):
        assert text in page, text
    prof = inputs.studies[0].profile
    if prof["recommendation"] == "speculative":
        assert "num_speculative_tokens_per_batch_size" in page
        assert "--speculative-algorithm STANDALONE" in page
    # the run-level heatmap defers to the study's, which marks infeasible and failed trials
    assert "the heatmap is drawn from the trials in the study section" in page
    assert 'id="plot-study-tiny-heatmap"' in page and 'id="plot-speedup-heatmap"' not in page


def test_profile_values_carry_their_trial_and_run(page, inputs):
    prof = inputs.studies[0].profile
    rows = study_tables.profile_rows(inputs.studies[0], inputs)
    band_rows = [r for r in rows if r["field"].startswith("batch size")]
    assert len(band_rows) == len(prof["bands"]) == 2
    for r, band in zip(band_rows, prof["bands"]):
        trials = {e["trial"] for e in r["ev"]}
        assert band["baseline"]["trial"] in trials and band["speculative"]["trial"] in trials
        assert all(e["anchor"] == study_tables.run_anchor(e["run"]) for e in r["ev"])


def test_infeasible_and_failed_trials_are_marked(edited_study, tiny_study):
    inputs = load_inputs([edited_study / "edited.db"], study_dir=tiny_study / "studies" / "tiny")
    (st,) = inputs.studies
    table = verdict.verdict_table(inputs, n_boot=200)
    cells = study_view.heatmap_cells(st, inputs, table).set_index("trial")
    t3 = st.study.trials[3]
    assert t3.params["method"] == "draft_model" and not cells.loc[3, "feasible"]
    plot = study_view.trial_heatmap(st, inputs, table)
    texts = [c for t in plot.figure.data if t.type == "heatmap" for row in t.text for c in row]
    assert any("infeasible" in c for c in texts)
    assert any(c.startswith("failed") and "#6" in c for c in texts)  # k = 8 at c = 2
    assert any(t.type == "scatter" and t.name == "infeasible" for t in plot.figure.data)
    html = build_report(inputs, n_boot=200)
    assert "out of memory: CPU RAM exhausted" in html
    assert "no: +0.75 GiB over budget" in html
    assert "No profile.yaml in the study directory" not in html  # the tiny study's, found via --study-dir
    hist = study_view.optimization_history(st)
    assert any(t.name == "infeasible trial" for t in hist.figure.data)


def test_report_command_on_a_study(tiny_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = specbench("report", tiny_study / "studies" / "tiny", "--n-boot", "200")
    assert res.code == 0, res.output
    out = tmp_path / "reports" / "study-tiny.html"
    assert out.is_file() and "2 run(s)" in res.out  # one per concurrency level


def test_a_storage_with_several_studies_needs_a_name(tiny_study, tmp_path):
    url = f"sqlite:///{tmp_path / 'two.db'}"
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=url)
    res = specbench("report", tmp_path / "two.db")
    assert res.code == 2 and len(res.error_lines) == 1
    assert "holds 2 studies (a, b): pass --study-name NAME" in res.err
    res = specbench("report", "--storage", url, "--study-name", "c")
    assert res.code == 2 and "no study named 'c'; studies there: a, b" in res.err


def test_a_db_without_its_study_directory_asks_for_it(edited_study):
    res = specbench("report", edited_study / "edited.db")
    assert res.code == 2 and len(res.error_lines) == 1
    assert "no study directory for 'edited' (pass --study-dir DIR)" in res.err


def test_a_missing_storage_is_refused_and_not_created(tmp_path):
    res = specbench("report", "--storage", f"sqlite:///{tmp_path / 'nope.db'}", "--study-name", "x")
    assert res.code == 2 and "no Optuna SQLite file" in res.err
    assert not (tmp_path / "nope.db").exists()


def test_study_model_section_reports_its_error(page):
    assert "Fitted speedup model" in page
    m = re.search(r"mean absolute error ([0-9.]+)% on the (\d+) measured", page)
    assert m and int(m.group(2)) == 4 and np.isfinite(float(m.group(1)))


def test_a_study_report_never_imports_torch(tiny_study, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import sys
sys.modules["torch"] = None          # `import torch` now raises ImportError
sys.modules["transformers"] = None
from specbench.report import build_report, load_inputs
html = build_report(load_inputs([{str(tiny_study / 'studies' / 'tiny')!r}]), n_boot=200)
assert "Speedup heatmap from the trials" in html
"""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(repo)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
