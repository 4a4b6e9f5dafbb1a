"""Every number a user gives specbench is held to one table (`specbench.limits`): each numeric
option of every command is in it (a new flag without a bound fails here), each refuses a huge
value and a NaN in one line naming the flag, and the values that slipped through before (list
items, --speculative-config keys, prompt-file cells, sweep values) are refused or handled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_harness import specbench
from specbench import limits
from specbench.cli import UNBOUNDED_HERE, _long_flag, _number_type, command
from specbench.config import parse_int_list, parse_speculative_config
from specbench.errors import ConfigError, WorkloadError


def numeric_options():
    """(command path, flag, "int" | "float") of every numeric option of every command."""
    out = []

    def walk(cmd, path):
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))
        for p in getattr(cmd, "params", ()):
            kind = _number_type(p)
            if kind and p.opts:
                out.append((path, _long_flag(p), kind))

    walk(command(), ())
    return out


OPTIONS = numeric_options()


def test_every_numeric_option_of_every_command_has_a_bound():
    assert len(OPTIONS) >= 30  # run, serve, compare, report and the sweep's numeric flags
    missing = []
    for path, flag, _ in OPTIONS:
        try:
            limits.limit(flag, path[0])
        except KeyError:
            missing.append(f"specbench {' '.join(path)} {flag}")
    assert not missing, f"add these to specbench.limits.LIMITS: {missing}"


def _args(path: tuple[str, ...], tmp_path: Path) -> list[str]:
    if path == ("compare",):
        return ["compare", str(tmp_path / "a"), str(tmp_path / "b")]
    if path == ("sweep",):
        return ["sweep", "--storage", f"sqlite:///{tmp_path}/s.db", "--out", str(tmp_path / "study")]
    return list(path)


@pytest.mark.parametrize("path, flag, kind", OPTIONS, ids=[f"{' '.join(p)} {f}" for p, f, _ in OPTIONS])
def test_a_huge_or_nan_value_is_one_line_naming_the_flag(path, flag, kind, tmp_path):
    for bad in (["99999999999999999999"] + (["nan", "inf", "-1e400"] if kind == "float" else ["-99999999999999999999"])):
        res = specbench(*_args(path, tmp_path), flag, bad)
        res.refusal(flag, alone=False)
    assert not (tmp_path / "study").exists()


def test_the_table_refuses_wrong_types():
    for name, value in [("--warmup", True), ("--warmup", 2.5), ("--warmup", "3"), ("--top-p", float("nan")),
                        ("dynamic_k", "false"), ("dynamic_k", 1), ("prompt_lookup_max", 3.9),
                        ("disable_by_batch_size", [1])]:
        with pytest.raises(ConfigError):
            limits.check(name, value)
    assert limits.check("prompt_lookup_max", 4.0) == 4 and limits.check("--top-p", 1) == 1.0
    assert limits.check("dynamic_k", False) is False and limits.check("--warmup", None) is None


# ---- list flags --------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[","], [""], ["4,,2"], ["2,"], [" , "]])
def test_an_empty_list_item_is_refused(values):
    with pytest.raises(ConfigError, match="empty item"):
        parse_int_list(values, "--concurrency")


def test_a_value_given_twice_counts_once_for_k_and_concurrency_alike():
    assert parse_int_list(["2,2", "4", "2"], "--concurrency") == [2, 4]
    assert parse_int_list(["2,2"], "--num-speculative-tokens") == [2]


def test_a_request_rate_given_twice_counts_once():
    """`--request-rate 5,5` measured every prompt twice under one config_id (issue 44, 3)."""
    from specbench.cli.run import _parse_rates

    assert _parse_rates(["5,5", "5.0", "2"]) == [5.0, 2.0]


@pytest.mark.parametrize("args, needles", [
    (["-k", ","], ["--num-speculative-tokens", "empty item"]),
    (["-k", ""], ["--num-speculative-tokens", "empty item"]),
    (["--concurrency", ","], ["--concurrency", "empty item"]),
    (["--concurrency", "99999999999999999999"], ["--concurrency", "<= 65536"]),
    (["-k", "99999999999999999999"], ["--num-speculative-tokens", "<= 256"]),
    (["--endpoint", "chat"], ["--endpoint", "--backend openai"]),
    (["--retries", "3"], ["--retries", "--backend openai"]),
    (["--request-timeout", "5"], ["--request-timeout", "--backend openai"]),
    (["--speculative-config", " "], ["--speculative-config is empty"]),
    (["--out", ""], ["--out is empty"]),
    (["--temperature", "1e-320"], ["--temperature", "0 or at least 1e-05"]),
    (["--warmup", "99999999999999999999"], ["--warmup", "<= 1000"]),
    (["--repeats", "99999999999999999999"], ["--repeats", "<= 1000"]),
    (["--tool-call-parser", "mistral"], ["--tool-call-parser must be one of json, hermes, llama3_json, got 'mistral'"]),
])
def test_run_refuses_in_one_line(args, needles, tmp_path):
    specbench("run", *args, "--out" if "--out" not in args else "--seed", *(
        [str(tmp_path / "o")] if "--out" not in args else ["0"])).refusal(*needles)
    assert not (tmp_path / "o").exists()


# ---- --speculative-config (run and serve) -------------------------------------------------------------


BAD_SPECS = [
    ('{"method": "ngram", "num_speculative_tokens": 100000000000}', ["num_speculative_tokens", "<= 256"]),
    ('{"method": "ngram", "prompt_lookup_min": "abc"}', ["prompt_lookup_min", "integer", "'abc'"]),
    ('{"method": "ngram", "prompt_lookup_min": null}', ["prompt_lookup_min", "null"]),
    ('{"method": "ngram", "prompt_lookup_max": [4]}', ["prompt_lookup_max", "integer", "[4]"]),
    ('{"method": "ngram", "prompt_lookup_max": 3.9}', ["prompt_lookup_max", "integer", "3.9"]),
    ('{"model": "m", "draft_confidence_threshold": "x"}', ["draft_confidence_threshold", "'x'"]),
    ('{"model": "m", "disable_by_batch_size": "4"}', ["disable_by_batch_size", "integer", "'4'"]),
    ('{"model": "m", "disable_by_batch_size": [1]}', ["disable_by_batch_size", "integer", "[1]"]),
    ('{"model": "m", "disable_by_batch_size": 2.5}', ["disable_by_batch_size", "integer", "2.5"]),
    ('{"model": "m", "dynamic_k": "false"}', ["dynamic_k", "true or false", "'false'"]),
    ('{"model": 5}', ["model", "non-empty string", "5"]),
    ('{"model": ["a"]}', ["model", "non-empty string", "['a']"]),
    ('{"method": 7}', ["method", "non-empty string"]),
    ("[" * 30000 + "]" * 30000, ["nested too deeply"]),
    ('{"method": "ngram", "num_speculative_tokens": 1%s}' % ("0" * 5000), ["number too long to read"]),
    ('{"model": "m", "speculative_token_tree": []}', ["speculative_token_tree", "non-empty list"]),
    ('{"model": "m", "speculative_token_tree": [[]]}', ["speculative_token_tree", "non-empty paths"]),
    ('{"model": "m", "speculative_token_tree": "%s"}' % ("(" * 5000 + ")" * 5000), ["speculative_token_tree",
                                                                                  "is not a list of paths"]),
    # issue 44, items 5 and 6: ranks past any node's children, and a rank too large for an int64
    ('{"model": "m", "speculative_token_tree": [[0], [299], [400]]}', ["speculative_token_tree", "branch rank 400",
                                                                       "ranks 0..63"]),
    ('{"model": "m", "speculative_token_tree": [[0], [100000000000000000000000]]}',
     ["speculative_token_tree", "branch rank 100000000000000000000000"]),
    ('{"model": "m", "speculative_token_tree": %s}' % json.dumps([[i] for i in range(64)]
                                                                  + [[i, j] for i in range(64) for j in range(64)]),
     ["speculative_token_tree has 4160 nodes", "at most 4096"]),
]


@pytest.mark.parametrize("text, needles", BAD_SPECS, ids=[t[:40] for t, _ in BAD_SPECS])
def test_a_bad_speculative_config_value_is_one_line(text, needles, tmp_path):
    with pytest.raises(ConfigError) as exc:
        parse_speculative_config(text)
    message = str(exc.value)
    assert "\n" not in message and all(n in message for n in needles), message
    specbench("serve", "--speculative-config", text, "--port", "0").refusal(*needles)


def test_good_spec_values_still_parse():
    spec = parse_speculative_config('{"method": "ngram", "prompt_lookup_max": 4.0, "dynamic_k": true}')
    assert spec.ngram_max == 4 and spec.dynamic_k is True
    assert parse_speculative_config('{"model": "m", "dynamic_k": false}').dynamic_k is False


def test_serve_k_0_is_refused_not_served_as_the_baseline():
    specbench("serve", "--method", "ngram", "-k", "0", "--port", "0").refusal(
        "--num-speculative-tokens", ">= 1", "without speculation")


@pytest.mark.parametrize("args, needles", [
    (["--n-boot", "99999999999"], ["--n-boot", "<= 100000"]),
    (["--seed", "-1"], ["--seed", ">= 0"]),
])
def test_compare_and_report_bound_their_numbers(args, needles, tmp_path):
    specbench("compare", tmp_path / "a", tmp_path / "b", *args).refusal(*needles)
    if args[0] == "--n-boot":
        specbench("report", tmp_path / "a", *args).refusal(*needles)


# ---- prompt files ---------------------------------------------------------------------------------------


def _load(path: Path):
    from specbench.workload import load_workload

    return load_workload(str(path))


@pytest.mark.parametrize("row, needles", [
    ('{"prompt": "x", "temperature": NaN}', ["field 'temperature'", "finite", "nan"]),
    ('{"prompt": "x", "seed": %d}' % 2**70, ["field 'seed'", "<= 9223372036854775807"]),
    ('{"prompt": "x", "id": ["a"]}', ["field 'id'", "string or a number", "list"]),
    ('{"prompt": "x", "category": {"a": 1}}', ["field 'category'", "string or a number", "dict"]),
    ('{"prompt": "x", "temperature": 1e-320}', ["field 'temperature'", "0 or at least"]),
    ('{"prompt": %s}' % ("9" * 5000), ["number too long to read"]),
    ("[" * 100000 + "]" * 100000, ["nested too deeply"]),
])
def test_a_bad_prompt_cell_is_refused_with_file_line_and_field(row, needles, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(row + "\n")
    with pytest.raises(WorkloadError) as exc:
        _load(path)
    assert str(exc.value).startswith(f"{path}:1: ") and all(n in str(exc.value) for n in needles), exc.value


@pytest.mark.parametrize("text, needle", [("[" * 100000 + "]" * 100000, "nested too deeply"),
                                          ('[{"prompt": %s}]' % ("9" * 5000), "number too long to read")])
def test_a_json_prompt_file_json_cannot_read_is_one_line(text, needle, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=needle):
        _load(path)


def test_a_csv_with_a_utf8_bom_reads_its_first_field(tmp_path):
    path = tmp_path / "p.csv"
    path.write_bytes("\ufeffprompt,category\nhello there,chat\n".encode("utf-8"))
    w = _load(path)
    assert [(p.text, p.category) for p in w.prompts] == [("hello there", "chat")]


@pytest.mark.fault("workload", "--workload is a FIFO with no writer", sees="one line: not a regular file",
                   kept="nothing started")
def test_a_fifo_workload_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    specbench("run", "--workload", fifo, "--out", tmp_path / "o").refusal(str(fifo), "not a regular file")


# ---- models and the context --------------------------------------------------------------------------


@pytest.fixture
def no_tokenizer(tiny_pair, tmp_path) -> Path:
    import shutil

    d = tmp_path / "notok"
    shutil.copytree(tiny_pair[0], d)
    for f in d.iterdir():
        if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
            f.unlink()
    return d


def test_a_model_without_tokenizer_files_is_named_not_blamed_on_the_prompts(no_tokenizer, tmp_path):
    specbench("models", "info", no_tokenizer).refusal(str(no_tokenizer), "no usable tokenizer", "tokenizer.json")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    msg = specbench("run", "--target", no_tokenizer, "--method", "ngram", "-k", "2", "--workload", prompts,
                    "--max-new-tokens", "4", "--warmup", "0", "--device", "cpu", "--dtype", "float32",
                    "--out", tmp_path / "o").refusal("no usable tokenizer", alone=False)
    assert "longer than" not in msg


def test_skipping_long_prompts_names_the_categories_lost(tiny_tokenizer):
    from specbench.config import SamplingParams
    from specbench.session import tokenize
    from specbench.workload.prompt import Prompt, Workload

    long_text = " ".join(["word"] * 400)
    prompts = [Prompt(id="c1", category="coding", text="short"), Prompt(id="c2", category="coding", text=long_text),
               Prompt(id="r1", category="rag", text=long_text), Prompt(id="r2", category="rag", text=long_text),
               Prompt(id="w1", category="writing", text="short too")]
    said: list[str] = []
    requests, skipped = tokenize(Workload("set", "custom", tuple(prompts)), tiny_tokenizer,
                                 SamplingParams(max_new_tokens=8), max_context=128, chat_template=False,
                                 log=said.append)
    assert skipped == 3 and {r.category for r in requests} == {"coding", "writing"}
    text = " ".join(said)
    assert "coding 1 of 2" in text and "rag 2 of 2" in text
    assert "1 of 3 categories gone from the run: rag" in text


# ---- sweep ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needles", [
    (["-k", "1..100000000"], ["--num-speculative-tokens", "<= 256"]),
    (["-k", "4,,2"], ["--num-speculative-tokens", "empty item"]),
    (["--sampler-seed", "4294967296"], ["--sampler-seed", "<= 4294967295"]),
    (["--warmup", "99999999999999999999"], ["--warmup", "<= 10000"]),
    (["--server-command", "  "], ["--server-command", "is empty"]),
    (["--out", "/proc/specbench-nope"], ["--out", "/proc/specbench-nope", "cannot write there"]),
    (["--profile", "/proc/nope/profile.yaml"], ["--profile", "/proc/nope", "cannot write there"]),
])
def test_sweep_refuses_before_the_first_trial(args, needles, tmp_path):
    base = ["sweep", "--storage", f"sqlite:///{tmp_path}/s.db", "--target", "/nonexistent/target",
            "--draft", "/nonexistent/draft"]
    if "--out" not in args:
        base += ["--out", str(tmp_path / "study")]
    specbench(*base, *args).refusal(*needles)
    assert not (tmp_path / "s.db").exists()


def test_sweep_spec_file_values_use_the_same_bounds(tmp_path):
    from specbench.sweep.spec import build_spec

    for key, value, needle in [("study.seed", 2**40, "<= 4294967295"), ("space.concurrency", [1, 10**9], "<= 65536"),
                               ("workload.num_prompts", 10**12, "<= 10000000"),
                               ("space.num_speculative_tokens", {"low": 1, "high": 10**8}, "<= 256")]:
        with pytest.raises(ConfigError, match=needle):
            build_spec({key: value}, source=tmp_path / "x.toml")


def test_compare_takes_one_prompt_file_spelled_relative_or_absolute():
    import pandas as pd

    from specbench.compare.comparable import setup_differences

    def frame(workload: str):
        return pd.DataFrame({"workload": [workload], "workload_kind": ["custom"], "config_id": ["baseline-c1"],
                             "prompt_id": ["p"], "temperature": [0.0], "top_p": [1.0], "top_k": [0],
                             "max_new_tokens": [8], "seed": [None], "repeat": [0]})

    pairs = [("baseline-c1", "baseline-c1")]
    same = setup_differences(frame("prompts.jsonl"), {}, frame("/home/ci/repo/prompts.jsonl"), {}, pairs)
    assert not [r for r in same if r.startswith("workload")], same
    other = setup_differences(frame("prompts.jsonl"), {}, frame("/home/ci/other.jsonl"), {}, pairs)
    assert [r for r in other if r.startswith("workload differs")], other
