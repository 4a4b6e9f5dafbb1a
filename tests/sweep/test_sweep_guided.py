"""The model-guided sampler (`--sampler model`, specbench/sweep/guided.py) end to end on tiny
float32 models, whose random draft loses everywhere: after the baselines it measures the
corners of k × concurrency, then refits the speedup model after every trial and skips the
points it rules out, saying so; the study, profile and report record why, the sweep ends with
fewer trials than the grid, and a rerun measures nothing. A draft that pays (the target as
its own draft: every token accepted) is not skipped where it pays."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

from cli_harness import specbench
from specbench.runner import Configuration
from specbench.sweep import guided
from specbench.sweep.space import config_key, configuration
from specbench.sweep.trials import SKIPPED_ATTR

PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "code", "category": "code", "prompt": "def add(a, b):\n    return"},
    {"id": "list", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,"},
]
KS, CONCS = (1, 2, 3, 4), (1, 2, 4)


def args(target, draft, tmp_path: Path, *extra) -> list:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return ["sweep", "--target", target, "--draft", draft, "--workload", prompts,
            "--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "12",
            "--storage", f"sqlite:///{tmp_path / 'g.db'}", "--out", tmp_path / "study", "--study-name", "g",
            "--sampler", "model", "--method", "draft_model", "-k", ",".join(map(str, KS)),
            "--concurrency", ",".join(map(str, CONCS)), "--no-sequential", "--batch", "trial", *extra]


def study_of(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="g", storage=f"sqlite:///{tmp_path / 'g.db'}")


def test_model_sampler_measures_corners_then_skips_what_the_model_rules_out(tiny_pair, tmp_path):
    # a bar of 10x, which no prediction from these timings comes near even at a held-out error
    # of a few hundred percent: which points are skipped does not hang on the machine's noise
    # (the rule's margins are tested on planted predictions below)
    res = specbench(*args(*tiny_pair, tmp_path, "--min-speedup", "10"))
    assert res.code == 0, res.output
    study = study_of(tmp_path)
    measured = [configuration(**t.params) for t in study.trials if t.state == TrialState.COMPLETE]
    spec_points = [p for p in measured if not p.is_baseline]
    # the baselines and the four corners first, in that order
    assert [p.is_baseline for p in measured[:3]] == [True] * 3
    assert {(p.spec.num_speculative_tokens, p.concurrency) for p in spec_points[:4]} == {(1, 1), (4, 1), (1, 4), (4, 4)}
    skipped = study.user_attrs[SKIPPED_ATTR]
    grid = len(KS) * len(CONCS)
    # every speculative point is measured or skipped, never both, and most are skipped here
    assert len(spec_points) + len(skipped) == grid
    assert not {config_key(p) for p in spec_points} & set(skipped)
    assert len(skipped) == grid - 4, skipped  # every point but the corners
    for key, why in skipped.items():
        assert why.startswith("predicted ") and "needed at concurrency" in why, why
        assert f"model: skipping {guided.label(key)}" in res.output
    assert "model: done" in res.output
    assert f"{len(skipped)} configuration(s) not measured: the fitted model rules them out" in res.output
    profile = yaml.safe_load((tmp_path / "study" / "profile.yaml").read_text())
    assert profile["study"]["skipped_by_model"] == skipped
    assert profile["recommendation"] == "baseline"

    # a rerun finds the study settled: nothing is measured again
    n = len(study.trials)
    again = specbench(*args(*tiny_pair, tmp_path, "--min-speedup", "10"))
    assert again.code == 0, again.output
    assert len(study_of(tmp_path).trials) == n


class Planted:
    """A stand-in for the fitted model: planted predictions per (k, concurrency)."""

    def __init__(self, predicted: dict[tuple[int, int], float], reach: tuple[int, int] = (4, 4)):
        self.predicted, self.reach = predicted, reach
        self.families = [guided.family(point(1, 1))]

    def predict(self, family, k, c):
        return self.predicted[(k, c)]

    def extrapolated(self, family, k, c):
        return k > self.reach[0] or c > self.reach[1]


def point(k: int, c: int) -> Configuration:
    return configuration("draft_model", k, "/models/draft", c)


def test_the_rule_skips_only_what_cannot_reach_the_bar_and_measures_the_closest_first():
    predicted = {(2, 1): 1.50, (3, 1): 0.95, (2, 2): 0.80, (3, 2): 0.40, (2, 4): 0.55}
    todo = [point(k, c) for k, c in predicted]
    bar = {1: 1.0, 2: 1.0, 4: 1.0}
    got = guided.rank(todo, Planted(predicted), u=0.10, bar=bar)
    # 0.80 × 1.2 = 0.96 < 1 and 0.40, 0.55: skipped; 0.95 × 1.2 >= 1: still in doubt
    assert set(got.skipped) == {config_key(point(2, 2)), config_key(point(3, 2)), config_key(point(2, 4))}
    assert "predicted 0.80×" in got.skipped[config_key(point(2, 2))]
    assert got.config == point(3, 1)  # |log 0.95| < |log 1.5|: the closest to the bar
    # a wider uncertainty rules out less
    wide = guided.rank(todo, Planted(predicted), u=0.30, bar=bar)
    assert set(wide.skipped) == {config_key(point(3, 2)), config_key(point(2, 4))}  # 0.80 × 1.6 >= 1: kept
    # a bar raised by a measured 1.7× at concurrency 1: 1.5 can still beat it, 0.95 cannot
    high = guided.rank(todo, Planted(predicted), u=0.10, bar={**bar, 1: 1.7})
    assert config_key(point(3, 1)) in high.skipped and config_key(point(2, 1)) not in high.skipped
    assert high.config == point(2, 1)
    # what the model cannot speak for is measured first, never skipped
    beyond = guided.rank(todo + [point(6, 1)], Planted({**predicted, (6, 1): 0.1}, reach=(4, 4)), 0.10, bar)
    assert beyond.config == point(6, 1) and config_key(point(6, 1)) not in beyond.skipped
    # nothing left in doubt: the sweep is done
    done = guided.rank([point(3, 2)], Planted(predicted), 0.10, bar)
    assert done.config is None and config_key(point(3, 2)) in done.skipped


def test_level_batches_measure_the_corner_levels_whole_and_skip_a_level_the_model_rules_out(tiny_pair, tmp_path):
    # the model sampler's default, [budget] batch = "level": the first corner's trial measures
    # its whole level with one baseline, so does the other corner's; the middle level, where
    # the model rules every point out, costs nothing, its baseline included
    base = [a for a in args(*tiny_pair, tmp_path, "--min-speedup", "10") if a not in ("--batch", "trial")]
    res = specbench(*base)
    assert res.code == 0, res.output
    study = study_of(tmp_path)
    done = [t for t in study.trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    measured = {config_key(configuration(**t.params)) for t in done}
    levels = {c: [config_key(configuration("draft_model", k, tiny_pair[1], c)) for k in KS] for c in CONCS}
    for c in (CONCS[0], CONCS[-1]):
        assert set(levels[c]) | {config_key(configuration("none", concurrency=c))} <= measured
    skipped = study.user_attrs[SKIPPED_ATTR]
    assert set(skipped) == set(levels[2]) | {config_key(configuration("none", concurrency=2))}
    assert "no baseline to measure them against" in skipped[config_key(configuration("none", concurrency=2))]
    runs = list((tmp_path / "study" / "runs").iterdir())
    assert len(runs) == 2  # two levels, one run each
    profile = yaml.safe_load((tmp_path / "study" / "profile.yaml").read_text())
    assert profile["recommendation"] == "baseline"
    n = len(study.trials)
    again = specbench(*base)
    assert again.code == 0, again.output
    assert len(study_of(tmp_path).trials) == n


def test_label_reads_chain_and_tree_keys():
    assert guided.label(config_key(configuration("draft_model", 3, "/m/qwen-0.5b", 4))) == \
        "draft_model k3 (qwen-0.5b) c4"
    assert guided.label(config_key(configuration("ngram", 2, None, 1))) == "ngram k2 c1"
    tree = config_key(configuration("draft_model", 3, "d", 2, topk=2, num_draft_tokens=6))
    assert guided.label(tree) == f"draft_model k3 (d) c2 {tree.split('|')[-1]}"
