"""`specbench serve` batches: concurrent clients share target passes (continuous batching), and
greedy outputs stay token for token those of the non-speculative baseline, alone or at
concurrency 8, streaming or not."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from specbench.backends.openai import parse_prometheus
from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.loading import load_model

PROMPTS = [[(5 * i + j) % 250 + 3 for j in range(4 + 3 * i)] for i in range(8)]
MAX_TOKENS = 48  # long enough that 8 requests sent together overlap for most of their steps


@pytest.fixture(scope="module")
def baseline(tiny_pair):
    """The non-speculative greedy output of every prompt, from the engine in this process."""
    t = load_model(str(tiny_pair[0]), EngineConfig(device="cpu", dtype="float32"))
    engine = Engine(t.model, eos_token_ids=t.eos_token_ids, max_context=t.max_context)
    sp = SamplingParams(max_new_tokens=MAX_TOKENS, ignore_eos=True)
    return [engine.generate(p, sp, SpeculativeConfig()).output_ids for p in PROMPTS]


def complete(base: str, prompt: list[int], stream: bool) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            "ignore_eos": True}
    if not stream:
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["choices"][0]["token_ids"]
    ids: list[int] = []
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    ids += c.get("token_ids") or []
    return ids


def counters(base: str) -> tuple[float, float]:
    m = parse_prometheus(httpx.get(base + "/metrics").text)
    return m["specbench:engine_steps_total"][0][1], m["specbench:engine_step_rows_total"][0][1]


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_outputs_equal_the_baseline_alone_and_at_concurrency_8(server, baseline, stream):
    base = server.base_url
    alone = [complete(base, p, stream) for p in PROMPTS]
    assert alone == baseline
    steps0, rows0 = counters(base)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: complete(base, p, stream), PROMPTS))
    assert together == baseline
    steps, rows = counters(base)
    # Concurrent requests shared target passes: more than one row per step on average.
    assert (rows - rows0) / (steps - steps0) > 1.5
