"""The static step (specbench.engine.static) decodes what the eager step decodes.

- greedy: token for token and step for step (drafted, accepted, first rejection) equal to the
  eager step on tiny float32 models, for the baseline and draft-model chains of every k, alone
  and in continuous batches whose rows join, finish and pad a bucket, with dynamic k,
  disable_by_batch_size, a confidence threshold, stop tokens and budget caps;
- compiled (torch.compile, fullgraph, no dynamic shapes): the same outputs, and one graph per
  (bucket, width, sampling kind) however long the contexts grow (no recompile per KV length);
- sampling: the first three tokens follow the target's exact joint distribution (chi-square,
  enumerated on a 6-token vocabulary), with sampled chains and trees at concurrency 64 among
  ragged companions (alone, and through the traced graphs, a request draws the very tokens it
  draws there), and the same test rejects a verifier that draws from p after a rejection;
- the counter-based random numbers are uniform, and depend on (seed, decision, position) only.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine, scheduler
from specbench.engine import static as static_mod
from specbench.engine import static_medusa, static_tree
from specbench.engine.sampling import SALT_ACCEPT, SALT_TOKEN, counter_uniform, probs_from_logits, row_probs
from specbench.engine.static import bucket
import test_lossless_sampling as lossless
from test_lossless_sampling import BATCH, SAMPLINGS, V, exact_joint, joint_counts, sample_outputs


@pytest.fixture(scope="module")
def models():
    target = tiny.make_model(vocab_size=300, layers=2, seed=0, eos_token_id=3)
    return target, tiny.perturbed_copy(target, 0.05)


def ragged_requests(n: int = 9, seed: int = 0, **sampling) -> list:
    """Prompts of 2-20 tokens and budgets of 1-30; the second request's budget is 1, so a
    first wave of several has a row that ends at its first token amid the others (the rows
    after it close ranks before the draft's prefill)."""
    rnd = random.Random(seed)
    return [([rnd.randrange(300) for _ in range(rnd.randint(2, 20))],
             SamplingParams(max_new_tokens=1 if i == 1 else rnd.randint(1, 30), seed=i, **sampling))
            for i in range(n)]


def chain(k: int, **kw) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft="draft", **kw)


def tree(paths=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)), **kw) -> SpeculativeConfig:
    """A static speculative_token_tree (vLLM's paths of branch ranks)."""
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=max(map(len, paths)), draft="draft",
                             token_tree=paths, **kw)


def trace(results) -> list:
    return [(g.output_ids, g.finish_reason, [(s.drafted, s.accepted, s.first_rejection, s.emitted, s.draft_depth,
                                              s.accepted_ranks) for s in g.steps])
            for g in results]


DYNAMIC = chain(3, topk=2, num_draft_tokens=6)  # an EAGLE-2 tree: 5 of its 10 candidates kept
SPECS = [SpeculativeConfig(), chain(1), chain(2), chain(4), chain(3, dynamic_k=True),
         chain(3, disable_by_batch_size=2), chain(4, draft_confidence_threshold=0.6),
         chain(4, num_draft_tokens=3), tree(), tree(((0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)),
                                                   draft_confidence_threshold=0.5, dynamic_k=True),
         # dynamic (EAGLE-2) trees: the kept nodes re-ranked under a budget, or every candidate
         DYNAMIC, chain(4, topk=3, num_draft_tokens=9, dynamic_k=True),
         chain(2, topk=2), chain(3, topk=2, num_draft_tokens=5, draft_confidence_threshold=0.3,
                                 disable_by_batch_size=2)]


def spec_id(spec: SpeculativeConfig) -> str:
    shape = "tree" if spec.token_tree else f"t{spec.topk}n{spec.draft_nodes}-" if spec.topk > 1 else "k"
    return f"{spec.method}-{shape}{spec.num_speculative_tokens}"


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
@pytest.mark.parametrize("concurrency", [1, 3, 4])
def test_greedy_static_step_equals_the_eager_step(models, spec, concurrency):
    target, draft = models
    reqs = ragged_requests()
    eager, _ = scheduler.run(Engine(target, draft, pack=False, eos_token_ids=[3]), reqs, spec, concurrency=concurrency)
    static, stats = scheduler.run(Engine(target, draft, static="static", eos_token_ids=[3]), reqs, spec,
                                  concurrency=concurrency)
    assert trace(static) == trace(eager)
    assert stats.steps == sum(len(g.steps) for g in static) or concurrency > 1


