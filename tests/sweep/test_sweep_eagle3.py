"""Sweeps accept eagle3 in their method space: the head comes from `models.head` (--head), one
per study; a grid over draft_model and eagle3 measures each once, the eagle3 trial's run
records name the head, and a launched server gets vLLM's eagle3 --speculative-config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiny
from cli_harness import specbench
from specbench.config import DEFAULT_EAGLE3_HEAD
from specbench.errors import ConfigError
from specbench.models.eagle3 import save_head
from specbench.records import read_run
from specbench.sweep import build_spec
from specbench.sweep.server import speculative_config_json
from specbench.sweep.space import config_key, configuration
from specbench.sweep.trials import params_key
from test_sweep_run import FAST, load, measured, prompts_file  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def head_dir(tiny_pair, tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype="float32").eval()
    return save_head(tiny.make_head(target, draft_vocab_size=100, seed=3), tmp_path_factory.mktemp("h") / "head")


def test_eagle3_needs_a_head_except_on_the_default_target_whose_head_is_in_the_catalog():
    with pytest.raises(ConfigError, match=r"method eagle3 needs an EAGLE-3 head directory: set models.head \(--head\)"):
        build_spec(None, {"space.method": ["eagle3"], "models.target": "/models/other"})
    assert build_spec(None, {"space.method": ["eagle3"]}).space.head == DEFAULT_EAGLE3_HEAD
    assert build_spec(None, {"space.method": ["eagle3"], "models.head": "/heads/h"}).space.head == "/heads/h"


def test_the_head_is_part_of_each_eagle3_configuration_not_of_the_key(tmp_path):
    spec = build_spec(None, {"space.method": ["draft_model", "eagle3"], "models.head": "/heads/h",
                             "space.num_speculative_tokens": ["3"]})
    e = [c for c in spec.space.configurations() if c.spec.method == "eagle3"]
    assert len(e) == 1 and e[0].spec.draft == "/heads/h"
    params = spec.space.params(e[0])
    assert config_key(e[0]) == "eagle3|k3|-|c1" and "draft" not in params
    # the head is the study's, not a parameter: the space puts it back into what params name
    assert spec.space.from_params(params) == e[0]
    assert params_key(spec.space, params) == "eagle3|k3|-|c1"  # a queued trial's key
    assert spec.space.describe()["head"] == "/heads/h"
    assert json.loads(speculative_config_json(e[0].spec)) == {"method": "eagle3", "model": "/heads/h",
                                                               "num_speculative_tokens": 3}
    no_head = build_spec(None, {"space.method": ["ngram"], "models.head": "/heads/h"})
    assert no_head.space.head is None and "head" not in no_head.space.describe()
    assert configuration("eagle3", 3, "/x").spec.draft == "/x" and configuration("ngram", 3, "/x").spec.draft is None
    # an eagle3 configuration does not exist without its head (k = 0 is the baseline)
    with pytest.raises(ConfigError, match="needs an EAGLE-3 head directory"):
        configuration("eagle3", 3)
    assert configuration("eagle3", 0) == configuration()


@pytest.mark.parametrize("batch", ["level", "trial"])
def test_grid_sweep_over_draft_model_and_eagle3(tiny_pair, head_dir, prompts_file, tmp_path, batch):  # noqa: F811
    where = tmp_path
    res = specbench("sweep", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--head", head_dir,
                    "--workload", prompts_file, *FAST, "--storage", f"sqlite:///{where / 'study.db'}",
                    "--out", where / "study", "--study-name", "tiny", "--sampler", "grid", "--batch", batch,
                    "--method", "draft_model,eagle3", "-k", "2", "--concurrency", "1")
    assert res.code == 0, res.output
    trials = measured(load(where))
    methods = sorted(t.params["method"] for t in trials)
    assert methods == ["draft_model", "eagle3", "none"]
    e = next(t for t in trials if t.params["method"] == "eagle3")
    df, meta = read_run(where / "study" / e.user_attrs["run_dir"])
    # its baseline interleaved with it: its own (trial), or the level's, with the draft model too (level)
    assert set(df["method"]) == ({"none", "eagle3"} if batch == "trial" else {"none", "eagle3", "draft_model"})
    if batch == "trial":
        assert meta["config"]["draft"] == str(head_dir)
    else:  # one run for the level: the draft model and the head each drafted their own rows
        d = df[df["method"] == "draft_model"]
        assert set(d["draft_model"]) == {str(tiny_pair[1])} and (d["token_match_rate"] == 1.0).all()
    df = df[df["method"] == "eagle3"]
    assert set(df["draft_model"]) == {str(head_dir)}
    assert (df["token_match_rate"] == 1.0).all()
