"""One streamed OpenAI response read into an `Attempt`: the server-sent events split into their
`data:` payloads, each JSON event's choices turned into timed chunks (text, token ids when the
server gives them: `token_ids` as vLLM's `return_token_ids` and `specbench serve`, else
`token_id:N` logprobs as vLLM's `return_tokens_as_token_ids`), and what rides on the events
kept as the server sent it: usage, `specbench serve`'s `spec_decode`, vLLM's
`metrics.speculative_decoding`, SGLang's `meta_info`. A malformed stream raises `Fault`.

Boundary: an aiohttp response (or its raw bytes) in, an `Attempt` out; no retries, no `Result`s.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from dataclasses import dataclass, field

from typing import Any

from aiohttp.client_proto import ResponseHandler

_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


class Fault(Exception):
    """A request failed; `retryable` for 429/5xx/timeouts/dropped streams."""

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status


@dataclass
class Chunk:
    t: float  # perf_counter when the event arrived
    text: str
    ids: list[int] | None  # exact token ids, when the server gave them
    n: int | None  # tokens in this chunk, when the server said (token_ids or logprobs)


@dataclass
class Attempt:
    sent: float  # perf_counter when the client began the request (before connecting)
    wire: float | None = None  # when its body was handed to the socket (None: never written)
    end: float | None = None  # perf_counter when the stream ended (or failed)
    chunks: list[Chunk] = field(default_factory=list)
    finish: str | None = None
    usage: dict | None = None
    spec: dict | None = None  # specbench serve's per-step `spec_decode`
    vllm_spec: dict | None = None  # vLLM's `metrics.speculative_decoding`
    meta_info: dict | None = None  # SGLang's `meta_info`
    tool_calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [name, arguments] streamed
    content: str = ""  # the text streamed as content (a chat's, without its tool calls' arguments)


def error_message(body: str) -> str:
    """The message of an OpenAI/vLLM error body (`{"error": {"message"}}` or
    `{"message"}`), else the body's first line."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"]).splitlines()[0][:300]
        if isinstance(err, str):
            return err[:300]
    first = body.strip().splitlines()[0] if body.strip() else "(empty body)"
    return first[:300]


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """The complete server-sent events in `buf` (each its `data:` payload, lines joined) and
    the incomplete rest. Line ends may be LF, CRLF or CR; bytes are decoded per complete
    event, so a multi-byte character cut between reads is whole again."""
    if b"\r" in buf:
        keep_cr = buf.endswith(b"\r")  # a CRLF cut between reads: wait for the LF
        body = buf[:-1] if keep_cr else buf
        buf = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if keep_cr else b"")
    *blocks, rest = buf.split(b"\n\n")
    out = []
    for block in blocks:
        data = [ln[6:] if ln[5:6] == b" " else ln[5:]
                for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if data:
            out.append(b"\n".join(data))
    return out, rest


def tool_call_pieces(choice: dict) -> list[tuple[int, str, str]]:
    """(index, name piece, arguments piece) of each tool call a streamed chat choice carries
    (OpenAI's `delta.tool_calls`: a name once, the arguments' JSON text in pieces)."""
    out = []
    for call in (choice.get("delta") or {}).get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        index = call.get("index", 0)
        out.append((index if isinstance(index, int) else 0, str(fn.get("name") or ""), str(fn.get("arguments") or "")))
    return out


def choice_content(choice: dict, chat: bool) -> str:
    """The text one streamed choice carries as content (a chat's delta content, without the
    arguments of its tool calls; a completion's text)."""
    return ((choice.get("delta") or {}).get("content") or "") if chat else (choice.get("text") or "")


def chunk_tokens(choice: dict, chat: bool) -> tuple[str, list[int] | None, int | None]:
    """(text, token ids or None, token count or None) of one streamed choice. A chat choice's
    text is its content and any tool-call arguments it streams: both are output tokens."""
    text = choice_content(choice, chat)
    if chat:
        text += "".join(a for _, _, a in tool_call_pieces(choice))
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return text, list(ids), len(ids)
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        toks = lp.get("tokens") if not chat else [c.get("token") for c in (lp.get("content") or [])
                                                   if isinstance(c, dict)]
        if isinstance(toks, list):
            parsed = [_TOKEN_ID.match(t) if isinstance(t, str) else None for t in toks]
            if toks and all(parsed):
                return text, [int(m.group(1)) for m in parsed], len(toks)
            return text, None, len(toks)
    return text, None, None


async def read_stream(resp: Any, chat: bool, att: Attempt) -> None:
    """Fill `att` from a streamed aiohttp response until `[DONE]` or the end of the stream;
    `Fault` for an HTTP error status, a body that is not an event stream, a malformed event
    or an error event."""
    if resp.status != 200:
        body = (await resp.read()).decode("utf-8", "replace")
        retry_after = None
        try:
            retry_after = float(resp.headers.get("retry-after", ""))
        except ValueError:
            pass
        raise Fault(f"HTTP {resp.status}: {error_message(body)}",
                    resp.status == 429 or resp.status >= 500, retry_after, status=resp.status)
    ctype = resp.headers.get("content-type", "")
    if "text/event-stream" not in ctype:
        raise Fault(f"expected an event stream, got {ctype or 'no content-type'} "
                    f"({(await resp.read())[:80]!r})", False)
    handler = getattr(resp.connection, "protocol", None) if resp.connection is not None else None
    if not isinstance(handler, StampingHandler):
        await read_events(resp.content.iter_any(), chat, att)
        return
    # Body bytes that came with the headers, before this, were received at the last read.
    feeds: deque[tuple[float, int]] = deque([(handler.last_read, resp.content.total_bytes)])
    handler.watch = (resp.content, feeds)
    try:
        await read_events(resp.content.iter_any(), chat, att, feeds)
    finally:
        handler.watch = None


class StampingHandler(ResponseHandler):
    """aiohttp's connection protocol, stamping the payload bytes of each read where the socket
    hands them over (its data_received), not when the reading task wakes: when a wave of
    streams gets its events at once, the loop runs every connection's data_received first and
    only then the tasks, each after the ones before it parsed theirs, so a task-side stamp read
    the 64th of 64 first tokens late by the 63 parses before it. `watch`: the response body
    being read and the (stamp, payload bytes) list to fill; `last_read`: when the latest read
    came (the stamp of body bytes that came with the headers)."""

    __slots__ = ("watch", "last_read")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watch: tuple[Any, deque[tuple[float, int]]] | None = None
        self.last_read = 0.0

    def data_received(self, data: bytes) -> None:
        self.last_read = now = time.perf_counter()
        watch = self.watch
        if watch is None:
            return super().data_received(data)
        before = watch[0].total_bytes
        super().data_received(data)
        fed = watch[0].total_bytes - before
        if fed > 0:
            watch[1].append((now, fed))


def _pieces(raw: bytes, now: float, feeds: deque[tuple[float, int]] | None) -> list[tuple[float, bytes]]:
    """`raw` (what one read returned) cut into the pieces the connection received, each with
    its stamp; bytes buffered before the stamps began, or a read that does not add up to them
    (then its stamps are dropped), get `now`."""
    if not feeds:
        return [(now, raw)]
    sizes = [(t, n) for t, n in feeds if n > 0]
    feeds.clear()
    early = len(raw) - sum(n for _, n in sizes)
    if early < 0:
        return [(now, raw)]
    pieces, pos = ([(now, raw[:early])] if early else []), early
    for t, n in sizes:
        pieces.append((t, raw[pos:pos + n]))
        pos += n
    return pieces


async def read_events(body, chat: bool, att: Attempt, feeds: deque[tuple[float, int]] | None = None) -> None:
    """Fill `att` from the raw bytes of an event stream (an async iterator of bytes) until
    `[DONE]` or its end. Each chunk is stamped with the time its bytes were read (`feeds`: the
    stamp and size of each piece as the connection received it, the stamps to use), before
    anything is parsed, so parsing never shows in the timings."""
    buf = b""
    async for raw in body:
        for now, piece in _pieces(raw, time.perf_counter(), feeds):
            buf += piece
            if b"\n" not in piece and b"\r" not in piece:
                continue
            events, buf = split_events(buf)
            for data in events:
                if handle_event(data, now, chat, att):
                    return
    events, rest = split_events(buf + b"\n\n")
    for data in events:
        if handle_event(data, time.perf_counter(), chat, att):
            return


def handle_event(raw: bytes, now: float, chat: bool, att: Attempt) -> bool:
    """One event's payload into `att`; True at `[DONE]`."""
    if raw.strip() == b"[DONE]":
        return True
    data = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise Fault(f"not an OpenAI stream event: {data[:80]!r}", False)
    if obj.get("error"):
        raise Fault(f"server error in stream: {error_message(data)}", True)
    if isinstance(obj.get("usage"), dict):
        att.usage = obj["usage"]
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        att.vllm_spec = metrics["speculative_decoding"]
    if isinstance(obj.get("meta_info"), dict):
        att.meta_info = obj["meta_info"]
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        text, ids, n = chunk_tokens(choice, chat)
        att.content += choice_content(choice, chat)
        for index, name, args in tool_call_pieces(choice) if chat else ():
            call = att.tool_calls.setdefault(index, ["", ""])
            call[0] += name
            call[1] += args
        if text or n:
            att.chunks.append(Chunk(now, text, ids, n))
        if choice.get("finish_reason"):
            att.finish = str(choice["finish_reason"])
        if isinstance(choice.get("spec_decode"), dict):
            att.spec = choice["spec_decode"]
        if isinstance(choice.get("meta_info"), dict):
            att.meta_info = choice["meta_info"]
    return False