@pytest.fixture(scope="module")
def e3_models():
    """A 16-token target and a random EAGLE-3 head over 10 of its tokens (seldom accepted:
    the accepting paths are compared with a trained head, tests/engine/test_eagle3_training.py)."""
    target = tiny.make_model(vocab_size=16, layers=2, seed=0, init_range=0.5)
    return target, tiny.make_head(target, draft_vocab_size=10, seed=2, std=0.6)


def e3_requests(n: int = 9, seed: int = 0) -> list:
    """As `ragged_requests`: the second request ends at its first token."""
    rnd = random.Random(seed)
    return [([rnd.randrange(16) for _ in range(rnd.randint(2, 20))],
             SamplingParams(max_new_tokens=1 if i == 1 else rnd.randint(1, 30), seed=i, ignore_eos=True))
            for i in range(n)]


E3_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0))  # (1, 0): fed from the second
E3_SPECS = [SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head"),
            SpeculativeConfig(method="eagle3", num_speculative_tokens=1, draft="head"),
            SpeculativeConfig(method="eagle3", num_speculative_tokens=4, draft="head", dynamic_k=True,
                              draft_confidence_threshold=0.3),
            SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head", disable_by_batch_size=2),
            # trees: static (with a threshold, dynamic k, steps that draft nothing) and dynamic
            SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head", token_tree=E3_TREE),
            SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head", token_tree=E3_TREE,
                              draft_confidence_threshold=0.2, dynamic_k=True, disable_by_batch_size=2),
            SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head", topk=2, num_draft_tokens=6),
            SpeculativeConfig(method="eagle3", num_speculative_tokens=4, draft="head", topk=3, num_draft_tokens=9,
                              dynamic_k=True, draft_confidence_threshold=0.1)]


@pytest.mark.parametrize("spec", E3_SPECS, ids=lambda s: f"{spec_id(s)}{'-dyn' if s.dynamic_k else ''}"
                         f"{'-off2' if s.disable_by_batch_size else ''}{'-thr' if s.draft_confidence_threshold else ''}")
@pytest.mark.parametrize("concurrency", [1, 4])
def test_greedy_static_eagle3_equals_the_eager_step(e3_models, spec, concurrency):
    """Step for step, chains and trees (static and dynamic), with budgets, dynamic k, the
    confidence threshold, and steps that draft nothing (disable_by_batch_size above 2 rows:
    the head's pending buffer fills and is caught up before the step that would overflow it)."""
    target, head = e3_models
    reqs = e3_requests()
    eager, _ = scheduler.run(Engine(target, head=head, pack=False), reqs, spec, concurrency=concurrency)
    static, stats = scheduler.run(Engine(target, head=head, static="static"), reqs, spec, concurrency=concurrency)
    assert trace(static) == trace(eager)
    assert stats.draft_weight_bytes > 0 and stats.draft_kv_peak_bytes > 0


def medusa(k: int, **kw) -> SpeculativeConfig:
    return SpeculativeConfig(method="medusa", num_speculative_tokens=k, draft="heads", **kw)


def medusa_tree(paths=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)), **kw) -> SpeculativeConfig:
    """Medusa's own form: a static tree of each head's ranks (its `medusa_choices`)."""
    return medusa(max(map(len, paths)), token_tree=paths, **kw)


