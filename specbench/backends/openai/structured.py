"""Structured output through an OpenAI-compatible server: a prompt's `response_format`, `tools`
/ `tool_choice` and `structured_outputs` (specbench.structured) sent in the server's dialect,
and the output read back as the text its constraint is checked against.

- vLLM (`owned_by` "vllm", and any server that does not say): OpenAI's fields as given, on
  chat and completions (vLLM reads `response_format` on both), and `structured_outputs` as
  vLLM names it (`json`, `regex`, `grammar`, `choice`).
- SGLang (`owned_by` "sglang"): OpenAI's fields as given; `structured_outputs` as SGLang's own
  sampling parameters: `json_schema` (text), `regex`, and a choice as a regex of the escaped
  alternatives. A Lark grammar has no SGLang equivalent (SGLang reads EBNF) and is refused.

Tools exist only on chat completions: a tool prompt on `--endpoint completions` is refused.
A server streams a tool call as `delta.tool_calls` (a name, then its arguments' JSON in
pieces): those are output tokens and the text checked, rebuilt as specbench.structured
expects it (a named tool: its arguments; "required": the array of `{"name", "parameters"}`;
under `--tool-call-parser hermes` the `<tool_call>` blocks, under `llama3_json` the
`{"name", "parameters"}` objects separated by "; ", after the content for an "auto" choice).
"""

from __future__ import annotations

import json
import re
from typing import Any

from specbench.errors import ConfigError
from specbench.structured import HERMES_CLOSE, HERMES_OPEN, TAG_PARSERS, hermes_head, llama_head
from specbench.types import Request


def dialect(card: dict[str, Any]) -> str:
    return "sglang" if str(card.get("owned_by") or "").lower() == "sglang" else "vllm"


def check(request: Request, endpoint: str, server: str) -> None:
    """Refuse, in one line, a prompt this endpoint or server cannot be sent as it asks."""
    fields = request.structured or {}
    if fields.get("tools") and endpoint != "chat":
        raise ConfigError(f"prompt {request.id!r} offers tools, which only chat completions take: "
                          "pass --endpoint chat")
    so = fields.get("structured_outputs") or {}
    if server == "sglang" and so.get("grammar") is not None:
        raise ConfigError(f"prompt {request.id!r}: structured_outputs.grammar is a Lark grammar, which SGLang "
                          "does not read (it takes EBNF); use json, regex or choice, or a vLLM server")


def body_fields(request: Request, endpoint: str, server: str) -> dict[str, Any]:
    """The request-body fields of a prompt's structured output ({} for a free prompt)."""
    fields = request.structured or {}
    out: dict[str, Any] = {}
    if "response_format" in fields:
        out["response_format"] = fields["response_format"]
    if endpoint == "chat":
        out.update({k: fields[k] for k in ("tools", "tool_choice") if k in fields})
    so = fields.get("structured_outputs")
    if so is None:
        return out
    if server == "vllm":
        out["structured_outputs"] = dict(so)
    elif so.get("json") is not None:
        out["json_schema"] = json.dumps(so["json"])
    elif so.get("regex") is not None:
        out["regex"] = so["regex"]
    elif so.get("choice") is not None:
        out["regex"] = "(" + "|".join(re.escape(c) for c in so["choice"]) + ")"
    return out


def output_text(request: Request, content: str, tool_calls: dict[int, list[str]]) -> str | None:
    """The text a structured output is checked against: the content, or the tool calls the
    server parsed out of it (None for a free prompt: nothing to check)."""
    c = request.constraint
    if c is None:
        return None
    if c.scenario != "tools" or not tool_calls:
        return content
    calls = [tool_calls[i] for i in sorted(tool_calls)]
    if c.kind == "json_schema":  # a named tool: its arguments
        return calls[0][1]
    if c.kind in TAG_PARSERS:  # the calls in the model's form, as the server's parser read them
        if c.kind == "hermes":
            blocks = "".join(f"{HERMES_OPEN}\n{hermes_head(name)}{arguments}}}\n{HERMES_CLOSE}" for name, arguments in calls)
        else:  # llama3_json: calls separated by "; ", as vLLM's llama parser splits them
            blocks = "; ".join(f"{llama_head(name)}{arguments}}}" for name, arguments in calls)
        # an "auto" choice: the parser's content is the text before the calls
        return (content if json.loads(c.source).get("auto") else "") + blocks
    parsed = []
    for name, arguments in calls:
        try:
            parsed.append({"name": name, "parameters": json.loads(arguments)})
        except json.JSONDecodeError:
            return arguments  # checked as it came: not JSON
    return json.dumps(parsed)
