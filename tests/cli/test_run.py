"""`specbench run` end to end on tiny float32 models: exit codes, the console table, the
Parquet records (schema and values) and their run metadata, every bad input refused with one
line on stderr, and an interrupted run keeping what it finished.

Commands go through `specbench.cli.main()` in-process (the real entry point: it turns a
`SpecbenchError` into `error: ...` on stderr and an exit code), with stdout and stderr
captured; one test runs `python -m specbench` in a subprocess to check the same holds there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import tiny
from specbench.records import RUN_FILE, SAMPLES_FILE, SCHEMA, read_run

# Fast settings for every run: float32 (exact greedy comparisons), short outputs, no warm-up.
FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "12"]

PROMPTS = [  # greedy by default: SamplingParams' temperature is 0
    {"id": "greet", "prompt": "Say hello to the team."},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "code", "category": "code", "prompt": "def add(a, b):\n    return"},
]


from cli_harness import Outcome, specbench  # noqa: E402,F401


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", PROMPTS)


@pytest.fixture(scope="module")
def models(tiny_pair):
    return str(tiny_pair[0]), str(tiny_pair[1])


def run_ok(*args) -> Outcome:
    res = specbench("run", *args)
    assert res.code == 0, res.output
    assert "Traceback" not in res.output
    return res


def outputs(df, config_id: str) -> dict[str, list[int]]:
    rows = df[df["config_id"] == config_id]
    return {r.prompt_id: [int(t) for t in r.output_token_ids] for r in rows.itertuples()}


def check_row_invariants(df) -> None:
    for r in df.itertuples():
        assert sum(r.accepted_per_step) == r.accepted_tokens
        assert len(r.accepted_per_step) == len(r.rejection_positions) == r.num_steps
        assert r.output_tokens == len(r.output_token_ids)
        assert r.output_tokens >= 1 and r.finish_reason in ("stop", "length")
        assert pd.isna(r.error)
        assert 0 <= r.accepted_tokens <= r.drafted_tokens
        if r.drafted_tokens:
            assert r.acceptance_rate == pytest.approx(r.accepted_tokens / r.drafted_tokens)
        if r.is_baseline:
            assert r.method == "none" and r.num_speculative_tokens == 0 and pd.isna(r.draft_model)
            assert r.drafted_tokens == 0 and len(r.accepted_per_step) == 0
            assert r.num_steps == 0 and r.mean_acceptance_length == 1.0
            assert pd.isna(r.token_match_rate) and pd.isna(r.first_divergence)
        assert r.peak_memory_bytes > 0 and r.prefill_time_s > 0
        assert r.ttft_s >= r.queue_s >= 0 and r.e2e_s >= r.ttft_s


# ---- a draft_model run with two k on the shipped regression set ---------------------------


@pytest.fixture(scope="module")
def regression_run(models, tmp_path_factory):
    target, draft = models
    out = tmp_path_factory.mktemp("runs") / "reg"
    res = run_ok("--target", target, "--draft", draft, "--method", "draft_model", "-k", "2,4",
                 "--workload", "regression", "--num-prompts", "2", *FAST, "--out", out)
    df, meta = read_run(out)
    return res, out, df, meta


def test_regression_run_writes_samples_and_run_json(regression_run, models):
    res, out, df, meta = regression_run
    assert (out / SAMPLES_FILE).is_file() and (out / RUN_FILE).is_file()
    assert sorted(df["config_id"].unique()) == ["baseline-c1", "draft_model-k2-c1",
                                                 "draft_model-k4-c1"]
    assert len(df) == 3 * 2  # baseline + two k, two prompts each
    prompts = {c: set(g["prompt_id"]) for c, g in df.groupby("config_id")}
    assert len(set(map(frozenset, prompts.values()))) == 1  # every config ran the same prompts
    assert (df["run_id"] == out.name).all() and (df["backend"] == "embedded").all()
    assert (df["workload"] == "regression").all() and (df["workload_kind"] == "regression").all()
    assert (df["concurrency"] == 1).all()
    base = df[df["is_baseline"]]
    assert len(base) == 2 and (base["config_id"] == "baseline-c1").all()
    spec = df[~df["is_baseline"]]
    assert set(spec["method"]) == {"draft_model"}
    assert set(spec["draft_model"]) == {models[1]}
    for r in spec.itertuples():
        assert r.config_id == f"draft_model-k{r.num_speculative_tokens}-c1"
        assert r.drafted_tokens > 0
        assert 0 <= r.token_match_rate <= 1  # regression prompts are compared with the baseline
    check_row_invariants(df)


def test_regression_run_greedy_prompts_match_the_baseline(regression_run):
    _, _, df, _ = regression_run
    greedy = df[(~df["is_baseline"]) & (df["temperature"] == 0)]
    assert len(greedy) >= 2
    assert (greedy["token_match_rate"] == 1.0).all() and (greedy["first_divergence"] == -1).all()
    base = outputs(df, "baseline-c1")
    for cfg in ("draft_model-k2-c1", "draft_model-k4-c1"):
        got = outputs(df[df["temperature"] == 0], cfg)
        assert got == {p: base[p] for p in got}


def test_regression_run_parquet_schema_is_the_records_schema(regression_run):
    _, out, _, _ = regression_run
    schema = pq.read_schema(out / SAMPLES_FILE)
    assert schema.names == SCHEMA.names
    for field in SCHEMA:
        assert schema.field(field.name).type == field.type, field.name
        assert schema.field(field.name).nullable == field.nullable, field.name


def test_regression_run_metadata(regression_run, models):
    _, out, _, meta = regression_run
    assert meta["status"] == "complete" and meta["finished_at"]
    assert meta["run_id"] == out.name
    assert json.loads((out / RUN_FILE).read_text()) == meta
    cfg = meta["config"]
    assert cfg["target"] == models[0] and cfg["draft"] == models[1]
    assert cfg["method"] == "draft_model" and cfg["num_speculative_tokens"] == [2, 4]
    assert cfg["workload"] == "regression" and cfg["num_prompts"] == 2
    assert cfg["configurations"] == ["baseline-c1", "draft_model-k2-c1", "draft_model-k4-c1"]
    assert cfg["dtype"] == "float32" and cfg["dtype_resolved"] == "float32"
    assert cfg["backend"] == "embedded" and cfg["warmup"] == 0
    for name in ("specbench", "torch", "transformers", "python"):
        assert meta["versions"][name], name
    assert meta["device"].startswith("cpu")
    assert "run" in meta["command"]


def test_regression_run_prints_the_summary_table(regression_run):
    res, out, _, _ = regression_run
    for cfg in ("baseline-c1", "draft_model-k2-c1", "draft_model-k4-c1"):
        assert cfg in res.out
    assert "speedup" in res.out and "TTFT" in res.out
    assert f"records: {out / SAMPLES_FILE}" in one_line(res.out)
    assert "(6 samples)" in res.out


def test_float32_regression_run_prints_no_false_mismatch_warning(regression_run):
    res, _, _, _ = regression_run
    assert "differ from the baseline" not in res.out


# ---- user prompt files, identical drafts, other methods and backends ----------------------


@pytest.fixture(scope="module")
def embedded_run(models, prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "emb"
    run_ok("--target", models[0], "--draft", models[1], "-k", "2", "--workload", prompts_file,
           *FAST, "--out", out)
    return read_run(out)


def test_user_jsonl_run_has_every_prompt_under_every_config(embedded_run, prompts_file):
    df, meta = embedded_run
    assert len(df) == 2 * len(PROMPTS)
    assert set(df["config_id"]) == {"baseline-c1", "draft_model-k2-c1"}
    assert set(df["prompt_id"]) == {p["id"] for p in PROMPTS}
    assert set(df["workload_kind"]) == {"custom"} and set(df["workload"]) == {str(prompts_file)}
    assert (df["temperature"] == 0).all() and (df["max_new_tokens"] == 12).all()
    assert df.loc[df["prompt_id"] == "code", "category"].iloc[0] == "code"
    spec = df[~df["is_baseline"]]
    assert (spec["token_match_rate"] == 1.0).all()  # greedy float32: lossless
    assert outputs(df, "draft_model-k2-c1") == outputs(df, "baseline-c1")
    assert meta["status"] == "complete"
    check_row_invariants(df)


def test_identical_draft_accepts_every_token(models, prompts_file, tmp_path):
    out = tmp_path / "same"
    res = run_ok("--target", models[0], "--draft", models[0], "-k", "3",
                 "--workload", prompts_file, *FAST, "--out", out)
    df, _ = read_run(out)
    spec = df[~df["is_baseline"]]
    assert len(spec) == len(PROMPTS)
    assert (spec["drafted_tokens"] > 0).all()
    assert (spec["acceptance_rate"] == 1.0).all()
    assert all((r == -1).all() for r in spec["rejection_positions"])
    assert (spec["token_match_rate"] == 1.0).all() and (spec["first_divergence"] == -1).all()
    assert "differ from the baseline" not in res.out
    check_row_invariants(df)


def test_identical_draft_on_business_prompts_at_temperature_zero(models, tmp_path):
    # Business prompts are longer than the tiny model's 512-token context: --truncate keeps them.
    out = tmp_path / "biz"
    run_ok("--target", models[0], "--draft", models[0], "-k", "4", "--workload", "business",
           "--num-prompts", "2", "--temperature", "0", "--truncate", *FAST, "--out", out)
    df, meta = read_run(out)
    assert len(df) == 4 and set(df["workload"]) == {"business"}
    spec = df[~df["is_baseline"]]
    assert (spec["acceptance_rate"] == 1.0).all() and (spec["token_match_rate"] == 1.0).all()
    assert meta["config"]["sampling"] == {"temperature": 0.0, "max_new_tokens": 12}
    check_row_invariants(df)


def test_ngram_run_loads_no_draft(models, prompts_file, tmp_path, monkeypatch):
    from specbench.models import loading

    loaded = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda spec, cfg: loaded.append(str(spec)) or real(spec, cfg))
    out = tmp_path / "ngram"
    res = run_ok("--target", models[0], "--method", "ngram", "-k", "3",
                 "--workload", prompts_file, *FAST, "--out", out)
    assert loaded == [str(models[0])]  # the target only: n-gram lookup needs no draft model
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "ngram-k3-c1"} and len(df) == 2 * len(PROMPTS)
    spec = df[~df["is_baseline"]]
    assert set(spec["method"]) == {"ngram"} and spec["draft_model"].isna().all()
    assert (spec["num_speculative_tokens"] == 3).all()
    assert (spec["token_match_rate"] == 1.0).all()
    assert meta["config"]["draft"] is None and meta["config"]["method"] == "ngram"
    assert "ngram-k3-c1" in res.out and "speedup" in res.out
    check_row_invariants(df)


def test_speculative_config_json_selects_ngram(models, prompts_file, tmp_path):
    out = tmp_path / "json"
    run_ok("--target", models[0], "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 3}',
           "--workload", prompts_file, "--num-prompts", "2", *FAST, "--out", out)
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "ngram-k3-c1"} and len(df) == 4
    assert meta["config"]["method"] == "ngram" and meta["config"]["num_speculative_tokens"] == [3]
    check_row_invariants(df)


def test_run_json_records_the_knobs_the_speculative_config_set(models, prompts_file, tmp_path):
    out = tmp_path / "knobs"
    run_ok("--target", models[0], "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 2, "dynamic_k": true, "disable_by_batch_size": 3}',
           "--workload", prompts_file, "--num-prompts", "1", *FAST, "--out", out)
    df, meta = read_run(out)
    assert set(df["config_id"]) == {"baseline-c1", "ngram-k2dyn-off3-c1"}
    assert meta["config"]["dynamic_k"] is True and meta["config"]["disable_by_batch_size"] == 3


def test_method_none_writes_baseline_rows_only(models, prompts_file, tmp_path):
    out = tmp_path / "none"
    res = run_ok("--target", models[0], "--method", "none", "--workload", prompts_file,
                 "--num-prompts", "2", *FAST, "--out", out)
    assert "loading draft" not in res.err
    df, _ = read_run(out)
    assert len(df) == 2 and df["is_baseline"].all() and set(df["config_id"]) == {"baseline-c1"}
    assert "baseline-c1" in res.out
    check_row_invariants(df)


def test_no_baseline_writes_speculative_rows_only(models, prompts_file, tmp_path):
    out = tmp_path / "nobase"
    res = run_ok("--target", models[0], "--draft", models[1], "-k", "2", "--no-baseline",
                 "--workload", prompts_file, "--num-prompts", "2", *FAST, "--out", out)
    df, meta = read_run(out)
    assert len(df) == 2 and not df["is_baseline"].any()
    assert set(df["config_id"]) == {"draft_model-k2-c1"}
    assert df["token_match_rate"].isna().all()  # nothing to compare with
    assert meta["config"]["configurations"] == ["draft_model-k2-c1"]
    assert "draft_model-k2-c1" in res.out
    check_row_invariants(df)


def test_no_baseline_with_method_none_is_refused(models, prompts_file, tmp_path):
    res = specbench("run", "--target", models[0], "--method", "none", "--no-baseline",
                    "--workload", prompts_file, "--num-prompts", "1", *FAST,
                    "--out", tmp_path / "x")
    assert res.code == 2 and "--no-baseline" in res.err


def test_hf_backend_greedy_outputs_equal_the_embedded_engine(models, prompts_file, embedded_run,
                                                            tmp_path):
    out = tmp_path / "hf"
    res = run_ok("--target", models[0], "--draft", models[1], "-k", "2", "--backend", "hf",
                 "--workload", prompts_file, *FAST, "--out", out)
    df, meta = read_run(out)
    emb, _ = embedded_run
    assert set(df["backend"]) == {"hf"} and meta["config"]["backend"] == "hf"
    assert set(df["config_id"]) == {"baseline-c1", "draft_model-k2-c1"}
    for cfg in ("baseline-c1", "draft_model-k2-c1"):
        assert outputs(df, cfg) == outputs(emb, cfg), cfg
    assert (df.loc[~df["is_baseline"], "token_match_rate"] == 1.0).all()
    assert "draft_model-k2-c1" in res.out
    check_row_invariants(df)


# ---- bad input: one line on stderr, exit code 2, nothing written ---------------------------


def assert_refused(res: Outcome, *needles: str, lines_before_ok: bool = False) -> str:
    assert res.code == 2, res.output
    assert "Traceback" not in res.output
    assert len(res.error_lines) == 1, res.err
    if not lines_before_ok:
        assert res.err.strip().splitlines() == res.error_lines, res.err
    msg = res.error_lines[0]
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    return {
        "malformed": write_jsonl(d / "malformed.jsonl", [{"prompt": "ok"}, '{"prompt": "oops"']),
        "nofield": write_jsonl(d / "nofield.jsonl", [{"title": "t", "body": "b"}]),
        "empty": write_jsonl(d / "empty.jsonl", []),
        "surrogate": write_jsonl(d / "surrogate.jsonl", ['{"id": "s1", "prompt": "bad \\ud800 text"}']),
    }


BAD_FLAGS = {
    "negative-k": (["-k", "-1"], ["--num-speculative-tokens", "-1"]),
    "top-p-above-1": (["--top-p", "1.5"], ["--top-p", "1.5"]),
    "top-p-zero": (["--top-p", "0"], ["--top-p", "(0, 1]"]),
    "negative-temperature": (["--temperature", "-1"], ["--temperature", ">= 0"]),
    "unknown-method": (["--method", "bogus"], ["'bogus'", "draft_model", "ngram"]),
    "concurrency-zero": (["--concurrency", "0"], ["--concurrency", ">= 1", "0"]),
    "concurrency-not-int": (["--concurrency", "1,x"], ["--concurrency", "'x'"]),
    "negative-request-rate": (["--request-rate", "-2"], ["--request-rate", ">= 0.001"]),
    "disable-by-batch-size-zero": (["--disable-by-batch-size", "0"], ["--disable-by-batch-size", ">= 1"]),
    "hf-with-concurrency": (["--backend", "hf", "--concurrency", "2"], ["--backend hf", "--concurrency 1"]),
    "unknown-backend": (["--backend", "nope"], ["--backend", "'nope'", "embedded", "hf"]),
    "unknown-onednn": (["--onednn", "fast"], ["--onednn", "'fast'", "off", "auto", "on"]),
    "unknown-capture": (["--capture", "graphs"], ["--capture", "'graphs'", "static", "compile", "cudagraph"]),
    "onednn-and-capture": (["--onednn", "on", "--capture", "compile"], ["--onednn on", "--capture compile",
                                                                       "exclude each other"]),
    "cudagraph-on-cpu": (["--device", "cpu", "--capture", "cudagraph"], ["--capture cudagraph", "--device cuda"]),
    "request-rate-nan": (["--request-rate", "nan"], ["--request-rate", "finite", "nan"]),
    "request-rate-inf": (["--request-rate", "inf"], ["--request-rate", "finite", "inf"]),
    "top-p-nan": (["--top-p", "nan"], ["--top-p", "(0, 1]"]),
    "temperature-nan": (["--temperature", "nan"], ["--temperature", "finite"]),
    "time-budget-negative": (["--time-budget", "-5"], ["--time-budget", ">= 0"]),
    "time-budget-nan": (["--time-budget", "nan"], ["--time-budget", "finite"]),
    "repeats-zero": (["--repeats", "0"], ["--repeats", ">= 1"]),
    "k-only-zero": (["-k", "0"], ["-k 0 is the baseline", "--method none"]),
    "topk-zero": (["--topk", "0"], ["--topk", ">= 1", "0"]),
    "num-draft-tokens-one": (["--num-draft-tokens", "1"], ["--num-draft-tokens", ">= 2"]),
    "num-draft-tokens-too-many": (["-k", "2", "--topk", "2", "--num-draft-tokens", "9"],
                                  ["--num-draft-tokens 9", "depth 2", "topk 2"]),
    "topk-with-ngram": (["--method", "ngram", "--topk", "2"], ["'ngram'", "topk", "draft_model, eagle3"]),
    "unknown-tool-call-parser": (["--tool-call-parser", "mistral"], ["--tool-call-parser", "json, hermes", "'mistral'"]),
    "unknown-workload": (["--workload", "nosuch"],
                         ["unknown workload 'nosuch'", "regression", "business", "high-entropy"]),
}


@pytest.mark.parametrize("name", list(BAD_FLAGS))
def test_bad_flag_is_refused_in_one_line(name, models, prompts_file, tmp_path):
    args, needles = BAD_FLAGS[name]
    out = tmp_path / "out"
    res = specbench("run", "--target", models[0], "--draft", models[1], "--workload",
                    prompts_file, *FAST, "--out", out, *args)
    assert_refused(res, *needles)
    assert not out.exists()


def test_draft_with_ngram_is_refused(models, prompts_file, tmp_path):
    out = tmp_path / "out"
    res = specbench("run", "--target", models[0], "--method", "ngram", "--draft", models[1],
                    "--workload", prompts_file, *FAST, "--out", out)
    assert_refused(res, "--draft", "ngram")
    assert not out.exists()


@pytest.mark.parametrize("kind, needles", [
    ("malformed", [":2:", "invalid JSON"]),
    ("nofield", [":1:", "no prompt field", "title, body", "--prompt-field"]),
    ("empty", ["empty prompt set"]),
    ("surrogate", ["surrogate.jsonl", "'s1'", "lone surrogate", "\\ud800"]),
])
def test_bad_prompt_file_is_refused_in_one_line(kind, needles, bad_files, models, tmp_path):
    out = tmp_path / "out"
    res = specbench("run", "--target", models[0], "--draft", models[1],
                    "--workload", bad_files[kind], *FAST, "--out", out)
    msg = assert_refused(res, *needles)
    assert str(bad_files[kind]) in msg
    assert not out.exists()


def test_missing_prompt_field_names_the_flag_and_the_fields_present(bad_files, models, tmp_path):
    res = specbench("run", "--target", models[0], "--method", "ngram", "--workload",
                    bad_files["nofield"], "--prompt-field", "question", *FAST,
                    "--out", tmp_path / "out")
    assert_refused(res, "'question'", "--prompt-field", "title, body")


def test_missing_target_model_is_refused(prompts_file, tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "no-such-model"
    res = specbench("run", "--target", missing, "--method", "ngram", "--workload", prompts_file,
                    *FAST, "--out", out)
    assert_refused(res, str(missing), "no such file or directory", lines_before_ok=True)
    assert not (out / SAMPLES_FILE).exists()


def test_missing_draft_model_is_refused(models, prompts_file, tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "no-such-draft"
    res = specbench("run", "--target", models[0], "--draft", missing, "--workload", prompts_file,
                    *FAST, "--out", out)
    assert_refused(res, str(missing), "no such file or directory", lines_before_ok=True)
    assert not (out / SAMPLES_FILE).exists()


@pytest.fixture(scope="module")
def other_vocab_model(tmp_path_factory) -> Path:
    """A tiny model whose tokenizer has 41 extra tokens (300 in all) and a 300-row head."""
    tok = tiny.make_tokenizer()
    tok.add_tokens([f"<extra_{i}>" for i in range(300 - len(tok))])
    assert len(tok) == 300
    model = tiny.make_model(vocab_size=300, seed=3, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("other") / "other-vocab"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_draft_with_a_different_tokenizer_is_refused(models, other_vocab_model, prompts_file,
                                                     tmp_path):
    out = tmp_path / "out"
    res = specbench("run", "--target", models[0], "--draft", other_vocab_model,
                    "--workload", prompts_file, *FAST, "--out", out)
    assert_refused(res, "do not share a tokenizer", "259", "300", lines_before_ok=True)
    assert not (out / SAMPLES_FILE).exists()


def test_prompts_longer_than_the_context_suggest_only_real_flags(models, tmp_path):
    res = specbench("run", "--target", models[0], "--method", "ngram", "--workload", "business",
                    "--num-prompts", "2", *FAST, "--out", tmp_path / "out")
    msg = assert_refused(res, "--truncate", lines_before_ok=True)
    help_text = specbench("run", "--help").out
    for flag in re.findall(r"--[a-z][a-z-]+", msg):
        assert flag in help_text, flag


def test_bad_flag_via_python_m_specbench_prints_one_line(models, prompts_file, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "specbench", "run", "--target", models[0], "--draft", models[1],
         "--workload", prompts_file, *FAST, "--top-p", "1.5", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --top-p must be in (0, 1], got 1.5"]
    assert proc.stdout == "" and not out.exists()


# ---- existing output directories ------------------------------------------------------------


@pytest.fixture
def existing_run(models, prompts_file, tmp_path) -> Path:
    out = tmp_path / "existing"
    run_ok("--target", models[0], "--method", "none", "--workload", prompts_file,
           "--num-prompts", "1", *FAST, "--out", out)
    return out


def test_existing_output_directory_is_refused_and_left_untouched(existing_run, models,
                                                                prompts_file):
    before = {p.name: p.read_bytes() for p in existing_run.iterdir()}
    res = specbench("run", "--target", models[0], "--method", "ngram", "-k", "2",
                    "--workload", prompts_file, *FAST, "--out", existing_run)
    assert_refused(res, str(existing_run), "--overwrite")
    assert {p.name: p.read_bytes() for p in existing_run.iterdir()} == before


def test_overwrite_replaces_the_records(existing_run, models, prompts_file):
    (existing_run / "notes.txt").write_text("mine")
    old = (existing_run / SAMPLES_FILE).read_bytes()
    run_ok("--target", models[0], "--method", "ngram", "-k", "2", "--workload", prompts_file,
           "--num-prompts", "2", *FAST, "--out", existing_run, "--overwrite")
    assert (existing_run / SAMPLES_FILE).read_bytes() != old
    df, meta = read_run(existing_run)
    assert set(df["config_id"]) == {"baseline-c1", "ngram-k2-c1"} and len(df) == 4
    assert meta["status"] == "complete" and meta["config"]["method"] == "ngram"
    assert (existing_run / "notes.txt").read_text() == "mine"  # not ours: never deleted


def test_failed_overwrite_keeps_the_previous_records(existing_run, models, prompts_file, tmp_path):
    before = (existing_run / SAMPLES_FILE).read_bytes()
    res = specbench("run", "--target", models[0], "--draft", tmp_path / "typo",
                    "--workload", prompts_file, *FAST, "--out", existing_run, "--overwrite")
    assert res.code == 2
    assert (existing_run / SAMPLES_FILE).read_bytes() == before


# ---- Ctrl-C ---------------------------------------------------------------------------------


@pytest.fixture
def interrupted_run(models, prompts_file, tmp_path, monkeypatch):
    """A run whose 5th request (the 2nd of the speculative configuration) gets Ctrl-C."""
    from specbench.backends.embedded import EmbeddedBackend

    real = EmbeddedBackend.run
    calls = []

    def run(self, requests, spec, **kwargs):
        record = kwargs.get("on_results")
        if record is not None:  # not the warm-up
            def on_results(pairs):
                for request, result in pairs:
                    calls.append(request.id)
                    if len(calls) == 5:
                        raise KeyboardInterrupt
                    record([(request, result)])
            kwargs["on_results"] = on_results
        return real(self, requests, spec, **kwargs)

    monkeypatch.setattr(EmbeddedBackend, "run", run)
    out = tmp_path / "intr"
    res = specbench("run", "--target", models[0], "--draft", models[1], "-k", "2",
                    "--workload", prompts_file, *FAST, "--out", out)
    return res, out


def test_interrupted_run_keeps_completed_samples(interrupted_run):
    res, out = interrupted_run
    assert "Traceback" not in res.output
    df, meta = read_run(out)  # a valid Parquet file with its metadata
    assert meta["status"] == "interrupted" and meta["finished_at"]
    assert len(df) == 4
    # Configurations alternate request by request (ABBA): two samples of each so far.
    assert (df["config_id"] == "baseline-c1").sum() == 2
    assert (df["config_id"] == "draft_model-k2-c1").sum() == 2
    assert json.loads((out / RUN_FILE).read_text())["status"] == "interrupted"
    assert "interrupted (SIGINT): 4 completed sample(s) kept" in one_line(res.err)
    assert str(out / SAMPLES_FILE) in "".join(res.err.split())  # rich may wrap the path
    check_row_invariants(df)


def test_interrupted_run_exits_130(interrupted_run):
    res, _ = interrupted_run
    assert res.code == 130


def test_k_zero_in_a_list_is_dropped_with_a_note(models, prompts_file, tmp_path):
    res = run_ok("--target", models[0], "--method", "ngram", "-k", "0,2", "--workload", prompts_file,
                 *FAST, "--out", tmp_path / "k0")
    assert "-k 0 is the baseline" in one_line(res.err)
    df = pd.read_parquet(tmp_path / "k0" / SAMPLES_FILE)
    assert set(df["config_id"]) == {"baseline-c1", "ngram-k2-c1"}


def test_more_prompts_asked_than_the_file_has_says_so(models, prompts_file, tmp_path):
    res = run_ok("--target", models[0], "--method", "ngram", "-k", "2", "--workload", prompts_file,
                 "--num-prompts", "1000", *FAST, "--out", tmp_path / "many")
    assert "--num-prompts 1000, but" in one_line(res.err) and "running all 3" in one_line(res.err)


def test_a_time_budget_stops_admitting_prompts_but_keeps_them_paired(models, prompts_file, tmp_path, monkeypatch):
    from specbench import runner

    clock = [0.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    real_block = runner._run_block

    def slow_block(*args, **kwargs):
        clock[0] += 10.0  # every block takes 10 s of the (fake) clock
        return real_block(*args, **kwargs)

    monkeypatch.setattr(runner, "_run_block", slow_block)
    res = run_ok("--target", models[0], "--method", "ngram", "-k", "2", "--workload", prompts_file,
                 "--time-budget", "45", *FAST, "--out", tmp_path / "budget")
    df = pd.read_parquet(tmp_path / "budget" / SAMPLES_FILE)
    counts = df.groupby("config_id")["prompt_id"].apply(set)
    assert counts["baseline-c1"] == counts["ngram-k2-c1"] and len(counts["baseline-c1"]) == 2
    assert "time budget (45 s) reached: 2 of 3 prompt(s)" in one_line(res.out)
    stats = json.loads((tmp_path / "budget" / RUN_FILE).read_text())["config"]["configuration_stats"]
    assert stats["baseline-c1"]["stopped_by_budget"] == {"measured": 2, "planned": 3, "time_budget_s": 45.0}
