"""`specbench.engine.sampling` at its edges, where mutation testing (issue 43) found the
suite blind: top-p exactly reached by a prefix, top-p = 1 leaving the softmax bit for bit
(tokens below float32's resolution included), the batched `row_probs` with top-k = 1 and with
one filter switched off, the inverse-CDF draw at its boundaries and zero-probability tokens,
and the counter-based uniforms as the documented hash, all 64 bits of a seed."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SamplingParams
from specbench.engine.sampling import (SALT_ACCEPT, SALT_DRAFT, SALT_TOKEN, _pcg, counter_uniform, probs_from_logits,
                                       row_probs, sample_inverse_cdf)

M32 = 0xFFFFFFFF


def rows(logits: torch.Tensor, params: list[SamplingParams], **flags) -> torch.Tensor:
    return row_probs(logits, torch.tensor([p.temperature for p in params]), torch.tensor([p.top_k for p in params]),
                     torch.tensor([p.top_p for p in params]), **flags)


# ---- top-p --------------------------------------------------------------------------------------

def test_a_prefix_that_reaches_top_p_exactly_is_where_the_cut_falls():
    """Mass before a token >= p cuts it: with four equal tokens (0.25 each, sums exact in
    float32) p = 0.5 keeps two, and two equal tokens at p = 0.5 keep one. As transformers'
    TopPLogitsWarper (it removes what the ascending cumulative mass leaves at or below 1 - p)."""
    four, two = torch.zeros(4), torch.zeros(2)
    sp = SamplingParams(temperature=1.0, top_p=0.5)
    assert (probs_from_logits(four, sp) > 0).sum() == 2
    assert sorted(probs_from_logits(two, sp).tolist()) == [0.0, 1.0]
    assert (rows(four.expand(2, 4), [sp, sp]) > 0).sum(-1).tolist() == [2, 2]
    assert sorted(rows(two.view(1, 2), [sp])[0].tolist()) == [0.0, 1.0]


def test_top_p_one_leaves_the_softmax_bit_for_bit():
    """p = 1 filters nothing: not a token whose mass is below float32's resolution (the mass
    before it rounds to 1.0), and not by renormalizing a sum that is not exactly 1."""
    tiny = torch.tensor([0.0, -40.0])  # exp(-40) ~ 4e-18: the mass before it is 1.0 in float32
    sp = SamplingParams(temperature=1.0, top_p=1.0)
    got = probs_from_logits(tiny, sp)
    assert torch.equal(got, torch.softmax(tiny, -1)) and float(got[1]) > 0
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 2
    soft = torch.softmax(logits, -1)
    assert bool((soft.sum(-1) != 1.0).any()), "the check needs a softmax whose float32 sum is not exactly 1"
    one = [sp] * 3
    assert torch.equal(rows(logits, one), soft)
    assert torch.equal(rows(tiny.view(1, 2), [sp]), torch.softmax(tiny, -1).view(1, 2))
    # a batch that mixes p = 1 with p < 1: the p = 1 rows are still the softmax, bit for bit
    mixed = [sp, SamplingParams(temperature=1.0, top_p=0.5), sp]
    got = rows(logits, mixed)
    assert torch.equal(got[0], soft[0]) and torch.equal(got[2], soft[2])
    assert int((got[1] > 0).sum()) < 50


# ---- row_probs: per-row parameters ------------------------------------------------------------

def test_row_top_k_one_is_the_argmax_of_each_row():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(2))
    got = rows(logits, [SamplingParams(temperature=0.8, top_k=1)] * 3)
    assert torch.equal(got, torch.nn.functional.one_hot(logits.argmax(-1), 20).float())


@pytest.mark.parametrize("use_top_k,use_top_p", [(True, False), (False, True), (False, False)])
def test_a_filter_switched_off_for_the_batch_changes_nothing_for_rows_that_do_not_use_it(use_top_k, use_top_p):
    """The static step passes use_top_k/use_top_p False when no row of its batch asks for that
    filter; the rows' distributions are then those of the full computation."""
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(3)) * 2
    params = [SamplingParams(temperature=t, top_k=k if use_top_k else 0, top_p=p if use_top_p else 1.0)
              for t, k, p in [(0.7, 3, 0.6), (1.0, 5, 0.9), (1.3, 0, 0.5), (0.9, 8, 1.0)]]
    got = rows(logits, params, use_top_k=use_top_k, use_top_p=use_top_p)
    for b, p in enumerate(params):
        torch.testing.assert_close(got[b], probs_from_logits(logits[b], p), rtol=0, atol=1e-6)
        assert torch.equal(got[b] > 0, probs_from_logits(logits[b], p) > 0)


