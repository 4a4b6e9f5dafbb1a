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


def test_the_model_spells_the_text_a_grammar_forces():
    """As under xgrammar (vLLM's default backend), where a schema forces `{"name":` the mask
    allows the merged token `{"` and the lone `{` alike, and either path goes on; llguidance's
    default allows only the canonical `{"` (the check fails on that variant)."""
    import llguidance

    from specbench.backends import grammar

    tok = tiny.make_tokenizer(merges=(("{", '"'),))
    merged, brace, quote = (tok.convert_tokens_to_ids(t) for t in ('{"', "{", '"'))
    assert tok.encode('{"a', add_special_tokens=False)[0] == merged
    c = OutputConstraint("json_schema", json.dumps({"type": "object", "properties": {"name": {"type": "string"}},
                                                    "required": ["name"]}), "json")
    compiler = Compiler(tok, len(tok))
    first = compiler.matcher(c, "p").allowed(len(tok))
    assert first[merged] and first[brace] and int(first.sum()) == 2
    for path in ([merged], [brace, quote]):
        m = compiler.matcher(c, "p")
        ids = path + tok.encode('name":"Al"}', add_special_tokens=False)
        assert m.advance(ids) == len(ids) and m.allowed(len(tok))[tok.eos_token_id]
    forced = llguidance.LLMatcher(compiler.tokenizer, llguidance.LLMatcher.grammar_from_lark(
        grammar._lark(c)), log_level=0)  # the same grammar, llguidance's default forcing
    canonical = grammar.Matcher(forced, compiler.stop_ids, compiler.n_vocab).allowed(len(tok))
    assert canonical[merged] and not canonical[brace]


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


# ---- tool calls in the hermes form (--tool-call-parser hermes) ---------------------------------

def test_the_hermes_form_of_tool_calls():
    """vLLM 0.32's structural tag for the hermes parser: one call for a named choice (only that
    tool), one or more for "required"; the check parses the blocks and holds the arguments to
    the tool's schema."""
    required = constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": "required"}, "hermes")
    named = constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function",
                                                                      "function": {"name": "get_time"}}}, "hermes")
    assert (required.kind, required.scenario) == ("hermes", "tools")
    assert json.loads(required.source) == {"forced": False, "tools": {
        "get_weather": {"parameters": WEATHER["function"]["parameters"], "strict": False},
        "get_time": {"parameters": CLOCK["function"]["parameters"], "strict": False}}}
    assert json.loads(named.source)["forced"] and list(json.loads(named.source)["tools"]) == ["get_time"]
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    compact = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert check_output(required, call) is None and check_output(required, call + compact) is None
    assert check_output(named, call) is None
    assert check_output(named, call + call) == "2 tool calls where the named tool_choice asks for one"
    assert check_output(named, compact) == "at 0/name: 'get_weather' is not a tool (get_time)"
    assert check_output(required, call.replace("UTC", "PST")) == "at 0/arguments/zone: 'PST' is not one of ['UTC', 'CET']"
    assert check_output(required, call + " done") == f"not a sequence of <tool_call> blocks (from character {len(call)})"
    assert check_output(required, '{"name": "get_time", "arguments": {}}').startswith("not a sequence of <tool_call>")
    assert check_output(required, "<tool_call>\n{oops}\n</tool_call>").startswith("at 0: not JSON: ")
    assert check_output(required, '<tool_call>{"name": "get_time"}</tool_call>') == \
        "at 0: a tool call is an object with exactly 'name' and 'arguments'"
    mixed = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    assert check_output(required, mixed + call) == "at 0: no '\\n</tool_call>' closes the <tool_call> at character 0"
    assert check_output(required, call + "<tool_call>{") == \
        f"at 1: no '</tool_call>' closes the <tool_call> at character {len(call)}"
    # a block ends at its first close, as vLLM's parser reads it: an opening tag in an argument
    # string is text (the grammar allows it), a closing one ends the block there
    free = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}
    echo = constraint_of({"tools": [free], "tool_choice": "required"}, "hermes")
    assert check_output(echo, '<tool_call>{"name": "echo", "arguments": {"q": "<tool_call>"}}</tool_call>') is None
    assert check_output(echo, '<tool_call>{"name": "echo", "arguments": {"q": "a</tool_call>b"}}</tool_call>'
                        ).startswith("at 0: not JSON: Unterminated string")
    bare = {"type": "function", "function": {"name": "ping", "strict": True}}  # strict, no parameters: any JSON
    assert json.loads(constraint_of({"tools": [bare], "tool_choice": "required"}, "hermes").source)[
        "tools"]["ping"] == {"parameters": {}, "strict": True}
    strict = dict(CLOCK, function=dict(CLOCK["function"], strict=True))
    assert json.loads(constraint_of({"tools": [strict], "tool_choice": "required"}, "hermes").source)[
        "tools"]["get_time"]["strict"] is True
    assert constraint_of({"tools": [WEATHER]}, "hermes") is None  # auto without a strict tool: free, as under json
    assert constraint_of({"tools": [strict], "tool_choice": "auto"}, "json") is None  # no structural tag under json
    with pytest.raises(ValueError, match="tool_call_parser must be one of json, hermes, llama3_json, got 'xml'"):
        constraint_of({"tools": [WEATHER], "tool_choice": "required"}, "xml")