MEDUSA_SPECS = [medusa(3), medusa(3, dynamic_k=True), medusa(2, disable_by_batch_size=2),
                medusa_tree(), medusa_tree(dynamic_k=True, disable_by_batch_size=2),
                medusa_tree(((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (1,), (1, 0))),  # deeper than the 3 heads
                medusa(3, topk=2, num_draft_tokens=5),  # a dynamic tree: 4 of its 2 + 4 + 4 candidates kept
                medusa(3, topk=3, num_draft_tokens=9, dynamic_k=True, disable_by_batch_size=2)]


@pytest.mark.parametrize("spec", MEDUSA_SPECS, ids=lambda s: f"{spec_id(s)}{'-dyn' if s.dynamic_k else ''}"
                         f"{'-off2' if s.disable_by_batch_size else ''}{'-thr' if s.draft_confidence_threshold else ''}")
@pytest.mark.parametrize("concurrency", [1, 4])
def test_greedy_static_medusa_equals_the_eager_step(models, spec, concurrency):
    """Random heads (the accepting paths: tests/engine/test_medusa_training.py), chains and
    trees (static, one deeper than the heads, and dynamic), budgets, dynamic k, the confidence
    threshold and steps that draft nothing."""
    target, _ = models
    heads = medusa_heads_for(target, 3)
    reqs = ragged_requests()
    eager, _ = scheduler.run(Engine(target, head=heads, pack=False, eos_token_ids=[3]), reqs, spec,
                             concurrency=concurrency)
    static, stats = scheduler.run(Engine(target, head=heads, static="static", eos_token_ids=[3]), reqs, spec,
                                  concurrency=concurrency)
    assert trace(static) == trace(eager)
    assert stats.draft_weight_bytes > 0


def medusa_heads_for(target, n: int):
    from specbench.models.medusa import MedusaConfig, MedusaHeads

    cfg = target.config
    torch.manual_seed(5)
    return MedusaHeads(MedusaConfig(num_heads=n, num_layers=1, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                                    draft_vocab_size=cfg.vocab_size)).eval()


def test_the_static_step_refuses_what_it_does_not_run(models):
    target, draft = models
    engine = Engine(target, draft, static="static")
    for spec, why in [(SpeculativeConfig(method="ngram", num_speculative_tokens=2), "method ngram"),
                      (SpeculativeConfig(method="suffix", num_speculative_tokens=2), "method suffix"),
                      (SpeculativeConfig(method="eagle3", num_speculative_tokens=2, draft="h"), "no EAGLE-3 head")]:
        assert why in engine.static_reason(spec)
        with pytest.raises(ValueError, match=why):
            engine.batch(spec)
    assert "no Medusa heads loaded" in engine.static_reason(medusa(2))
    assert Engine(target, head=medusa_heads_for(target, 2), static="static").static_reason(
        medusa(2, token_tree=((0,), (1,), (0, 0)))) == ""
    with_head = Engine(target, head=tiny.make_head(target, seed=1), static="static")
    e3_tree = SpeculativeConfig(method="eagle3", num_speculative_tokens=2, draft="h", token_tree=((0,), (1,), (0, 0)))
    assert with_head.static_reason(e3_tree) == ""
    assert with_head.static_reason(SpeculativeConfig(method="eagle3", num_speculative_tokens=2, draft="h")) == ""
    with pytest.raises(ValueError, match="prepacking"):
        Engine(target, static="static", pack=True)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Engine(target, static="cudagraph").batch(SpeculativeConfig())


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]


