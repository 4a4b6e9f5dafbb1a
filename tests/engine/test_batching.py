"""Continuous batching: outputs at concurrency 2, 4, 8 equal the single-sequence engine's,
rows with ragged acceptance roll back independently, the cache compacts without changing
results, and no request is dropped or duplicated."""

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine.kv import BatchKV, CachedModel
from specbench.engine.scheduler import BatchEngine

PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3], [7, 7, 7, 7, 8, 9, 10, 7, 7], [11, 30, 42, 5], [3] * 20,
           list(range(40)), [5, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7], [20, 21, 22, 23] * 3]
BUDGETS = [30, 17, 40, 5, 25, 33, 1, 28]
SPECS = {
    "none": SpeculativeConfig(),
    "draft_model": SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d"),
    "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=3),
}


@pytest.fixture(scope="module")
def models():
    target = tiny.make_model(vocab_size=64, seed=0)
    return target, tiny.perturbed_copy(target, 0.05, seed=1)


def requests(temperature=0.0):
    return [(p, SamplingParams(max_new_tokens=n, temperature=temperature, seed=i))
            for i, (p, n) in enumerate(zip(PROMPTS, BUDGETS))]


@pytest.mark.parametrize("method", sorted(SPECS))
def test_greedy_outputs_independent_of_concurrency(models, method):
    spec = SPECS[method]
    reqs = requests()
    single = Engine(*models)
    expected = [single.generate(p, sp, spec).output_ids for p, sp in reqs]
    batch = BatchEngine(*models)
    for c in (1, 2, 4, 8):
        results, stats = batch.run(reqs, spec, concurrency=c)
        assert [r.output_ids for r in results] == expected, f"concurrency {c}"
        assert max(stats.batch_sizes) == min(c, sum(1 for n in BUDGETS if n > 1))


def test_sampled_request_depends_on_its_seed_not_its_batch(models):
    spec = SPECS["draft_model"]
    reqs = requests(temperature=0.8)
    batch = BatchEngine(*models)
    alone = [batch.run([r], spec)[0][0].output_ids for r in reqs]
    for c in (2, 4, 8):
        together = [r.output_ids for r in batch.run(reqs, spec, concurrency=c)[0]]
        assert together == alone, f"concurrency {c}"
    # Same seed, different batch mates (reversed order): same tokens.
    reverse = [r.output_ids for r in batch.run(reqs[::-1], spec, concurrency=4)[0]][::-1]
    assert reverse == alone


def test_every_request_finishes_exactly_once_with_early_eos(models):
    target, draft = models
    base = Engine(target, draft).generate(PROMPTS[0], SamplingParams(max_new_tokens=30), SPECS["none"]).output_ids
    eos = base[6]  # some rows stop early on it while others run on
    batch = BatchEngine(target, draft, eos_token_ids=[eos])
    finished = []
    results, _ = batch.run(requests(), SPECS["draft_model"], concurrency=3,
                           on_finish=lambda i, g: finished.append(i))
    assert sorted(finished) == list(range(len(PROMPTS)))
    assert all(r is not None for r in results)
    single = Engine(target, draft, eos_token_ids=[eos])
    for (p, sp), r in zip(requests(), results):
        assert r.output_ids == single.generate(p, sp, SPECS["draft_model"]).output_ids
        assert len(r.token_times) == len(r.output_ids)
        assert r.arrival_time <= r.start_time <= r.token_times[0]


def test_disable_by_batch_size_turns_speculation_off_above_the_threshold(models):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, disable_by_batch_size=2)
    results, stats = BatchEngine(*models).run(requests(), spec, concurrency=4)
    drafted_at = [s.drafted for r in results for s in r.steps]
    assert max(stats.batch_sizes) == 4
    assert any(d > 0 for d in drafted_at)  # drafting resumed once 2 or fewer rows remained
    expected = [Engine(*models).generate(p, sp, SPECS["none"]).output_ids for p, sp in requests()]
    assert [r.output_ids for r in results] == expected


def test_dynamic_k_stays_within_bounds_and_keeps_outputs(models):
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=6, draft="d", dynamic_k=True)
    results, _ = BatchEngine(*models).run(requests(), spec, concurrency=4)
    expected = [Engine(*models).generate(p, sp, SPECS["none"]).output_ids for p, sp in requests()]
    assert [r.output_ids for r in results] == expected
    drafted = [s.drafted for r in results for s in r.steps]
    assert max(drafted) <= 6 and len(set(drafted)) > 1


def test_open_loop_arrivals_are_seeded_and_queue_time_is_recorded(models):
    reqs = requests()[:4]
    be = BatchEngine(*models)
    a, _ = be.run(reqs, SPECS["none"], concurrency=4, request_rate=50.0, rate_seed=3)
    gaps_a = [r.arrival_time - a[0].arrival_time for r in a]
    b, _ = be.run(reqs, SPECS["none"], concurrency=4, request_rate=50.0, rate_seed=3)
    gaps_b = [r.arrival_time - b[0].arrival_time for r in b]
    assert gaps_a == pytest.approx(gaps_b, abs=1e-9)
    assert all(r.start_time >= r.arrival_time for r in a)
    assert sorted(gaps_a) == gaps_a and gaps_a[-1] > 0


def test_ragged_rollback_and_compaction_match_a_compact_sequence(models):
    """Rows that keep different numbers of slots, with holes, then compacted, must give the
    logits of each row's compact sequence."""
    target = models[0]
    seqs = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
    kv = BatchKV(target, torch.device("cpu"))
    with torch.inference_mode():
        for s in seqs:
            row = CachedModel(target, torch.device("cpu"))
            row.forward(s)
            kv.add_row(row)
        kv.forward([[20, 21, 22], [23], [24, 25]])
        kv.truncate(0, len(seqs[0]) + 1)  # keeps 20, drops 21 22
        kv.truncate(2, len(seqs[2]))  # drops 24 25
        kept = [seqs[0] + [20], seqs[1] + [23], seqs[2]]
        kv.settle()
        before = kv.forward([[30], [31], [32]])[:, -1]
        kv.compact()
        for b in range(3):
            kv.truncate(b, len(kept[b]))
        after = kv.forward([[30], [31], [32]])[:, -1]
        for b, s in enumerate(kept):
            ref = target(torch.tensor([s + [30 + b]])).logits[0, -1]
            assert torch.allclose(before[b], ref, atol=1e-4)
            assert torch.allclose(after[b], ref, atol=1e-4)
