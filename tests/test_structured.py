"""Structured output: prompt fields checked when read (one line naming the file, line and
field), the constraint each asks for, the check of an output, and decoding under it with
llguidance on the embedded engine (tiny float32 models, the byte-level test tokenizer):
every output valid for the baseline and speculative methods, greedy speculation equal to the
baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tiny
from specbench.backends.grammar import Compiler
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine, scheduler
from specbench.errors import WorkloadError
from specbench.structured import OutputConstraint, check_output, constraint_of, scenario_of
from specbench.workload.files import load_file

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "role"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99},
                         "role": {"enum": ["dev", "ops"]}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 8}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}


def write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("row,message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "bogus"}}}},
     r"prompts.jsonl:2: response_format.json_schema.schema is not valid JSON Schema at type: 'bogus' is not valid"),
    ({"response_format": {"type": "xml"}}, r"prompts.jsonl:2: field 'response_format' must be an object with type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
     r"prompts.jsonl:2: response_format.json_schema must be an object with a 'name'"),
    ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]},
     r"prompts.jsonl:2: tools\[0\].function.name must be 1-64 letters"),
    ({"tools": [WEATHER, WEATHER]}, r"tools\[1\].function.name 'get_weather' is given twice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     r"tool_choice names 'nope', which is not among the tools \(get_weather\)"),
    ({"tool_choice": "required"}, r"field 'tool_choice' needs 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
     r"tools\[0\].function.parameters is not valid JSON Schema"),
    ({"structured_outputs": {"regex": "a", "choice": ["x"]}}, r"exactly one of json, regex, grammar, choice"),
    ({"structured_outputs": {"regex": "[a-"}}, r"structured_outputs.regex does not compile"),
    ({"structured_outputs": {"choice": []}}, r"structured_outputs.choice must be a non-empty list"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     r"give one of response_format, structured_outputs and a tool_choice"),
])
def test_bad_structured_fields_name_file_line_and_field(tmp_path, row, message):
    path = write(tmp_path / "prompts.jsonl", [{"prompt": "fine"}, {"prompt": "hi", **row}])
    with pytest.raises(WorkloadError, match=message):
        load_file(path)


def test_the_constraint_each_field_asks_for():
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    assert constraint_of({"response_format": fmt}) == OutputConstraint("json_schema", json.dumps(PERSON), "json")
    assert constraint_of({"response_format": {"type": "json_object"}}).kind == "json_object"
    assert constraint_of({"response_format": {"type": "text"}}) is None
    assert constraint_of({"structured_outputs": {"regex": "[0-9]+"}}) == OutputConstraint("regex", "[0-9]+", "regex")
    named = constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function",
                                                                      "function": {"name": "get_time"}}})
    assert named.scenario == "tools" and named.schema == CLOCK["function"]["parameters"]
    required = constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": "required"})
    assert check_output(required, '[{"name":"get_time","parameters":{"zone":"UTC"}}]') is None
    assert check_output(required, '[{"name":"get_time","parameters":{"city":"Oslo"}}]') == \
        "at 0/parameters: Additional properties are not allowed ('city' was unexpected)"
    assert check_output(required, '[{"name":"get_time","parameters":{"zone":"PST"}}]') == \
        "at 0/parameters/zone: 'PST' is not one of ['UTC', 'CET']"
    assert check_output(required, '[{"name":"sleep","parameters":{}}]') == \
        "at 0/name: 'sleep' is not a tool (get_weather, get_time)"
    assert check_output(required, "[]") == "not a non-empty JSON array of tool calls"
    assert required.schema["items"]["anyOf"][1]["properties"]["parameters"] == CLOCK["function"]["parameters"]
    assert constraint_of({"tools": [WEATHER]}) is None  # auto: the server's tool parser decides
    assert scenario_of({"tools": [WEATHER]}) == "tools" and scenario_of({}) == "free"
    assert scenario_of({"tools": [WEATHER], "tool_choice": "none"}) == "free"


def test_check_output_says_the_first_error_in_one_line():
    person = OutputConstraint("json_schema", json.dumps(PERSON), "json")
    assert check_output(person, '{"name":"Ada","age":36,"role":"dev"}') is None
    assert check_output(person, '{"name":"Ada","age":360,"role":"dev"}') == "at age: 360 is greater than the maximum of 99"
    assert check_output(person, '{"name":"Ada","age":3').startswith("not JSON: ")
    assert check_output(OutputConstraint("json_object", "{}", "json"), "[1]") == "a JSON list, not an object"
    assert check_output(OutputConstraint("regex", "[a-c]{3}", "regex"), "abd") == "does not match /[a-c]{3}/"
    assert check_output(OutputConstraint("choice", '["yes", "no"]', "choice"), "no") is None


def test_csv_cells_hold_the_fields_as_json_text(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('prompt,structured_outputs\nhi,"{""regex"": ""[0-9]{2}""}"\n')
    (prompt,) = load_file(path)
    assert prompt.structured == {"structured_outputs": {"regex": "[0-9]{2}"}}


# ---- decoding under the constraint: the embedded engine with llguidance -----------------------

CONSTRAINTS = {
    "json": OutputConstraint("json_schema", json.dumps(PERSON), "json"),
    # a named tool: the output is its arguments ("required" is an array a weak model may extend forever)
    "tools": constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function",
                                                                     "function": {"name": "get_weather"}}}),
    "regex": OutputConstraint("regex", "(ab|ba)[0-9]{2}-[a-c]{1,4}", "regex"),
    "choice": OutputConstraint("choice", '["alpha", "beta", "gamma"]', "choice"),
}


@pytest.fixture(scope="module")
def pair():
    tok = tiny.make_tokenizer()
    target = tiny.make_model(vocab_size=len(tok), seed=1, eos_token_id=tok.eos_token_id)
    return tok, target, tiny.perturbed_copy(target, 0.05, seed=2)


def decode_all(pair, spec, sampling, concurrency=2):
    tok, target, draft = pair
    engine = Engine(target, draft, eos_token_ids=[tok.eos_token_id])
    compiler = Compiler(tok, target.config.vocab_size)
    reqs, names = [], []
    for i, (name, c) in enumerate(sorted(CONSTRAINTS.items())):
        for j, text in enumerate(("Return it:", "JSON please {", "x")):
            prompt = tok.encode(f"{text} {name}", add_special_tokens=False)
            reqs.append((prompt, sampling.with_(seed=10 * i + j), compiler.matcher(c, f"{name}{j}")))
            names.append(name)
    results, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency)
    return [(n, tok.decode(g.output_ids, skip_special_tokens=True), g) for n, g in zip(names, results)]


SPECS = {
    "baseline": SpeculativeConfig(),
    "draft_model": SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft="d"),
    "tree": SpeculativeConfig(method="draft_model", num_speculative_tokens=2, draft="d", topk=2, num_draft_tokens=5),
    "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=3),
}


@pytest.mark.parametrize("sampling", ["greedy", "T0.7"])
def test_every_output_is_valid_and_greedy_speculation_is_the_baseline(pair, sampling):
    sp = SamplingParams(temperature=0.0 if sampling == "greedy" else 0.7, max_new_tokens=60)
    outs = {name: decode_all(pair, spec, sp) for name, spec in SPECS.items()}
    for name, rows in outs.items():
        for scenario, text, g in rows:
            assert g.finish_reason == "stop", (name, scenario, text)
            assert check_output(CONSTRAINTS[scenario], text) is None, (name, scenario, text)
    if sampling == "greedy":
        base = [g.output_ids for _, _, g in outs["baseline"]]
        for name in SPECS:
            assert [g.output_ids for _, _, g in outs[name]] == base, name
    drafted = sum(s.accepted for _, _, g in outs["draft_model"] for s in g.steps)
    assert drafted > 0  # the draft model's drafts were accepted under the grammar


def test_a_grammar_that_does_not_compile_names_the_prompt():
    compiler = Compiler(tiny.make_tokenizer(), 259)
    with pytest.raises(WorkloadError, match=r"prompt 'p7': its grammar does not compile"):
        compiler.matcher(OutputConstraint("grammar", "start: nothing_here", "grammar"), "p7")


def test_the_matcher_rolls_back_exactly(pair):
    tok = pair[0]
    m = Compiler(tok, 259).matcher(CONSTRAINTS["json"], "p")
    first = m.allowed(259)
    ids = tok.encode('{"name":"Al', add_special_tokens=False)
    assert m.advance(ids) == len(ids)
    assert m.advance(tok.encode("\n", add_special_tokens=False)) == 0  # no raw newline in a JSON string
    m.rollback(len(ids))
    assert torch.equal(m.allowed(259), first)
    assert first.sum() == 1 and first[tok.encode("{", add_special_tokens=False)[0]]
