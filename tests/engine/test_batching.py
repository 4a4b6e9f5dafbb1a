"""Continuous batching on the one decode path: outputs at concurrency 1..8 equal a request
decoded alone, rows with ragged acceptance roll back independently in their KV slots, the
cache never copies or grows per step, closed-loop TTFT includes the wait for earlier
prefills, and no request is dropped or duplicated."""

from dataclasses import replace

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine.model import ModelRunner
from specbench.engine import scheduler
from specbench.config import MAX_PREFILL_TOKENS
from specbench.engine.rows import Admission

PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3], [7, 7, 7, 7, 8, 9, 10, 7, 7], [11, 30, 42, 5], [3] * 20,
           list(range(40)), [5, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7], [20, 21, 22, 23] * 3]
BUDGETS = [30, 17, 40, 5, 25, 33, 1, 28]
SPECS = {
    "none": SpeculativeConfig(),
    "draft_model": SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d"),
    "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=3),
    "dynamic_k": SpeculativeConfig(method="draft_model", num_speculative_tokens=6, draft="d", dynamic_k=True),
    "confidence": SpeculativeConfig(method="draft_model", num_speculative_tokens=6, draft="d",
                                    draft_confidence_threshold=0.5),
}


@pytest.fixture(scope="module")
def models():
    target = tiny.make_model(vocab_size=64, seed=0)
    return target, tiny.perturbed_copy(target, 0.05, seed=1)


@pytest.fixture(scope="module")
def engine(models):
    return Engine(*models)


def requests(temperature=0.0):
    return [(p, SamplingParams(max_new_tokens=n, temperature=temperature, seed=i))
            for i, (p, n) in enumerate(zip(PROMPTS, BUDGETS))]


@pytest.mark.parametrize("method", sorted(SPECS))
def test_greedy_outputs_independent_of_concurrency(engine, method):
    spec = SPECS[method]
    reqs = requests()
    baseline = [engine.generate(p, sp, SPECS["none"]).output_ids for p, sp in reqs]
    for c in (1, 2, 4, 8):
        results, stats = scheduler.run(engine, reqs, spec, concurrency=c)
        assert [r.output_ids for r in results] == baseline, f"concurrency {c}"
        assert max(stats.batch_sizes) == min(c, sum(1 for n in BUDGETS if n > 1))


@pytest.mark.parametrize("method", ["draft_model", "ngram", "dynamic_k"])
def test_sampled_request_depends_on_its_seed_not_its_batch(engine, method):
    spec = SPECS[method]
    reqs = requests(temperature=0.8)
    alone = [scheduler.run(engine, [r], spec)[0][0].output_ids for r in reqs]
    for c in (2, 4, 8):
        results = scheduler.run(engine, reqs, spec, concurrency=c)[0]
        together = [r.output_ids for r in results]
        assert together == alone, f"concurrency {c}"
        if method == "dynamic_k":  # the case measures dynamic k: it drafts other lengths than fixed k
            fixed = scheduler.run(engine, reqs, replace(spec, dynamic_k=False), concurrency=c)[0]
            assert [[s.drafted for s in r.steps] for r in results] != [[s.drafted for s in r.steps] for r in fixed]
    # Same seed, different batch mates (reversed order): same tokens.
    reverse = [r.output_ids for r in scheduler.run(engine, reqs[::-1], spec, concurrency=4)[0]][::-1]
    assert reverse == alone


def test_every_request_finishes_exactly_once_with_early_eos(models):
    target, draft = models
    base = Engine(target, draft).generate(PROMPTS[0], SamplingParams(max_new_tokens=30), SPECS["none"]).output_ids
    eos = base[6]  # some rows stop early on it while others run on
    engine = Engine(target, draft, eos_token_ids=[eos])
    finished = []
    results, _ = scheduler.run(engine, requests(), SPECS["draft_model"], concurrency=3,
                            on_finish=lambda i, g: finished.append(i))
    assert sorted(finished) == list(range(len(PROMPTS)))
    assert all(r is not None for r in results)
    for (p, sp), r in zip(requests(), results):
        assert r.output_ids == engine.generate(p, sp, SPECS["none"]).output_ids
        assert len(r.token_times) == len(r.output_ids)
        assert r.arrival_time <= r.start_time <= r.token_times[0]


