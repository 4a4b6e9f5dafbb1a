"""Structured output through an OpenAI-compatible server: each dialect's request fields, the
prompts a server or endpoint cannot take refused in one line, and a streamed tool call read
back as output tokens and as the text its constraint is checked against."""

from __future__ import annotations

import json

import pytest

from specbench.backends.openai.client import OpenAIBackend
from specbench.backends.openai.sse import Attempt, handle_event
from specbench.backends.openai.structured import body_fields, check, dialect, output_text
from specbench.config import SamplingParams
from specbench.errors import ConfigError
from specbench.structured import check_output, constraint_of, scenario_of
from specbench.types import Request

CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "required": ["zone"], "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
FMT = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}


def request(**fields) -> Request:
    return Request(id="p1", prompt_ids=(1, 2), sampling=SamplingParams(), structured=fields or None,
                   constraint=constraint_of(fields), scenario=scenario_of(fields))


def test_vllm_gets_openai_fields_and_its_own_structured_outputs():
    assert body_fields(request(response_format=FMT), "completions", "vllm") == {"response_format": FMT}
    tools = request(tools=[CLOCK], tool_choice="required")
    assert body_fields(tools, "chat", "vllm") == {"tools": [CLOCK], "tool_choice": "required"}
    so = {"choice": ["yes", "no"]}
    assert body_fields(request(structured_outputs=so), "chat", "vllm") == {"structured_outputs": so}
    assert body_fields(request(), "chat", "vllm") == {}


def test_sglang_gets_its_own_sampling_parameters():
    assert body_fields(request(structured_outputs={"json": {"type": "object"}}), "chat", "sglang") == \
        {"json_schema": '{"type": "object"}'}
    assert body_fields(request(structured_outputs={"regex": "[0-9]+"}), "completions", "sglang") == {"regex": "[0-9]+"}
    assert body_fields(request(structured_outputs={"choice": ["a.b", "c"]}), "chat", "sglang") == {"regex": r"(a\.b|c)"}
    assert body_fields(request(response_format=FMT), "chat", "sglang") == {"response_format": FMT}
    assert dialect({"owned_by": "sglang"}) == "sglang" and dialect({}) == "vllm"


def test_what_a_server_cannot_take_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"prompt 'p1' offers tools, which only chat completions take: pass --endpoint chat"):
        check(request(tools=[CLOCK], tool_choice="required"), "completions", "vllm")
    with pytest.raises(ConfigError, match=r"structured_outputs.grammar is a Lark grammar, which SGLang does not read"):
        check(request(structured_outputs={"grammar": "start: /a+/"}), "chat", "sglang")
    check(request(structured_outputs={"grammar": "start: /a+/"}), "chat", "vllm")


def event(delta: dict) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()


