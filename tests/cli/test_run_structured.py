"""`specbench run` on structured-output prompts (tiny float32 models, the byte-level test
tokenizer): records carry each sample's scenario and whether its output is valid, the
console shows them by scenario, greedy speculation equals the baseline under the grammar, and
the static step refuses such prompts in one line."""

from __future__ import annotations

import json

import pytest

from cli_harness import specbench
from specbench.records import read_run

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 5},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
PROMPTS = [
    {"id": "free", "prompt": "Say hello."},
    {"id": "person", "prompt": "Who is Ada?",
     "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}},
    {"id": "clock", "messages": [{"role": "user", "content": "Time in Paris?"}], "tools": [CLOCK],
     "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    {"id": "code", "prompt": "A ticket code:", "structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}},
    {"id": "pick", "prompt": "Yes or no?", "structured_outputs": {"choice": ["yes", "no", "maybe"]}},
]
FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "40"]


@pytest.fixture(scope="module")
def structured_run(tiny_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("structured")
    prompts = d / "structured.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = d / "run"
    res = specbench("run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--method", "draft_model",
                    "-k", "3", "--workload", str(prompts), *FAST, "--out", str(out))
    assert res.code == 0, res.output
    return res, read_run(out)[0], prompts


def test_records_say_each_scenario_and_that_every_output_is_valid(structured_run):
    _, df, _ = structured_run
    assert dict(zip(df["prompt_id"], df["scenario"])) == {"free": "free", "person": "json", "clock": "tools",
                                                          "code": "regex", "pick": "choice"}
    constrained = df[df["scenario"] != "free"]
    assert constrained["output_valid"].eq(True).all() and constrained["validation_error"].isna().all()
    assert df[df["scenario"] == "free"]["output_valid"].isna().all()
    assert (constrained["finish_reason"] == "stop").all()


def test_greedy_speculation_equals_the_baseline_under_the_grammar(structured_run):
    _, df, _ = structured_run
    base = df[df["is_baseline"]].set_index("prompt_id")["output_token_ids"]
    spec = df[~df["is_baseline"]].set_index("prompt_id")["output_token_ids"]
    assert {p: list(v) for p, v in base.items()} == {p: list(v) for p, v in spec.items()}
    assert (df[~df["is_baseline"]]["token_match_rate"] == 1.0).all()


def test_the_console_shows_validity_by_scenario(structured_run):
    res, _, _ = structured_run
    text = " ".join(res.out.replace("│", " ").split())
    assert "By scenario (structured output)" in text
    for scenario in ("json", "tools", "regex", "choice"):
        assert f"{scenario} baseline-c1 1 1/1" in text and f"{scenario} draft_model-k3-c1 1 1/1" in text


def test_the_static_step_refuses_structured_output_in_one_line(tiny_pair, structured_run, tmp_path):
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "none", "--workload", str(structured_run[2]), *FAST,
                    "--capture", "static", "--out", str(tmp_path / "static"))
    assert res.code != 0 and "Traceback" not in res.output
    line = [ln for ln in res.err.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "--capture static: structured output" in line[0] and "eager step" in line[0]
    assert not (tmp_path / "static" / "samples.parquet").exists()


def test_the_report_draws_acceptance_speedup_and_validity_by_scenario(structured_run, tmp_path):
    _, df, prompts = structured_run
    run_dir = prompts.parent / "run"
    res = specbench("report", str(run_dir), "--out", str(tmp_path / "r.html"), "--n-boot", "200")
    assert res.code == 0, res.output
    page = (tmp_path / "r.html").read_text()
    assert 'id="plot-by-scenario"' in page
    for scenario in ("json", "tools", "regex", "choice"):
        assert f"<td>{scenario}</td><td>draft_model-k3-c1</td><td>1</td><td>1/1</td>" in page.replace("\n", "")


def test_ignore_eos_is_said_and_a_complete_grammar_still_ends_the_output(tiny_pair, structured_run, tmp_path):
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "none", "--workload", str(structured_run[2]),
                    *FAST, "--ignore-eos", "--out", str(tmp_path / "forced"))
    assert res.code == 0, res.output
    assert "--ignore-eos forced every output to max_new_tokens" in " ".join(res.out.split())
    df = read_run(tmp_path / "forced")[0].set_index("prompt_id")
    assert df.loc["free", "output_tokens"] == 40 and df.loc["free", "finish_reason"] == "length"
    for pid in ("person", "clock", "code", "pick"):  # the grammar ends them: nothing else is allowed
        assert df.loc[pid, "finish_reason"] == "stop" and df.loc[pid, "output_valid"], pid


def test_capture_auto_takes_the_eager_step_for_structured_output(tiny_pair, structured_run, tmp_path, monkeypatch):
    """Where --capture auto would take the static step (a CUDA device, here pretended), a run
    with structured prompts takes the eager step and run.json says why, instead of refusing."""
    from specbench.session import Session

    monkeypatch.setattr(Session, "device_type", property(lambda self: "cuda"))
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "none", "--workload", str(structured_run[2]),
                    *FAST, "--out", str(tmp_path / "auto"))
    assert res.code == 0, res.output
    engine = json.loads((tmp_path / "auto" / "run.json").read_text())["config"]["engine"]
    assert engine["capture"] == "off" and "structured output" in engine["capture_off_reason"]