class CountingBackend:
    """A torch.compile backend that counts the graphs dynamo hands it (each compile or
    recompile) and runs them as they are."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def test_compiled_step_matches_and_never_recompiles_for_a_length(models):
    target, draft = models
    backend = CountingBackend()
    engine = Engine(target, draft, static="compile", compile_backend=backend, eos_token_ids=[3])
    eager = Engine(target, draft, pack=False, eos_token_ids=[3])
    # one request whose context runs from 60 to 100 tokens: one graph for the whole run
    long = [([7] * 60, SamplingParams(max_new_tokens=40, seed=1, ignore_eos=True))]
    assert trace(scheduler.run(engine, long, SpeculativeConfig())[0]) == \
        trace(scheduler.run(eager, long, SpeculativeConfig())[0])
    assert backend.graphs == 1
    # other prompts and lengths on the same buffers: nothing is compiled again
    reqs = ragged_requests(5, seed=1)
    assert trace(scheduler.run(engine, reqs, SpeculativeConfig())[0]) == \
        trace(scheduler.run(eager, reqs, SpeculativeConfig())[0])
    assert backend.graphs == 1
    for spec, concurrency in [(chain(3), 1), (chain(3), 3), (tree(), 3), (DYNAMIC, 2)]:
        reqs = ragged_requests(5, seed=concurrency)
        assert trace(scheduler.run(engine, reqs, spec, concurrency=concurrency)[0]) == \
            trace(scheduler.run(eager, reqs, spec, concurrency=concurrency)[0])
    graphs = [b.graphs for b in engine._static_batches.values()]
    # dynamo built no graph the step did not ask for (a new key, or a key again over
    # buffers that grew): no guard failed and recompiled; and the keys are bounded by
    # (draft, verify) x (bucket, width): the chain at c1 its drafting and non-drafting
    # (budget) widths, at c3 those at buckets 1, 2 and 4, the static tree the same at c3 and
    # the dynamic tree at c2 at buckets 1 and 2 (its shape is data: keyed as a static tree's)
    assert backend.graphs <= sum(g.builds for g in graphs)
    assert sum(len(g.built) for g in graphs) <= 1 + 2 * 2 + 2 * 2 * 3 + 2 * 2 * 3 + 2 * 2 * 2


def assert_compiled_heads_step_is_the_eager_one(target, head, spec, requests, **engine_kw):
    """The heads' step traced whole (fullgraph) decodes the eager step's records at concurrency
    1 and 3, and builds one graph per key: no guard failed and recompiled, and the keys are
    bounded by (draft, verify) x (drafting, not drafting) x buckets 1, 2, 4."""
    backend = CountingBackend()
    engine = Engine(target, head=head, static="compile", compile_backend=backend, **engine_kw)
    eager = Engine(target, head=head, pack=False, **engine_kw)
    for concurrency in (1, 3):
        reqs = requests(5, seed=concurrency)
        assert trace(scheduler.run(engine, reqs, spec, concurrency=concurrency)[0]) == \
            trace(scheduler.run(eager, reqs, spec, concurrency=concurrency)[0])
    (batch,) = engine._static_batches.values()
    assert backend.graphs <= batch.graphs.builds
    assert len(batch.graphs.built) <= 2 * 2 * 3


@pytest.mark.parametrize("spec", [E3_SPECS[0], E3_SPECS[4], E3_SPECS[6]], ids=["chain", "tree", "dynamic_tree"])
def test_compiled_eagle3_step_matches_and_never_recompiles_for_a_length(e3_models, spec):
    assert_compiled_heads_step_is_the_eager_one(*e3_models, spec, e3_requests)


@pytest.mark.parametrize("spec", [medusa_tree(), medusa(3, topk=2, num_draft_tokens=5)], ids=["tree", "dynamic_tree"])
def test_compiled_medusa_tree_matches_and_never_recompiles_for_a_length(models, spec):
    target, _ = models
    assert_compiled_heads_step_is_the_eager_one(target, medusa_heads_for(target, 3), spec, ragged_requests,
                                                eos_token_ids=[3])


def test_the_graph_counter_sees_a_recompile():
    """The count above can fail: a function specialised on a Python int recompiles per value."""
    backend = CountingBackend()
    f = torch.compile(lambda x, n: x + n, backend=backend, dynamic=False)
    for n in range(3):
        f(torch.ones(2), n)
    assert backend.graphs == 3


def test_inductor_compiles_the_whole_step_without_a_graph_break():
    """With Inductor itself (fullgraph: a break would raise), on a one-layer model."""
    target = tiny.make_model(vocab_size=64, layers=1, hidden=32, seed=2)
    draft = tiny.perturbed_copy(target, 0.1)
    reqs = [([1, 2, 3, 4], SamplingParams(max_new_tokens=8, seed=0)),
            ([5, 6], SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=6, seed=1))]
    eager = scheduler.run(Engine(target, draft, pack=False), reqs[:1], chain(2), concurrency=1)[0]
    engine = Engine(target, draft, static="compile")
    out, _ = scheduler.run(engine, reqs, chain(2), concurrency=1)  # one bucket: three graphs
    assert out[0].output_ids == eager[0].output_ids
    assert len(out[1].output_ids) == 6
    graphs = engine._static_batches[chain(2)].graphs
    assert len(graphs.built) == 3 and graphs.build_s > 0  # draft and verify of width 3, verify of width 1


# ---- sampling -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=3)


@pytest.fixture(scope="module")
def static_engine(tiny_target):
    return Engine(tiny_target, tiny.perturbed_copy(tiny_target, 0.5, seed=9), static="static")


CASES = [  # (concurrency, sampling, configuration)
    (BATCH, "temperature", chain(3)),
    (BATCH, "top_p", chain(2)),
    (BATCH, "all", chain(3, dynamic_k=True)),
    (BATCH, "top_k", chain(1)),
    (BATCH, "temperature", tree()),  # a static tree: siblings tried against the residual of the rejected
    (BATCH, "all", tree(dynamic_k=True)),
    (BATCH, "top_p", chain(3, topk=2, num_draft_tokens=5, dynamic_k=True)),  # a dynamic tree, its shape per row
]


@pytest.mark.parametrize("concurrency,sampling,spec", CASES, ids=lambda x: spec_id(x) if isinstance(x, SpeculativeConfig)
                         else str(x))
def test_static_sampling_follows_the_target_distribution(static_engine, tiny_target, concurrency, sampling, spec):
    sp = SAMPLINGS[sampling]
    outputs = sample_outputs(static_engine, sp, spec, None, concurrency)
    counts, expected = joint_counts(outputs), exact_joint(tiny_target, sp)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("sampling,spec", [("temperature", chain(3)), ("all", tree()), ("all", DYNAMIC)],
                         ids=["chain3", "tree", "dynamic_tree"])
def test_a_request_alone_draws_what_it_draws_in_the_batch(static_engine, sampling, spec):
    sp = SAMPLINGS[sampling]
    lossless.assert_alone_as_in_the_batch(lambda concurrency, n: sample_outputs(static_engine, sp, spec, None,
                                                                                concurrency, n=n))


def test_compiled_sampling_draws_what_the_functions_draw(static_engine, tiny_target):
    """The traced graphs (dynamo's, run without Inductor) sample as the functions do: seed for
    seed the same tokens as the static engine, whose distribution the cases above check, in
    every bucket a ragged batch passes through. At concurrency 16, not BATCH: a request draws
    the same tokens in any batch, and each bucket more is a trace of every graph (alone, 2-core
    EPYC: 17.5-17.8 s at 64, 10.5-14.9 s at 16)."""
    engine = Engine(tiny_target, static_engine.draft, static="compile", compile_backend="eager")
    sp = SAMPLINGS["all"]
    compiled = sample_outputs(engine, sp, chain(3), None, 16, n=2 * lossless.ALONE)
    functions = sample_outputs(static_engine, sp, chain(3), None, 16, n=2 * lossless.ALONE)
    lossless.assert_same_draws(functions, compiled, "through the traced graphs")
    # traced for every bucket the batch shrank through (draft and verify graphs of each)
    assert {key[1] for key in engine._static_batches[chain(3)].graphs.built} == {1, 2, 4, 8, 16}


def test_static_baseline_sampling_follows_the_target_distribution(static_engine, tiny_target):
    sp = SAMPLINGS["top_k"]
    outputs = sample_outputs(static_engine, sp, SpeculativeConfig(), None, BATCH)
    assert gof_pvalue(joint_counts(outputs), exact_joint(tiny_target, sp)) > 1e-3


@pytest.mark.parametrize("spec", [medusa(3, dynamic_k=True), medusa_tree(dynamic_k=True),
                                  medusa(3, topk=2, num_draft_tokens=5)], ids=["chain", "tree", "dynamic_tree"])
def test_static_medusa_sampling_follows_the_target_distribution(tiny_target, spec):
    """One-hot drafts on the static step, at concurrency 64 with ragged companions: chains, and
    trees whose siblings are tried against the residual of the rejected ones."""
    engine = Engine(tiny_target, head=medusa_heads_for(tiny_target, 3), static="static")
    sp = SAMPLINGS["all"]
    outputs = sample_outputs(engine, sp, spec, None, BATCH, n=1500)
    counts, expected = joint_counts(outputs), exact_joint(tiny_target, sp)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3


def test_the_same_test_rejects_medusa_drafts_verified_against_a_q_they_were_not_drawn_from(tiny_target,
                                                                                         monkeypatch):
    """Argmax drafts handed on with the heads' softmax as q (as if sampled from it): caught."""
    def softmax_q(self, B, K, sampled):
        drafts, q, ks = real(self, B, K, sampled)
        if q is not None:
            q = torch.softmax(self._medusa_logits(B)[:, :K], dim=-1)
        return drafts, q, ks
    real = static_medusa.MedusaStep._draft_medusa
    monkeypatch.setattr(static_medusa.MedusaStep, "_draft_medusa", softmax_q)
    engine = Engine(tiny_target, head=medusa_heads_for(tiny_target, 3), static="static")
    sp = SAMPLINGS["temperature"]
    outputs = sample_outputs(engine, sp, medusa(3), None, BATCH, n=600)
    pvalue = gof_pvalue(joint_counts(outputs), exact_joint(tiny_target, sp))
    print(f"static Medusa with a softmax q, 600 draws: p = {pvalue:.3g}")
    assert pvalue < 1e-3


@pytest.fixture(scope="module")
def e3_target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=2, init_range=0.5, seed=3)