# ---- the inverse-CDF draw ---------------------------------------------------------------------

def test_the_draw_is_the_first_token_whose_cumulative_mass_exceeds_u():
    probs = torch.tensor([[0.25, 0.0, 0.5, 0.25]] * 6)
    u = torch.tensor([0.0, 0.2499999, 0.25, 0.7499999, 0.75, 1 - 2 ** -52], dtype=torch.float64)
    # u exactly at a boundary goes to the next token with mass: the zero-probability token 1
    # is never drawn, even where its (empty) interval begins
    assert sample_inverse_cdf(probs, u).tolist() == [0, 0, 2, 2, 3, 3]


def test_the_draw_scales_u_by_each_rows_total():
    """Unnormalized rows (a residual max(0, p - q) before it is divided) draw as their
    normalized selves; trailing zero-probability tokens are never drawn."""
    probs = torch.tensor([[1.0, 0.0, 2.0, 1.0], [3.0, 1.0, 0.0, 0.0]])
    u = torch.tensor([0.5, 0.9999], dtype=torch.float64)
    assert sample_inverse_cdf(probs, u).tolist() == [2, 1]
    assert sample_inverse_cdf(probs / probs.sum(-1, keepdim=True), u).tolist() == [2, 1]


def test_the_draw_accumulates_in_float64():
    """Over 200,000 float32 masses a float32 running sum misplaces some draws (8 of these 2,000
    when checked); in float64 every u aimed at the middle of a token's interval lands on it."""
    g = torch.Generator().manual_seed(0)
    V = 200_000
    probs = torch.rand((1, V), generator=g)
    cdf = torch.cumsum(probs.double(), -1)[0]
    aimed = torch.randint(0, V, (2000,), generator=g)
    u = (cdf[aimed] - probs[0, aimed].double() / 2) / cdf[-1]
    assert [int(sample_inverse_cdf(probs, u[i:i + 1])[0]) for i in range(len(aimed))] == aimed.tolist()


# ---- counter-based uniforms -------------------------------------------------------------------

def pcg_reference(v: int) -> int:
    """The PCG hash of Jarzynski & Olano (2020) on unsigned 32-bit integers, as published."""
    state = (v * 747796405 + 2891336453) & M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & M32
    return ((word >> 22) ^ word) & M32


def uniform_reference(seed: int, salt: int, position: int) -> float:
    """`counter_uniform` as its docstring and the engine's comment define it, one number at a
    time in Python integers: the seed's two 32-bit halves (two's complement), the position and
    the salt chained through the hash; 26 + 26 bits, centred in their cell of width 2**-52."""
    s = seed & (2 ** 64 - 1)
    h = pcg_reference((s & M32) ^ pcg_reference(((s >> 32) & M32) ^ pcg_reference((position & M32) ^ pcg_reference(salt))))
    h2 = pcg_reference(h ^ 0x9E3779B9)
    return ((h >> 6) * 2 ** 26 + (h2 >> 6) + 0.5) * 2.0 ** -52


def test_the_hash_is_pcg_on_32_bit_words():
    values = [0, 1, 2, 255, 2 ** 16 + 3, 2 ** 31 - 1, 2 ** 31, 0x9E3779B9, M32 - 1, M32]
    got = _pcg(torch.tensor(values, dtype=torch.long)).tolist()
    assert got == [pcg_reference(v) for v in values]


def test_counter_uniforms_are_the_documented_hash_bit_for_bit():
    """A request's sampled outputs are a function of its seed only if this function never
    changes: every bit of it is pinned to the reference above (seeds negative, past 32 bits,
    at int64's ends; positions past 2**32)."""
    seeds = [0, 1, -1, 7, 2 ** 32, 2 ** 32 + 7, -(2 ** 40) + 3, 2 ** 63 - 1, -(2 ** 63)]
    positions = [0, 1, 5, 1000, 2 ** 32 + 9]
    for salt in (SALT_DRAFT, SALT_ACCEPT, SALT_TOKEN):
        got = counter_uniform(torch.tensor(seeds, dtype=torch.long), salt,
                              torch.tensor([positions] * len(seeds), dtype=torch.long))
        want = [[uniform_reference(s, salt, p) for p in positions] for s in seeds]
        assert got.tolist() == want


def test_seeds_that_differ_only_in_their_high_32_bits_draw_differently():
    low = torch.tensor([3, 3 + 2 ** 32, 3 + 2 ** 33, 3 + 2 ** 40, 3 - 2 ** 32], dtype=torch.long)
    u = counter_uniform(low, SALT_TOKEN, torch.arange(8).repeat(len(low), 1))
    assert len({tuple(r) for r in u.tolist()}) == len(low)

