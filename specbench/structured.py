"""Structured output: what a prompt asks its output to be, checked when the prompt is read, and
whether an output is that.

A prompt record may carry OpenAI's chat-completions fields `response_format`
(`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"name": ..., "schema":
{...}}}`), `tools` and `tool_choice`, and vLLM's `structured_outputs` (exactly one of `json`,
`regex`, `grammar` (Lark, as llguidance and vLLM read it) or `choice`). `parse_structured`
checks them (a schema must be valid JSON Schema, a tool needs a name, a named tool_choice a
tool of that name, a regex must compile) with one line naming the field; HTTP backends send
them as given, in their server's dialect.

`constraint_of` turns them into the one `OutputConstraint` the output must satisfy: what the
embedded engine decodes under (specbench.backends.grammar) and what `check_output` verifies.
Tool calls are constrained as the server's tool parser has vLLM constrain them
(`TOOL_CALL_PARSERS`, the run's `--tool-call-parser`):
- `json` (vLLM 0.32's parsers without a structural tag, and every vLLM before structural tags):
  a named `tool_choice` makes the output the function's arguments (its `parameters` schema),
  `"required"` a JSON array of `{"name", "parameters"}`.
- `hermes` (vLLM 0.32's structural tag for `--tool-call-parser hermes`, what Qwen2.5 and Hermes
  models are served with): the model's native form, one call (a named choice) or one or more
  (`"required"`) of `<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>` (or the
  same without the two newlines). As vLLM does at its default `--tool-strict-level`, ARGS is
  any JSON unless the tool says `"strict": true` (then its `parameters` schema, no property it
  does not name, as xgrammar's strict mode), with free whitespace; the check still holds the
  arguments to the tool's schema as written.
  Under `"auto"` the output is free unless a tool is strict (vLLM's default strict level
  builds no structural tag otherwise): then it is free text in which `<tool_call>` may only
  open a call of one of the tools, in the form above, with free text again after it (xgrammar's
  TriggeredTags, vLLM's structural tag for an `"auto"` choice); zero or more calls.
- `llama3_json` (xgrammar's llama tag, which vLLM 0.32 builds for `--tool-call-parser
  llama3_json`): a call is `{"name": "NAME", "parameters": ARGS}`; a named choice makes the
  output that one call, `"required"` opens the output with a call and lets free text and more
  calls follow, `"auto"` (with a strict tool) allows zero or more amid free text; every
  `{"name": ` in the text opens a call, and free text holds no `<think>` or `</think>`. ARGS as
  under hermes.
Other parsers' structural tags are not built. `"none"` leaves the output free under all, and
`"auto"` under `json`.

Boundary: plain values and JSON; no tokenizer, no engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

import jsonschema

from specbench.errors import WorkloadError

FIELDS = ("response_format", "tools", "tool_choice", "structured_outputs")
TOOL_CALL_PARSERS = ("json", "hermes", "llama3_json")
# the parsers whose structural tag specbench builds (vLLM 0.32's; kind of their constraint = the name)
TAG_PARSERS = ("hermes", "llama3_json")
# a hermes tool call: OPEN [\n] hermes_head(name) ARGS } [\n] CLOSE, newlines both or neither
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
# a llama3_json tool call: llama_head(name) ARGS }, where free text may not hold LLAMA_TRIGGER
# but to open one, nor LLAMA_EXCLUDED (xgrammar's llama tag keeps the think tags out of text)
LLAMA_TRIGGER = '{"name": '
LLAMA_EXCLUDED = ("<think>", "</think>")
STRUCTURED_KEYS = ("json", "regex", "grammar", "choice")
# the scenario of a sample: records, console, report and compare group by it
SCENARIOS = ("free", "json", "tools", "regex", "grammar", "choice")


@dataclass(frozen=True)
class OutputConstraint:
    """What an output must be: `kind` json_object | json_schema | tool_calls | hermes | llama3_json | regex |
    grammar | choice, and its `source` (the schema as JSON text, each tool's parameters schema
    by name, for hermes and llama3_json `{"forced": bool, "tools": {name: {"parameters",
    "strict"}}}` (and `"auto": true` for calls amid free text), the
    regex, the Lark grammar, the choices as a JSON list). `scenario` groups samples: json, tools, regex, grammar or choice."""

    kind: str
    source: str
    scenario: str

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema of a json_schema constraint, and of tool_calls (whose source maps each
        tool's name to its parameters' schema): a non-empty array of `{"name", "parameters"}`
        calls, as vLLM constrains tool_choice "required"."""
        if self.kind == "json_schema":
            return json.loads(self.source)
        if self.kind != "tool_calls":
            return None
        call = [{"type": "object", "properties": {"name": {"type": "string", "enum": [n]}, "parameters": p},
                 "required": ["name", "parameters"], "additionalProperties": False}
                for n, p in json.loads(self.source).items()]
        return {"type": "array", "minItems": 1, "items": call[0] if len(call) == 1 else {"anyOf": call}}