def eagle3(k: int, **kw) -> SpeculativeConfig:
    return SpeculativeConfig(method="eagle3", num_speculative_tokens=k, draft="head", **kw)


E3_CASES = [  # (concurrency, sampling, draft vocabulary, configuration)
    # 3 of 6 tokens: the target's support is not covered (batched; greedy EAGLE-3 alone is
    # compared token for token, and a sampled request alone draws what it draws in the batch,
    # test_a_static_eagle3_request_alone_draws_what_it_draws_in_the_batch)
    (BATCH, "temperature", 3, eagle3(3)),
    (BATCH, "all", V, eagle3(3, dynamic_k=True)),  # ragged companions, k changing per row
    # trees: siblings tried against the residual of the rejected ones, the draft vocabulary short
    (BATCH, "temperature", 3, eagle3(3, token_tree=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))),
    (BATCH, "all", V, eagle3(3, topk=2, num_draft_tokens=5, dynamic_k=True)),
]


@pytest.mark.parametrize("concurrency,sampling,draft_vocab,spec", E3_CASES,
                         ids=lambda x: spec_id(x) if isinstance(x, SpeculativeConfig) else str(x))
def test_static_eagle3_sampling_follows_the_target_distribution(e3_target, concurrency, sampling, draft_vocab, spec):
    head = tiny.make_head(e3_target, draft_vocab_size=draft_vocab, seed=14, std=0.6)
    engine = Engine(e3_target, head=head, static="static")
    sp = SAMPLINGS[sampling]
    outputs = sample_outputs(engine, sp, spec, None, concurrency, n=1000)
    counts, expected = joint_counts(outputs), exact_joint(e3_target, sp)
    assert counts[expected == 0].sum() == 0, "emitted a sequence the target can never produce"
    assert gof_pvalue(counts, expected) > 1e-3


