"""Multi-turn replay: the next turn of a conversation, sent with the history so far, the
model's OWN earlier answers included (not the dataset's), as AIPerf's and GuideLLM's
multi-turn modes replay a conversation. Each configuration therefore answers its own history.

`next_turn(request, output_ids, ...)` is turn t + 1 after turn t answered with `output_ids`:
the messages so far, the answer (decoded, special tokens skipped) as the assistant's, then the
next user turn, through the tokenizer's chat template (without one: the texts joined). Its id
is `<conversation>#t<turn>` (so every configuration's turn t pairs up), its seed derived from
the previous turn's. None when the conversation is over or the next turn would not fit the
context (the replay of that conversation ends there).

Boundary: requests and token ids in, a request out (the only other place prompts meet a
tokenizer, after `requests.build_requests`).
"""

from __future__ import annotations

from typing import Any, Sequence

from specbench.types import Request
from specbench.workload.requests import render_chat, request_seed


def next_turn(request: Request, output_ids: Sequence[int], tokenizer: Any, *, use_chat_template: bool = True,
              max_context: int | None = None) -> Request | None:
    if not request.later_turns or request.conversation_id is None:
        return None
    answer = tokenizer.decode(list(output_ids), skip_special_tokens=True)
    user = request.later_turns[0]
    history = request.messages or ({"role": "user", "content": request.prompt_text or ""},)
    messages = (*history, {"role": "assistant", "content": answer}, {"role": "user", "content": user})
    rid = f"{request.conversation_id}#t{request.turn + 1}"
    if use_chat_template and request.messages is not None and getattr(tokenizer, "chat_template", None):
        text = render_chat(tokenizer, messages, rid, (request.structured or {}).get("tools"))
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        kept: tuple[dict[str, str], ...] | None = messages
    else:
        text = f"{request.prompt_text or ''}{answer}\n\n{user}\n\n"
        ids = list(tokenizer.encode(text, add_special_tokens=True))
        kept = None
    if max_context is not None and len(ids) + request.sampling.max_new_tokens > max_context:
        return None
    return Request(
        id=rid, prompt_ids=tuple(ids), sampling=request.sampling.with_(seed=request_seed(request.sampling.seed, rid)),
        category=request.category, workload=request.workload, kind=request.kind, prompt_text=text, messages=kept,
        structured=request.structured, constraint=request.constraint, scenario=request.scenario,
        conversation_id=request.conversation_id, turn=request.turn + 1, later_turns=request.later_turns[1:])
