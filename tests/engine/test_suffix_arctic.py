"""Our suffix trees against the reference: Arctic Inference's SuffixDecodingCache (what vLLM's
`suffix` method runs), in its own virtualenv, on random repetitive token streams with earlier
requests in the global tree, for several depths, spec factors, minimum probabilities and cache
sizes. Wherever the path is unambiguous, every query's proposed tokens, their
score and the match length must agree (Arctic breaks ties between equally frequent children in its hash
map's order). Skipped, saying why, when no Arctic Inference interpreter is given
(SPECBENCH_ARCTIC_PYTHON; .ci/run builds one)."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbench.engine.drafters.suffix import SuffixCache, SuffixDrafter

ARCTIC = os.environ.get("SPECBENCH_ARCTIC_PYTHON")
pytestmark = pytest.mark.skipif(
    not ARCTIC or not Path(ARCTIC).exists(),
    reason="no Arctic Inference interpreter: set SPECBENCH_ARCTIC_PYTHON (.ci/run builds one)")


def stream(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Random text with repeats: phrases drawn from a small phrase book, some noise."""
    book = [[rng.randrange(vocab) for _ in range(rng.randint(2, 6))] for _ in range(6)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(book) if rng.random() < 0.8 else [rng.randrange(vocab)]
    return out[:n]


def job(seed: int, depth: int, max_cached: int, factor: float, min_prob: float) -> dict:
    rng = random.Random(seed)
    earlier = [stream(rng, rng.randint(5, 40), 12) for _ in range(8)]
    prompts = [stream(rng, rng.randint(3, 20), 12) for _ in range(8)]
    queries = [{"prompt": stream(rng, rng.randint(4, 30), 12), "output": stream(rng, rng.randint(1, 30), 12),
                "k": rng.randint(1, 10)} for _ in range(40)]
    return {"depth": depth, "max_cached": max_cached, "factor": factor, "min_prob": min_prob,
            "earlier": earlier, "earlier_prompts": prompts, "queries": queries}


def ours(j: dict) -> list[dict]:
    cache = SuffixCache(j["depth"], j["max_cached"])
    for prompt, out in zip(j["earlier_prompts"], j["earlier"]):
        d = SuffixDrafter(cache, j["factor"], j["min_prob"])
        d.add_row(0, prompt, None)
        d.propose([SimpleNamespace(ids=prompt + out)], [0])
        d.retain([])
    answers = []
    for q in j["queries"]:
        d = SuffixDrafter(cache, j["factor"], j["min_prob"])
        d.add_row(0, q["prompt"], None)
        ids = q["prompt"] + q["output"]
        d.propose([SimpleNamespace(ids=ids)], [0])  # feed the output into both trees
        cands = d.candidates(0, ids, q["k"])
        best = max(cands, key=lambda c: c.score, default=None)
        tie = best is not None and _ambiguous(d, cache, best, ids)
        answers.append({"tokens": best.tokens if best else [], "score": best.score if best else 0.0,
                        "match_len": best.match_len if best else 0, "ambiguous": tie})
        d.retain([])
    return answers


def _ambiguous(d, cache, cand, ids) -> bool:
    """Whether following the most frequent child met a tie on `cand`'s path (or two match
    lengths / trees reach the best score), where Arctic's choice is its hash map's."""
    tree = d.local[0] if cand.source == "prompt" else cache.tree
    node = tree._match(ids[len(ids) - cand.match_len:])
    for tok in cand.tokens:
        counts = [c.count for c in node.children.values()]
        if counts.count(max(counts)) > 1:
            return True
        node = node.children[tok]
    scores = [c.score for c in d.candidates(0, ids, len(cand.tokens) + 10)]
    return sum(abs(s - cand.score) < 1e-4 for s in scores) > 1


@pytest.mark.parametrize("seed,depth,max_cached,factor,min_prob", [
    (0, 24, 10000, 1.0, 0.1), (1, 8, 10000, 2.0, 0.0), (2, 24, 3, 1.0, 0.3), (3, 5, 0, 4.0, 0.05),
    (4, 64, 10000, 0.5, 0.1),
])
def test_speculation_matches_arctic_inference(seed, depth, max_cached, factor, min_prob):
    j = job(seed, depth, max_cached, factor, min_prob)
    ref = json.loads(subprocess.run([ARCTIC, str(Path(__file__).with_name("arctic_reference.py"))],
                                    input=json.dumps(j), capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    got = ours(j)
    compared = 0
    for i, (a, b) in enumerate(zip(got, ref)):
        if not a["ambiguous"]:  # (after a tie the paths, and so the scores, may part)
            assert a["score"] == pytest.approx(b["score"], abs=1e-4), (i, a, b)
            assert a["tokens"] == b["tokens"], (i, a, b)
            if a["tokens"]:  # (an empty proposal's match length means nothing)
                assert a["match_len"] == b["match_len"], (i, a, b)
            compared += 1
    assert compared >= len(got) // 4, compared  # many queries are compared token for token
    assert sum(1 for a in got if a["tokens"]) >= len(got) // 2  # and most propose something
