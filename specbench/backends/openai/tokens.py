"""Output token ids and one timestamp per token from a streamed response's chunks, in time
linear in the output (called once per request, after its stream ended).

Ids: the stream's own token ids when every chunk carried them, else the target's tokenizer
applied to the whole text once. Token count: the server's `usage.completion_tokens` when the
stream has one (it is authoritative: text can re-tokenize differently from the tokens sent,
with byte-level BPE merges or special tokens), else the ids counted. Per chunk: the tokens it
carried (token ids / logprobs), else one per content chunk when that adds up to the server's
count (servers stream one token per chunk), else the tokens of the re-tokenized text that end
inside it (offsets of one encode; never an encode per prefix), the first content chunk at
least one. A chunk of n tokens gives n equal timestamps, so TTFT, ITL, TPOT and E2E come out
of `specbench.metrics` exactly as for the embedded engine; `token_count_delta` is the
server's count minus the client's own (None without usage).

Boundary: chunks in, (ids, times, delta) out.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from specbench.backends.openai.sse import Chunk


def _encode(tok: Any, text: str) -> tuple[list[int], list[int] | None]:
    """Token ids of `text` and, when the tokenizer gives offsets, each token's end offset."""
    if tok is None:
        return [], None
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [int(e) for _, e in enc["offset_mapping"]]
    except (TypeError, ValueError, KeyError, NotImplementedError):
        return list(tok.encode(text, add_special_tokens=False)), None


def _counts_from_text(chunks: list[Chunk], ids: list[int], ends: list[int] | None, tok: Any) -> list[int]:
    """Tokens of the re-tokenized text ending inside each chunk."""
    if ends is None:  # a slow tokenizer without offsets: token boundaries of each prefix
        counts, seen, cum = [], 0, ""
        for c in chunks:
            cum += c.text
            n = len(tok.encode(cum, add_special_tokens=False)) if tok is not None else 0
            counts.append(max(n - seen, 0))
            seen = max(seen, n)
        return counts
    bounds, pos = [], 0
    for c in chunks:
        pos += len(c.text)
        bounds.append(pos)
    counts = [0] * len(chunks)
    for e in ends:  # a token belongs to the chunk its last character arrived in
        counts[min(bisect.bisect_left(bounds, e), len(chunks) - 1)] += 1
    return counts


def output_tokens(chunks: list[Chunk], usage: dict | None, finish: str | None, tokenizer: Any,
                  eos_token_ids: Sequence[int]) -> tuple[list[int], list[float], int | None]:
    """(output ids, one timestamp per token, server count minus client count or None)."""
    usage_n = (usage or {}).get("completion_tokens")
    usage_n = usage_n if isinstance(usage_n, int) and not isinstance(usage_n, bool) and usage_n >= 0 else None
    if chunks and all(c.ids is not None for c in chunks):
        ids = [i for c in chunks for i in c.ids]  # type: ignore[union-attr]
        times = [c.t for c in chunks for _ in c.ids]  # type: ignore[union-attr]
        return ids, times, (usage_n - len(ids)) if usage_n is not None else None
    text = "".join(c.text for c in chunks)
    ids, ends = _encode(tokenizer, text)
    if all(c.n is not None for c in chunks):
        counts = [int(c.n) for c in chunks]  # type: ignore[arg-type]
        client_n = sum(counts)
    else:
        client_n = len(ids)
        content = sum(1 for c in chunks if c.text)
        if usage_n is not None and usage_n in (content, content + 1):  # one token per chunk (+ EOS)
            counts = [1 if c.text else 0 for c in chunks]
        else:
            counts = _counts_from_text(chunks, ids, ends, tokenizer)
        first = next((i for i, c in enumerate(chunks) if c.text), None)
        if first is not None and counts[first] == 0:  # the first token arrived with the first text
            later = next((j for j in range(first + 1, len(counts)) if counts[j]), None)
            counts[first] = 1
            if later is not None:
                counts[later] -= 1
    delta = (usage_n - client_n) if usage_n is not None else None
    if usage_n is not None and usage_n == len(ids) + 1 and finish == "stop" and eos_token_ids:
        ids.append(eos_token_ids[0])  # the end-of-sequence token has no text
    times = [c.t for c, n in zip(chunks, counts) for _ in range(n)]
    total = usage_n if usage_n is not None else len(ids)
    if chunks and len(times) < total:
        times += [chunks[-1].t] * (total - len(times))
    return ids, times[:total], delta