def test_a_static_eagle3_request_alone_draws_what_it_draws_in_the_batch(e3_target):
    engine = Engine(e3_target, head=tiny.make_head(e3_target, draft_vocab_size=3, seed=14, std=0.6), static="static")
    sp = SAMPLINGS["temperature"]
    lossless.assert_alone_as_in_the_batch(lambda concurrency, n: sample_outputs(engine, sp, eagle3(3), None,
                                                                                concurrency, n=n))


def test_the_same_test_rejects_static_eagle3_q_left_in_draft_id_order(e3_target, monkeypatch):
    """The head's distribution handed to the verifier indexed by draft id instead of
    scattered to the target ids (the classic EAGLE-3 slip; the drafts themselves drawn
    right), on the static step: caught."""
    real = static_mod.StaticBatch._draft_chain

    def draft_order_q(self, B, K, sampled, top_k, top_p):
        drafts, q, ks = real(self, B, K, sampled, top_k, top_p)
        if q is not None:
            ids = self.head.draft_ids
            wrong = torch.zeros_like(q)
            wrong[..., : ids.numel()] = q[..., ids]
            q = wrong
        return drafts, q, ks
    monkeypatch.setattr(static_mod.StaticBatch, "_draft_chain", draft_order_q)
    head = tiny.make_head(e3_target, draft_vocab_size=3, seed=14, std=0.6)
    assert head.draft_ids.tolist() != [0, 1, 2]  # otherwise the two orders coincide
    sp = SAMPLINGS["temperature"]
    outputs = sample_outputs(Engine(e3_target, head=head, static="static"), sp, eagle3(3), None, BATCH, n=600)
    pvalue = gof_pvalue(joint_counts(outputs), exact_joint(e3_target, sp))
    print(f"static EAGLE-3 q in draft-id order, 600 draws: p = {pvalue:.3g}")
    assert pvalue < 1e-3


