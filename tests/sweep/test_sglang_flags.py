"""The SGLang flags a profile writes (`serving.sglang_args`) parsed by SGLang's own argument
parser (`ServerArgs.add_cli_args`), and held to the rules SGLang then applies: an algorithm it
knows, a chain's `--speculative-num-draft-tokens` equal to steps + 1 (else SGLang silently
changes it), a tree's node budget within what depth × topk holds, and NGRAM drafted as a chain
(breadth 1; SGLang's default breadth of 10 would make a tree that was never measured).

SGLang is not a dependency of specbench. The parser runs where `SPECBENCH_SGLANG_PATH` names
directories holding the `sglang` package and what its argument parser imports (checked with
sglang 0.5.23: unpack its wheel, then `pip install --no-deps --target DIR orjson pybase64
triton pillow starlette msgspec pyzmq ipython traitlets`); torch and transformers come from
specbench's own environment. Without it the test is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specbench.sweep.serving import sglang_args

PATH = os.environ.get("SPECBENCH_SGLANG_PATH")

CONFIGS = [  # method, draft, k, topk, num_draft_tokens
    ("draft_model", "/models/draft", 3, 1, None),
    ("draft_model", "/models/draft", 5, 4, 8),
    ("eagle3", "/models/head", 3, 1, None),
    ("eagle3", "/models/head", 7, 2, 8),
    ("ngram", None, 4, 1, None),
]

PARSE = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
out = []
for flags in json.loads(sys.stdin.read()):
    ns = vars(p.parse_args(["--model-path", "/models/target", *flags]))
    ns["algorithm_known"] = ns["speculative_algorithm"].upper() in SpeculativeAlgorithm.__members__
    out.append({k: v for k, v in ns.items() if k.startswith("speculative") or k == "algorithm_known"})
print(json.dumps(out))
"""


def sglang_parse(flag_sets: list[list[str]]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PATH, os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(flag_sets), capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def check(parsed: dict, k: int, topk: int, nodes: int | None, method: str) -> None:
    """SGLang's rules for what a profile asks of it (sglang/srt/arg_groups/speculative_hook.py)."""
    assert parsed["algorithm_known"], parsed["speculative_algorithm"]
    if method == "ngram":  # its topk becomes the BFS breadth, its steps num_draft_tokens // breadth
        assert parsed["speculative_ngram_max_bfs_breadth"] == 1 == parsed["speculative_ngram_min_bfs_breadth"]
        assert parsed["speculative_num_draft_tokens"] == k + 1
        return
    assert parsed["speculative_num_steps"] == k and parsed["speculative_eagle_topk"] == topk
    if topk == 1:
        assert parsed["speculative_num_draft_tokens"] == k + 1
    else:
        assert parsed["speculative_num_draft_tokens"] == nodes
        assert 2 <= nodes <= 1 + k * topk


@pytest.mark.skipif(not PATH, reason="SGLang's parser is not available: set SPECBENCH_SGLANG_PATH "
                    "(see this module's docstring)")
def test_profile_flags_parse_with_sglangs_own_parser_and_follow_its_rules():
    flags = [sglang_args(*c) for c in CONFIGS]
    parsed = sglang_parse(flags)
    for (method, _, k, topk, nodes), p in zip(CONFIGS, parsed):
        check(p, k, topk, nodes, method)
    # the rules can fail: the ngram flags without the breadth, as profiles wrote them before,
    # parse, and SGLang would then draft a tree 10 wide
    old = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    (p,) = sglang_parse([old])
    assert p["speculative_ngram_max_bfs_breadth"] == 10
    with pytest.raises(AssertionError):
        check(p, 4, 1, None, "ngram")
