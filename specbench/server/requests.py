"""What a request to `specbench serve` asks for: the JSON body decoded and validated into
prompt token ids and `SamplingParams`, in vLLM's dialect. Anything invalid is an `ApiError`
naming the field: malformed JSON (NaN, numbers past a double, a lone surrogate), a wrong type
or range for any field, a model that is not served, values past the model's context
(`max_tokens`, refused as vLLM refuses it). `max_completion_tokens` stands in for a missing or
null `max_tokens`; sampling fields the engine does not implement (penalties, min_p,
min_tokens, logit_bias, ...) are refused unless they hold their neutral value; fields it does
not know are ignored, as vLLM ignores them.

Boundary: Python objects from JSON in, token ids and `SamplingParams` out; no sockets, no engine.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

from specbench.config import INT32_MAX, SamplingParams
from specbench.errors import ConfigError
from specbench.server.text import SharedTokenizer

_INT64 = (-(2**63), 2**63 - 1)  # seeds: torch.Generator's range, as vLLM validates `seed`
_SAMPLING_EPS = 1e-5  # as vLLM: a smaller temperature is greedy (logits / 1e-320 overflow to inf)
_UNSUPPORTED = ("echo", "best_of", "suffix", "tools", "logit_bias", "response_format", "top_logprobs")
# Sampling fields of vLLM's API the engine's one sampling function does not implement; their
# neutral value changes nothing and is accepted (clients send defaults), any other is refused:
# silently ignoring a penalty would measure a different distribution than the one asked for.
_NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                     "min_p": 0.0, "min_tokens": 0}


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; send a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a double; send a finite number")
    return value


def decode_json(raw: bytes) -> Any:
    """The body's JSON (an empty body is null); NaN, Infinity and numbers past a double's range
    are not JSON here."""
    try:
        return json.loads(raw or b"null", parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON (nested too deeply)") from None
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON ({exc})") from None


def _lone_surrogate(body: Any) -> str | None:
    """Where (`messages[0].content`) the parsed body holds a string that is not valid Unicode:
    a lone surrogate from an escape such as \\ud800, which JSON allows and no tokenizer or
    UTF-8 writer accepts. None when every key and string is valid."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, str):
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError:
                return path or "the body"
        elif isinstance(obj, dict):
            for k, v in obj.items():
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    return f"a key of {path or 'the body'}"
                stack.append((f"{path}.{k}" if path else k, v))
        elif isinstance(obj, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(obj))))
    return None


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}", param=name)
    return value


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{name} must be a number, got {value!r}", param=name)
    try:
        return float(value)
    except OverflowError:  # an integer literal past a double's range
        raise ApiError(400, f"{name} must be a finite number, got an integer of {len(str(value))} digits",
                       param=name) from None


def _flag(name: str, value: Any) -> bool:
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", param=name.split(".")[0])
    return bool(value)


@dataclass
class ParsedRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    stream: bool
    # "none", "final" (stream_options.include_usage: a usage chunk at the end) or "continuous"
    # (also continuous_usage_stats: cumulative usage on every chunk, as vLLM)
    usage: str


