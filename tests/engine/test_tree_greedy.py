"""Greedy losslessness of draft trees: token-for-token equality with plain decoding for
draft_model, eagle3 and medusa at topk 1, 2 and 4, tree sizes (num_draft_tokens) 4, 8 and 16,
concurrency 1, 4 and 8 on float32 tiny models (the fused CPU layers, and transformers' own),
with static token trees, a confidence threshold and dynamic depth; and sampled requests whose
output depends on their seed, not on their batch."""

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.models.medusa import MedusaConfig, MedusaHeads
from specbench.engine import scheduler

PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3], [7, 7, 7, 7, 8, 9, 10, 7, 7], [11, 30, 42, 5], [3] * 20,
           list(range(40)), [5, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7], [20, 21, 22, 23] * 3]
BUDGETS = [14, 9, 17, 5, 12, 15, 1, 13]


def requests(temperature=0.0):
    return [(p, SamplingParams(max_new_tokens=n, temperature=temperature, seed=i))
            for i, (p, n) in enumerate(zip(PROMPTS, BUDGETS))]


def fresh_pair():
    """The target and its draft, unpacked (an engine fuses and packs its models in place)."""
    target = tiny.make_model(vocab_size=64, seed=0)
    return target, tiny.perturbed_copy(target, 0.1, seed=1)


@pytest.fixture(scope="module")
def engines():
    target, draft = fresh_pair()
    head_target = tiny.make_model(vocab_size=64, seed=0)
    medusa_target = tiny.make_model(vocab_size=64, seed=0)
    torch.manual_seed(6)  # random heads: greedy equality holds whatever they propose
    heads = MedusaHeads(MedusaConfig(num_heads=5, num_layers=1, hidden_size=medusa_target.config.hidden_size,
                                     vocab_size=64, draft_vocab_size=64)).eval()
    return {"draft_model": Engine(target, draft),
            "eagle3": Engine(head_target, head=tiny.make_head(head_target, seed=4)),
            "medusa": Engine(medusa_target, head=heads)}


@pytest.fixture(scope="module")
def baseline(engines):
    return [engines["draft_model"].generate(p, sp, SpeculativeConfig()).output_ids for p, sp in requests()]


def tree(method: str, topk: int, size: int, **knobs) -> SpeculativeConfig:
    depth = size - 1 if topk == 1 else 5  # a chain of size - 1, or a tree 5 deep
    return SpeculativeConfig(method=method, draft="d", num_speculative_tokens=depth, topk=topk,
                             num_draft_tokens=size, **knobs)


@pytest.mark.parametrize("method", ["draft_model", "eagle3", "medusa"])
@pytest.mark.parametrize("topk", [1, 2, 4])
@pytest.mark.parametrize("size", [4, 8, 16])
def test_greedy_trees_equal_plain_decoding(engines, baseline, method, topk, size):
    spec = tree(method, topk, size)
    for c in (1, 4, 8):
        results, _ = scheduler.run(engines[method], requests(), spec, concurrency=c)
        assert [r.output_ids for r in results] == baseline, f"concurrency {c}"
        steps = [s for r in results for s in r.steps if s.drafted]
        assert max(s.drafted for s in steps) <= size - 1
        assert max(s.draft_depth for s in steps) <= spec.num_speculative_tokens
        if topk > 1 and size > 4:
            assert max(s.drafted for s in steps) > max(s.draft_depth for s in steps), "never branched"


@pytest.mark.parametrize("knobs", [
    {"token_tree": ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0))},
    {"draft_confidence_threshold": 0.3},
    {"dynamic_k": True},
])
def test_greedy_static_trees_thresholds_and_dynamic_depth(engines, baseline, knobs):
    if "token_tree" in knobs:
        spec = SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=4, **knobs)
    else:
        spec = tree("draft_model", 2, 8, **knobs)
    for c in (1, 4):
        results, _ = scheduler.run(engines["draft_model"], requests(), spec, concurrency=c)
        assert [r.output_ids for r in results] == baseline, f"concurrency {c}"


def test_greedy_medusa_sparse_tree(engines, baseline):
    """Medusa's form of tree: a static tree of head ranks (vLLM's speculative_token_tree)."""
    spec = SpeculativeConfig(method="medusa", draft="h", num_speculative_tokens=4,
                             token_tree=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)))
    for c in (1, 4):
        results, _ = scheduler.run(engines["medusa"], requests(), spec, concurrency=c)
        assert [r.output_ids for r in results] == baseline, f"concurrency {c}"
        steps = [s for r in results for s in r.steps if s.drafted]
        assert max(s.drafted for s in steps) == 8 and max(s.draft_depth for s in steps) == 4


def test_greedy_trees_on_transformers_layers(baseline):
    eng = Engine(*fresh_pair(), pack=False)
    results, _ = scheduler.run(eng, requests(), tree("draft_model", 4, 8), concurrency=4)
    assert [r.output_ids for r in results] == baseline


@pytest.mark.parametrize("method,topk", [("draft_model", 1), ("draft_model", 4), ("eagle3", 2)])
def test_sampled_tree_request_depends_on_its_seed_not_its_batch(engines, method, topk):
    spec = tree(method, topk, 8)
    reqs = requests(temperature=0.8)
    alone = [scheduler.run(engines[method], [r], spec)[0][0].output_ids for r in reqs]
    together = [r.output_ids for r in scheduler.run(engines[method], reqs, spec, concurrency=8)[0]]
    assert together == alone
