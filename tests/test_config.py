"""`specbench.config`: vLLM's --speculative-config JSON (aliases, defaults, every refusal one
line naming the key), the list flags, the default draft, `SpeculativeConfig.for_method`, and
`RunConfig`, which reads back what run.json holds, from today's runs, sweep trials and older
runs alike."""

from __future__ import annotations

import json

import pytest

from specbench.config import (
    DEFAULT_DRAFT,
    DEFAULT_NGRAM,
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_TARGET,
    RunConfig,
    SpeculativeConfig,
    default_draft,
    parse_int_list,
    parse_speculative_config,
    split_list,
)
from specbench.errors import ConfigError

# ---- --speculative-config -------------------------------------------------------------------


def test_an_ngram_config_with_vllms_prompt_lookup_bounds():
    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, '
                                    '"prompt_lookup_min": 2, "prompt_lookup_max": 5}')
    assert spec == SpeculativeConfig(method="ngram", num_speculative_tokens=3, ngram_min=2, ngram_max=5)


def test_ngram_bounds_default_to_the_speculative_config_defaults():
    spec = parse_speculative_config('{"method": "ngram"}')
    assert (spec.ngram_min, spec.ngram_max) == DEFAULT_NGRAM == (SpeculativeConfig().ngram_min,
                                                                   SpeculativeConfig().ngram_max)
    assert spec.num_speculative_tokens == DEFAULT_NUM_SPECULATIVE_TOKENS


@pytest.mark.parametrize("alias, method", [("draft", "draft_model"), ("draft_model", "draft_model"),
                                           ("prompt_lookup", "ngram"), ("eagle3", "eagle3")])
def test_vllm_method_names_map_to_ours(alias, method):
    model = "" if method == "ngram" else ', "model": "m"'
    assert parse_speculative_config(f'{{"method": "{alias}"{model}}}').method == method


def test_a_model_without_a_method_means_draft_model_and_nothing_means_none():
    spec = parse_speculative_config('{"model": "small", "num_speculative_tokens": 2}')
    assert (spec.method, spec.draft, spec.num_speculative_tokens) == ("draft_model", "small", 2)
    none = parse_speculative_config("{}")
    assert none.method == "none" and none.num_speculative_tokens == 0 and not none.speculative


def test_the_knobs_and_vllms_disable_by_batch_size_name():
    spec = parse_speculative_config('{"method": "ngram", "speculative_disable_by_batch_size": 8, '
                                    '"dynamic_k": true}')
    assert spec.disable_by_batch_size == 8 and spec.dynamic_k
    spec = parse_speculative_config('{"model": "m", "draft_confidence_threshold": 0.3, '
                                    '"disable_by_batch_size": 2}')
    assert spec.draft_confidence_threshold == 0.3 and spec.disable_by_batch_size == 2


