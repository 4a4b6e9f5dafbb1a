"""Speculative decoding under an output constraint (specbench.engine.constraint) stays lossless
against the constrained target: the target's distribution with the grammar's disallowed ids
removed at every position, before temperature / top-k / top-p.

The grammar here is a table over a 6-token vocabulary (which ids may follow the last one:
three each, so every position has several choices), a stand-in for a JSON schema or a regex
(specbench.backends.grammar compiles those with llguidance; tests/test_structured.py runs
them end to end). The first three tokens drawn with speculation follow the exact constrained
joint distribution (800 draws a case), enumerated, for a draft model that never sees the grammar
(as vLLM's), n-gram and one-hot drafts the grammar often refuses, and a draft tree, in a
continuous batch with ragged unconstrained companions (alone, a request draws the very tokens
it draws there); and the same test rejects a step that cuts a sampled draw at its first
refused token before verifying it, as vLLM's scheduler does (that position then draws from p
where the rejection would have drawn the residual)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import tiny
from gof import gof_pvalue
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.engine import Engine, scheduler
from specbench.engine.drafters import Proposal, StatelessDrafter
from specbench.engine.drafters import tree_search
from specbench.engine.sampling import probs_from_logits
import test_lossless_sampling as lossless
from test_lossless_sampling import BATCH

V = 6
PROMPT = [1, 2, 3]
N = 800  # draws per lossless case
N_BROKEN = 1200  # the broken verifier: p ~ 1e-14 here (at 600 it is only ~1e-2)
MAX_NEW = 6
FIRST = frozenset({0, 1, 2, 3})
FOLLOW = {t: frozenset({(t + 1) % V, (t + 2) % V, (t + 4) % V}) for t in range(V)}


def allowed_after(history: list[int]) -> frozenset[int]:
    return FOLLOW[history[-1]] if history else FIRST


class TableGrammar:
    """A TokenConstraint: after token t only FOLLOW[t] (FIRST at the start); it never ends."""

    stop_ids: frozenset[int] = frozenset()

    def __init__(self) -> None:
        self.history: list[int] = []

    def allowed(self, vocab_size: int) -> torch.Tensor:
        out = torch.zeros(vocab_size, dtype=torch.bool)
        out[list(allowed_after(self.history))] = True
        return out

    def advance(self, tokens) -> int:
        n = 0
        for t in tokens:
            if t not in allowed_after(self.history):
                break
            self.history.append(int(t))
            n += 1
        return n

    def rollback(self, n: int) -> None:
        del self.history[len(self.history) - n:]


def grammatical(out: list[int]) -> bool:
    return all(t in allowed_after(out[:i]) for i, t in enumerate(out))


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=3)


@pytest.fixture(scope="module")
def engine(target):
    return Engine(target, tiny.perturbed_copy(target, 0.5, seed=9))


def exact_joint(target, sp: SamplingParams, n: int = 3) -> np.ndarray:
    """P(t1..tn | prompt) under the grammar, by enumeration: the target's logits masked by
    what each prefix allows, then sampled as plain decoding would (probs_from_logits)."""
    out = np.zeros(V ** n)
    with torch.inference_mode():
        joint = {(): 1.0}
        for _ in range(n):
            nxt = {}
            for prefix, mass in joint.items():
                logits = target(torch.tensor([PROMPT + list(prefix)])).logits[0, -1]
                mask = torch.zeros(V, dtype=torch.bool)
                mask[list(allowed_after(list(prefix)))] = True
                p = probs_from_logits(logits.masked_fill(~mask, float("-inf")), sp).double()
                for t in range(V):
                    if p[t] > 0:
                        nxt[prefix + (t,)] = mass * float(p[t])
            joint = nxt
    for seq, mass in joint.items():
        out[np.ravel_multi_index(seq, (V,) * n)] = mass
    return out


def joint_counts(outputs) -> np.ndarray:
    counts = np.zeros(V ** 3, dtype=np.int64)
    for out in outputs:
        counts[np.ravel_multi_index(tuple(out[:3]), (V,) * 3)] += 1
    return counts


class ConstantDrafter(StatelessDrafter):
    """Always proposes token 5 (a point mass), which the grammar refuses after 0, 2 and 3."""

    def propose(self, rows, ks):
        return Proposal([[5] * k for k in ks])


SAMPLINGS = {
    "temperature": SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, ignore_eos=True),
    "all": SamplingParams(temperature=0.9, top_k=2, top_p=0.9, max_new_tokens=MAX_NEW, ignore_eos=True),
}


def spec_for(method: str, k: int, **extra) -> SpeculativeConfig:
    if method == "ngram":
        return SpeculativeConfig(method="ngram", num_speculative_tokens=k, **extra)
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=k, draft="draft", **extra)


def sample_outputs(engine, sp, spec, concurrency, n=N, drafter=None) -> list[list[int]]:
    """n seeded constrained requests of PROMPT; at concurrency > 1 with ragged unconstrained
    companions that join and leave while they run."""
    rng = random.Random(7)
    reqs, measured = [], []
    for seed in range(n):
        measured.append(len(reqs))
        reqs.append((PROMPT, sp.with_(seed=seed), TableGrammar()))
        if concurrency > 1 and seed % 2 == 0:
            other = [rng.randrange(V) for _ in range(rng.randint(2, 12))]
            companion = rng.choice([sp, SamplingParams(), SamplingParams(temperature=0.6, top_p=0.9)])
            reqs.append((other, companion.with_(seed=10_000 + seed, max_new_tokens=rng.randint(1, 9), ignore_eos=True)))
    results, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency, drafter=drafter)
    return [results[i].output_ids for i in measured]


CASES = [  # (concurrency, sampling, method, k, extra)
    (BATCH, "temperature", "draft_model", 3, {}),
    (BATCH, "all", "draft_model", 3, {"dynamic_k": True}),
    (BATCH, "temperature", "draft_model", 2, {"topk": 2, "num_draft_tokens": 5}),
    (BATCH, "temperature", "ngram", 3, {}),
    (BATCH, "temperature", "one_hot", 3, {}),
]


@pytest.mark.parametrize("concurrency,sampling,method,k,extra", CASES)
def test_constrained_tokens_follow_the_constrained_target(engine, target, concurrency, sampling, method, k, extra):
    sp = SAMPLINGS[sampling]
    drafter = ConstantDrafter() if method == "one_hot" else None
    spec = spec_for("draft_model" if method == "one_hot" else method, k, **extra)
    outputs = sample_outputs(engine, sp, spec, concurrency, drafter=drafter)
    assert all(grammatical(o) for o in outputs), "emitted a token the grammar refuses"
    assert gof_pvalue(joint_counts(outputs), exact_joint(target, sp)) > 1e-3


@pytest.mark.parametrize("sampling,method,k,extra", [("temperature", "draft_model", 3, {}),
                                                  ("temperature", "draft_model", 2, {"topk": 2, "num_draft_tokens": 5})])
def test_a_request_alone_draws_what_it_draws_in_the_batch(engine, sampling, method, k, extra):
    sp, spec = SAMPLINGS[sampling], spec_for(method, k, **extra)
    lossless.assert_alone_as_in_the_batch(lambda concurrency, n: sample_outputs(engine, sp, spec, concurrency, n=n))


def test_a_step_that_cuts_a_sampled_draw_at_a_refused_token_is_caught(target, monkeypatch):
    """vLLM's cut (validate_tokens) applied to sampled draft-model chains too: the position of
    the first refused token then draws from the constrained p instead of the residual
    max(0, p - q), and the outputs move by Q(refused) (p - r). The same test, on the same
    batched path, must reject it; with a draft unlike the target (r far from p), as a draft
    close to it hides the error (r ~ p)."""
    engine = Engine(target, tiny.make_model(vocab_size=V, hidden=16, layers=1, init_range=0.5, seed=11))
    from specbench.engine import constraint, engine as engine_mod

    real = constraint.trim_chains
    monkeypatch.setattr(engine_mod, "trim_chains", lambda rows, tokens, parents, sampled_q=False:
                        real(rows, tokens, parents, sampled_q=False))
    sp = SAMPLINGS["temperature"]
    outputs = sample_outputs(engine, sp, spec_for("draft_model", 3), BATCH, n=N_BROKEN)
    assert gof_pvalue(joint_counts(outputs), exact_joint(target, sp)) < 1e-3


def test_greedy_speculation_equals_the_constrained_baseline(engine):
    """Greedy outputs under the grammar are the baseline's, token for token, for every drafter
    here (their drafts are often refused), at concurrency 1 and 3."""
    sp = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 4, 0, 1], [5], [2, 3, 1, 0, 5, 4]]

    def run(spec, concurrency, drafter=None):
        reqs = [(p, sp, TableGrammar()) for p in prompts]
        results, _ = scheduler.run(engine, reqs, spec, concurrency=concurrency, drafter=drafter)
        return [r.output_ids for r in results]

    base = run(SpeculativeConfig(), 1)
    assert all(grammatical(o) and len(o) == 12 for o in base)
    free = [r.output_ids for r in scheduler.run(engine, [(p, sp) for p in prompts], SpeculativeConfig())[0]]
    assert free != base  # the grammar changed what the target emits
    for concurrency in (1, 3):
        for spec, drafter in ((spec_for("draft_model", 3), None), (spec_for("ngram", 2), None),
                              (spec_for("draft_model", 3), ConstantDrafter()),
                              (spec_for("draft_model", 2, topk=2, num_draft_tokens=5), None)):
            assert run(spec, concurrency, drafter) == base, (spec, concurrency, drafter)


def test_the_grammar_end_ends_the_request(engine):
    """A constraint's stop ids end the row even under ignore_eos (a complete grammar allows
    nothing else), and the matcher ends where the output ends."""

    class EndsAfterThree(TableGrammar):
        stop_ids = frozenset({5})

        def allowed(self, vocab_size):
            out = torch.zeros(vocab_size, dtype=torch.bool)
            out[[5] if len(self.history) == 3 else [0, 1, 2]] = True
            return out

        def advance(self, tokens):
            n = 0
            for t in tokens:
                if not self.allowed(V)[t]:
                    break
                self.history.append(int(t))
                n += 1
            return n

    sp = SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True, seed=4)
    for spec in (SpeculativeConfig(), spec_for("draft_model", 3)):
        grammar = EndsAfterThree()
        g = engine.generate(PROMPT, sp, spec, constraint=grammar)
        assert len(g.output_ids) == 4 and g.output_ids[-1] == 5 and g.finish_reason == "stop"
        assert set(g.output_ids[:3]) <= {0, 1, 2} and grammar.history == g.output_ids


def test_the_static_step_refuses_a_constrained_request():
    engine = Engine(tiny.make_model(vocab_size=V, hidden=16, layers=1), static="static")
    batch = engine.batch(SpeculativeConfig())
    with pytest.raises(ValueError, match="eager step"):
        batch.admit(PROMPT, SamplingParams(max_new_tokens=4), constraint=TableGrammar())


def test_a_chain_is_cut_to_what_the_grammar_accepts_before_it_is_verified(engine):
    """As vLLM's scheduler cuts drafts (validate_tokens): a constrained row's chain keeps the
    prefix its grammar accepts, a free row's and a tree's are left whole, and the matcher
    stays where it was; through the engine, n-gram drafts under the grammar count only the
    tokens it accepts (the outputs are the baseline's either way)."""
    from types import SimpleNamespace

    from specbench.engine.constraint import trim_chains

    g = TableGrammar()
    g.advance([1])  # after 1: 2, 3 or 5
    rows = [SimpleNamespace(constraint=g), SimpleNamespace(constraint=None), SimpleNamespace(constraint=g)]
    tokens = [[3, 4, 0, 3], [3, 0, 0], [0, 1]]
    trim_chains(rows, tokens, None)
    assert tokens == [[3, 4, 0], [3, 0, 0], []] and g.history == [1]
    tree = [[3, 0, 4]]  # two children of the root: a tree, whole
    trim_chains(rows[:1], tree, [[-1, -1, 0]])
    assert tree == [[3, 0, 4]]
    # through the engine: every drafted token is one the grammar accepted along the chain
    sp = SamplingParams(max_new_tokens=30, ignore_eos=True)
    base = engine.generate(PROMPT, sp, SpeculativeConfig(), constraint=TableGrammar())
    seen = []

    class Recording(StatelessDrafter):  # the n-gram lookup, its proposals recorded with the row's history
        def propose(self, rows, ks):
            from specbench.engine.drafters.ngram import lookup
            out = [lookup(r.ids, k, 1, 3) for r, k in zip(rows, ks)]
            seen.append((list(rows[0].constraint.history), list(out[0])))
            return Proposal(out)

    g = engine.generate(PROMPT, sp, SpeculativeConfig(method="ngram", num_speculative_tokens=3),
                        drafter=Recording(), constraint=TableGrammar())
    assert g.output_ids == base.output_ids
    drafted = [s.drafted for s in g.steps]
    valid = []
    for history, chain in seen:
        n = 0
        while n < len(chain) and chain[n] in allowed_after(history + chain[:n]):
            n += 1
        valid.append(n)
    assert drafted == valid and sum(valid) < sum(len(c) for _, c in seen)  # some were cut