def test_disable_by_batch_size_turns_speculation_off_above_the_threshold(engine):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, disable_by_batch_size=2)
    results, stats = scheduler.run(engine, requests(), spec, concurrency=4)
    steps = [s for r in results for s in r.steps]
    assert max(stats.batch_sizes) == 4
    assert all(s.drafted == 0 for s in steps if s.batch_size > 2)
    assert any(s.drafted > 0 for s in steps)  # drafting resumed once 2 or fewer rows remained
    expected = [engine.generate(p, sp, SPECS["none"]).output_ids for p, sp in requests()]
    assert [r.output_ids for r in results] == expected


def test_dynamic_k_stays_within_bounds(engine):
    results, _ = scheduler.run(engine, requests(), SPECS["dynamic_k"], concurrency=4)
    drafted = [s.drafted for r in results for s in r.steps]
    assert max(drafted) <= 6 and len(set(drafted)) > 1
    # The single-request path adapts k the same way (one decode path): 6, then it moves.
    g = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=30), SPECS["dynamic_k"])
    assert g.steps[0].drafted == 6 and len({s.drafted for s in g.steps}) > 1


def test_per_step_facts_are_recorded(engine):
    results, stats = scheduler.run(engine, requests(), SPECS["draft_model"], concurrency=4)
    for (p, _), r in zip(requests(), results):
        context = len(p) + 1  # the prefill emitted one token
        for s in r.steps:
            assert s.context_tokens == context and 1 <= s.batch_size <= 4
            context += s.emitted
    assert sum(stats.batch_sizes.values()) == stats.steps
    assert stats.step_s >= stats.draft_s + stats.verify_s > 0


def test_open_loop_arrivals_are_seeded_and_queue_time_is_recorded(engine):
    reqs = requests()[:4]
    a, _ = scheduler.run(engine, reqs, SPECS["none"], concurrency=4, request_rate=50.0, rate_seed=3)
    gaps_a = [r.arrival_time - a[0].arrival_time for r in a]
    b, _ = scheduler.run(engine, reqs, SPECS["none"], concurrency=4, request_rate=50.0, rate_seed=3)
    gaps_b = [r.arrival_time - b[0].arrival_time for r in b]
    assert gaps_a == pytest.approx(gaps_b, abs=1e-9)
    assert all(r.start_time >= r.arrival_time for r in a)
    assert sorted(gaps_a) == gaps_a and gaps_a[-1] > 0


@pytest.mark.parametrize("budget,per_pass", [(MAX_PREFILL_TOKENS, 6), (1200, 2), (500, 1)])
def test_a_turns_admissions_share_prefill_passes_up_to_the_token_budget(budget, per_pass):
    """Long prompts admitted in one turn are prefilled together, as many to a pass as the
    token budget holds (a prompt longer than the budget alone): they all arrive at the start;
    one pass's requests share its start, prefill time and first-token time, and each later
    pass's requests wait for the passes ahead (queue time, part of their TTFT)."""
    target = tiny.make_model(vocab_size=64, seed=0, hidden=128, layers=4, max_position_embeddings=2048)
    engine = Engine(target)
    reqs = [([(7 * i + j) % 60 for j in range(600)], SamplingParams(max_new_tokens=4, ignore_eos=True))
            for i in range(6)]
    results, _ = scheduler.run(engine, reqs, SPECS["none"], concurrency=6, max_prefill_tokens=budget)
    assert len({r.arrival_time for r in results}) == 1  # the first wave arrives at the start
    passes = [results[i:i + per_pass] for i in range(0, 6, per_pass)]
    for one in passes:
        for key in (lambda r: r.start_time, lambda r: r.prefill_time_s, lambda r: r.token_times[0]):
            assert len({key(r) for r in one}) == 1
    for n in range(1, len(passes)):
        before, after = passes[n - 1][0], passes[n][0]
        assert after.start_time - after.arrival_time >= sum(p[0].prefill_time_s for p in passes[:n]) * 0.99
        assert after.token_times[0] - before.token_times[0] >= after.prefill_time_s * 0.99