def test_a_streamed_tool_call_is_output_tokens_and_the_checked_text():
    att = Attempt(sent=0.0)
    pieces = [{"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '{"zone": '}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]}]
    for i, delta in enumerate(pieces):
        handle_event(event(delta), float(i), True, att)
    assert [c.text for c in att.chunks] == ['{"zone": ', '"UTC"}']  # each piece timed as output
    assert att.tool_calls == {0: ["get_time", '{"zone": "UTC"}']}
    required = request(tools=[CLOCK], tool_choice="required")
    text = output_text(required, "", att.tool_calls)
    assert json.loads(text) == [{"name": "get_time", "parameters": {"zone": "UTC"}}]
    assert check_output(required.constraint, text) is None
    named = request(tools=[CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert output_text(named, "", att.tool_calls) == '{"zone": "UTC"}'
    assert output_text(named, '{"zone": "CET"}', {}) == '{"zone": "CET"}'  # no tool parser: the content
    assert output_text(request(), "free text", {}) is None
    broken = {0: ["get_time", '{"zone": "UT']}
    assert check_output(required.constraint, output_text(required, "", broken)).startswith("not JSON")


def test_under_the_hermes_parser_the_parsed_calls_are_checked_as_tool_call_blocks():
    fields = {"tools": [CLOCK], "tool_choice": "required"}
    req = Request(id="p1", prompt_ids=(1, 2), sampling=SamplingParams(), structured=fields,
                  constraint=constraint_of(fields, "hermes"), scenario=scenario_of(fields))
    calls = {0: ["get_time", '{"zone": "UTC"}'], 1: ["get_time", '{"zone":"CET"}']}
    text = output_text(req, "", calls)
    assert text == ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
                    '<tool_call>\n{"name": "get_time", "arguments": {"zone":"CET"}}\n</tool_call>')
    assert check_output(req.constraint, text) is None
    assert check_output(req.constraint, output_text(req, "", {0: ["get_time", '{"zone": "PST"}']})) == \
        "at 0/arguments/zone: 'PST' is not one of ['UTC', 'CET']"
    assert check_output(req.constraint, output_text(req, "", {0: ["get_time", '{"zone": "UT']})).startswith(
        "at 0: not JSON")


def test_an_auto_choice_with_a_strict_tool_is_checked_as_its_content_then_the_parsed_calls():
    """vLLM's hermes parser hands the text before the calls back as content: checked with
    the calls rebuilt after it (a free answer without calls is its content)."""
    fields = {"tools": [dict(CLOCK, function=dict(CLOCK["function"], strict=True))], "tool_choice": "auto"}
    req = Request(id="p1", prompt_ids=(1, 2), sampling=SamplingParams(), structured=fields,
                  constraint=constraint_of(fields, "hermes"), scenario=scenario_of(fields))
    text = output_text(req, "Let me look. ", {0: ["get_time", '{"zone": "UTC"}']})
    assert text == 'Let me look. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    assert check_output(req.constraint, text) is None
    assert output_text(req, "No call.", {}) == "No call." and check_output(req.constraint, "No call.") is None
    assert check_output(req.constraint, output_text(req, "", {0: ["get_time", '{"zone": "PST"}']})) == \
        "at 0/arguments/zone: 'PST' is not one of ['UTC', 'CET']"


def test_under_the_llama3_json_parser_the_parsed_calls_are_checked_as_its_objects():
    fields = {"tools": [CLOCK], "tool_choice": "required"}
    req = Request(id="p1", prompt_ids=(1, 2), sampling=SamplingParams(), structured=fields,
                  constraint=constraint_of(fields, "llama3_json"), scenario=scenario_of(fields))
    text = output_text(req, "", {0: ["get_time", '{"zone": "UTC"}'], 1: ["get_time", '{"zone":"CET"}']})
    assert text == '{"name": "get_time", "parameters": {"zone": "UTC"}}; {"name": "get_time", "parameters": {"zone":"CET"}}'
    assert check_output(req.constraint, text) is None
    assert check_output(req.constraint, output_text(req, "", {0: ["get_time", '{"zone": "PST"}']})) == \
        "at 0/parameters/zone: 'PST' is not one of ['UTC', 'CET']"


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_an_auto_call_streamed_after_content_is_checked_with_its_arguments_once(parser):
    """The client's result checks the streamed content, then the calls the server parsed: a
    chat chunk's text also holds the arguments (they are output tokens), which must not come
    back as content too (an argument `{"name": ...` would read as a second llama call)."""
    user = {"type": "function", "function": {"name": "add_user", "strict": True, "parameters": {
        "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}
    fields = {"tools": [user], "tool_choice": "auto"}
    req = Request(id="p1", prompt_ids=(1, 2), sampling=SamplingParams(), structured=fields,
                  constraint=constraint_of(fields, parser), scenario=scenario_of(fields))
    att = Attempt(sent=0.0)
    for i, delta in enumerate([{"content": "Adding. "},
                               {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                "function": {"name": "add_user", "arguments": ""}}]},
                               {"tool_calls": [{"index": 0, "function": {"arguments": '{"name": "Bob"}'}}]}]):
        handle_event(event(delta), float(i), True, att)
    handle_event(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                             "usage": {"completion_tokens": 3}}).encode(), 3.0, True, att)
    assert att.content == "Adding. " and "".join(c.text for c in att.chunks) == 'Adding. {"name": "Bob"}'
    res = OpenAIBackend("http://127.0.0.1:1", "m", endpoint="chat")._result(req, 0.0, att, 1)
    call = ('<tool_call>\n{"name": "add_user", "arguments": {"name": "Bob"}}\n</tool_call>' if parser == "hermes"
            else '{"name": "add_user", "parameters": {"name": "Bob"}}')
    assert res.output_text == "Adding. " + call
    assert check_output(req.constraint, res.output_text) is None