def test_an_auto_choice_with_a_strict_tool_allows_calls_amid_free_text():
    """vLLM's structural tag for "auto" when a tool is strict (xgrammar's TriggeredTags): any
    text, in which every `<tool_call>` opens a call of one of the tools; zero or more calls."""
    strict = dict(CLOCK, function=dict(CLOCK["function"], strict=True))
    auto = constraint_of({"tools": [WEATHER, strict], "tool_choice": "auto"}, "hermes")
    assert (auto.kind, auto.scenario) == ("hermes", "tools")
    assert json.loads(auto.source) == {"forced": False, "auto": True, "tools": {
        "get_weather": {"parameters": WEATHER["function"]["parameters"], "strict": False},
        "get_time": {"parameters": CLOCK["function"]["parameters"], "strict": True}}}
    assert constraint_of({"tools": [WEATHER, strict]}, "hermes") == auto  # "auto" is the default choice
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    compact = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    for text in ("", "Just text, no call.", call, "Let me check. " + call + " and " + compact + "\nDone."):
        assert check_output(auto, text) is None, text
    assert check_output(auto, "Checking " + call.replace("UTC", "PST")) == \
        "at 0/arguments/zone: 'PST' is not one of ['UTC', 'CET']"
    assert check_output(auto, "x <tool_call>{oops}</tool_call>").startswith("at 0: not JSON: ")
    assert check_output(auto, call + " then <tool_call> alone") == \
        f"at 1: no '</tool_call>' closes the <tool_call> at character {len(call) + 6}"
    # the required form still refuses text around its calls
    required = constraint_of({"tools": [WEATHER, strict], "tool_choice": "required"}, "hermes")
    assert check_output(required, "Let me check. " + call).startswith("not a sequence of <tool_call> blocks")


def test_the_llama3_json_form_of_tool_calls():
    """xgrammar's llama tag, as vLLM 0.32 builds it for --tool-call-parser llama3_json: a named
    choice is one `{"name", "parameters"}` object; "required" opens with a call, then free text
    and calls; "auto" (a strict tool) calls anywhere; no think tags in the text."""
    strict = dict(CLOCK, function=dict(CLOCK["function"], strict=True))
    named = constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function",
                                                                      "function": {"name": "get_time"}}}, "llama3_json")
    required = constraint_of({"tools": [WEATHER, strict], "tool_choice": "required"}, "llama3_json")
    auto = constraint_of({"tools": [WEATHER, strict], "tool_choice": "auto"}, "llama3_json")
    assert (named.kind, required.kind, auto.kind) == ("llama3_json",) * 3
    assert constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": "auto"}, "llama3_json") is None  # none strict
    call = '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    other = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    assert check_output(named, call) is None
    assert check_output(named, call + " ok") == f"text after the call (from character {len(call)})"
    assert check_output(named, other) == "at 0/name: 'get_weather' is not a tool (get_time)"
    assert check_output(required, call + "; " + other) is None and check_output(required, call + " Done.") is None
    assert check_output(required, "Sure. " + call) == "the output does not open with a call ('{\"name\": ')"
    assert check_output(required, "") == "the output does not open with a call ('{\"name\": ')"
    assert check_output(required, call.replace("UTC", "PST")) == \
        "at 0/parameters/zone: 'PST' is not one of ['UTC', 'CET']"
    assert check_output(required, call + " and <think>") == "<think> in the text after the calls"
    assert check_output(auto, "") is None and check_output(auto, "Sure. " + call + " Done.") is None
    assert check_output(auto, "a </think> " + call) == "</think> in the text before call 0"
    assert check_output(auto, 'x {"name": y').startswith("at 0: not JSON: ")
    assert check_output(auto, '{"name": "get_time", "arguments": {}}') == \
        "at 0: a tool call is an object with exactly 'name' and 'parameters'"