def test_a_later_wave_arrives_when_its_slot_frees():
    target = tiny.make_model(vocab_size=64, seed=0, hidden=128, layers=4, max_position_embeddings=2048)
    engine = Engine(target)
    reqs = [([(7 * i + j) % 60 for j in range(600)], SamplingParams(max_new_tokens=4, ignore_eos=True))
            for i in range(6)]
    # A later wave arrives when the slot it takes frees: the last token of the request it replaces.
    results, _ = scheduler.run(engine, reqs, SPECS["none"], concurrency=2)
    frees = sorted(r.token_times[-1] for r in results)
    for r in results[2:]:
        assert any(abs(r.arrival_time - f) < 1e-9 for f in frees)


def test_kv_slots_never_grow_or_copy_per_step(engine):
    cache = engine.target_runner.cache
    for spec in (SPECS["none"], SPECS["draft_model"]):
        scheduler.run(engine, requests(), spec, concurrency=4)  # reserves what the requests need
        allocations, moves = cache.allocations, cache.moves
        results, stats = scheduler.run(engine, requests(), spec, concurrency=4)
        assert cache.allocations == allocations, "the cache grew although it had room"
        # Only a finished row's slot is refilled, by moving one surviving row into it.
        assert cache.moves - moves <= len(results)
        assert stats.steps > cache.moves - moves


def test_slots_with_ragged_rollback_match_a_compact_sequence(models):
    """Rows that keep different numbers of positions, are rolled back and moved between
    slots, must give the logits of each row's compact sequence."""
    target = models[0]
    runner = ModelRunner(target, rows=3, capacity=8)
    seqs = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
    with torch.inference_mode():
        for b, s in enumerate(seqs):
            runner.forward(torch.tensor([s]), slice(b, b + 1), torch.tensor([0]), positions=None, prefill=True)
        feed = torch.tensor([[20, 21, 22], [23, 0, 0], [24, 25, 0]])  # ragged: 3, 1, 2 real tokens
        logits, _ = runner.forward(feed, slice(0, 3), torch.tensor([5, 3, 7]))
        for b, real in enumerate([3, 1, 2]):
            ref = target(torch.tensor([seqs[b] + feed[b, :real].tolist()])).logits[0, -real:]
            assert torch.allclose(logits[b, :real], ref, atol=1e-4)
        # Row 0 keeps 20 (drops 21 22), row 1 keeps 23, row 2 keeps none of 24 25.
        kept = [seqs[0] + [20], seqs[1] + [23], seqs[2]]
        logits, _ = runner.forward(torch.tensor([[30], [31], [32]]), slice(0, 3),
                                   torch.tensor([len(k) for k in kept]))
        for b, s in enumerate(kept):
            ref = target(torch.tensor([s + [30 + b]])).logits[0, -1]
            assert torch.allclose(logits[b, 0], ref, atol=1e-4)
        runner.cache.move_row(2, 0, len(kept[2]) + 1)  # row 2 takes slot 0
        logits, _ = runner.forward(torch.tensor([[40]]), slice(0, 1), torch.tensor([len(kept[2]) + 1]))
        ref = target(torch.tensor([kept[2] + [32, 40]])).logits[0, -1]
        assert torch.allclose(logits[0, 0], ref, atol=1e-4)



def _arch(name: str) -> tuple[torch.nn.Module, list[int | None]]:
    """A tiny model of architecture `name` and the sliding window of each of its 2 layers."""
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM)

    if name == "qwen2":
        return tiny.make_model(vocab_size=64, seed=3), [None, None]
    torch.manual_seed(3)
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa",
                  dtype="float32")
    # Qwen2 and Qwen2-MoE: one layer full, one with a 6-token window (by their configs' layer
    # types). Qwen2-MoE's attention does not pass its window to the attention interface; its
    # decoder masks by layer type.
    sliding = dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval(), [None, None]
    if name.endswith("-sliding"):
        moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
        model = Qwen2ForCausalLM(Qwen2Config(**common, **sliding)) if name == "qwen2-sliding" else \
            Qwen2MoeForCausalLM(Qwen2MoeConfig(**common, **sliding, **moe))
        windows = [6 if t == "sliding_attention" else None for t in model.config.layer_types]
        assert sorted(windows, key=str) == [6, None]  # one layer of each kind
        return model.eval(), windows
    window = int(name.split("-")[1])
    return MistralForCausalLM(MistralConfig(**common, sliding_window=window)).eval(), [window, window]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "mistral-6", "mistral-64", "qwen2-sliding", "qwen2moe-sliding"])