@dataclass
class RequestParser:
    """Validates request bodies against the served model."""

    tokenizer: SharedTokenizer
    model_name: str
    max_context: int
    vocab_size: int

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ApiError(400, "messages must be a non-empty list", param="messages")
            clean = []
            for i, m in enumerate(msgs):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise ApiError(400, f"messages[{i}] needs a role (a string) and content", param="messages")
                content = m.get("content")
                if isinstance(content, list):  # content parts: only text is supported
                    if any(not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str)
                           for p in content):
                        raise ApiError(400, f"messages[{i}].content: only text content parts "
                                       '({"type": "text", "text": "..."}) are supported', param="messages")
                    content = "".join(p["text"] for p in content)
                if not isinstance(content, str):
                    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                                   param="messages")
                clean.append({"role": m["role"], "content": content})
            if not self.tokenizer.chat_template:
                raise ApiError(400, "the model has no chat template; use /v1/completions")
            text = self.tokenizer.chat_prompt(clean)
            return self.tokenizer.encode(text, add_special_tokens=False)  # the template holds any BOS
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        elif isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            ids = list(prompt)
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ApiError(400, f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                               param="prompt")
        else:
            raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request)",
                           param="prompt")
        if not ids:
            raise ApiError(400, "empty prompt", param="prompt")
        return ids

    def parse(self, body: Any, chat: bool) -> ParsedRequest:
        """The request a body asks for; ApiError for anything invalid."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        bad = _lone_surrogate(body)
        if bad is not None:
            raise ApiError(400, f"{bad} is not valid Unicode (a lone surrogate such as \\ud800); send UTF-8 text",
                           param=re.split(r"[.\[]", bad)[0] if not bad.startswith(("a key", "the body")) else None)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ApiError(400, f"model must be a string, got {model!r}", param="model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; served: {self.model_name}",
                           "NotFoundError", "model")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or n != 1):
            raise ApiError(400, "n must be 1", param="n")
        for name in _UNSUPPORTED:
            if body.get(name):
                raise ApiError(400, f"{name} is not supported by specbench serve", param=name)
        if body.get("logprobs") not in (None, False):
            raise ApiError(400, "logprobs are not supported by specbench serve (token ids are in "
                           "every chunk's token_ids)", param="logprobs")
        if body.get("stop"):
            raise ApiError(400, "stop strings are not supported; use stop_token_ids", param="stop")
        for name, neutral in _NEUTRAL_SAMPLING.items():
            value = body.get(name)
            if value is None:
                continue
            if _number(name, value) != neutral:
                raise ApiError(400, f"{name} is not supported by specbench serve (its engine samples with "
                               f"temperature, top_p and top_k only); omit it or send {neutral!r}", param=name)
        stream, ignore_eos = _flag("stream", body.get("stream")), _flag("ignore_eos", body.get("ignore_eos"))
        opts = body.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise ApiError(400, f"stream_options must be an object, got {opts!r}", param="stream_options")
        opts = opts or {}
        usage = "none"
        if _flag("stream_options.include_usage", opts.get("include_usage")):
            continuous = _flag("stream_options.continuous_usage_stats", opts.get("continuous_usage_stats"))
            usage = "continuous" if continuous else "final"
        ids = self.prompt_ids(body, chat)
        room = self.max_context - len(ids)
        if room < 1:
            raise ApiError(400, f"prompt of {len(ids)} tokens leaves no room in a context of {self.max_context}",
                           param="prompt")
        limit_name = "max_tokens"
        max_tokens = body.get("max_tokens")
        if max_tokens is None and body.get("max_completion_tokens") is not None:
            # the newer OpenAI name; clients send both, with max_tokens null
            limit_name, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
        if max_tokens is None:  # the OpenAI defaults: the rest of the context (chat), 16 (completions)
            max_tokens = room if chat else min(16, room)
        else:
            max_tokens = _integer(limit_name, max_tokens)
            if max_tokens < 1:
                raise ApiError(400, f"{limit_name} must be >= 1, got {max_tokens}", param=limit_name)
            if max_tokens > room:  # refused, as vLLM refuses it, rather than silently shortened
                raise ApiError(400, f"{limit_name} is too large: {max_tokens}. This model's maximum context length "
                               f"is {self.max_context} tokens and your request has {len(ids)} input tokens "
                               f"({max_tokens} > {self.max_context} - {len(ids)})", param=limit_name)
        temperature = 1.0 if body.get("temperature") is None else _number("temperature", body["temperature"])
        if temperature < 0:
            raise ApiError(400, f"temperature must be >= 0 (0 = greedy), got {temperature:g}", param="temperature")
        if temperature < _SAMPLING_EPS:
            temperature = 0.0
        top_p = 1.0 if body.get("top_p") is None else _number("top_p", body["top_p"])
        if not 0.0 < top_p <= 1.0:
            raise ApiError(400, f"top_p must be in (0, 1], got {top_p:g}", param="top_p")
        top_k = 0 if body.get("top_k") is None else _integer("top_k", body["top_k"])
        if top_k < -1:
            raise ApiError(400, f"top_k must be -1 or 0 (off) or >= 1, got {top_k}", param="top_k")
        seed = body.get("seed")
        if seed is not None and not _INT64[0] <= _integer("seed", seed) <= _INT64[1]:
            raise ApiError(400, f"seed must be an integer in [-2**63, 2**63 - 1] (int64), got {seed}", param="seed")
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
            raise ApiError(400, "stop_token_ids must be a list of token ids", param="stop_token_ids")
        try:
            sampling = SamplingParams(
                # vLLM: -1 = off; a k past any vocabulary keeps every token, which is off too
                temperature=temperature, top_p=top_p, top_k=0 if top_k > INT32_MAX else max(top_k, 0),
                seed=secrets.randbelow(2**31) if seed is None else seed,
                max_new_tokens=max_tokens, stop_token_ids=tuple(stop_ids), ignore_eos=ignore_eos)
        except ConfigError as exc:  # checked above; a rule SamplingParams adds still answers 400
            raise ApiError(400, str(exc)) from None
        return ParsedRequest(ids, sampling, stream, usage)