@pytest.fixture(scope="module")
def tagged():
    """The byte-level tokenizer plus `<tool_call>` and `</tool_call>` as added tokens that are
    not special (as Qwen2.5 has them), and a model over that vocabulary."""
    tok = tiny.make_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    target = tiny.make_model(vocab_size=len(tok), seed=3, eos_token_id=tok.eos_token_id)
    return tok, target, tiny.perturbed_copy(target, 0.05, seed=4)


def test_the_hermes_grammar_spells_its_tags_out_and_takes_both_forms(tagged):
    """Both forms of a call are accepted up to the end (then the stop id), a mix of them is
    not; the tags are spelled with the vocabulary's own tokens, never the added `<tool_call>`
    token (as vLLM's xgrammar has them); strict arguments follow the schema, others any JSON."""
    tok = tagged[0]
    special = tok.convert_tokens_to_ids("<tool_call>")
    compiler = Compiler(tok, len(tok))
    tool_choice = {"type": "function", "function": {"name": "get_time"}}
    loose = constraint_of({"tools": [WEATHER, CLOCK], "tool_choice": tool_choice}, "hermes")
    strict = constraint_of({"tools": [WEATHER, dict(CLOCK, function=dict(CLOCK["function"], strict=True))],
                            "tool_choice": tool_choice}, "hermes")

    def spell(text):  # byte by byte, as the grammar spells it (the tokenizer would use the added token)
        pieces = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
        return [tok.convert_tokens_to_ids(ch) for piece, _ in pieces for ch in piece]

    for c, args, ok in [(loose, '{"zone": "PST"}', True), (loose, '[1, 2]', True), (strict, '{"zone": "PST"}', False),
                        (strict, '{"zone" :  "CET"}', True)]:
        for text in ('<tool_call>\n{"name": "get_time", "arguments": ' + args + '}\n</tool_call>',
                     '<tool_call>{"name": "get_time", "arguments": ' + args + '}</tool_call>'):
            m = compiler.matcher(c, "p")
            assert not m.allowed(len(tok))[special]
            ids = spell(text)
            n = m.advance(ids)
            assert (n == len(ids) and bool(m.allowed(len(tok))[tok.eos_token_id])) == ok, (text, n, len(ids))
    open_tool = {"type": "function", "function": {"name": "get_time", "strict": True, "parameters": {
        "type": "object", "properties": {"zone": {"type": "object", "properties": {"id": {"type": "string"}}}}}}}
    closed = constraint_of({"tools": [open_tool], "tool_choice": tool_choice}, "hermes")
    for args, ok in [('{"zone": {"id": "x"}}', True), ('{"zone": {"id": "x"}, "more": 1}', False),
                     ('{"zone": {"id": "x", "more": 1}}', False)]:  # strict: no property the schema does not name
        ids = spell('<tool_call>{"name": "get_time", "arguments": ' + args + '}</tool_call>')
        assert (compiler.matcher(closed, "p").advance(ids) == len(ids)) == ok, args
    # an allOf's parts each name some of the properties: closed apart, no object could hold them all
    parts = {"type": "function", "function": {"name": "get_time", "strict": True, "parameters": {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        {"type": "object", "properties": {"b": {"type": "integer"}, "c": {"type": "object", "properties": {}}}}]}}}
    joined = constraint_of({"tools": [parts], "tool_choice": tool_choice}, "hermes")
    for args, ok in [('{"a": 1, "b": 2}', True), ('{"a": 1, "c": {}}', True), ('{"a": 1, "c": {"x": 1}}', False)]:
        ids = spell('<tool_call>{"name": "get_time", "arguments": ' + args + '}</tool_call>')
        assert (compiler.matcher(joined, "p").advance(ids) == len(ids)) == ok, args
        if ok:  # and the check, which holds the schema as written, takes what the grammar took
            assert check_output(joined, '<tool_call>{"name": "get_time", "arguments": ' + args + '}</tool_call>') is None
    # no grammar takes an added token as text (a regex neither); the model spells it
    regex = compiler.matcher(OutputConstraint("regex", "<tool_call>x", "regex"), "p").allowed(len(tok))
    assert not regex[special] and regex[tok.convert_tokens_to_ids("<")]
    mixed = spell('<tool_call>\n{"name": "get_time", "arguments": {}}</tool_call>')
    assert compiler.matcher(loose, "p").advance(mixed) < len(mixed)
    twice = spell('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>' * 2)
    assert compiler.matcher(loose, "p").advance(twice) == len(twice) // 2  # a named choice: one call


