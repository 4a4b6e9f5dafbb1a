"""`specbench run --method eagle3 --draft HEAD` and vLLM's `--speculative-config '{"method":
"eagle3", "model": HEAD, ...}'` end to end on a tiny float32 target with a tiny random head:
records say eagle3, name the head and match the baseline token for token; a missing or bad
head, or a backend that cannot run one, is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiny
from cli_harness import specbench
from specbench.models.eagle3 import save_head
from specbench.records import read_run
from test_run import FAST, PROMPTS, assert_refused, check_row_invariants, write_jsonl


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", PROMPTS)


@pytest.fixture(scope="module")
def head_dir(tiny_pair, tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype="float32").eval()
    head = tiny.make_head(target, draft_vocab_size=100, seed=3)
    return save_head(head, tmp_path_factory.mktemp("head") / "eagle3-head", fmt="speculators")


def test_method_eagle3_with_a_head_directory(tiny_pair, head_dir, prompts_file, tmp_path):
    out = tmp_path / "run"
    res = specbench("run", "--target", tiny_pair[0], "--method", "eagle3", "--draft", head_dir, "-k", "3",
                    "--workload", prompts_file, *FAST, "--out", out)
    assert res.code == 0, res.output
    assert "loading EAGLE-3 head" in res.err and "loading draft" not in res.err
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "eagle3-k3-c1"} and len(df) == 6
    spec = df[~df["is_baseline"]]
    assert set(spec["method"]) == {"eagle3"} and set(spec["draft_model"]) == {str(head_dir)}
    assert (spec["token_match_rate"] == 1.0).all() and spec["drafted_tokens"].sum() > 0
    assert meta["config"]["method"] == "eagle3" and meta["config"]["draft"] == str(head_dir)
    assert meta["config"]["eagle3_head"]["format"] == "speculators"
    assert meta["config"]["eagle3_head"]["draft_vocab_size"] == 100
    assert "eagle3-k3-c1" in res.out
    check_row_invariants(df)


def test_method_eagle3_on_the_static_step(tiny_pair, head_dir, prompts_file, tmp_path):
    """`--capture static` runs the head on the static step (its own static KV slots), and
    run.json says so; greedy outputs stay the baseline's."""
    out = tmp_path / "run"
    res = specbench("run", "--target", tiny_pair[0], "--method", "eagle3", "--draft", head_dir, "-k", "3",
                    "--capture", "static", "--workload", prompts_file, *FAST, "--out", out)
    assert res.code == 0, res.output
    df, meta = read_run(out)
    assert meta["config"]["engine"]["capture"] == "static"
    assert "capture_off_reason" not in meta["config"]["engine"]
    spec = df[~df["is_baseline"]]
    assert set(spec["method"]) == {"eagle3"} and spec["drafted_tokens"].sum() > 0
    assert (spec["token_match_rate"] == 1.0).all()
    check_row_invariants(df)


def test_vllm_speculative_config_selects_eagle3(tiny_pair, head_dir, prompts_file, tmp_path):
    out = tmp_path / "json"
    cfg = json.dumps({"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": 2})
    res = specbench("run", "--target", tiny_pair[0], "--speculative-config", cfg, "--workload", prompts_file,
                    "--num-prompts", "2", *FAST, "--out", out)
    assert res.code == 0, res.output
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "eagle3-k2-c1"}
    assert meta["config"]["num_speculative_tokens"] == [2]
    check_row_invariants(df)


def test_eagle3_without_a_head_is_refused(tiny_pair, prompts_file, tmp_path):
    res = specbench("run", "--target", tiny_pair[0], "--method", "eagle3", "--workload", prompts_file, *FAST,
                    "--out", tmp_path / "x")
    assert_refused(res, "method 'eagle3' needs an EAGLE-3 head directory", "--draft")
    assert not (tmp_path / "x").exists()


def test_a_bad_head_is_one_line(tiny_pair, prompts_file, tmp_path):
    res = specbench("run", "--target", tiny_pair[0], "--method", "eagle3", "--draft", tiny_pair[1],
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "x")
    assert_refused(res, "not an EAGLE-3 head", "--method draft_model", lines_before_ok=True)


def test_the_hf_backend_refuses_eagle3(tiny_pair, head_dir, prompts_file, tmp_path):
    res = specbench("run", "--target", tiny_pair[0], "--method", "eagle3", "--draft", head_dir, "--backend", "hf",
                    "--workload", prompts_file, *FAST, "--out", tmp_path / "x")
    assert_refused(res, "--backend hf", "eagle3")


def test_a_catalog_head_runs_by_name_and_the_run_records_which_release(tiny_pair, head_dir, prompts_file, tmp_path,
                                                                       monkeypatch):
    """`--draft NAME` of a catalog head: pulled (unpacked) on first use, drafted with exactly as
    its directory, and run.json records the entry's sha256 beside the head's shape."""
    from head_fakes import ship
    from specbench.models import fetch

    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    sha = ship(tmp_path, monkeypatch, "tiny-head", head_dir=head_dir, part_bytes=50_000).sha256
    runs = {}
    for name, draft in (("by-name", "tiny-head"), ("by-dir", head_dir)):
        res = specbench("run", "--target", tiny_pair[0], "--method", "eagle3", "--draft", draft, "-k", "3",
                        "--workload", prompts_file, *FAST, "--out", tmp_path / name)
        assert res.code == 0, res.output
        runs[name] = read_run(tmp_path / name)
    (named, meta), (direct, meta_dir) = runs["by-name"], runs["by-dir"]
    assert meta["config"]["draft"] == "tiny-head" and meta["config"]["eagle3_head"]["catalog_sha256"] == sha
    assert "catalog_sha256" not in meta_dir["config"]["eagle3_head"]
    key = ["config_id", "prompt_id"]
    a, b = (d.sort_values(key).reset_index(drop=True) for d in (named, direct))
    assert [list(x) for x in a["output_token_ids"]] == [list(x) for x in b["output_token_ids"]]
    assert a["step_accepted"].map(list).tolist() == b["step_accepted"].map(list).tolist()  # the same drafts
