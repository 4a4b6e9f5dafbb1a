"""Multi-turn replay's inputs: conversations keep every user turn (chat files, MT-bench /
Spec-Bench `turns`, ShareGPT), turns that do not alternate are refused with one line naming
file, line, field and index, and the next turn carries the model's own earlier answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiny
from specbench.config import SamplingParams
from specbench.errors import WorkloadError
from specbench.workload import build_requests, load_workload, packaged
from specbench.workload.conversation import next_turn
from specbench.workload.files import load_file


def write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CHAT = [{"id": "c1", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "dataset answer"},
                                  {"role": "user", "content": "And then?"}, {"role": "assistant", "content": "x"},
                                  {"role": "user", "content": "Last one"}]},
        {"id": "c2", "turns": ["First question", "Second question"]},
        {"id": "c3", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                                       {"from": "human", "value": "Q2"}]}]


def test_every_user_turn_is_kept_and_the_datasets_answers_are_not(tmp_path):
    prompts = {p.id: p for p in load_file(write(tmp_path / "c.jsonl", CHAT))}
    assert prompts["c1"].messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert prompts["c1"].later_turns == ("And then?", "Last one")
    assert prompts["c2"].text == "First question" and prompts["c2"].later_turns == ("Second question",)
    assert prompts["c3"].later_turns == ("Q2",)


@pytest.mark.parametrize("messages,index", [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], 1),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"}], 2),
])
def test_turns_that_do_not_alternate_are_refused_for_a_replay_of_them(tmp_path, messages, index):
    """A file run on first turns loads as it always did; replaying later turns is refused."""
    path = write(tmp_path / "c.jsonl", [{"prompt": "fine"}, {"messages": messages}])
    prompts = load_file(path)
    assert prompts[1].messages[-1]["content"] == "a" and prompts[1].later_turns == ()
    build_requests(load_workload(str(path)), tiny.make_tokenizer(), SamplingParams())
    with pytest.raises(WorkloadError, match=rf"c.jsonl:2: field 'messages'\[{index}\]: turns must alternate user and "
                                            r"assistant, got two \w+ turns in a row"):
        build_requests(load_workload(str(path)), tiny.make_tokenizer(), SamplingParams(), turns=2)


def test_a_tool_result_belongs_to_the_assistants_turn(tmp_path):
    conv = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "calling"},
            {"role": "tool", "content": "12 C"}, {"role": "assistant", "content": "12 C"},
            {"role": "user", "content": "thanks"}]
    (p,) = load_file(write(tmp_path / "c.jsonl", [{"messages": conv}]))
    assert p.later_turns == ("thanks",)


def test_the_next_turn_sends_the_history_with_the_models_own_answer(tmp_path):
    tok = tiny.make_tokenizer()
    wl = load_workload(str(write(tmp_path / "c.jsonl", CHAT)))
    reqs, _ = build_requests(wl, tok, SamplingParams(max_new_tokens=8), turns=3)
    first = reqs[0]
    assert first.id == "c1" and first.conversation_id == "c1" and first.turn == 1
    own = tok.encode(" my own reply", add_special_tokens=False)
    second = next_turn(first, own, tok)
    assert second.id == "c1#t2" and second.turn == 2 and second.later_turns == ("Last one",)
    assert [m["content"] for m in second.messages] == ["Be brief.", "Hi", " my own reply", "And then?"]
    assert tok.decode(second.prompt_ids).endswith("<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n")
    assert "dataset answer" not in second.prompt_text
    assert second.sampling.seed != first.sampling.seed and len(second.prompt_ids) > len(first.prompt_ids)
    third = next_turn(second, own, tok)
    assert third.id == "c1#t3" and next_turn(third, own, tok) is None  # the conversation is over
    assert next_turn(second, own, tok, max_context=len(third.prompt_ids) + 7) is None  # would not fit
    single, _ = build_requests(wl, tok, SamplingParams(max_new_tokens=8))
    assert single[0].conversation_id is None and next_turn(single[0], own, tok) is None


def test_sharegpt_conversations_keep_their_later_turns():
    prompts = packaged.sharegpt_prompts(40, seed=0)
    assert sum(1 for p in prompts if p.later_turns) >= 10
    assert all(t.strip() for p in prompts for t in p.later_turns)
