"""`specbench run --method medusa --draft HEADS` and `--method suffix` (also as vLLM's
`--speculative-config` JSON) end to end on a tiny float32 target: records name the method,
match the baseline token for token and run.json states the heads or the suffix knobs; a
missing or bad heads directory, a bad suffix knob, a --draft for suffix, or a backend that
cannot run them is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_harness import specbench
from specbench.models.medusa_train import init_heads
from specbench.models.medusa import save_heads
from specbench.records import read_run
from test_run import FAST, PROMPTS, assert_refused, check_row_invariants, write_jsonl


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", PROMPTS)


@pytest.fixture(scope="module")
def heads_dir(tiny_pair, tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype="float32").eval()
    return save_heads(init_heads(target, 3, seed=3), tmp_path_factory.mktemp("heads") / "medusa")


def test_method_medusa_with_a_heads_directory(tiny_pair, heads_dir, prompts_file, tmp_path):
    out = tmp_path / "run"
    res = specbench("run", "--target", tiny_pair[0], "--method", "medusa", "--draft", heads_dir, "-k", "3",
                    "--workload", prompts_file, *FAST, "--out", out)
    assert res.code == 0, res.output
    assert "loading Medusa heads" in res.err
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "medusa-k3-c1"}
    spec = df[~df["is_baseline"]]
    assert set(spec["method"]) == {"medusa"} and set(spec["draft_model"]) == {str(heads_dir)}
    assert (spec["token_match_rate"] == 1.0).all() and spec["drafted_tokens"].sum() > 0
    assert meta["config"]["medusa_heads"]["num_heads"] == 3
    check_row_invariants(df)


def test_method_medusa_on_the_static_step(tiny_pair, heads_dir, prompts_file, tmp_path):
    """`--capture static` runs the heads on the static step, and run.json says so; greedy
    outputs stay the baseline's."""
    out = tmp_path / "run"
    res = specbench("run", "--target", tiny_pair[0], "--method", "medusa", "--draft", heads_dir, "-k", "3",
                    "--capture", "static", "--workload", prompts_file, *FAST, "--out", out)
    assert res.code == 0, res.output
    df, meta = read_run(out)
    assert meta["config"]["engine"]["capture"] == "static"
    spec = df[~df["is_baseline"]]
    assert set(spec["method"]) == {"medusa"} and spec["drafted_tokens"].sum() > 0
    assert (spec["token_match_rate"] == 1.0).all()


def test_medusa_deeper_than_its_heads_is_refused(tiny_pair, heads_dir, prompts_file, tmp_path):
    """Issue 44, item 2: three heads draft at most three deep; -k 4 was recorded as
    medusa-k4 while every step drafted three."""
    res = specbench("run", "--target", tiny_pair[0], "--method", "medusa", "--draft", heads_dir, "-k", "2,4",
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "run")
    assert_refused(res, "--num-speculative-tokens 4", "at most 3 token(s) deep", "-k 1..3", lines_before_ok=True)
    assert not (tmp_path / "run" / "samples.parquet").exists()


def test_method_suffix_through_vllms_json(tiny_pair, prompts_file, tmp_path):
    out = tmp_path / "json"
    cfg = json.dumps({"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 16,
                      "suffix_decoding_min_token_prob": 0.0})
    res = specbench("run", "--target", tiny_pair[0], "--speculative-config", cfg, "--workload", prompts_file,
                    *FAST, "--out", out)
    assert res.code == 0, res.output
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "suffix-k3-c1"}
    assert (df[~df["is_baseline"]]["token_match_rate"] == 1.0).all()
    assert meta["config"]["suffix_decoding"]["suffix_decoding_max_tree_depth"] == 16
    assert meta["config"]["suffix_decoding"]["suffix_decoding_min_token_prob"] == 0.0
    check_row_invariants(df)


def test_medusa_without_heads_is_refused(tiny_pair, prompts_file, tmp_path):
    res = specbench("run", "--target", tiny_pair[0], "--method", "medusa", "--workload", prompts_file, *FAST,
                    "--out", tmp_path / "x")
    assert_refused(res, "method 'medusa' needs the Medusa heads' directory", "--draft")
    assert not (tmp_path / "x").exists()


def test_a_bad_heads_directory_is_one_line(tiny_pair, prompts_file, tmp_path):
    res = specbench("run", "--target", tiny_pair[0], "--method", "medusa", "--draft", tiny_pair[1],
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "x")
    assert_refused(res, "Medusa heads", "not Medusa heads", "--method draft_model", lines_before_ok=True)
    res = specbench("run", "--target", tiny_pair[0], "--method", "medusa", "--draft", tmp_path / "nowhere",
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "y")
    assert_refused(res, "Medusa heads", "does not exist", lines_before_ok=True)


@pytest.mark.parametrize("cfg,needle", [
    ({"method": "suffix", "suffix_decoding_max_tree_depth": 0}, "suffix_decoding_max_tree_depth must be"),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "suffix_decoding_min_token_prob must be"),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": -1}, "suffix_decoding_max_spec_factor must be"),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": -5}, "suffix_decoding_max_cached_requests"),
    ({"method": "suffix", "model": "x"}, "--draft cannot be used with method 'suffix'"),
])
def test_bad_suffix_settings_are_refused(tiny_pair, prompts_file, tmp_path, cfg, needle):
    res = specbench("run", "--target", tiny_pair[0], "--speculative-config", json.dumps(cfg),
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "x")
    assert_refused(res, needle)
    assert not (tmp_path / "x").exists()


def test_suffix_with_a_draft_flag_is_refused(tiny_pair, prompts_file, tmp_path):
    res = specbench("run", "--target", tiny_pair[0], "--method", "suffix", "--draft", tiny_pair[1],
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "x")
    assert_refused(res, "--draft cannot be used with method 'suffix'")


@pytest.mark.parametrize("method", ["medusa", "suffix"])
def test_the_hf_backend_refuses_them(tiny_pair, heads_dir, prompts_file, tmp_path, method):
    draft = ["--draft", heads_dir] if method == "medusa" else []
    res = specbench("run", "--target", tiny_pair[0], "--method", method, *draft, "--backend", "hf",
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "x")
    assert_refused(res, "--backend hf", method)
