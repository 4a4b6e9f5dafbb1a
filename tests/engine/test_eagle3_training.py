"""The feature path really works: a tiny EAGLE-3 head trained (training-time test, the public
recipe) on a tiny target's own hidden states and outputs for a few hundred steps drafts what
the target then accepts on held-out prompts, far more often than an untrained head; the same
acceptance check fails for a head that learned nothing, for a head trained without the
target's features, and for the trained head when the engine hands it zeros instead of them.

The tiny target must have something to learn: a random-weight model's next token is a
chaotic function of its whole context, which no head learns in seconds. So the fixture first
trains a tiny 2-layer target (a few seconds) on a language where each token is a fixed
permutation of the token two places back (x_{n+1} = P[x_{n-1}], 10% noise). Drafting x_{t+2}
from position t then needs x_t, which only the target's features carry: the head reads token
x_{t+1} and the features of position t."""

from __future__ import annotations

import random

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine
from specbench.engine.drafters.eagle3 import Eagle3Drafter
from specbench.engine.model import ModelRunner
from specbench.models.eagle3 import fit_to_target
from specbench.models.eagle3_train import capture, head_config_for, init_head, select_vocabulary, ttt_loss
from specbench.engine import scheduler

V = 48
AUX = (0, 1, 2)  # every layer input of a 2-layer target (0: the embeddings, 2: the last output)
SP = SamplingParams(max_new_tokens=24, ignore_eos=True)
LEARNED = 0.8  # acceptance a head that learned the language reaches (measured: ~0.99)


def language(n: int, length: int, seed: int, perm: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (n, length), generator=g)
    noise = torch.rand(n, length, generator=g) < 0.1
    for t in range(2, length):
        x[:, t] = torch.where(noise[:, t], x[:, t], perm[x[:, t - 2]])
    return x


@pytest.fixture(scope="module")
def world():
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
    with torch.no_grad():
        x = language(64, 24, 10**6, perm)
        follows = (target(input_ids=x).logits.argmax(-1)[:, 1:-1] == perm[x[:, :-2]]).float().mean()
    assert follows > 0.95, "the tiny target did not learn its language"

    # Training data: the target's own greedy continuations of prompts, and its features.
    eng = Engine(target, pack=False)
    train_prompts = language(128, 8, 5, perm).tolist()
    gens, _ = scheduler.run(eng, [(p, SP) for p in train_prompts], SpeculativeConfig(), concurrency=8)
    seqs = [p + g.output_ids for p, g in zip(train_prompts, gens)]
    vocab = select_vocabulary(seqs, V, V)
    runner = ModelRunner(target)
    runner.set_capture(AUX)
    data = []
    for p, s in zip(train_prompts, seqs):
        feats, logits = capture(runner, s)
        valid = torch.zeros(len(s), dtype=torch.bool)
        valid[len(p) - 1:] = True  # the response: what the head will draft
        data.append((feats, torch.tensor(s), logits[:, vocab], valid & torch.isin(logits.argmax(-1), vocab)))
    cfg = head_config_for(target, draft_vocab_size=V, aux_layers=AUX)
    held_out = language(16, 8, 6, perm).tolist()
    return target, cfg, vocab, data, held_out


def train(world, steps: int = 300, zero_features: bool = False):
    target, cfg, vocab, data, _ = world
    head = init_head(target, cfg, vocab, seed=0).train()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    for it in range(steps):
        batch = random.Random(it).sample(data, 8)
        feats, ids, logits, valid = (torch.stack(x) for x in zip(*batch))
        if zero_features:
            feats = torch.zeros_like(feats)
        loss, _ = ttt_loss(head, feats, ids, logits, valid, steps=3)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


