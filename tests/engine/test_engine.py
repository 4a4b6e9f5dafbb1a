"""Engine behaviour on tiny float32 models: greedy speculative output equals the baseline
token for token, stops are respected inside accepted bursts, and the per-step events add up."""

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine

VOCAB = 64
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 1, 2, 3],
    [7, 7, 7, 7, 8, 9, 10, 7, 7],
    [11, 30, 42, 5],
]


@pytest.fixture(scope="module")
def models():
    target = tiny.make_model(vocab_size=VOCAB, seed=0)
    return target, tiny.perturbed_copy(target, 0.05, seed=1)


def spec(method, k):
    return SpeculativeConfig(method=method, num_speculative_tokens=k,
                             draft="draft" if method == "draft_model" else None)


@pytest.fixture(scope="module")
def engine(models):
    return Engine(models[0], models[1])


@pytest.fixture(scope="module")
def baselines(engine):
    sp = SamplingParams(max_new_tokens=48)
    return {i: engine.generate(p, sp, SpeculativeConfig()).output_ids for i, p in enumerate(PROMPTS)}


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_output_independent_of_k(engine, baselines, method, k):
    sp = SamplingParams(max_new_tokens=48)
    for i, prompt in enumerate(PROMPTS):
        g = engine.generate(prompt, sp, spec(method, k))
        assert g.output_ids == baselines[i]
        assert sum(s.emitted for s in g.steps) + 1 == len(g.output_ids)
        assert all(0 <= s.accepted <= s.drafted <= k for s in g.steps)
        assert g.target_forward_passes == len(g.steps) + 1


def test_baseline_equals_transformers_greedy(baselines):
    target = tiny.make_model(vocab_size=VOCAB, seed=0)  # the same weights, never packed by the engine
    with torch.inference_mode():
        ref = target.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=48, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    assert ref[0, len(PROMPTS[0]):].tolist() == baselines[0]


def test_identical_draft_accepts_every_draft(models):
    target = models[0]
    engine = Engine(target, target)
    g = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=40), spec("draft_model", 4))
    assert sum(s.drafted for s in g.steps) > 0
    assert all(s.accepted == s.drafted and s.first_rejection == -1 for s in g.steps)
    # Every step emits k+1 tokens except where the budget clips the proposal.
    assert len(g.steps) == 8  # 1 prefill token + 39 tokens at 5 per step = 8 steps (last clipped)


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_eos_inside_accepted_burst_ends_the_output(models, baselines, method):
    target = models[0]
    base = baselines[1]
    eos_pos = 13
    eos = base[eos_pos]
    expected = base[: base.index(eos) + 1]  # stop at its first occurrence, inclusive
    engine = Engine(target, target, eos_token_ids=[eos])  # identical draft: long bursts
    for k in (3, 8):
        g = engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=48), spec(method, k))
        assert g.output_ids == expected
        assert g.finish_reason == "stop"
    # ignore_eos decodes through it; stop_token_ids end it without an EOS.
    plain = Engine(target, target)
    g = plain.generate(PROMPTS[1], SamplingParams(max_new_tokens=48, stop_token_ids=(eos,)), spec(method, 4))
    assert g.output_ids == expected
    g = engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=48, ignore_eos=True), spec(method, 4))
    assert g.output_ids == base and g.finish_reason == "length"


@pytest.mark.parametrize("budget", [1, 2, 3, 5])
def test_k_larger_than_remaining_budget_never_overshoots(models, baselines, budget):
    engine = Engine(models[0], models[0])
    for method in ("draft_model", "ngram"):
        g = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=budget), spec(method, 8))
        assert g.output_ids == baselines[0][:budget]
        assert g.finish_reason == "length"
        assert all(s.drafted <= budget - 1 for s in g.steps)


def test_context_limit_caps_the_output(models):
    engine = Engine(models[0], models[1], max_context=len(PROMPTS[0]) + 5)
    g = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=48), spec("draft_model", 4))
    assert len(g.output_ids) == 5


def test_sampled_output_is_a_function_of_the_seed(engine):
    sp = SamplingParams(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=11)
    s = spec("draft_model", 3)
    a = engine.generate(PROMPTS[2], sp, s).output_ids
    assert engine.generate(PROMPTS[0], sp, s).output_ids != a  # unrelated request in between
    assert engine.generate(PROMPTS[2], sp, s).output_ids == a
    assert engine.generate(PROMPTS[2], sp.with_(seed=12), s).output_ids != a


def test_token_times_are_monotonic_and_bursts_share_a_time(models):
    engine = Engine(models[0], models[0])
    g = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=20), spec("draft_model", 4))
    assert len(g.token_times) == len(g.output_ids)
    assert all(a <= b for a, b in zip(g.token_times, g.token_times[1:]))
    assert len(set(g.token_times)) == 1 + len(g.steps)
    assert g.start_time <= g.token_times[0]