def _schema_error(schema: Any, where: str, field: str) -> None:
    if not isinstance(schema, Mapping):
        raise WorkloadError(f"{where}: {field} must be a JSON Schema object, got {json.dumps(schema)[:80]}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        at = "/".join(str(p) for p in exc.path)
        raise WorkloadError(f"{where}: {field} is not valid JSON Schema"
                            f"{f' at {at}' if at else ''}: {exc.message}") from None


def _response_format(value: Any, where: str) -> None:
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(value, Mapping) or value.get("type") not in kinds:
        raise WorkloadError(f"{where}: field 'response_format' must be an object with type "
                            f"{', '.join(kinds)}, got {json.dumps(value)[:80]}")
    if value["type"] == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise WorkloadError(f"{where}: response_format.json_schema must be an object with a 'name' and "
                                "a 'schema'")
        _schema_error(spec.get("schema"), where, "response_format.json_schema.schema")


def _tools(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{where}: field 'tools' must be a non-empty list of "
                            '{"type": "function", "function": {"name": ..., "parameters": {...}}}')
    names = []
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise WorkloadError(f"{where}: tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise WorkloadError(f"{where}: tools[{i}].function.name must be 1-64 letters, digits, _ or -, "
                                f"got {name!r}")
        if name in names:
            raise WorkloadError(f"{where}: tools[{i}].function.name {name!r} is given twice")
        if "parameters" in fn:
            _schema_error(fn["parameters"], where, f"tools[{i}].function.parameters")
        names.append(name)
    return names


def _tool_choice(value: Any, names: list[str], where: str) -> None:
    if value in ("none", "auto", "required"):
        return
    fn = value.get("function") if isinstance(value, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise WorkloadError(f"{where}: field 'tool_choice' must be none, auto, required or "
                            f'{{"type": "function", "function": {{"name": ...}}}}, got {json.dumps(value)[:80]}')
    if name not in names:
        raise WorkloadError(f"{where}: tool_choice names {name!r}, which is not among the tools "
                            f"({', '.join(names) or 'none given'})")


def _structured_outputs(value: Any, where: str) -> None:
    keys = [k for k in STRUCTURED_KEYS if isinstance(value, Mapping) and value.get(k) is not None]
    if not isinstance(value, Mapping) or len(keys) != 1 or set(value) - set(STRUCTURED_KEYS):
        raise WorkloadError(f"{where}: field 'structured_outputs' must be an object with exactly one of "
                            f"{', '.join(STRUCTURED_KEYS)}")
    key = keys[0]
    spec = value[key]
    if key == "json":
        _schema_error(spec, where, "structured_outputs.json")
    elif key == "regex":
        try:
            re.compile(spec)
        except (re.error, TypeError) as exc:
            raise WorkloadError(f"{where}: structured_outputs.regex does not compile: {exc}") from None
    elif key == "grammar":
        if not isinstance(spec, str) or not spec.strip():
            raise WorkloadError(f"{where}: structured_outputs.grammar must be a Lark grammar (a string)")
    elif not isinstance(spec, list) or not spec or not all(isinstance(c, str) and c for c in spec):
        raise WorkloadError(f"{where}: structured_outputs.choice must be a non-empty list of strings")


def parse_structured(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The structured-output fields of a prompt record (`FIELDS`), checked; {} when none.
    `where` (e.g. `file.jsonl:3`) prefixes every error."""
    out = {k: row[k] for k in FIELDS if row.get(k) not in (None, "")}
    for key in ("response_format", "tools", "tool_choice", "structured_outputs"):
        if isinstance(out.get(key), str) and (key != "tool_choice" or out[key].lstrip().startswith("{")):
            # CSV and Parquet cells hold JSON text (a tool_choice may be a bare word)
            try:
                out[key] = json.loads(out[key])
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: field {key!r} is not valid JSON ({exc.msg})") from None
    if "response_format" in out:
        _response_format(out["response_format"], where)
    names = _tools(out["tools"], where) if "tools" in out else []
    if "tool_choice" in out:
        if not names:
            raise WorkloadError(f"{where}: field 'tool_choice' needs 'tools'")
        _tool_choice(out["tool_choice"], names, where)
    if "structured_outputs" in out:
        _structured_outputs(out["structured_outputs"], where)
    constraining = [k for k in ("response_format", "structured_outputs") if k in out
                    and not (k == "response_format" and out[k]["type"] == "text")]
    if len(constraining) > 1 or (constraining and _tool_constraint(out) is not None):
        raise WorkloadError(f"{where}: give one of response_format, structured_outputs and a tool_choice "
                            "that constrains the output (required or a named function), not several")
    return out


def _tool_constraint(structured: Mapping[str, Any], parser: str = "json") -> OutputConstraint | None:
    tools, choice = structured.get("tools"), structured.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    fns = [t["function"] for t in tools]
    if choice == "auto":  # constrained only by a structural tag, and only with a strict tool
        if parser not in TAG_PARSERS or not any(f.get("strict") is True for f in fns):
            return None
        calls = {f["name"]: {"parameters": f.get("parameters", {}), "strict": f.get("strict") is True} for f in fns}
        return OutputConstraint(parser, json.dumps({"forced": False, "auto": True, "tools": calls}), "tools")
    params = {f["name"]: f.get("parameters", {"type": "object"}) for f in fns}
    named = choice["function"]["name"] if isinstance(choice, Mapping) else None
    if parser in TAG_PARSERS:
        # (a strict tool without parameters takes any JSON, as vLLM's get_function_parameters has it)
        calls = {f["name"]: {"parameters": f.get("parameters", {}), "strict": f.get("strict") is True}
                 for f in fns if named is None or f["name"] == named}
        return OutputConstraint(parser, json.dumps({"forced": named is not None, "tools": calls}), "tools")
    if named is not None:  # a named function: the output is its arguments
        return OutputConstraint("json_schema", json.dumps(params[named]), "tools")
    return OutputConstraint("tool_calls", json.dumps(params), "tools")


def constraint_of(structured: Mapping[str, Any] | None, tool_call_parser: str = "json") -> OutputConstraint | None:
    """The constraint an output of these (checked) fields must satisfy, or None (free); tool
    calls in the form of `tool_call_parser` (`TOOL_CALL_PARSERS`)."""
    if tool_call_parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {tool_call_parser!r}")
    if not structured:
        return None
    fmt = structured.get("response_format")
    if fmt is not None and fmt["type"] == "json_object":
        return OutputConstraint("json_object", "{}", "json")
    if fmt is not None and fmt["type"] == "json_schema":
        return OutputConstraint("json_schema", json.dumps(fmt["json_schema"]["schema"]), "json")
    so = structured.get("structured_outputs")
    if so is not None:
        key = next(k for k in STRUCTURED_KEYS if so.get(k) is not None)
        if key == "json":
            return OutputConstraint("json_schema", json.dumps(so["json"]), "json")
        if key == "choice":
            return OutputConstraint("choice", json.dumps(so["choice"]), "choice")
        return OutputConstraint(key, so[key], key)
    return _tool_constraint(structured, tool_call_parser)


def scenario_of(structured: Mapping[str, Any] | None) -> str:
    """The sample's scenario: its constraint's, "tools" for tools the model may call freely,
    else "free"."""
    c = constraint_of(structured)
    if c is not None:
        return c.scenario
    return "tools" if structured and structured.get("tools") and structured.get("tool_choice") != "none" else "free"


def check_output(constraint: OutputConstraint, text: str) -> str | None:
    """None when `text` satisfies `constraint`, else the first error, in one line. A grammar
    is checked by the decoder that enforced it, not here (None: not checked, see
    specbench.metrics)."""
    if constraint.kind in ("json_object", "json_schema", "tool_calls"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc.msg} at character {exc.pos}"
        if constraint.kind == "json_object":
            return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
        if constraint.kind == "tool_calls":
            if not isinstance(value, list) or not value:
                return "not a non-empty JSON array of tool calls"
            return _check_calls(json.loads(constraint.source), value, "parameters")
        return _schema_check(constraint.schema, value)
    if constraint.kind in TAG_PARSERS:
        spec = json.loads(constraint.source)
        if constraint.kind == "hermes":
            calls = hermes_calls(text, amid_text=spec.get("auto", False))
        else:
            calls = llama_calls(text, forced=spec["forced"], first_at_start=not spec["forced"] and not spec.get("auto"))
        if isinstance(calls, str):
            return calls
        if spec["forced"] and len(calls) != 1:
            return f"{len(calls)} tool calls where the named tool_choice asks for one"
        field = "arguments" if constraint.kind == "hermes" else "parameters"
        return _check_calls({n: t["parameters"] for n, t in spec["tools"].items()}, calls, field)
    if constraint.kind == "regex":
        return None if re.fullmatch(constraint.source, text) else f"does not match /{constraint.source}/"[:300]
    if constraint.kind == "choice":
        choices = json.loads(constraint.source)
        return None if text in choices else f"not one of {len(choices)} choices"
    raise ValueError(f"check_output cannot check a {constraint.kind}")


def _schema_check(schema: Any, value: Any, prefix: str = "") -> str | None:
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is None:
        return None
    at = prefix + "/".join(str(p) for p in error.absolute_path)
    return f"{'at ' + at.rstrip('/') + ': ' if at else ''}{error.message}"[:300]


def hermes_head(name: str) -> str:
    """What a hermes call of tool `name` holds before its arguments (vLLM's structural tag)."""
    return '{"name": ' + json.dumps(name) + ', "arguments": '


def hermes_calls(text: str, amid_text: bool = False) -> list[Any] | str:
    """The calls of a hermes-form output, or the first error, in one line: one or more blocks
    and nothing else, each `<tool_call>\\n` JSON `\\n</tool_call>` or the same without the two
    newlines (the two forms vLLM's structural tag allows), the JSON one object. `amid_text`
    (an "auto" tool_choice): zero or more such blocks with any text around them, where every
    `<tool_call>` opens one. A block ends at the first close after its opening, as vLLM's
    parser (a non-greedy regex) ends it: a `<tool_call>` inside an argument string is text, a
    `</tool_call>` inside one ends the block (the grammar allows both in strings)."""
    calls, at = [], 0
    while at < len(text) or not (calls or amid_text):
        if amid_text:
            opens = text.find(HERMES_OPEN, at)
            if opens < 0:
                break
            at = opens
        elif not text.startswith(HERMES_OPEN, at):
            return f"not a sequence of {HERMES_OPEN} blocks (from character {at})"
        start = at + len(HERMES_OPEN)
        close = "\n" + HERMES_CLOSE if text.startswith("\n", start) else HERMES_CLOSE
        end = text.find(close, start)
        unclosed = f"at {len(calls)}: no {close!r} closes the {HERMES_OPEN} at character {at}"
        if end < 0:
            return unclosed
        try:  # up to the first close, as vLLM's hermes parser reads it: a tag in a string is text
            calls.append(json.loads(text[start:end]))
        except json.JSONDecodeError as exc:  # an opening inside: not closed before the next one opened
            if HERMES_OPEN in text[start:end]:
                return unclosed
            return f"at {len(calls)}: not JSON: {exc.msg} at character {exc.pos}"
        at = end + len(close)
    return calls


def llama_head(name: str) -> str:
    """What a llama3_json call of tool `name` holds before its parameters (xgrammar's llama tag)."""
    return LLAMA_TRIGGER + json.dumps(name) + ', "parameters": '


def llama_calls(text: str, forced: bool, first_at_start: bool) -> list[Any] | str:
    """The calls of a llama3_json-form output, or the first error, in one line: `forced` (a
    named tool_choice), the text is one JSON object; otherwise every `{"name": ` of the text
    opens a JSON object, a call, and the rest is free text without the think tags;
    `first_at_start` ("required"): the output opens with a call."""
    decoder = json.JSONDecoder()
    if forced:
        try:
            value, end = decoder.raw_decode(text)
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc.msg} at character {exc.pos}"
        return [value] if end == len(text) else f"text after the call (from character {end})"
    calls, at = [], 0
    while (opens := text.find(LLAMA_TRIGGER, at)) >= 0 or (first_at_start and not calls):
        if opens != 0 and first_at_start and not calls:
            return f"the output does not open with a call ({LLAMA_TRIGGER!r})"
        bad = next((t for t in LLAMA_EXCLUDED if t in text[at:opens]), None)
        if bad:
            return f"{bad} in the text before call {len(calls)}"
        try:
            value, at = decoder.raw_decode(text, opens)
        except json.JSONDecodeError as exc:
            return f"at {len(calls)}: not JSON: {exc.msg} at character {exc.pos}"
        calls.append(value)
    bad = next((t for t in LLAMA_EXCLUDED if t in text[at:]), None)
    return f"{bad} in the text after the calls" if bad else calls


def _check_calls(tools: dict[str, Any], calls: list[Any], field: str) -> str | None:
    """Calls of the tools given, each an object of exactly `name` and `field` (parameters in
    the JSON array form, arguments in hermes'), with arguments its tool's parameters accept."""
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or set(call) != {"name", field}:
            return f"at {i}: a tool call is an object with exactly 'name' and {field!r}"
        if not isinstance(call["name"], str) or call["name"] not in tools:
            return f"at {i}/name: {call['name']!r} is not a tool ({', '.join(tools)})"[:300]
        error = _schema_check(tools[call["name"]], call[field], f"{i}/{field}/")
        if error is not None:
            return error
    return None