def acceptance(world, head, *, blind: bool = False) -> float:
    """Greedy acceptance rate (accepted / drafted) of `head` at k = 3 on the held-out prompts,
    through the engine. `blind`: the drafter receives zeros in place of the target's features."""
    target, *_, held_out = world
    head = fit_to_target(head, target, path="<trained>", target_name="tiny")
    drafter = Eagle3Drafter(head)
    if blind:
        add_row, commit = drafter.add_row, drafter.commit
        drafter.add_row = lambda row, ids, f: add_row(row, ids, torch.zeros_like(f))
        drafter.commit = lambda acc, valid, f: commit(acc, valid, torch.zeros_like(f))
    eng = Engine(target, head=head, pack=False)
    spec = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="h")
    gens, _ = scheduler.run(eng, [(p, SP) for p in held_out], spec, concurrency=4, drafter=drafter)
    base, _ = scheduler.run(eng, [(p, SP) for p in held_out], SpeculativeConfig(), concurrency=4)
    assert [g.output_ids for g in gens] == [g.output_ids for g in base]  # lossless whatever the head
    steps = [s for g in gens for s in g.steps]
    return sum(s.accepted for s in steps) / sum(s.drafted for s in steps)


def learned(rate: float) -> bool:
    return rate >= LEARNED


@pytest.fixture(scope="module")
def trained(world):
    return train(world)


def test_a_trained_head_is_accepted_far_more_than_an_untrained_one(world, trained):
    target, cfg, vocab, *_ = world
    untrained = acceptance(world, init_head(target, cfg, vocab, seed=1).eval())
    rate = acceptance(world, trained)
    assert learned(rate), f"trained head: acceptance {rate:.3f}"
    assert not learned(untrained), f"untrained head passes the check: {untrained:.3f}"  # the check can fail
    assert rate > untrained + 0.6


def test_the_head_needs_the_target_features(world, trained):
    """Without the features (zeros in training, or zeros handed to the trained head by the
    engine) the same check fails: the acceptance comes through the feature path."""
    without = acceptance(world, train(world, zero_features=True))
    blind = acceptance(world, trained, blind=True)
    assert not learned(without), f"head trained on zeros: {without:.3f}"
    assert not learned(blind), f"trained head fed zeros: {blind:.3f}"
    assert acceptance(world, trained) > max(without, blind) + 0.3


TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


@pytest.mark.parametrize("k,concurrency,extra", [
    (3, 1, {}), (3, 4, {}), (4, 4, {"dynamic_k": True}), (3, 4, {"disable_by_batch_size": 2}),
    (3, 4, {"token_tree": TREE}), (3, 3, {"token_tree": TREE, "disable_by_batch_size": 2}),
    (3, 4, {"topk": 2, "num_draft_tokens": 6})], ids=["k3-c1", "k3-c4", "k4-c4-dyn", "k3-c4-off2", "tree-c4",
                                                      "tree-c3-off2", "dynamic-tree-c4"])
def test_the_static_step_drafts_with_the_trained_head_as_the_eager_step_does(world, trained, k, concurrency, extra):
    """EAGLE-3 on the static step (the head's own static KV slots, features captured by the
    static forward, pending features on the device), chains and trees: greedy, step for step
    the eager step's records, with the head's learned acceptance (accepted tokens per drafted
    depth), so the accepting paths are the ones compared (disable_by_batch_size: steps that
    draft nothing, and the pending buffer caught up early)."""
    target, *_, held_out = world
    head = fit_to_target(trained, target, path="<trained>", target_name="tiny")
    spec = SpeculativeConfig(method="eagle3", num_speculative_tokens=k, draft="h", **extra)
    reqs = [(p, SamplingParams(max_new_tokens=8 + 3 * i, ignore_eos=True)) for i, p in enumerate(held_out)]

    def records(engine):
        gens, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency)
        return [(g.output_ids, [(s.drafted, s.accepted, s.first_rejection, s.emitted, s.draft_depth,
                                 s.accepted_ranks) for s in g.steps]) for g in gens]

    eager = records(Engine(target, head=head, pack=False))
    static = records(Engine(target, head=head, static="static"))
    assert static == eager
    depth = sum(s[4] for _, steps in static for s in steps)
    accepted = sum(s[1] for _, steps in static for s in steps)
    assert depth > 0 and (accepted / depth >= LEARNED or "disable_by_batch_size" in extra)
