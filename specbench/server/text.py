"""Text <-> token ids for `specbench serve`'s handler threads: one tokenizer shared under a
lock (Hugging Face fast tokenizers are not safe to share across threads), and incremental
detokenization of a stream.

Boundary: the tokenizer only; no HTTP, no engine.
"""

from __future__ import annotations

import threading
from typing import Any


class SharedTokenizer:
    """The served model's tokenizer, every call under one lock."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.lock = threading.Lock()

    @property
    def chat_template(self) -> Any:
        return getattr(self.tokenizer, "chat_template", None)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self.lock:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        with self.lock:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


class Detokenizer:
    """Incremental detokenization (the prefix-offset scheme of vLLM/TGI): text is released
    only once it no longer ends in an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: SharedTokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self.tok.decode(self.ids[self.prefix:self.read])
        text = self.tok.decode(self.ids[self.prefix:])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(before):]
        return ""

    def flush(self) -> str:
        before = self.tok.decode(self.ids[self.prefix:self.read])
        text = self.tok.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(before):] if len(text) > len(before) else ""