def test_the_auto_grammar_lets_text_run_until_a_call_opens(tagged):
    """Free text then the stop id; `<tool_call>` anywhere must go on as a call of a tool (a
    strict one's arguments follow its schema), and text may follow the call."""
    tok = tagged[0]
    special = tok.convert_tokens_to_ids("<tool_call>")
    compiler = Compiler(tok, len(tok))
    strict = dict(CLOCK, function=dict(CLOCK["function"], strict=True))
    auto = constraint_of({"tools": [WEATHER, strict], "tool_choice": "auto"}, "hermes")

    def spell(text):
        pieces = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
        return [tok.convert_tokens_to_ids(ch) for piece, _ in pieces for ch in piece]

    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    for text, whole in [("No call needed.", True), ("Sure. " + call + " Done.", True),
                        ("A" + call + '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', True),
                        ("Sure. <tool_call>\nplain words", False), ("Sure. " + call.replace("CET", "PST"), False),
                        ('<tool_call>{"name": "get_date", "arguments": {}}</tool_call>', False)]:
        m = compiler.matcher(auto, "p")
        assert not m.allowed(len(tok))[special]  # the tags are spelled, as under the other hermes forms
        ids = spell(text)
        n = m.advance(ids)
        assert (n == len(ids) and bool(m.allowed(len(tok))[tok.eos_token_id])) == whole, (text, n, len(ids))
    m = compiler.matcher(auto, "p")
    assert m.advance(spell("Sure. " + call)) > 0 and m.allowed(len(tok))[tok.eos_token_id]  # text may stop after a call


@pytest.mark.parametrize("choice", ["named", "auto"])
def test_hermes_tool_calls_decode_valid_and_greedy_speculation_is_the_baseline(tagged, choice):
    tok, target, draft = tagged
    engine = Engine(target, draft, eos_token_ids=[tok.eos_token_id])
    compiler = Compiler(tok, len(tok))
    c = constraint_of({"tools": [WEATHER, dict(CLOCK, function=dict(CLOCK["function"], strict=True))],
                       "tool_choice": {"type": "function", "function": {"name": "get_time"}} if choice == "named"
                       else "auto"}, "hermes")
    outs = {}
    for name, spec in (("baseline", SPECS["baseline"]), ("draft_model", SPECS["draft_model"])):
        reqs = [(tok.encode(f"call {i}", add_special_tokens=False), SamplingParams(max_new_tokens=120, seed=i),
                 compiler.matcher(c, f"p{i}")) for i in range(3)]
        outs[name] = scheduler.run(engine, reqs, spec, concurrency=3)[0]
    for g in outs["baseline"] + outs["draft_model"]:
        text = tok.decode(g.output_ids, skip_special_tokens=True)
        assert text.startswith('<tool_call>') or choice == "auto"
        assert tok.convert_tokens_to_ids("<tool_call>") not in g.output_ids
        assert g.finish_reason == "length" or check_output(c, text) is None, text
    assert [g.output_ids for g in outs["draft_model"]] == [g.output_ids for g in outs["baseline"]]
