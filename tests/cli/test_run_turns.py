"""`specbench run --turns` on tiny float32 models: each conversation is replayed turn by turn
with the configuration's own answers, one record per turn with its conversation id and turn,
the prompt growing with the history; greedy speculation equals the baseline at every turn;
the console shows acceptance by turn."""

from __future__ import annotations

import json

import pytest

from cli_harness import specbench
from specbench.records import read_run

CONVERSATIONS = [
    {"id": "a", "turns": ["Tell me about tents.", "Which one for two people?", "And the price?"]},
    {"id": "b", "messages": [{"role": "user", "content": "abc abc abc"}, {"role": "assistant", "content": "?"},
                             {"role": "user", "content": "abc abc abc abc"}]},
    {"id": "c", "prompt": "A single prompt."},
]
FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "10"]


@pytest.fixture(scope="module")
def turns_run(tiny_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("turns")
    prompts = d / "conversations.jsonl"
    prompts.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    res = specbench("run", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--method", "draft_model",
                    "-k", "3", "--workload", str(prompts), "--turns", "3", "--concurrency", "2", *FAST,
                    "--out", str(d / "run"))
    assert res.code == 0, res.output
    return res, read_run(d / "run")[0]


def test_one_record_per_turn_with_the_history_growing(turns_run):
    _, df = turns_run
    for _, g in df.groupby("config_id"):
        got = {(r.conversation_id, int(r.turn)): r for r in g.itertuples()}
        assert sorted(got) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
        assert got[("a", 2)].prompt_id == "a#t2" and got[("a", 3)].prompt_id == "a#t3"
        for conv, last in (("a", 3), ("b", 2)):
            sizes = [got[(conv, t)].input_tokens for t in range(1, last + 1)]
            assert sizes == sorted(sizes) and len(set(sizes)) == last  # history + own answer + next turn
        # turn 2's prompt holds turn 1's prompt, the answer (10 tokens or fewer) and the next user turn
        assert got[("a", 2)].input_tokens > got[("a", 1)].input_tokens + len(got[("a", 1)].output_token_ids)


def test_greedy_speculation_equals_the_baseline_at_every_turn(turns_run):
    _, df = turns_run
    outs = {cid: {r.prompt_id: list(r.output_token_ids) for r in g.itertuples()} for cid, g in df.groupby("config_id")}
    assert outs["baseline-c2"] == outs["draft_model-k3-c2"]
    assert (df[~df["is_baseline"]]["token_match_rate"] == 1.0).all()


def test_the_console_shows_acceptance_by_turn(turns_run):
    res, _ = turns_run
    text = " ".join(res.out.replace("│", " ").split())
    assert "By turn (replayed conversations)" in text
    assert "3 draft_model-k3-c2 1" in text and "1 baseline-c2 3" in text


def test_turns_and_a_trace_are_refused_together(tiny_pair, tmp_path):
    res = specbench("run", "--target", str(tiny_pair[0]), "--turns", "2", "--trace", str(tmp_path / "t.jsonl"), *FAST[:-2])
    assert res.code != 0 and "--turns replays conversations, --trace single requests" in res.err
    res = specbench("run", "--target", str(tiny_pair[0]), "--turns", "0", *FAST)
    assert res.code != 0 and "--turns" in res.err and "got 0" in res.err and len(res.err.splitlines()) == 1


def test_the_report_draws_acceptance_by_turn(turns_run, tmp_path):
    res, df = turns_run
    run_dir = [ln.split("records: ")[1].split()[0] for ln in res.out.splitlines() if ln.startswith("records: ")][0]
    out = tmp_path / "r.html"
    rep = specbench("report", str(run_dir), "--out", str(out), "--n-boot", "200")
    assert rep.code == 0, rep.output
    page = out.read_text().replace("\n", "")
    assert 'id="plot-by-turn"' in page and "<td>3</td><td>draft_model-k3-c2</td><td>1</td>" in page
