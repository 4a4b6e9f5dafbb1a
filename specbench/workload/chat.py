"""Chat-form prompts: a list of messages (OpenAI `role`/`content`, ShareGPT `from`/`value`)
or of turns (MT-bench / Spec-Bench `turns`, all the user's) becomes the messages up to the
first user turn (leading system messages kept, assistant turns before it dropped) and the
user's later turns, which `specbench run --turns` replays with the model's own answers. Later
turns must alternate with the assistant's (tool messages belong to its turn); where they do not,
a replay of later turns is refused with one line naming the file, row, field and index.
"""

from __future__ import annotations

from typing import Any, Mapping

from specbench.errors import WorkloadError

_ROLES = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant", "bot": "assistant",
    "system": "system",
    "tool": "tool", "function": "tool", "ipython": "tool",
}


def _content(value: Any, where: str, field: str) -> str:
    """Message content: a string, or OpenAI content parts whose text parts are joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text", "") if isinstance(p, Mapping) else p for p in value]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(p for p in parts if p)
    raise WorkloadError(f"{where}: field {field!r}: message content must be a string or a list "
                        f"of text parts, got {type(value).__name__}")


def chat_prompt(value: list, where: str, field: str
                 ) -> tuple[str | None, tuple[dict, ...] | None, tuple[str, ...], str | None]:
    """(text, messages up to the first user turn, later user turns, why the later turns stop
    short or None) from a list of turns (strings) or messages (objects). The later turns are
    read up to the first that breaks the alternation; that is an error only for a replay of
    later turns (`--turns`), so a file run on first turns loads as before."""
    if all(isinstance(v, str) for v in value):  # MT-bench / Spec-Bench `turns`: all the user's
        turns = [v for v in value if v.strip()]
        return (turns[0] if turns else None), None, tuple(turns[1:]), None
    messages: list[dict[str, str]] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise WorkloadError(f"{where}: field {field!r}[{i}] must be a message object or a "
                                f"string turn, got {type(msg).__name__}")
        raw_role = msg.get("role", msg.get("from"))
        role = _ROLES.get(str(raw_role).lower()) if raw_role is not None else None
        if role is None:
            raise WorkloadError(
                f"{where}: field {field!r}[{i}]: unknown role {raw_role!r}; valid: "
                f"{', '.join(sorted(_ROLES))} (as 'role' with 'content', or ShareGPT 'from' "
                "with 'value')")
        content = _content(msg.get("content", msg.get("value")), where, field)
        if role == "system":
            if content.strip():
                messages.append({"role": "system", "content": content})
        elif role == "user":
            if not content.strip():
                return None, None, (), None
            messages.append({"role": "user", "content": content})
            return None, tuple(messages), *_later_user_turns(value, i + 1, where, field)
        # assistant/tool turns before the first user turn (a split conversation) are dropped
    return None, None, (), None  # no user turn


def _later_user_turns(value: list, start: int, where: str, field: str) -> tuple[tuple[str, ...], str | None]:
    """The user turns after the first (from index `start`) while the turns alternate assistant,
    user, assistant, ... (tool messages belong to the assistant's turn), and what stopped them
    (one line naming the file, row, field and index) where something did."""
    later: list[str] = []
    expect, last = "assistant", "user"
    for i in range(start, len(value)):
        msg = value[i]
        raw = msg.get("role", msg.get("from")) if isinstance(msg, Mapping) else None
        role = _ROLES.get(str(raw).lower()) if raw is not None else None
        if role is None or role == "system":
            return tuple(later), (f"{where}: field {field!r}[{i}]: a conversation's later turns are user, assistant "
                                  f"or tool messages, got role {raw!r}")
        previous, last = last, role
        if role == "tool" or (role == "assistant" and previous == "tool"):
            if expect == "user":
                continue  # a tool call's result, and the answer after it: the assistant's turn goes on
            role = "assistant"
        if role != expect:
            return tuple(later), (f"{where}: field {field!r}[{i}]: turns must alternate user and assistant, got "
                                  f"two {role} turns in a row")
        if role == "user":
            try:
                later.append(_content(msg.get("content", msg.get("value")), where, field))
            except WorkloadError as exc:
                return tuple(later), str(exc)
        expect = "user" if role == "assistant" else "assistant"
    return tuple(later), None
