"""`specbench compare` end to end: exit codes 0 / 1 / 2, the table, every output format on
stdout and in files, one-line refusals of bad input, and a real round trip on tiny float32
models where an identical rerun passes and a worse drafter is caught.

Commands go through `specbench.cli.main()` in-process, as in tests/cli/test_run.py. Synthetic
runs (tests/test_compare.py's builder) are written as real run directories.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tiny
from specbench.cli import app
from specbench.records import METADATA_KEY, RUN_FILE, SAMPLES_FILE, SCHEMA, read_run
from test_compare import synthetic_run


@pytest.fixture(scope="module", autouse=True)
def compare_command():
    # Until the root app lists it, register the sub-app the way specbench.cli would.
    if "compare" not in {c.name for c in app.registered_commands}:
        from specbench.cli import compare

        compare.register(app)


from cli_harness import Outcome, specbench  # noqa: E402,F401


def write_run(directory: Path, run) -> Path:
    """A run directory as RunWriter leaves it: samples.parquet (metadata inside) + run.json."""
    df, meta = run
    directory.mkdir(parents=True)
    table = pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False)
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    pq.write_table(table, directory / SAMPLES_FILE)
    (directory / RUN_FILE).write_text(json.dumps(meta, indent=2))
    return directory


def assert_refused(res: Outcome, *needles: str) -> str:
    assert res.code == 2, (res.out, res.err)
    assert "Traceback" not in res.out + res.err
    assert res.err.strip().splitlines() == res.error_lines and len(res.error_lines) == 1, res.err
    for needle in needles:
        assert needle in res.error_lines[0], (needle, res.error_lines[0])
    return res.error_lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cmp")
    return {
        "base": write_run(d / "base", synthetic_run(run_id="base")),
        "rerun": write_run(d / "rerun", synthetic_run(run_id="rerun", noise_seed=9)),
        "slower": write_run(d / "slower", synthetic_run(run_id="slower", noise_seed=7,
                                                        tpot_factor=1.2)),
        "other": write_run(d / "other", synthetic_run(run_id="other", workload="business")),
        "k5": write_run(d / "k5", synthetic_run(run_id="k5", noise_seed=3,
                                                configs=("baseline-c1", "draft_model-k5-c1"))),
    }


# ---- exit codes and the table ---------------------------------------------------------------


def test_identical_rerun_exits_0_with_a_table(runs):
    res = specbench("compare", runs["base"], runs["rerun"])
    assert res.code == 0, res.out + res.err
    for needle in ("baseline-c1", "draft_model-k4-c1", "tpot_p50", "acceptance_rate",
                   "greedy_match", "95% CI", "no regression"):
        assert needle in res.out, needle
    assert res.err == ""


def test_planted_tpot_regression_exits_1(runs):
    res = specbench("compare", runs["base"], runs["slower"], "--metric", "tpot_p50")
    assert res.code == 1, res.out + res.err
    assert "regression: 1 of 2 checks failed (tpot_p50 on draft_model-k4-c1)" in res.out


def test_parquet_file_paths_work_like_run_directories(runs):
    res = specbench("compare", runs["base"] / SAMPLES_FILE, runs["slower"] / SAMPLES_FILE,
                    "-m", "tpot_p50", "--max-regression", "30%")
    assert res.code == 0, res.out  # 20% slower is inside a 30% budget


def test_gate_deterministic_reports_the_timing_regression_and_exits_0(runs):
    res = specbench("compare", runs["base"], runs["slower"], "--gate", "deterministic")
    assert res.code == 0, res.out
    assert "regression (not gated)" in res.out


def test_not_comparable_exits_2_naming_the_difference(runs):
    res = specbench("compare", runs["base"], runs["other"])
    assert_refused(res, "not comparable", "workload differs", "'synthetic'", "'business'")
    assert res.out == ""


def test_config_diff_needs_the_flag(runs):
    assert_refused(specbench("compare", runs["base"], runs["k5"]),
                   "configurations differ", "draft_model-k5-c1", "--allow-config-diff")
    res = specbench("compare", runs["base"], runs["k5"], "--allow-config-diff")
    assert res.code == 0, res.out + res.err
    assert "draft_model-k4-c1 -> draft_model-k5-c1" in res.out


# ---- formats --------------------------------------------------------------------------------


def test_json_on_stdout(runs):
    res = specbench("compare", runs["base"], runs["slower"], "--format", "json")
    assert res.code == 1
    doc = json.loads(res.out)
    assert doc["outcome"] == "regression" and doc["baseline"]["run_id"] == "base"
    assert any(r["failed"] and r["metric"] == "tpot_p50" for r in doc["results"])


def test_junit_on_stdout(runs):
    res = specbench("compare", runs["base"], runs["rerun"], "-f", "junit")
    assert res.code == 0
    root = ET.fromstring(res.out)
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 7 + 9  # baseline config: 7 metrics; speculative config: 9
    assert root.find("testsuite").get("failures") == "0"


def test_markdown_on_stdout(runs):
    res = specbench("compare", runs["base"], runs["slower"], "-f", "markdown", "-m", "tpot_p50")
    assert res.code == 1
    assert "| config | metric | baseline | current |" in res.out
    assert "| draft_model-k4-c1 | tpot_p50 |" in res.out and "**regression**" in res.out


def test_output_files_take_their_format_from_the_suffix(runs, tmp_path):
    xml, md, js = tmp_path / "r" / "gate.xml", tmp_path / "gate.md", tmp_path / "gate.json"
    res = specbench("compare", runs["base"], runs["slower"], "-o", xml, "-o", md, "-o", js)
    assert res.code == 1 and "tpot_p50" in res.out  # the table still goes to stdout
    assert ET.parse(xml).getroot().find("testsuite").get("failures") != "0"
    assert md.read_text().startswith("### specbench compare:")
    assert json.loads(js.read_text())["exit_code"] == 1


def test_not_comparable_still_writes_machine_readable_reports(runs, tmp_path):
    xml = tmp_path / "gate.xml"
    res = specbench("compare", runs["base"], runs["other"], "-f", "json", "-o", xml)
    assert res.code == 2 and len(res.error_lines) == 1
    assert json.loads(res.out)["comparable"] is False
    assert ET.parse(xml).getroot().find("./testsuite/testcase/error") is not None


# ---- bad input: one line, exit 2 -------------------------------------------------------------


@pytest.mark.parametrize("args, needles", [
    (["--max-regression", "five"], ["--max-regression", "'five'", "5%"]),
    (["--max-regression", "5"], ["ambiguous", "5%"]),
    (["--metric", "latency"], ["unknown metric 'latency'", "tpot_p50", "greedy_match"]),
    (["--format", "html"], ["--format", "table", "junit", "markdown"]),
    (["--gate", "some"], ["--gate", "deterministic"]),
    (["--min-effect", "x"], ["--min-effect"]),
    (["-o", "report.txt"], ["--output", "'.txt'", ".xml"]),
    (["--n-boot", "5"], ["--n-boot"]),
])
def test_bad_flags_are_refused_in_one_line(runs, args, needles):
    assert_refused(specbench("compare", runs["base"], runs["rerun"], *args), *needles)


def test_an_output_inside_a_compared_run_is_refused_and_the_run_kept(runs):
    run_json = runs["rerun"] / RUN_FILE
    before = run_json.read_bytes()
    for target in (run_json, runs["base"] / "gate.json", runs["rerun"] / "sub" / "gate.md"):
        assert_refused(specbench("compare", runs["base"], runs["rerun"], "-o", target),
                       "--output", "inside the run directory")
    assert run_json.read_bytes() == before
    assert not (runs["base"] / "gate.json").exists()


def test_a_path_that_is_not_a_run_is_refused(runs, tmp_path):
    assert_refused(specbench("compare", tmp_path / "nope", runs["rerun"]), "no run at",
                   str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    assert_refused(specbench("compare", runs["base"], tmp_path / "empty"), "not a specbench run")


# ---- real round trip on tiny models ----------------------------------------------------------

FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "-k", "2"]
PROMPTS = [
    {"id": "greet", "prompt": "Say hello to the team.", "max_new_tokens": 16},
    {"id": "repeat", "prompt": "abc abc abc abc abc abc abc", "max_new_tokens": 16},
    {"id": "code", "prompt": "def add(a, b):\n    return", "max_new_tokens": 16},
    {"id": "poem", "prompt": "A poem:", "temperature": 0.8, "seed": 5, "max_new_tokens": 16},
]


@pytest.fixture(scope="module")
def tiny_runs(tiny_pair, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tinyruns")
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    target, draft = map(str, tiny_pair)
    # a worse drafter for the same target: the target's weights with 6x the noise
    bad = d / "draft-bad"
    model = tiny.perturbed_copy(tiny.make_model(vocab_size=len(tiny.make_tokenizer()), seed=0,
                                                eos_token_id=tiny.make_tokenizer().eos_token_id),
                                0.3, seed=1)
    model.save_pretrained(bad)
    tiny.make_tokenizer().save_pretrained(bad)
    out = {}
    for name, drafter in (("base", draft), ("rerun", draft), ("bad", str(bad))):
        out[name] = d / name
        res = specbench("run", "--target", target, "--draft", drafter, "--workload", prompts,
                        *FAST, "--out", out[name])
        assert res.code == 0, res.out + res.err
    return out


def test_real_identical_rerun_passes_the_deterministic_gate(tiny_runs):
    res = specbench("compare", tiny_runs["base"], tiny_runs["rerun"], "--gate", "deterministic")
    assert res.code == 0, res.out + res.err
    assert "no regression" in res.out and "acceptance_rate" in res.out


def test_real_worse_drafter_is_caught(tiny_runs, tmp_path):
    base, _ = read_run(tiny_runs["base"])
    bad, _ = read_run(tiny_runs["bad"])
    spec = lambda df: df[~df["is_baseline"]]  # noqa: E731
    assert spec(bad)["accepted_tokens"].sum() < spec(base)["accepted_tokens"].sum()
    xml = tmp_path / "gate.xml"
    res = specbench("compare", tiny_runs["base"], tiny_runs["bad"], "--gate", "deterministic",
                    "-o", xml)
    assert res.code == 1, res.out + res.err
    failed = {(c.get("classname"), c.get("name"))
              for c in ET.parse(xml).getroot().iter("testcase") if c.find("failure") is not None}
    assert ("specbench.compare.draft_model-k2-c1", "acceptance_rate") in failed
    assert ("specbench.compare.draft_model-k2-c1", "greedy_match") not in failed  # lossless
    assert "differs (allowed): draft:" in res.out


# ---- the project's perf gate -----------------------------------------------------------------

GATE = Path(__file__).resolve().parents[2] / "benchmarks" / "perf_gate"


def test_perf_gate_models_are_bit_identical_across_invocations(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("perf_gate_make_models", GATE / "make_models.py")
    make_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_models)
    for name in ("a", "b"):
        assert make_models.main([str(tmp_path / name)]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert {str(f) for f in files} >= set(make_models.WEIGHT_FILES)
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    # --verify refuses models that are not the recorded ones (here: a different draft)
    hashes = tmp_path / "hashes"
    assert make_models.main([str(tmp_path / "c"), "--write-hashes", str(hashes)]) == 0
    assert make_models.main([str(tmp_path / "d"), "--verify", str(hashes)]) == 0
    noisier = [str(tmp_path / "e"), "--draft-noise", "0.2", "--verify", str(hashes)]
    assert make_models.main(noisier) == 2


def test_perf_gate_baseline_is_a_small_complete_run():
    df, meta = read_run(GATE / "baseline")
    assert meta["status"] == "complete" and meta["config"]["dtype_resolved"] == "float32"
    assert set(df["config_id"]) == {"baseline-c1", "draft_model-k2-c1", "draft_model-k4-c1"}
    assert (GATE / "baseline" / SAMPLES_FILE).stat().st_size < 200_000
    # gated figures must be deterministic: greedy or fixed per-prompt seeds only
    assert df["seed"].notna().all()
    assert (df.loc[~df["is_baseline"] & (df["temperature"] == 0), "token_match_rate"] == 1).all()
