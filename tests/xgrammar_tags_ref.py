"""Run by the python of the vLLM virtualenv (SPECBENCH_VLLM_PYTHON), never imported by the tests:
reads cases as JSON on stdin, `[{"model", "tools", "tool_choice", "strings"}]`, and prints per
case whether xgrammar accepts each string, whole, under the structural tag vLLM 0.32 itself
builds for that tool parser's model ("hermes", "llama"), tools and tool_choice, at its default
strict level (null: vLLM builds no tag, the output is free). tests/test_structured_tags_vllm.py
compares the grammars specbench builds with these answers."""

import json
import sys

import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam, ChatCompletionToolsParam
from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag

out = []
for case in json.load(sys.stdin):
    tools = [ChatCompletionToolsParam.model_validate(t) for t in case["tools"]]
    choice = case["tool_choice"]
    if isinstance(choice, dict):
        choice = ChatCompletionNamedToolChoiceParam.model_validate(choice)
    tag = get_model_structural_tag(model=case["model"], tools=tools, tool_choice=choice, reasoning=False)
    if tag is None:
        out.append(None)
        continue
    grammar = xgr.Grammar.from_structural_tag(tag)
    out.append([_is_grammar_accept_string(grammar, s) for s in case["strings"]])
print(json.dumps(out))
