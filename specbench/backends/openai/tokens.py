"""Output token ids and one timestamp per token from a streamed response's chunks: the
stream's own token ids when every chunk carried them; else the target's tokenizer applied to
the text, each chunk given the tokens its logprobs counted (or, without counts, what it added
to the tokenized prefix), and the end-of-sequence token appended when the server's usage
counts one more token than the text holds. A chunk of n tokens gives n equal timestamps, so
TTFT, ITL, TPOT and E2E come out of `specbench.metrics` exactly as for the embedded engine.

Boundary: chunks in, (ids, times) out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specbench.backends.openai.sse import Chunk


def output_tokens(chunks: list[Chunk], usage: dict | None, finish: str | None, tokenizer: Any,
                  eos_token_ids: Sequence[int]) -> tuple[list[int], list[float]]:
    """Output ids and one timestamp per token; a chunk of n tokens gives n equal times."""
    if chunks and all(c.ids is not None for c in chunks):
        ids = [i for c in chunks for i in c.ids]  # type: ignore[union-attr]
        return ids, [c.t for c in chunks for _ in c.ids]  # type: ignore[union-attr]
    text = "".join(c.text for c in chunks)
    tok = tokenizer
    ids = list(tok.encode(text, add_special_tokens=False)) if tok is not None else []
    if all(c.n is not None for c in chunks):
        counts = [int(c.n) for c in chunks]  # type: ignore[arg-type]
    else:
        # Token boundaries of each prefix: a chunk's tokens are what it added to the count.
        counts, seen, cum = [], 0, ""
        for c in chunks:
            cum += c.text
            n = len(tok.encode(cum, add_special_tokens=False)) if tok is not None else 0
            counts.append(max(n - seen, 0))
            seen = max(seen, n)
    usage_n = (usage or {}).get("completion_tokens")
    if isinstance(usage_n, int) and usage_n == len(ids) + 1 and finish == "stop" and eos_token_ids:
        ids.append(eos_token_ids[0])  # the end-of-sequence token has no text
    times = [c.t for c, n in zip(chunks, counts) for _ in range(n)][: len(ids)]
    if chunks and len(times) < len(ids):
        times += [chunks[-1].t] * (len(ids) - len(times))
    return ids, times
