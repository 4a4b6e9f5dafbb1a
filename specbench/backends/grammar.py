"""Output constraints compiled for the embedded engine: a `specbench.structured.OutputConstraint`
and the tokenizer become a matcher over token ids (specbench.engine.constraint.TokenConstraint).

The grammar library is llguidance (the Rust matcher behind vLLM's `guidance` backend and
SGLang's `llguidance` backend): JSON Schema, regex and Lark grammars compile to one token-level
matcher that computes a next-token mask in microseconds, checks a token sequence without
consuming it, and rolls back exactly the tokens a rejected draft consumed. It ships one
dependency-free abi3 wheel (xgrammar, the other candidate, needs triton on Linux).

JSON is compact (no whitespace between tokens, llguidance's `whitespace_flexible` off, as
vLLM's `disable_any_whitespace`): free whitespace lets a weak model pad forever.

The model picks how text the grammar forces is spelled (llguidance's `no_forcing`), as under
xgrammar, vLLM's and SGLang's default backend: where a schema forces `{"name":`, the mask
allows `{` as well as `{"`. llguidance's default (vLLM's `guidance` backend) allows only the
canonical tokenization of forced text: on the json set, Qwen2.5-Coder-1.5B's outputs under it
left vLLM's (xgrammar) at the first token, `{"` where vLLM's model wrote `{` (3 of 16 greedy
draft_model k=4 outputs equal to vLLM 0.32 CPU's, bf16; 14 of 16 without forcing, the other two
parting at tokens 6 and 19, and acceptance 0.832 against vLLM's 0.823). Added tokens that are not special
(Qwen2.5's `<tool_call>`) are never allowed as text; xgrammar allows them, and the model gives
`<tool_call>` probability ~0 where it spells the tag `<`, `tool`, `_call`, `>` (what vLLM 0.32
emitted): a model trained to emit the added token would be refused it here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import llguidance
import llguidance.hf
# llguidance.numpy, not llguidance.torch: importing that one applies torch.compile (and so imports
# Inductor) to a kernel never called here, about a CPU-second of every process's start
import llguidance.numpy
import torch

from specbench.errors import WorkloadError
from specbench.structured import (HERMES_CLOSE, HERMES_OPEN, LLAMA_EXCLUDED, LLAMA_TRIGGER, TAG_PARSERS,
                                  OutputConstraint, hermes_head, llama_head)

# every grammar starts with this: the model spells forced text (as under xgrammar)
UNFORCED = '%llguidance {"no_forcing": true}\n'


def grammar_text(constraint: OutputConstraint) -> str:
    """The llguidance grammar of `constraint`, as Lark (`UNFORCED` first)."""
    return llguidance.LLMatcher.grammar_from_lark(UNFORCED + _lark(constraint))


def _json(schema: Any, flexible: bool = False) -> str:
    """A `%json` rule body: `schema` with its whitespace (compact unless `flexible`)."""
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_flexible": flexible}})


def _lark(constraint: OutputConstraint) -> str:
    if constraint.kind == "json_object":
        return f"start: {_json({'type': 'object'})}\n"
    if constraint.kind in ("json_schema", "tool_calls"):
        return f"start: {_json(constraint.schema)}\n"
    if constraint.kind in TAG_PARSERS:
        return tool_tag_grammar(constraint.kind, json.loads(constraint.source))
    if constraint.kind == "regex":  # llguidance's own escaping of the regex as a Lark terminal
        return json.loads(llguidance.LLMatcher.grammar_from_regex(constraint.source))["grammars"][0]["lark_grammar"]
    if constraint.kind == "choice":
        return "start: " + " | ".join(json.dumps(c) for c in json.loads(constraint.source)) + "\n"
    if constraint.kind == "grammar":
        return constraint.source
    raise ValueError(f"unknown constraint kind {constraint.kind!r}")


def tool_tag_grammar(parser: str, spec: dict[str, Any]) -> str:
    """vLLM 0.32's structural tag of `--tool-call-parser hermes` or `llama3_json` as Lark (specbench.structured says what each allows). A hermes call is `<tool_call>` +
    `{"name": "NAME", "arguments": ` + ARGS + `}` + `</tool_call>`, with a newline after the
    opening tag and before the closing one or neither; a llama3_json call is
    `{"name": "NAME", "parameters": ` + ARGS + `}`. ARGS is any JSON unless the tool is strict:
    then its parameters schema, with no property an object does not name (xgrammar's strict
    mode, which llguidance's JSON does not assume); whitespace in it is free, as xgrammar has it
    there.

    A named choice (`forced`) is one call; hermes' "required" one or more and nothing else;
    calls amid free text (an "auto" choice with a strict tool, and llama3_json's "required"
    after its first call: xgrammar's TriggeredTags) are each opened by the first trigger
    (`<tool_call>`, `{"name": `) of the text before them, a lazy lexeme as llguidance's own
    structural tags have it, and the text after the last call is free (without the trigger,
    and for llama3_json without the think tags)."""
    if parser == "hermes":
        trigger, excluded = HERMES_OPEN, ()
    else:
        trigger, excluded = LLAMA_TRIGGER, LLAMA_EXCLUDED
    rules = []
    for i, (name, tool) in enumerate(spec["tools"].items()):
        schema = _closed(tool["parameters"]) if tool["strict"] else {}
        if parser == "hermes":
            forms = [(nl + hermes_head(name), "}" + nl + HERMES_CLOSE) for nl in ("\n", "")]
        else:
            forms = [(llama_head(name)[len(trigger):], "}")]
        rules += [f"body_{i}: {' | '.join(f'{json.dumps(a)} args_{i} {json.dumps(b)}' for a, b in forms)}",
                  f"args_{i}: {_json(schema, flexible=True)}"]
    bodies = " | ".join(f"body_{i}" for i in range(len(spec["tools"])))
    amid = spec.get("auto") or (parser == "llama3_json" and not spec["forced"])
    if not amid:
        head = f"start: {'call' if spec['forced'] else 'call+'}\ncall: {json.dumps(trigger)} body\n"
    else:
        text = "/(.|\\n)*/" + "".join(" & ~/(.|\\n)*" + re.escape(x).replace("/", "\\/") + "(.|\\n)*/" for x in excluded)
        first = f"{json.dumps(trigger)} body " if not spec.get("auto") else ""  # llama3_json's "required"
        head = (f"start: {first}call* TEXT\nTEXT: {text}\n"
                f"trig[lazy]: TEXT {json.dumps(trigger)}\ncall: trig body\n")
    return head + f"body: {bodies}\n" + "\n".join(rules) + "\n"


def _closed(schema: Any, close: bool = True) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that says nothing
    of it (and every subschema walked the same way). Not where closing would change more than
    the properties an object may add: an `allOf` and its branches each see only their own
    properties (closed apart, they could never hold together), and a `not` closed would
    refuse less, not more."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    values = ("enum", "const", "default", "examples", "properties", "not", "allOf")  # not walked (some: below)
    out = {k: _closed(v) if isinstance(v, (dict, list)) and k not in values else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):  # names to subschemas, not a schema itself
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("allOf"), list):
        out["allOf"] = [_closed(s, close=False) for s in schema["allOf"]]
    if close and "allOf" not in schema and (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


class Matcher:
    """One request's llguidance matcher as the engine's TokenConstraint. A stop id (EOS) after a
    complete output is accepted without being consumed (llguidance stops there), so rolling a
    draft back past it is exact; nothing is accepted after it."""

    def __init__(self, matcher: llguidance.LLMatcher, stop_ids: frozenset[int], n_vocab: int):
        self.m = matcher
        self.stop_ids = stop_ids
        self.n_vocab = n_vocab  # the matcher's vocabulary (the model's, or the tokenizer's where larger)
        self.ended = False  # a stop id was accepted after a complete output
        self._bits_np = llguidance.numpy.allocate_token_bitmask(1, n_vocab)
        self._bits = torch.from_numpy(self._bits_np)  # the same memory: the matcher fills it
        self._shift = torch.arange(32, dtype=torch.int32)
        self._stops = torch.zeros(n_vocab, dtype=torch.bool)
        self._stops[[i for i in stop_ids if i < n_vocab]] = True

    def allowed(self, vocab_size: int) -> torch.Tensor:
        if self.ended:  # never sampled from (the request ends at its stop id), but a distribution
            return self._stops[:vocab_size].clone()
        llguidance.numpy.fill_next_token_bitmask(self.m, self._bits_np)
        if self.m.is_error():
            raise RuntimeError(f"output constraint: {self.m.get_error()}")
        bits = ((self._bits[0].view(-1, 1) >> self._shift) & 1).view(-1).bool()
        out = torch.zeros(vocab_size, dtype=torch.bool)
        n = min(vocab_size, bits.numel())
        out[:n] = bits[:n]
        if self.m.is_accepting():
            out |= self._stops[:vocab_size]
        return out

    def advance(self, tokens) -> int:
        if self.ended:
            return 0
        tokens = [int(t) for t in tokens]
        valid = next((i for i, t in enumerate(tokens) if not 0 <= t < self.n_vocab), len(tokens))
        tokens = tokens[:valid]  # an id past the vocabulary is refused like any the grammar refuses
        n = self.m.try_consume_tokens(tokens)
        if n < len(tokens) and tokens[n] in self.stop_ids and self.m.is_accepting():
            self.ended = True
            n += 1
        return n

    def rollback(self, n: int) -> None:
        if n and self.ended:
            self.ended, n = False, n - 1
        if n and not self.m.rollback(n):
            raise RuntimeError(f"output constraint: could not roll back {n} tokens: {self.m.get_error()}")


class Compiler:
    """Compiles constraints for one tokenizer (its llguidance view is built once) and a model
    vocabulary of `vocab_size` ids (it may pad the tokenizer's)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int] | set[int] = frozenset()):
        # the matcher's vocabulary covers the model's: ids an lm_head pads past the tokenizer are
        # ids the grammar never allows (and a draft that proposes one is refused, not an error)
        self.n_vocab = max(vocab_size, len(tokenizer))
        try:
            self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.n_vocab)
        except ValueError as exc:
            raise WorkloadError(f"structured output needs a fast (Rust) tokenizer: {exc}") from None
        self.vocab_size = vocab_size
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.stop_ids = frozenset(eos | set(eos_token_ids))
        self._grammars: dict[OutputConstraint, str] = {}

    def matcher(self, constraint: OutputConstraint, prompt_id: str) -> Matcher:
        """A fresh matcher for one request (`prompt_id` names it in an error)."""
        if constraint not in self._grammars:
            self._grammars[constraint] = grammar_text(constraint)
        m = llguidance.LLMatcher(self.tokenizer, self._grammars[constraint], log_level=0)
        if m.is_error():
            raise WorkloadError(f"prompt {prompt_id!r}: its {constraint.kind} does not compile: "
                                f"{m.get_error().splitlines()[0]}")
        return Matcher(m, self.stop_ids, self.n_vocab)

    def check(self, constraints: Iterable[tuple[OutputConstraint, str]]) -> None:
        """Compile every (constraint, prompt id) once before anything is measured, so a grammar
        llguidance refuses stops the run in one line up front, not in its middle."""
        for constraint, prompt_id in constraints:
            if constraint not in self._grammars:
                self.matcher(constraint, prompt_id)