def test_every_architecture_attends_causally_over_the_slots(monkeypatch, arch):
    """The runner's masks reach the attention whatever the architecture does with masks
    (Llama and Mistral build none for a custom attention, Qwen2-MoE passes no window): prefill
    logits at every position, then a ragged 2-row pass, equal transformers' own forward on each
    row's sequence, sliding windows included (one layer full, one sliding in the same forward).
    A prefill uses SDPA's causal attention without a mask, except where a layer's window is
    shorter than the prompt."""
    from specbench.engine import kv

    model, windows = _arch(arch)
    used = []
    get = kv.ForwardMasks.get

    def spy(self, window):
        used.append((self.prefill, self.width, window, get(self, window)))
        return used[-1][-1]

    monkeypatch.setattr(kv.ForwardMasks, "get", spy)
    runner = ModelRunner(model, rows=2, capacity=32)
    seqs = [[(7 * i + 3) % 64 for i in range(21)], [(5 * i + 1) % 64 for i in range(5)]]
    feed = torch.tensor([[11, 12, 13], [14, 0, 0]])  # ragged: 3 and 1 real tokens
    with torch.inference_mode():
        for row, s in enumerate(seqs):
            logits, _ = runner.forward(torch.tensor([s]), slice(row, row + 1), torch.tensor([0]),
                                       positions="all", prefill=True)
            ref = model(torch.tensor([s])).logits
            assert torch.allclose(logits, ref, atol=1e-4), (row, (logits - ref).abs().max())
        logits, _ = runner.forward(feed, slice(0, 2), torch.tensor([len(s) for s in seqs]))
        for row, real in enumerate([3, 1]):
            ref = model(torch.tensor([seqs[row] + feed[row, :real].tolist()])).logits[0, -real:]
            assert torch.allclose(logits[row, :real], ref, atol=1e-4), (row, (logits[row, :real] - ref).abs().max())
    assert [w for _, _, w, _ in used] == windows * 3  # two prefills and one decode, layer by layer
    for prefill, width, window, mask in used:
        assert (mask is None) == (prefill and (window is None or width <= window))


def test_attention_the_runner_cannot_compute_is_refused():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = tiny.make_model(vocab_size=64, seed=3)
    model.config.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match=r"chunked_attention.*supported: full_attention, sliding_attention"):
        ModelRunner(model)
    gemma2 = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                            attn_logit_softcapping=50.0)).eval()
    with pytest.raises(ValueError, match="Gemma2ForCausalLM: attention logit soft-capping is not supported"):
        ModelRunner(gemma2)
    sinks = tiny.make_model(vocab_size=64, seed=3)
    sinks.model.layers[1].self_attn.sinks = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="attention sinks are not supported"):
        ModelRunner(sinks)


def test_a_drafter_that_fails_midway_through_a_pass_takes_none_of_its_rows(engine):
    """A drafter that adds rows one by one (suffix trees) and fails on the second of a pass's
    rows: admit_many raises and the drafter keeps only the rows that ran before, so the batch
    goes on and the next admissions decode exactly as they would have."""
    spec = SpeculativeConfig(method="suffix", num_speculative_tokens=3)
    reqs = requests()[:3]
    alone = [engine.generate(p, sp, SPECS["none"]).output_ids for p, sp in reqs]
    batch = engine.batch(spec)
    assert batch.admit(*reqs[0]) is None
    real, calls = batch.drafter.add_row, []

    def flaky(row, ids, features):
        calls.append(row)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        real(row, ids, features)

    batch.drafter.add_row = flaky
    with pytest.raises(RuntimeError, match="out of memory"):
        batch.admit_many([Admission(p, sp) for p, sp in reqs[1:]])
    assert calls == [1, 2] and len(batch.rows) == 1 and len(batch.drafter.local) == 1
    batch.drafter.add_row = real
    assert batch.admit_many([Admission(p, sp, tag=i) for i, (p, sp) in enumerate(reqs[1:], start=1)]) == []
    done = {}
    while batch.rows:
        done.update({g.tag: g.output_ids for g in batch.step()})
    assert [done[None]] + [done[1], done[2]] == alone
