"""Suffix decoding (`specbench.engine.drafters.suffix`, `suffix_tree`): the tree's counts and
speculation rule (vLLM's knobs: depth, spec factor, min token probability, cached requests),
eviction, greedy losslessness through the engine, and the global cache that sets it apart from
n-gram lookup: on a workload that repeats earlier answers, acceptance rises with the request
index, which it does not without the global tree (max_cached_requests = 0) nor for n-gram."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

import tiny
from specbench.config import SamplingParams, SpeculativeConfig, parse_speculative_config
from specbench.engine import Engine
from specbench.engine.drafters.suffix import SuffixCache, SuffixDrafter, choose
from specbench.engine.drafters.suffix_tree import Candidate, SuffixTree
from specbench.errors import ConfigError
from specbench.engine import scheduler


def tree_of(*seqs, depth=8):
    t = SuffixTree(depth)
    for i, s in enumerate(seqs):
        t.extend(i, s)
    return t


def shape(node):
    return {tok: (c.count, shape(c)) for tok, c in node.children.items()}


# ---- the tree ------------------------------------------------------------------------


def test_counts_are_the_suffixes_through_each_node():
    t = tree_of([1, 2, 1, 2, 3])
    assert t.root.count == 5
    assert t.root.children[1].count == 2 and t.root.children[1].children[2].count == 2
    assert t.root.children[1].children[2].children[1].count == 1
    assert t.root.children[3].count == 1


def test_suffixes_are_cut_at_the_depth():
    t = tree_of([1, 2, 3, 4, 5], depth=2)
    assert shape(t.root) == {1: (1, {2: (1, {})}), 2: (1, {3: (1, {})}), 3: (1, {4: (1, {})}),
                             4: (1, {5: (1, {})}), 5: (1, {})}


def test_the_most_frequent_continuation_with_its_frequency_probabilities():
    # after [7, 8]: 9 twice, 5 once
    t = tree_of([7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 5])
    [c] = t.candidates([0, 7, 8], max_spec_tokens=4, max_spec_factor=4.0, min_token_prob=0.0)
    assert c.tokens[0] == 9 and c.probs[0] == pytest.approx(2 / 3)
    assert c.probs == sorted(c.probs, reverse=True)  # a running product of count ratios


def test_min_token_prob_cuts_the_proposal():
    t = tree_of([7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 5])
    [c] = t.candidates([0, 7, 8], 4, 4.0, min_token_prob=0.5)  # 9: 2/3, then 1 or 2: 1/3
    assert c.tokens == [9]
    assert t.candidates([0, 7, 8], 4, 4.0, min_token_prob=0.7) == []


def test_the_spec_factor_bounds_the_proposal_by_the_match_length():
    t = tree_of([1, 2, 3, 4, 5, 6, 7])
    assert t.candidates([9, 2], 5, max_spec_factor=1.0, min_token_prob=0.0)[0].tokens == [3]
    assert t.candidates([9, 1, 2], 5, max_spec_factor=1.0, min_token_prob=0.0)[0].tokens == [3, 4]
    assert t.candidates([9, 1, 2], 5, max_spec_factor=2.0, min_token_prob=0.0)[0].tokens == [3, 4, 5, 6]
    assert t.candidates([9, 1, 2], 2, max_spec_factor=2.0, min_token_prob=0.0)[0].tokens == [3, 4]


def test_the_depth_bounds_match_plus_proposal():
    t = tree_of([1, 2, 3, 4, 5, 6, 7], depth=4)
    [c] = t.candidates([1, 2, 3], 8, max_spec_factor=8.0, min_token_prob=0.0)
    assert c.tokens == [4, 5, 6] and c.match_len == 1  # 1 matched + 3 = the depth; "2 3" leaves only 2
    [c] = t.candidates([0, 1, 2, 3], 8, max_spec_factor=8.0, min_token_prob=0.0)
    assert c.tokens == [4, 5, 6] and c.match_len + len(c.tokens) <= 4


def test_remove_leaves_the_tree_of_the_other_sequences():
    a, b = [1, 2, 3, 1, 2, 4], [2, 3, 9, 1, 2]
    t = tree_of(a, b)
    t.remove(0)
    assert shape(t.root) == shape(tree_of(b).root) and t.root.count == len(b)
    assert 0 not in t and 1 in t


def test_the_cache_evicts_the_oldest_output_beyond_its_limit():
    cache = SuffixCache(max_tree_depth=8, max_cached_requests=2)
    seqs = [cache.start() for _ in range(3)]
    for s, toks in zip(seqs, ([1, 2, 3], [4, 5, 6], [7, 8, 9])):
        cache.add(s, toks)
    assert 1 not in cache.tree.root.children and {4, 7} <= set(cache.tree.root.children)
    off = SuffixCache(8, max_cached_requests=0)
    s = off.start()
    off.add(s, [1, 2, 3])
    assert off.tree.root.count == 0


def test_choose_takes_the_highest_score_and_the_first_on_a_tie():
    a = Candidate([1, 2], [0.5, 0.5], source="prompt")
    b = Candidate([3], [1.0], source="global")
    c = Candidate([4, 5], [0.9, 0.8], source="global")
    assert choose([a, b]) is a and choose([a, b, c]) is c and choose([]) is None


def test_the_drafter_reads_the_request_and_the_global_tree_per_row():
    cache = SuffixCache(8, 10)
    d = SuffixDrafter(cache, max_spec_factor=4.0, min_token_prob=0.0)
    d.add_row(0, [5, 6, 7, 8, 5, 6], None)
    row = SimpleNamespace(ids=[5, 6, 7, 8, 5, 6, 7])  # the prompt and the first output token
    assert d.propose([row], [2]).tokens == [[8, 5]]  # from its own prompt
    row.ids += [1, 2, 3]
    d.retain([])  # the row finished: its whole output (7 1 2 3) is in the global tree
    d2 = SuffixDrafter(cache, 4.0, 0.0)
    d2.add_row(0, [9, 9, 7, 1], None)
    proposal = d2.propose([SimpleNamespace(ids=[9, 9, 7, 1, 2])], [2])
    assert proposal.tokens == [[3]] and proposal.q is None  # "7 1 2" -> 3, from the other request
    alone = SuffixDrafter(SuffixCache(8, 0), 4.0, 0.0)
    alone.add_row(0, [9, 9, 7, 1], None)
    assert alone.propose([SimpleNamespace(ids=[9, 9, 7, 1, 2])], [2]).tokens == [[]]


# ---- the knobs -----------------------------------------------------------------------


@pytest.mark.parametrize("knob,value,says", [
    ("suffix_decoding_max_tree_depth", 0, ">= 1"),
    ("suffix_decoding_max_tree_depth", 2.5, "integer"),
    ("suffix_decoding_max_cached_requests", -1, ">= 0"),
    ("suffix_decoding_max_spec_factor", 0.0, "> 0"),
    ("suffix_decoding_max_spec_factor", float("nan"), "finite"),
    ("suffix_decoding_min_token_prob", 1.5, "[0, 1]"),
    ("suffix_decoding_min_token_prob", -0.1, "[0, 1]"),
])
def test_bad_knobs_are_one_line_errors_naming_them(knob, value, says):
    with pytest.raises(ConfigError) as exc:
        SpeculativeConfig(method="suffix", num_speculative_tokens=4, **{knob: value})
    assert knob in str(exc.value) and says in str(exc.value) and "\n" not in str(exc.value)


def test_vllms_json_shape_parses_with_its_defaults():
    spec = parse_speculative_config('{"method": "suffix"}')
    assert (spec.method, spec.num_speculative_tokens, spec.suffix_decoding_max_tree_depth) == ("suffix", 24, 24)
    spec = parse_speculative_config('{"method": "suffix", "num_speculative_tokens": 8, '
                                    '"suffix_decoding_max_tree_depth": 32, "suffix_decoding_min_token_prob": 0.2, '
                                    '"suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_max_cached_requests": 5}')
    assert (spec.num_speculative_tokens, spec.suffix_decoding_max_tree_depth, spec.suffix_decoding_min_token_prob,
            spec.suffix_decoding_max_spec_factor, spec.suffix_decoding_max_cached_requests) == (8, 32, 0.2, 2.0, 5)
    with pytest.raises(ConfigError, match="suffix decoding needs no model"):
        parse_speculative_config('{"method": "suffix", "model": "x"}')
    with pytest.raises(ConfigError, match="suffix_decoding_max_tree_depth"):
        parse_speculative_config('{"method": "suffix", "suffix_decoding_max_tree_depth": "deep"}')


# ---- through the engine --------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=40, seed=2, hidden=32, layers=2)


def repetitive(n_distinct: int, n: int, seed: int = 0) -> list[list[int]]:
    """n requests cycling through n_distinct random prompts: later requests repeat earlier ones."""
    rng = random.Random(seed)
    distinct = [[rng.randrange(40) for _ in range(rng.randint(4, 8))] for _ in range(n_distinct)]
    return [distinct[i % n_distinct] for i in range(n)]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_greedy_output_is_the_baseline_token_for_token(target, k, concurrency):
    eng = Engine(target, pack=False)
    prompts = repetitive(3, 8, seed=k) + [[1, 2, 3, 1, 2, 3, 1, 2]]
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True)
    base, _ = scheduler.run(eng, [(p, sp) for p in prompts], SpeculativeConfig(), concurrency=concurrency)
    spec = SpeculativeConfig(method="suffix", num_speculative_tokens=k, suffix_decoding_min_token_prob=0.0)
    got, _ = scheduler.run(eng, [(p, sp) for p in prompts], spec, concurrency=concurrency)
    assert [g.output_ids for g in got] == [g.output_ids for g in base]
    assert sum(s.drafted for g in got for s in g.steps) > 0


def acceptance_by_index(gens) -> list[float]:
    return [sum(s.accepted for s in g.steps) / max(1, sum(s.drafted for s in g.steps)) for g in gens]


def run_repetitive(target, spec, n=12, distinct=3):
    eng = Engine(target, pack=False)
    sp = SamplingParams(max_new_tokens=32, ignore_eos=True)
    gens, _ = scheduler.run(eng, [(p, sp) for p in repetitive(distinct, n, seed=11)], spec, concurrency=1)
    return acceptance_by_index(gens), gens


def test_acceptance_rises_with_the_request_index_as_the_global_tree_fills(target):
    spec = SpeculativeConfig(method="suffix", num_speculative_tokens=4)
    rates, _ = run_repetitive(target, spec)
    first, later = sum(rates[:3]) / 3, sum(rates[3:]) / len(rates[3:])
    assert later > 0.9, rates  # a repeated prompt's answer is drafted from the earlier one
    assert later > first + 0.2, rates
    # The same check fails without the global tree, and for n-gram lookup: both see only the
    # request itself, so a repeat is no easier than the first time.
    for other in (SpeculativeConfig(method="suffix", num_speculative_tokens=4, suffix_decoding_max_cached_requests=0),
                  SpeculativeConfig(method="ngram", num_speculative_tokens=4)):
        r, _ = run_repetitive(target, other)
        f, lat = sum(r[:3]) / 3, sum(r[3:]) / len(r[3:])
        assert not (lat > 0.9 and lat > f + 0.2), (other.method, r)


def test_the_global_tree_outlives_a_batch_and_is_one_per_engine_and_configuration(target):
    eng = Engine(target, pack=False)
    spec = SpeculativeConfig(method="suffix", num_speculative_tokens=4)
    sp = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    first, _ = scheduler.run(eng, [(prompt, sp)], spec)
    again, _ = scheduler.run(eng, [(prompt, sp)], spec)  # a new batch: the first answer is in the global tree
    assert again[0].output_ids == first[0].output_ids
    assert acceptance_by_index(again)[0] > 0.9 and eng.suffix_cache(spec).requests_seen == 2
    assert eng.suffix_cache(spec) is not eng.suffix_cache(SpeculativeConfig(method="suffix", num_speculative_tokens=2))
    assert Engine(target, pack=False).suffix_cache(spec).requests_seen == 0