def test_a_model_vocabulary_padded_past_the_tokenizer_decodes_under_the_grammar():
    """An lm_head wider than the tokenizer (padded vocabularies): the matcher covers the model's
    ids, padding ids are never allowed, and a tree draft that proposes one is refused, not a crash."""
    import tiny
    from specbench.backends.grammar import Compiler
    from specbench.config import SamplingParams, SpeculativeConfig
    from specbench.engine import Engine, scheduler
    from specbench.structured import OutputConstraint, check_output

    tok = tiny.make_tokenizer()
    for pad in (3, 40):
        target = tiny.make_model(vocab_size=len(tok) + pad, seed=1, eos_token_id=tok.eos_token_id)
        engine = Engine(target, tiny.perturbed_copy(target, 0.05, seed=2), eos_token_ids=[tok.eos_token_id])
        compiler = Compiler(tok, len(tok) + pad)
        c = OutputConstraint("regex", "[a-z ]{3,12}\\.", "regex")
        reqs = [(tok.encode(f"Say {i}", add_special_tokens=False), SamplingParams(max_new_tokens=20, seed=i),
                 compiler.matcher(c, "p")) for i in range(4)]
        spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft="d", topk=4, num_draft_tokens=10)
        results, _ = scheduler.run(engine, reqs, spec, concurrency=2)
        assert all(check_output(c, tok.decode(g.output_ids, skip_special_tokens=True)) is None for g in results)


def test_a_grammar_llguidance_refuses_stops_the_run_before_it_measures(tiny_pair, tmp_path):
    """Python's re compiles a lookahead, llguidance does not: every constraint is compiled before
    the first block, so the run stops in one line naming the prompt and writes no sample."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "ok", "prompt": "hi"}) + "\n" +
                       json.dumps({"id": "look", "prompt": "hi", "structured_outputs": {"regex": "(?=a)a+"}}) + "\n")
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "none", "--workload", str(prompts), *FAST,
                    "--out", str(tmp_path / "run"))
    assert res.code != 0 and "Traceback" not in res.output
    (line,) = [ln for ln in res.err.splitlines() if ln.startswith("error:")]
    assert "prompt 'look': its regex does not compile" in line
    assert not (tmp_path / "run" / "samples.parquet").exists()


def tool_run(tiny_pair, tmp_path, tool_choice, parser: str, max_new_tokens: int):
    """One prompt offering the strict clock tool, run baseline and draft_model k=3 under
    `--tool-call-parser parser`: (records, run.json, each output's text)."""
    strict = dict(CLOCK, function=dict(CLOCK["function"], strict=True))
    prompts = tmp_path / "tools.jsonl"
    prompts.write_text(json.dumps({"id": "clock", "messages": [{"role": "user", "content": "Time in Paris?"}],
                                   "tools": [strict], "tool_choice": tool_choice}) + "\n")
    out = tmp_path / "run"
    res = specbench("run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--method", "draft_model",
                    "-k", "3", "--workload", str(prompts), *FAST, "--max-new-tokens", str(max_new_tokens),
                    "--tool-call-parser", parser, "--out", str(out))
    assert res.code == 0, res.output
    df, meta = read_run(out)
    assert meta["config"]["tool_call_parser"] == parser
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_pair[0])
    return df, meta, [tok.decode(list(ids), skip_special_tokens=True) for ids in df["output_token_ids"]]


def test_tool_calls_take_the_hermes_form_under_its_parser(tiny_pair, tmp_path):
    """--tool-call-parser hermes: the named tool's call is a `<tool_call>` block (vLLM 0.32's
    structural tag) checked in that form, the run says which form, and greedy speculation
    still equals the baseline."""
    df, _, texts = tool_run(tiny_pair, tmp_path, {"type": "function", "function": {"name": "get_time"}}, "hermes", 120)
    for (_, row), text in zip(df.iterrows(), texts):
        assert text.startswith('<tool_call>\n{"name": "get_time", "arguments": ') or \
            text.startswith('<tool_call>{"name": "get_time", "arguments": '), text
        assert row["finish_reason"] == "length" or (row["output_valid"] and not isinstance(row["validation_error"], str)), text
    assert (df["finish_reason"] == "stop").any()  # a complete call was checked, not only cut-off ones
    base, spec = (df[df["is_baseline"] == b]["output_token_ids"].map(list).tolist() for b in (True, False))
    assert base == spec


def test_tool_calls_take_the_llama3_json_form_under_its_parser(tiny_pair, tmp_path):
    """--tool-call-parser llama3_json: "required" opens the output with a `{"name", "parameters"}`
    call (xgrammar's llama tag), checked in that form; greedy speculation equals the baseline."""
    df, _, texts = tool_run(tiny_pair, tmp_path, "required", "llama3_json", 60)
    for (_, row), text in zip(df.iterrows(), texts):
        assert text.startswith('{"name": "get_time", "parameters": '), text
        assert row["finish_reason"] == "length" or row["output_valid"], text
    base, spec = (df[df["is_baseline"] == b]["output_token_ids"].map(list).tolist() for b in (True, False))
    assert base == spec and len(base) == 1
