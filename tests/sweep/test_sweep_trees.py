"""Draft trees as sweep dimensions (`[space] topk`, `num_draft_tokens`; SGLang's
--speculative-eagle-topk / --speculative-num-draft-tokens): the space's configurations (chains
keep their keys, sizes that come to the same tree are one configuration), the spec's refusals, the
profile and the paste files of a study whose best configuration is a tree (SGLang gets the
tree's flags; vLLM, which serves no trees, the best chain where that chain pays too, else
K = 0, and says why), and a tiny end-to-end sweep whose records carry the tree."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from cli_harness import specbench
from specbench.errors import ConfigError
from specbench.records import read_run
from specbench.runner import Configuration
from specbench.sweep import build_profile, build_spec, write_profile
from specbench.sweep.serving import serving_profiles
from specbench.sweep.space import config_key, configuration
from test_sweep_profile import make_spec
from test_sweep_verdict import _summary

HALF = 0.05


def tree_spec(**flags):
    return make_spec(**{"space.topk": [1, 2], "space.num_draft_tokens": [5, 100], **flags})


def test_space_configurations_trees_beside_chains_with_the_old_chain_keys():
    spec = tree_spec(**{"space.concurrency": ["1"], "space.num_speculative_tokens": ["2"]})
    configs = spec.space.configurations()
    keys = [config_key(c) for c in configs]
    # chain k=2 keeps its key; topk 2: a 5-token tree, and 100 capped to what depth 2 holds
    # (2 + 1 * 4 = 6 nodes + the root = 7)
    assert keys == ["none|k0|-|c1", "draft_model|k2|d|c1", "draft_model|k2|d|c1|t2n5", "draft_model|k2|d|c1|t2n7"]
    tree, capped = configs[2], configs[3]
    assert tree.spec.num_draft_tokens == 5 and tree.spec.verify_width == 5
    # the configuration holds the size the tree comes to, what SpeculativeConfig accepts...
    assert capped.spec.num_draft_tokens == 7 and capped.spec.verify_width == 7
    assert configuration("draft_model", 2, "d", 1, 2, 100) == capped  # ...whatever size was asked
    assert spec.space.params(tree) == {"method": "draft_model", "concurrency": 1, "num_speculative_tokens": 2,
                                       "draft": "d", "topk": 2, "num_draft_tokens": 5}
    # ...and its params the size the space asks for, a choice of suggest's distribution
    assert spec.space.params(capped)["num_draft_tokens"] == 100
    assert spec.space.from_params(spec.space.params(capped)) == capped
    assert spec.space.params(configs[1])["topk"] == 1  # enqueued chains stay chains
    assert spec.space.grid()["topk"] == [1, 2] and spec.space.grid()["num_draft_tokens"] == [5, 100]
    # a tree no size of the space comes to is not in it
    with pytest.raises(ValueError, match="not in this space"):
        spec.space.params(configuration("draft_model", 2, "d", 1, 2, 4))
    # a chain-only space is described, keyed and gridded as before trees existed
    chain = make_spec()
    assert "topk" not in chain.space.grid() and "topk" not in chain.space.describe()
    ngram = chain.space.from_params({"method": "ngram", "num_speculative_tokens": 3, "topk": 4})
    assert config_key(ngram) == "ngram|k3|-|c1" and ngram.spec.topk == 1 and ngram.spec.num_draft_tokens is None


@pytest.mark.parametrize("flags,needle", [
    ({"space.topk": [2], "space.method": ["ngram"]}, "only draft_model, eagle3, medusa build"),
    ({"space.num_draft_tokens": [8]}, "add a topk above 1"),
    ({"space.topk": [0]}, "values must be >= 1"),
    ({"space.topk": [2], "space.num_draft_tokens": [1]}, "values must be >= 2"),
    ({"space.topk": [2], "server.command": "sglang --port {port} --speculative-num-steps {k}"},
     "must pass {topk} and {num_draft_tokens}"),
])
def test_spec_refuses_trees_it_cannot_measure(flags, needle):
    with pytest.raises(ConfigError) as exc:
        make_spec(**flags)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def tree_study(spec, results: dict[Configuration, float]) -> optuna.Study:
    """Paired trials: configuration -> paired TPOT speedup (interval +-HALF); baselines added."""
    study = optuna.create_study(directions=spec.directions)
    dists = {"method": CategoricalDistribution(("none", "draft_model")),
             "concurrency": CategoricalDistribution(spec.space.concurrency),
             "num_speculative_tokens": CategoricalDistribution(spec.space.num_speculative_tokens),
             "draft": CategoricalDistribution(("d",)), "topk": CategoricalDistribution(spec.space.topk),
             "num_draft_tokens": CategoricalDistribution(spec.space.num_draft_tokens)}
    configs = [(configuration(concurrency=c), 1.0) for c in spec.space.concurrency] + list(results.items())
    for i, (p, x) in enumerate(configs):
        attrs = {"config_key": config_key(p), "run_id": f"run-{i}", "run_dir": f"runs/run-{i}",
                 "summary": _summary(p, x, 3.0)}
        if not p.is_baseline:
            attrs["baseline_summary"] = _summary(configuration(concurrency=p.concurrency), 1.0, 3.0)
            attrs["paired"] = {"point": x, "lo": x * (1 - HALF), "hi": x * (1 + HALF), "n": 8, "planned": 24}
        params = spec.space.params(p)
        study.add_trial(create_trial(state=TrialState.COMPLETE, params=params,
                                     distributions={k: dists[k] for k in params}, values=[x], user_attrs=attrs))
    return study


def tree(k, c, n=5):
    return configuration("draft_model", k, "d", c, 2, n)


def chain(k, c):
    return configuration("draft_model", k, "d", c)


def test_a_tree_that_wins_goes_to_sglang_and_vllm_gets_the_chain_where_it_pays(tmp_path):
    spec = tree_spec(**{"space.num_draft_tokens": [5]})
    study = tree_study(spec, {tree(2, 1): 1.8, chain(4, 1): 1.5, chain(2, 1): 1.3,
                              tree(2, 4): 1.3, chain(4, 4): 0.95,
                              tree(2, 16): 0.8, chain(2, 16): 0.7})
    prof = build_profile(spec, study)
    bands = prof["bands"]
    assert [b["profile"] for b in bands] == ["speculative", "speculative", "baseline"]
    assert (bands[0]["topk"], bands[0]["num_draft_tokens"]) == (2, 5)
    assert bands[0]["chain"]["config"]["num_speculative_tokens"] == 4 and bands[0]["chain"]["pays"]
    assert not bands[1]["chain"]["pays"]
    assert prof["speculative_config"] == {"method": "draft_model", "model": "d", "num_speculative_tokens": 2,
                                          "topk": 2, "num_draft_tokens": 5, "disable_by_batch_size": 4}
    assert "topk=2 n=5" in bands[0]["why"]
    serving = serving_profiles(prof)
    # vLLM: the chain k=4 at batch size 1 (it pays too), nothing where only the tree pays
    assert serving["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 4, 0], [5, 16, 0]]
    assert "vLLM does not serve" in serving["bands"][1]["why"] and "no chain" in serving["bands"][1]["why"]
    assert serving["vllm_legacy"] == {"method": "draft_model", "model": "d", "num_speculative_tokens": 4,
                                      "disable_by_batch_size": 1}
    # SGLang: it stops paying at 16, so baseline, with the tree's flags for traffic below it
    assert serving["sglang"] is None
    assert "--speculative-eagle-topk 2 --speculative-num-draft-tokens 5" in serving["sglang_why"]
    assert "up to batch size 4" in serving["sglang_why"]


def test_a_tree_that_pays_everywhere_is_sglangs_and_vllm_without_a_paying_chain_says_baseline(tmp_path):
    spec = tree_spec(**{"space.num_draft_tokens": [5], "space.concurrency": ["1,4"]})
    study = tree_study(spec, {tree(2, 1): 1.6, chain(2, 1): 0.97, tree(2, 4): 1.2, chain(2, 4): 0.9})
    written = write_profile(tmp_path / "profile.yaml", build_profile(spec, study))
    sglang = (tmp_path / "profile.sglang.txt").read_text()
    assert sglang.split() == ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "d",
                              "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                              "--speculative-num-draft-tokens", "5"]
    assert json.loads((tmp_path / "profile.vllm.json").read_text()) is None
    assert json.loads((tmp_path / "profile.vllm-legacy.json").read_text()) is None
    rollout = yaml.safe_load((tmp_path / "profile.rollout.yaml").read_text())
    assert rollout["profiles"]["spec_decode_draft_model_k2_topk2"]["sglang"]["args"][-1] == "5"
    assert "vLLM: baseline" in (tmp_path / "profile.rollout.yaml").read_text()
    assert set(written) >= {"vllm", "sglang", "rollout"}


PROMPTS = [{"id": "a", "prompt": "abc abc abc abc abc"}, {"id": "b", "prompt": "def add(a, b):\n    return"}]


def test_a_tiny_sweep_measures_trees_and_records_them(tiny_pair, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    res = specbench("sweep", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--workload", prompts,
                    "--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "8",
                    "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", tmp_path / "study",
                    "--study-name", "trees", "--sampler", "grid", "-k", "2", "--topk", "1,2",
                    "--num-draft-tokens", "5", "--concurrency", "1", "--no-sequential")
    assert res.code == 0, res.output
    trials = [t for t in optuna.load_study(study_name="trees", storage=f"sqlite:///{tmp_path / 's.db'}").trials
              if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    keys = sorted(config_key(configuration(**t.params)) for t in trials)
    d = tiny_pair[1]
    assert keys == sorted(["none|k0|-|c1", f"draft_model|k2|{d}|c1", f"draft_model|k2|{d}|c1|t2n5"])
    (t,) = [t for t in trials if configuration(**t.params).spec.is_tree]
    df, _ = read_run(Path(tmp_path / "study") / t.user_attrs["run_dir"])
    spec_rows = df[df["config_id"] == t.user_attrs["config_id"]]  # the level's run holds the chain too
    assert len(spec_rows) == len(PROMPTS)
    assert (spec_rows["topk"] == 2).all() and (spec_rows["num_draft_tokens"] == 5).all()
    assert spec_rows["step_drafted"].map(lambda s: max(s, default=0)).max() <= 4  # 5 tokens: 4 drafted + root
    base = df[df["is_baseline"]].set_index("prompt_id")["output_token_ids"]
    for _, row in spec_rows.iterrows():  # greedy: the tree's output is the baseline's
        assert list(row["output_token_ids"]) == list(base[row["prompt_id"]])