def test_the_same_test_rejects_a_verifier_that_draws_from_p_after_a_rejection(static_engine, tiny_target,
                                                                              monkeypatch):
    monkeypatch.setattr(static_mod, "residual", lambda p, q: p)  # the classic bug: resample from p
    sp = SAMPLINGS["temperature"]
    engine = Engine(tiny_target, static_engine.draft, static="static")
    counts = joint_counts(sample_outputs(engine, sp, chain(3), None, BATCH, n=600))  # p ~ 1e-21 at this n
    assert gof_pvalue(counts, exact_joint(tiny_target, sp)) < 1e-3


@pytest.mark.parametrize("method", ["draft_model", "medusa", "eagle3"])
def test_the_same_test_rejects_a_tree_walk_that_keeps_a_rejected_sibling(static_engine, tiny_target, e3_target,
                                                                         monkeypatch, method):
    """A rejected child's mass left in p (the next sibling and the recovered token drawn
    against p, not p without it) is caught on the static tree, drafted by a draft model,
    Medusa heads or an EAGLE-3 head."""
    monkeypatch.setattr(static_tree, "rejected", lambda p, q, x, last: p)
    sp = SAMPLINGS["temperature"]
    target = e3_target if method == "eagle3" else tiny_target
    if method == "medusa":
        engine = Engine(tiny_target, head=medusa_heads_for(tiny_target, 3), static="static")
        spec = medusa_tree()
    elif method == "eagle3":
        engine = Engine(e3_target, head=tiny.make_head(e3_target, draft_vocab_size=V, seed=14, std=0.6),
                        static="static")
        spec = eagle3(3, token_tree=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    else:
        engine, spec = Engine(tiny_target, static_engine.draft, static="static"), tree()
    pvalue = gof_pvalue(joint_counts(sample_outputs(engine, sp, spec, None, BATCH, n=600)),
                        exact_joint(target, sp))
    print(f"{method} static tree keeping a rejected sibling's mass, 600 draws: p = {pvalue:.3g}")
    assert pvalue < 1e-3


def test_row_probs_is_probs_from_logits_per_row():
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0)) * 3
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.2, top_k=5),
              SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=1.0, top_k=7, top_p=0.6)]
    got = row_probs(logits, torch.tensor([p.temperature for p in params]), torch.tensor([p.top_k for p in params]),
                    torch.tensor([p.top_p for p in params]))
    for b, p in enumerate(params):
        torch.testing.assert_close(got[b], probs_from_logits(logits[b], p))


def test_counter_uniforms_are_uniform_and_keyed_by_seed_salt_and_position():
    seeds = torch.arange(-2000, 2000, dtype=torch.long) * 7919
    pos = torch.arange(16).repeat(len(seeds), 1)
    u = counter_uniform(seeds, SALT_TOKEN, pos)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    counts = np.histogram(u.numpy().ravel(), bins=64, range=(0, 1))[0]
    assert gof_pvalue(counts, np.full(64, 1 / 64)) > 1e-3
    # a broken variant (the low 8 bits only) fails the same test
    assert gof_pvalue(np.histogram((u.numpy().ravel() * 256 % 1) ** 2, bins=64, range=(0, 1))[0],
                      np.full(64, 1 / 64)) < 1e-3
    again = counter_uniform(seeds[5:6], SALT_TOKEN, pos[:1])
    torch.testing.assert_close(again, u[5:6])  # a row's numbers do not depend on its batch
    assert not torch.equal(counter_uniform(seeds, SALT_ACCEPT, pos), u)
    assert len(set(u[:, 0].tolist())) == len(seeds)
    # neighbouring positions of one seed are not correlated
    x = u[:, :-1].numpy().ravel() - 0.5
    y = u[:, 1:].numpy().ravel() - 0.5
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.02
