"""Medusa through the engine: heads trained Medusa-1 style (target frozen) on a tiny target's own
outputs and last hidden states draft what the target then accepts on held-out prompts, far
more often than untrained heads (the recipe's initialization: identity blocks, the target's
LM head, which predict the wrong position); the same check fails for untrained heads and for
the trained heads when the engine hands them zeros instead of the target's hidden state.
Greedy output is the baseline's, token for token, whatever the heads, at concurrency 1 and 4.

The tiny target learns a language where each token is a fixed permutation of the token two
places back (x_{n+1} = P[x_{n-1}], 10% noise), so head 0 (x_{t+2} = P[x_t]) and head 1
(x_{t+3} = P[P[x_{t-1}]]) need what the target's last hidden state carries."""

from __future__ import annotations

import random

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine.drafters.medusa import MedusaDrafter
from specbench.models.medusa import build_heads, read_heads, save_heads
from specbench.models.medusa_train import init_heads, last_hidden, medusa_loss
from specbench.engine import scheduler

V = 48
HEADS = 2
SP = SamplingParams(max_new_tokens=24, ignore_eos=True)
LEARNED = 0.75  # acceptance heads that learned the language reach at k = 2


def language(n: int, length: int, seed: int, perm: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (n, length), generator=g)
    noise = torch.rand(n, length, generator=g) < 0.1
    for t in range(2, length):
        x[:, t] = torch.where(noise[:, t], x[:, t], perm[x[:, t - 2]])
    return x


@pytest.fixture(scope="module")
def world():
    return build_world()


def build_world():
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    target = tiny.make_model(vocab_size=V, layers=2, seed=0, init_range=0.02, hidden=64).train()
    opt = torch.optim.AdamW(target.parameters(), lr=3e-3)
    for it in range(150):
        x = language(32, 24, it, perm)
        loss = target(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    target.eval().requires_grad_(False)
    eng = Engine(target, pack=False)
    prompts = language(96, 8, 5, perm).tolist()
    gens, _ = scheduler.run(eng, [(p, SP) for p in prompts], SpeculativeConfig(), concurrency=8)
    seqs = [torch.tensor(p + g.output_ids) for p, g in zip(prompts, gens)]
    hidden = torch.stack([last_hidden(target, s) for s in seqs])
    held_out = language(12, 8, 6, perm).tolist()
    return target, hidden, torch.stack(seqs), held_out


def train(world, steps: int = 250):
    target, hidden, ids, _ = world
    heads = init_heads(target, HEADS, seed=0).train()
    opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=3e-3)
    for it in range(steps):
        idx = torch.tensor(random.Random(it).sample(range(len(ids)), 16))
        loss, _ = medusa_loss(heads, hidden[idx], ids[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def trained(world):
    return train(world)


def acceptance(world, heads, *, blind: bool = False, concurrency: int = 4) -> float:
    target, *_, held_out = world
    eng = Engine(target, head=heads, pack=False)
    drafter = MedusaDrafter(heads, eng.target_runner)
    if blind:
        add_row, commit = drafter.add_row, drafter.commit
        drafter.add_row = lambda row, ids, f: add_row(row, ids, torch.zeros_like(f))
        drafter.commit = lambda acc, valid, f: commit(acc, valid, torch.zeros_like(f))
    spec = SpeculativeConfig(method="medusa", num_speculative_tokens=HEADS, draft="h")
    gens, _ = scheduler.run(eng, [(p, SP) for p in held_out], spec, concurrency=concurrency, drafter=drafter)
    base, _ = scheduler.run(eng, [(p, SP) for p in held_out], SpeculativeConfig(), concurrency=concurrency)
    assert [g.output_ids for g in gens] == [g.output_ids for g in base]  # lossless whatever the heads
    steps = [s for g in gens for s in g.steps]
    return sum(s.accepted for s in steps) / sum(s.drafted for s in steps)


def test_trained_heads_are_accepted_far_more_than_untrained_ones(world, trained):
    target = world[0]
    untrained = acceptance(world, init_heads(target, HEADS, seed=1).eval())
    rate = acceptance(world, trained)
    assert rate >= LEARNED, f"trained heads: acceptance {rate:.3f}"
    assert untrained < LEARNED, f"untrained heads pass the check: {untrained:.3f}"  # the check can fail
    assert rate > untrained + 0.5
    assert acceptance(world, trained, concurrency=1) >= LEARNED


def test_the_heads_need_the_target_hidden_state(world, trained):
    blind = acceptance(world, trained, blind=True)
    assert blind < LEARNED, f"trained heads fed zeros: {blind:.3f}"


def test_k_beyond_the_heads_proposes_one_token_per_head(world, trained):
    target, *_, held_out = world
    eng = Engine(target, head=trained, pack=False)
    spec = SpeculativeConfig(method="medusa", num_speculative_tokens=5, draft="h")
    gens, _ = scheduler.run(eng, [(p, SP) for p in held_out[:3]], spec)
    assert max(s.drafted for g in gens for s in g.steps) == HEADS


def test_saved_heads_load_back_and_draft_the_same(world, trained, tmp_path):
    save_heads(trained, tmp_path / "heads")
    cfg, weights = read_heads(tmp_path / "heads")
    again = build_heads(cfg, weights, tmp_path / "heads")
    h = world[1][:2]
    assert torch.equal(again(h), trained(h))


TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0))  # each head's two best, Medusa's own form


@pytest.mark.parametrize("k,concurrency,sampling,shape", [
    (2, 1, SP, {}), (2, 4, SP, {}), (1, 4, SP, {}), (2, 4, SP.with_(temperature=0.8, top_p=0.9, seed=3), {}),
    (2, 4, SP, {"token_tree": TREE}), (2, 3, SP.with_(temperature=0.8, top_p=0.9, seed=3), {"token_tree": TREE}),
    (2, 4, SP, {"topk": 2, "num_draft_tokens": 4})], ids=["k2-c1", "k2-c4", "k1-c4", "k2-c4-sampled", "tree-c4",
                                                         "tree-c3-sampled", "dynamic-tree-c4"])
def test_the_static_step_drafts_with_the_trained_heads_as_the_eager_step_does(world, trained, k, concurrency,
                                                                              sampling, shape):
    """Medusa on the static step (the target's last hidden state kept per slot on the device,
    the heads' argmax chain or top-ranked tree, one-hot q): greedy, step for step the eager
    step's records, with the heads' learned acceptance (accepted tokens per drafted depth);
    sampled, the same acceptance (the outputs follow the target's distribution:
    tests/engine/test_static.py)."""
    target, *_, held_out = world
    spec = SpeculativeConfig(method="medusa", num_speculative_tokens=k, draft="h", **shape)
    reqs = [(p, sampling.with_(max_new_tokens=8 + 3 * i)) for i, p in enumerate(held_out)]

    def records(engine):
        gens, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency)
        return [(g.output_ids, [(s.drafted, s.accepted, s.first_rejection, s.emitted, s.draft_depth,
                                 s.accepted_ranks) for s in g.steps]) for g in gens]

    static = records(Engine(target, head=trained, static="static"))
    depth = sum(s[4] for _, steps in static for s in steps)
    accepted = sum(s[1] for _, steps in static for s in steps)
    assert depth > 0 and accepted / depth >= LEARNED
    if shape:  # the tree's second-ranked children are taken, not only its best path
        assert any(r > 0 for _, steps in static for s in steps for r in s[5])
    if sampling.greedy:
        assert static == records(Engine(target, head=trained, pack=False))