@pytest.mark.parametrize("text, needles", [
    ("{'method': 'ngram'}", ["not valid JSON", "char 1"]),
    ("[1, 2]", ["must be a JSON object"]),
    ('{"method": "ngram", "k": 3}', ["unknown key(s) k", "num_speculative_tokens", "prompt_lookup_max"]),
    ('{"method": "mlp_speculator"}', ["unknown method 'mlp_speculator'", "draft_model", "medusa", "suffix"]),
    ('{"method": "medusa"}', ["method 'medusa' needs the Medusa heads' directory", "model"]),
    ('{"method": "ngram", "num_speculative_tokens": "4"}', ["num_speculative_tokens", "integer", "'4'"]),
    ('{"method": "ngram", "num_speculative_tokens": true}', ["num_speculative_tokens", "integer", "True"]),
    ('{"method": "ngram", "num_speculative_tokens": -1}', ["--speculative-config", "num_speculative_tokens", ">= 0"]),
    ('{"method": "ngram", "num_speculative_tokens": 0}', ["--speculative-config", "num_speculative_tokens", ">= 1"]),
    ('{"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}', ["ngram_min <= ngram_max", "3..2"]),
    ('{"method": "ngram", "model": "m"}', ["--draft", "ngram"]),
    ('{"method": "eagle3"}', ["eagle3", "head"]),
    ('{"model": "m", "draft_confidence_threshold": 1.5}', ["draft_confidence_threshold", "[0, 1)"]),
])
def test_a_bad_speculative_config_is_one_line(text, needles):
    with pytest.raises(ConfigError) as exc:
        parse_speculative_config(text)
    message = str(exc.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


# ---- list flags, the default draft, for_method -----------------------------------------------


def test_list_flags_split_on_commas_and_repeats():
    assert split_list(["2,4", " 8 ", "16"]) == ["2", "4", "8", "16"]
    for bad in ([""], [","], ["16,"], ["4,,2"]):
        with pytest.raises(ConfigError, match="empty item"):
            split_list(bad, "-k")
    assert split_list(None) == []
    assert parse_int_list(["1,2", "4"], "--concurrency") == [1, 2, 4]
    assert parse_int_list(None, "--concurrency") is None and parse_int_list([], "-k") is None


def test_a_list_item_that_is_not_an_integer_names_the_flag():
    with pytest.raises(ConfigError, match=r"--concurrency: 'x' is not an integer \(use e.g. --concurrency 1,2,4\)"):
        parse_int_list(["1,x"], "--concurrency")


def test_only_the_default_target_gets_a_default_draft():
    assert default_draft(DEFAULT_TARGET, "draft_model", None) == DEFAULT_DRAFT
    assert default_draft(DEFAULT_TARGET, "draft_model", "mine") == "mine"
    assert default_draft("other/target", "draft_model", None) is None
    assert default_draft(DEFAULT_TARGET, "ngram", None) is None


def test_for_method_keeps_a_draft_only_where_the_method_drafts_with_one():
    assert SpeculativeConfig.for_method("draft_model", 3, "d").draft == "d"
    assert SpeculativeConfig.for_method("eagle3", 2, "head").draft == "head"
    baseline = SpeculativeConfig.for_method("none", 4, "d")
    assert baseline == SpeculativeConfig() and not baseline.speculative
    with pytest.raises(ConfigError, match="--draft cannot be used with method 'ngram'"):
        SpeculativeConfig.for_method("ngram", 2, "d")
    assert SpeculativeConfig.for_method("ngram", 2, None, dynamic_k=True).short == "ngram-k2dyn"


def test_a_confidence_threshold_is_refused_where_the_drafter_has_no_probability_to_cut_on():
    """n-gram, suffix and Medusa drafts have no draft probability the threshold could read: a
    run that set one would record a configuration its steps never applied."""
    for method, draft in [("ngram", None), ("suffix", None), ("medusa", "heads")]:
        with pytest.raises(ConfigError, match=f"draft_confidence_threshold applies to draft_model and eagle3 drafts .*"
                                              f"method {method} ignores it"):
            SpeculativeConfig(method=method, num_speculative_tokens=2, draft=draft, draft_confidence_threshold=0.3)
        assert SpeculativeConfig(method=method, num_speculative_tokens=2, draft=draft).draft_confidence_threshold == 0
    for method in ("draft_model", "eagle3"):
        assert SpeculativeConfig(method=method, num_speculative_tokens=2, draft="d",
                                 draft_confidence_threshold=0.3).draft_confidence_threshold == 0.3


# ---- RunConfig --------------------------------------------------------------------------------

# run.json's config as `specbench run` writes it (an embedded draft_model run, after the run)
RUN_JSON = {
    "time_budget_s": None, "target": "t", "draft": "d", "method": "draft_model",
    "num_speculative_tokens": [2, 4], "ngram": [1, 4], "workload": "regression", "workload_kind": "regression",
    "num_prompts": 2, "sampling": {"max_new_tokens": 12}, "seed": 0, "ignore_eos": False,
    "concurrency": [1, 4], "request_rate": None, "disable_by_batch_size": None, "dynamic_k": False,
    "warmup": 0, "repeats": 1, "interleave": True, "device": "cpu", "dtype": "float32", "onednn": "auto",
    "capture": "auto",
    "backend": "embedded", "baseline": True, "chat_template": True, "truncate": False,
    "configurations": ["baseline-c1", "draft_model-k2-c1"],
    "engine": {"forward_path": "prepacked oneDNN linears", "fast_path_setup_s": 0.1},
    "dtype_resolved": "float32",
    "configuration_stats": {"baseline-c1": {"wall_s": 1.5, "batch_sizes": {"1": 10}}},
}


def test_run_json_reads_back_typed_and_writes_the_same_keys():
    cfg = RunConfig.from_dict(RUN_JSON)
    assert cfg.num_speculative_tokens == (2, 4) and cfg.concurrency == (1, 4) and cfg.ngram == (1, 4)
    assert cfg.configurations == ("baseline-c1", "draft_model-k2-c1")
    assert cfg.engine["forward_path"] == "prepacked oneDNN linears" and cfg.dtype_used == "float32"
    assert cfg.configuration_stats["baseline-c1"]["wall_s"] == 1.5
    assert not cfg.extra
    assert cfg.to_dict() == RUN_JSON
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_keys_set_only_once_known_stay_out_until_set():
    written = RunConfig(target="t", method="none", backend="hf").to_dict()
    for key in ("engine", "openai", "eagle3_head", "dtype_resolved", "server", "sweep", "configuration_stats",
                "interrupted_by"):
        assert key not in written, key
    # the keys every run writes are there, also when empty, so readers can index them
    assert written["draft"] is None and written["request_rate"] is None and written["num_speculative_tokens"] == []


def test_a_sweep_trials_config_reads_and_its_own_keys_survive():
    trial = {"target": "t", "method": "ngram", "num_speculative_tokens": [3], "ngram": [1, 4],
             "backend": "embedded", "warmup": 1, "configurations": ["ngram-k3-c2"], "dtype": "auto",
             "sweep": {"study": "s", "trial": 4}, "dtype_resolved": "bfloat16", "future_key": {"x": 1}}
    cfg = RunConfig.from_dict(trial)
    assert cfg.sweep == {"study": "s", "trial": 4} and cfg.dtype_used == "bfloat16"
    assert cfg.repeats is None and cfg.time_budget_s is None and cfg.onednn is None  # a sweep writes none
    assert cfg.extra == {"future_key": {"x": 1}}
    assert cfg.to_dict()["future_key"] == {"x": 1}


def test_an_old_or_empty_config_reads_as_unknowns_not_guesses():
    for old in (None, {}, {"target": "t"}):
        cfg = RunConfig.from_dict(old)
        assert cfg.method is None and cfg.backend is None and cfg.warmup is None
        assert cfg.configuration_stats == {} and cfg.concurrency == ()
    assert RunConfig.from_dict({"dtype": "float16"}).dtype_used == "float16"


def test_capture_resolves_per_device_and_per_run():
    from specbench.config import EngineConfig

    auto = EngineConfig()
    assert auto.static_mode("cpu", "")[0] is None and "CPU" in auto.static_mode("cpu", "")[1]
    assert auto.static_mode("cuda", "") == ("cudagraph", "")
    # a run with a configuration the static step does not run keeps every configuration eager
    mode, why = auto.static_mode("cuda", "method ngram (the static step runs the baseline and draft_model chains)")
    assert mode is None and "method ngram" in why
    assert EngineConfig(capture="off").static_mode("cuda", "") == (None, "--capture off")
    assert EngineConfig(capture="compile").static_mode("cpu", "") == ("compile", "")
    assert EngineConfig(capture="compile").pack is False and EngineConfig().pack is None
    with pytest.raises(ConfigError, match=r"--capture static: method ngram .*--capture off or auto"):
        EngineConfig(capture="static").static_mode("cpu", "method ngram (...)")
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        EngineConfig(capture="cudagraph").static_mode("cpu", "")
