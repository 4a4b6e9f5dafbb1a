"""Arrival traces (specbench.workload.trace): every bad line refused with one line naming the
file, line and field; prompts synthesized to the exact lengths from real text, equal hash ids
the same blocks (shared prefixes really shared); send times from the timestamps, sped up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiny
from specbench.config import SamplingParams
from specbench.errors import WorkloadError
from specbench.workload import load_workload
from specbench.workload.trace import BLOCK_TOKENS, load_trace, trace_requests


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"timestamp": 0, "input_length": 10, "output_length": 4}


@pytest.mark.parametrize("row,message", [
    ({"timestamp": -1, "input_length": 5, "output_length": 2}, r"t.jsonl:2: field 'timestamp' must be a number of ms >= 0"),
    ({"timestamp": 5, "input_length": -3, "output_length": 2}, r"t.jsonl:2: field 'input_length' must be between 1 and"),
    ({"timestamp": 5, "input_length": 3, "output_length": 2.5}, r"t.jsonl:2: field 'output_length' must be an integer"),
    ({"timestamp": 5, "input_length": 3}, r"t.jsonl:2: field 'output_length' must be an integer number of tokens, got None"),
    ({"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": [1, "a"]}, r"field 'hash_ids' must be a list"),
    ({"timestamp": 5, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2]},
     r"t.jsonl:2: 2 hash_ids cover 1024 tokens \(512 each\), fewer than input_length 1100"),
    ("{not json", r"t.jsonl:2: invalid JSON"),
    ([1, 2], r"t.jsonl:2: expected a JSON object"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, row, message):
    with pytest.raises(WorkloadError, match=message):
        load_trace(write(tmp_path / "t.jsonl", [{**GOOD, "timestamp": 0}, row]))


def test_decreasing_timestamps_are_refused(tmp_path):
    rows = [GOOD, {**GOOD, "timestamp": 900}, {**GOOD, "timestamp": 899.5}]
    with pytest.raises(WorkloadError, match=r"t.jsonl:3: field 'timestamp' 899.5 is before the previous line's 900"):
        load_trace(write(tmp_path / "t.jsonl", rows))
    with pytest.raises(WorkloadError, match="empty trace"):
        load_trace(write(tmp_path / "e.jsonl", []))
    with pytest.raises(WorkloadError, match="trace file not found"):
        load_trace(tmp_path / "missing.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(WorkloadError, match=r"bin.jsonl: not UTF-8 text"):
        load_trace(tmp_path / "bin.jsonl")


def test_prompts_have_the_lengths_and_share_the_blocks_the_trace_says(tmp_path):
    rows = [{"timestamp": 1000, "input_length": 700, "output_length": 5, "hash_ids": [7, 8]},
            {"timestamp": 1250, "input_length": 900, "output_length": 3, "hash_ids": [7, 9]},
            {"timestamp": 1250, "input_length": 40, "output_length": 2},
            {"timestamp": 3000, "text_input": "hello there", "output_length": 6}]
    entries = load_trace(write(tmp_path / "t.jsonl", rows))
    tok = tiny.make_tokenizer()
    reqs, schedule = trace_requests(entries, tok, SamplingParams(temperature=0.5, seed=3), load_workload("business"),
                                    speedup=2.0)
    assert [len(r.prompt_ids) for r in reqs] == [700, 900, 40, len(tok.encode("hello there", add_special_tokens=False))]
    assert reqs[0].prompt_ids[:BLOCK_TOKENS] == reqs[1].prompt_ids[:BLOCK_TOKENS]  # block 7, shared
    assert reqs[0].prompt_ids[BLOCK_TOKENS:] != reqs[1].prompt_ids[BLOCK_TOKENS:BLOCK_TOKENS + 188]  # 8 vs 9
    assert reqs[2].prompt_ids != reqs[0].prompt_ids[:40]
    assert schedule == [0.0, 0.125, 0.125, 1.0]  # (ms - first) / 1000 / speedup
    assert [r.sampling.max_new_tokens for r in reqs] == [5, 3, 2, 6]
    assert all(r.sampling.ignore_eos and r.sampling.temperature == 0.5 for r in reqs)
    assert len({r.sampling.seed for r in reqs}) == 4 and len({r.id for r in reqs}) == 4
    again, _ = trace_requests(entries, tok, SamplingParams(temperature=0.5, seed=3), load_workload("business"),
                              speedup=2.0)
    assert [r.prompt_ids for r in again] == [r.prompt_ids for r in reqs]  # reproducible
    with pytest.raises(WorkloadError, match="--trace-speedup must be a number > 0"):
        trace_requests(entries, tok, SamplingParams(), load_workload("business"), speedup=0.0)
