"""Draft trees on the one decode path, piece by piece: the verify feed of a tree (depths,
ancestors, children), the tree attention mask (a chain's is the causal mask), one forward over
a tree scoring every node exactly as its own chain would (transformers' layers and the fused
ones), the accepted path's KV gathered into place equal to a chain's cache, the greedy rule
taking the longest matching path, the drafters' trees (EAGLE-2 dynamic, static), the drafter's
own cache after a branch other than the first was accepted, and the knobs' bad values."""

import copy

import pytest
import torch

import tiny
from specbench.config import SamplingParams, SpeculativeConfig, parse_speculative_config
from specbench.engine import Engine
from specbench.engine.drafters import Proposal
from specbench.engine.drafters.base import tree_from_paths
from specbench.engine.fused import fuse_layers
from specbench.engine.kv import TreeAttention, causal_mask
from specbench.engine.model import ModelRunner, pack_linears
from specbench.engine.tree import StaticTree, gather_paths, path_features, tree_batch
from specbench.engine.verify import verify_tree
from specbench.errors import ConfigError


def test_tree_batch_depths_ancestors_children():
    prop = Proposal([[5, 6, 7, 8], [9]], parents=[[-1, -1, 0, 2], [-1]])
    t = tree_batch([1, 2], prop, [3, 1])
    assert t.feed.tolist() == [[1, 5, 6, 7, 8], [2, 9, 0, 0, 0]]
    assert t.depth[0].tolist() == [0, 1, 1, 2, 3] and t.depth[1, :2].tolist() == [0, 1]
    seen = [[a for a in range(5) if t.visible[0, j, a]] for j in range(5)]
    assert seen == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 3, 4]]
    assert t.visible[1, 3].tolist() == [False, False, False, True, False]  # padding sees itself
    assert t.children[0, 0, :2].tolist() == [1, 2] and t.children[0, 1, 0] == 3 and t.children[0, 3, 0] == 4
    assert t.ranks == [[0, 1, 0, 0], [0]] and t.has_children[0] == [True, False, True, False]
    assert t.depth.max(dim=1).values.tolist() == [3, 1] and t.max_depth == 3
    # every table whole: children padded with -1, long indices throughout, the rows' own links
    assert t.children.tolist() == [[[1, 2], [3, -1], [-1, -1], [4, -1], [-1, -1]],
                                   [[1, -1], [-1, -1], [-1, -1], [-1, -1], [-1, -1]]]
    assert {x.dtype for x in (t.feed, t.depth, t.children)} == {torch.long} and t.visible.dtype == torch.bool
    assert t.parents == [[-1, -1, 0, 2], [-1]] and t.nodes == [4, 1]


def test_static_tree_tables_by_hand():
    """The static step's index tables for ((0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)): nodes
    n0..n4 in (depth, path) order, feed entry i + 1 is node i. Drafting feeds n0, then n1 and
    n2 together (each seeing the fed n0 and itself, never its sibling), leaves are not fed."""
    t = StaticTree(((0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)), torch.device("cpu"))
    assert (t.nodes, t.depth, t.width) == (5, 3, 2)
    assert t.children.tolist() == [[1, -1], [2, 3], [4, -1], [5, -1], [-1, -1], [-1, -1]]
    seen = [[a for a in range(6) if t.visible[j, a]] for j in range(6)]
    assert seen == [[0], [0, 1], [0, 1, 2], [0, 1, 3], [0, 1, 2, 4], [0, 1, 3, 5]]
    assert t.feed_depth.tolist() == [0, 1, 2, 2, 3, 3] and t.rank.tolist() == [0, 0, 0, 1, 0, 0]
    assert t.fed_at.tolist() == [-1, 0, 1, 2, -1, -1]
    levels = [(at.tolist(), parent.tolist(), rank.tolist(), c, kid_pos.tolist(), fed, seen_.tolist())
              for at, parent, rank, c, kid_pos, fed, seen_ in t.levels]
    assert levels == [
        ([0], [0], [0], 1, [0], 0, [[True]]),
        ([1, 2], [0, 0], [0, 1], 2, [0, 1], 1, [[True, True, False], [True, False, True]]),
        ([3, 4], [0, 1], [0, 0], 1, [], 3, []),
    ]


def test_static_tree_whose_last_node_is_the_child_of_the_one_before():
    """((0,), (1,), (1, 0)): the last feed entry's parent is the entry just before it."""
    t = StaticTree(((0,), (1,), (1, 0)), torch.device("cpu"))
    assert t.children.tolist() == [[1, 2], [-1, -1], [3, -1], [-1, -1]]
    assert t.fed_at.tolist() == [-1, -1, 0, -1]  # only n1 has a child: it alone is fed


def test_path_features_are_the_root_then_the_accepted_path_in_order():
    """The verify pass's feature rows gathered at [root, path...] per row, ragged paths padded
    with the root's (index 0) features; rows never mix."""
    feats = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)  # [B, M, F], every value distinct
    got = path_features(feats, [[1, 3], []])
    assert got.shape == (2, 3, 3)
    assert torch.equal(got[0], feats[0, [0, 2, 4]]) and torch.equal(got[1], feats[1, [0, 0, 0]])
    assert torch.equal(path_features(feats, [[0], [3]]), torch.stack([feats[0, [0, 1]], feats[1, [0, 4]]]))
    got = path_features(feats, [[1, 3], [2]])  # ragged: the shorter path is padded with index 0
    assert torch.equal(got, torch.stack([feats[0, [0, 2, 4]], feats[1, [0, 3, 0]]]))


@pytest.mark.parametrize("parents,ks,match", [([[0]], [2], "parent 0"), ([[-1, 5]], [2], "parent 5"),
                                              ([[-2]], [2], r"parent -2 \(valid: -1 for the root or an earlier node\)"),
                                              ([[-1, 0, 1]], [2], "depth 3 exceeds"), ([[-1]], [2], "2 tokens")])
def test_bad_proposals_name_the_row(parents, ks, match):
    tokens = [[1, 2, 3][:len(parents[0])]] if match != "2 tokens" else [[1, 2]]
    with pytest.raises(ValueError, match=match):
        tree_batch([0], Proposal(tokens, parents=parents), ks)


def test_tree_from_paths_sorts_and_links():
    parents, ordered = tree_from_paths([(1,), (0, 0), (0,), (0, 1), (0, 0, 0)])
    assert ordered == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)] and parents == [-1, -1, 0, 0, 2]


def test_chain_tree_mask_is_the_causal_mask():
    t = tree_batch([0, 0], Proposal([[1, 2, 3], [4]]), [3, 3])
    start = torch.tensor([5, 9])
    attn = TreeAttention(start, start.view(2, 1) + t.depth, t.visible)
    mask = attn.mask(14, torch.device("cpu"), window=6)
    ref = causal_mask(start, 4, 14, torch.device("cpu"), window=6)
    assert torch.equal(mask[0], ref[0]) and torch.equal(mask[1, :, :2], ref[1, :, :2])


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=64, seed=0)


@pytest.mark.parametrize("fused", [False, True])
def test_tree_forward_scores_each_node_as_its_chain_and_gathered_kv_is_a_chains(target, fused):
    model = copy.deepcopy(target)
    if fused:
        fuse_layers(model)
        pack_linears(model)
    contexts = [[3, 14, 15, 9, 2, 6], [5, 35, 8]]
    prop = Proposal([[10, 11, 12, 13, 20], [21, 22, 23]], parents=[[-1, -1, 0, 0, 3], [-1, 0, -1]])
    runner = ModelRunner(model, rows=2)
    for b, ctx in enumerate(contexts):  # each row's context but its last token, which is the root
        runner.forward(torch.tensor([ctx[:-1]]), slice(b, b + 1), torch.zeros(1, dtype=torch.long),
                       positions=None, prefill=True)
    t = tree_batch([c[-1] for c in contexts], prop, [3, 2])
    start = torch.tensor([len(c) - 1 for c in contexts])
    logits, _ = runner.forward(t.feed, slice(0, 2), start,
                               tree=TreeAttention(start, start.view(2, 1) + t.depth, t.visible))

    def path_to(b, node):  # tokens from the root's child down to `node`
        out = []
        while node >= 0:
            out.append(prop.tokens[b][node])
            node = prop.parents[b][node]
        return out[::-1]

    with torch.inference_mode():
        for b, ctx in enumerate(contexts):
            ref = target(torch.tensor([ctx])).logits[0, -1]
            assert torch.allclose(logits[b, 0], ref, atol=1e-4)
            for i in range(len(prop.tokens[b])):
                ref = target(torch.tensor([ctx + path_to(b, i)])).logits[0, -1]
                assert torch.allclose(logits[b, i + 1], ref, atol=1e-4), (b, i)
    # Accept row 0's path to node 4 (nodes 0, 3, 4: the second child of node 0), row 1's node 2.
    paths = [[0, 3, 4], [2]]
    gather_paths(runner.cache, start + 1, paths)
    nxt = torch.tensor([[7], [7]])
    after = start + 1 + torch.tensor([3, 1])
    logits2, _ = runner.forward(nxt, slice(0, 2), after)
    with torch.inference_mode():
        for b, ctx in enumerate(contexts):
            seq = ctx + [prop.tokens[b][i] for i in paths[b]] + [7]
            assert torch.allclose(logits2[b, 0], target(torch.tensor([seq])).logits[0, -1], atol=1e-4)


def test_greedy_verification_takes_the_longest_matching_path():
    V = 10
    prop = Proposal([[4, 5, 6, 7, 8]], parents=[[-1, -1, 1, 1, 2]])  # root -> {4, 5}; 5 -> {6, 7}; 6 -> {8}
    t = tree_batch([0], prop, [3])
    logits = torch.zeros(1, 6, V)
    # by feed index (root, then nodes): root -> 5 (its second child), at 5 -> 7 (its second
    # child), at 7 -> 9 (7 has no children: the extra token)
    argmax = [5, 1, 7, 2, 9, 3]
    for j, a in enumerate(argmax):
        logits[0, j, a] = 5.0
    paths, extra = verify_tree(t, logits, None, [SamplingParams()], [torch.Generator()])
    assert paths == [[1, 3]] and extra == [9]


def _draft_engine(target, noise=0.3):
    return Engine(target, tiny.perturbed_copy(target, noise, seed=1), pack=False)


def test_dynamic_tree_keeps_the_best_candidates_within_the_budget(target):
    eng = _draft_engine(target)
    spec = SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=4, topk=3, num_draft_tokens=8)
    batch = eng.batch(spec)
    for p in ([1, 2, 3, 4], [9, 9, 8]):
        batch.admit(p, SamplingParams(max_new_tokens=30))
    prop = batch.drafter.propose(batch.rows, [4, 2])
    t = tree_batch([0, 0], prop, [4, 2])
    assert t.nodes == [7, 7] and t.depth[0].max() <= 4 and t.depth[1].max() <= 2
    # the kept nodes are the candidates of highest cumulative draft probability: every kept
    # node scores at least as high as any root child that was not kept
    draft = eng.draft
    with torch.inference_mode():
        for b, r in enumerate(batch.rows):
            lp = torch.log_softmax(draft(torch.tensor([r.ids])).logits[0, -1], -1)
            kids = [prop.tokens[b][i] for i, p in enumerate(prop.parents[b]) if p == -1]
            assert kids == lp.topk(len(kids)).indices.tolist()  # the root's best, best first


def test_static_tree_has_the_shape_given(target):
    paths = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    eng = _draft_engine(target)
    spec = parse_speculative_config('{"method": "draft_model", "model": "d", "speculative_token_tree": '
                                    '"[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"}')
    batch = eng.batch(spec)
    batch.admit([1, 2, 3], SamplingParams(max_new_tokens=30))
    prop = batch.drafter.propose(batch.rows, [3])
    assert prop.parents == [tree_from_paths(paths)[0]]
    with torch.inference_mode():
        lp = eng.draft(torch.tensor([batch.rows[0].ids])).logits[0, -1]
    assert prop.tokens[0][:2] == lp.topk(2).indices.tolist()


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_caches_after_accepting_other_branches_equal_a_fresh_prefill(target, method):
    """Greedy steps that accept branches other than the first (the drafter's second choice
    is often the target's): after every step, the target's slot and the draft model's hold
    exactly a fresh prefill of the sequence they claim."""
    head = tiny.make_head(target, seed=4) if method == "eagle3" else None
    eng = Engine(target, tiny.perturbed_copy(target, 0.6, seed=2) if head is None else None, head=head, pack=False)
    spec = SpeculativeConfig(method=method, draft="d", num_speculative_tokens=3, topk=3, num_draft_tokens=10)
    batch = eng.batch(spec)
    for p in ([1, 2, 3, 4, 5], [7, 8], [30, 31, 32, 33, 34, 35, 36]):
        batch.admit(p, SamplingParams(max_new_tokens=40, ignore_eos=True))
    ranks = []
    for _ in range(8):
        batch.step()
        for b, r in enumerate(batch.rows):
            ranks += r.steps[-1].accepted_ranks
            n = len(r.ids) - 1
            fresh = ModelRunner(target)
            fresh.forward(torch.tensor([r.ids[:n]]), slice(0, 1), torch.zeros(1, dtype=torch.long),
                          positions=None, prefill=True)
            for layer in range(fresh.num_layers):
                assert torch.allclose(batch.target.cache.keys[layer][b, :, :n], fresh.cache.keys[layer][0, :, :n],
                                      atol=1e-5)
            if method == "draft_model":
                d = batch.drafter
                m = d.lengths[b]
                fresh = ModelRunner(eng.draft)
                fresh.forward(torch.tensor([r.ids[:m]]), slice(0, 1), torch.zeros(1, dtype=torch.long),
                              positions=None, prefill=True)
                for layer in range(fresh.num_layers):
                    assert torch.allclose(d.lm.cache.values[layer][b, :, :m], fresh.cache.values[layer][0, :, :m],
                                          atol=1e-5)
    assert any(r > 0 for r in ranks), "no step accepted a branch other than the first"


@pytest.mark.parametrize("text,match", [
    ('{"method": "draft_model", "model": "d", "topk": 0}', "topk must be >= 1"),
    ('{"method": "draft_model", "model": "d", "topk": "2"}', "topk must be an integer"),
    ('{"method": "draft_model", "model": "d", "num_draft_tokens": 1}', "num_draft_tokens must be >= 2"),
    ('{"method": "draft_model", "model": "d", "num_steps": 2, "topk": 2, "num_draft_tokens": 9}', "can hold"),
    ('{"method": "draft_model", "model": "d", "num_steps": 2, "num_speculative_tokens": 3}', "disagree"),
    ('{"method": "ngram", "topk": 2}', "drafts one continuation"),
    ('{"method": "draft_model", "model": "d", "speculative_token_tree": "[(0, 0)]"}', "path \\[0\\] is missing"),
    ('{"method": "draft_model", "model": "d", "speculative_token_tree": "[(0,), (0,)]"}', "twice"),
    ('{"method": "draft_model", "model": "d", "speculative_token_tree": "[(-1,)]"}', "branch ranks"),
    ('{"method": "draft_model", "model": "d", "speculative_token_tree": "not a tree"}', "not a list of paths"),
    ('{"method": "draft_model", "model": "d", "speculative_token_tree": [[0]], "num_speculative_tokens": 3}',
     "has 1 nodes"),
    ('{"method": "draft_model", "model": "d", "speculative_token_tree": [[0]], "topk": 2}', "fixes the tree"),
])
def test_tree_knobs_bad_values_are_one_line_errors(text, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_speculative_config(text)
    assert "\n" not in str(err.value)


def test_tree_knobs_parse_to_sglang_meaning():
    spec = parse_speculative_config('{"method": "eagle3", "model": "h", "num_steps": 5, "topk": 4, '
                                    '"num_draft_tokens": 8}')
    assert (spec.num_speculative_tokens, spec.topk, spec.draft_nodes, spec.verify_width) == (5, 4, 7, 8)
    assert spec.short == "eagle3-k5-t4n8"
    chain = SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=3)
    assert (chain.draft_nodes, chain.verify_width, chain.is_tree) == (3, 4, False)
    tree = parse_speculative_config('{"method": "draft_model", "model": "d", "speculative_token_tree": '
                                    '[[0], [1], [0, 0]]}')
    assert (tree.num_speculative_tokens, tree.draft_nodes, tree.is_tree) == (2, 3, True)


def test_records_carry_the_tree_shape_per_step():
    import pyarrow as pa

    from specbench.metrics import sample_metrics
    from specbench.records import SCHEMA, make_row
    from specbench.types import Request, Result, StepEvent

    spec = SpeculativeConfig(method="draft_model", draft="d", num_speculative_tokens=3, topk=2, num_draft_tokens=6)
    req = Request(id="p", prompt_ids=(1, 2), sampling=SamplingParams(max_new_tokens=8))
    steps = [StepEvent(5, 2, 2, 3, 0.01, 0.02, 1, 10, draft_depth=3, accepted_ranks=(1, 0)),
             StepEvent(5, 3, -1, 4, 0.01, 0.02, 1, 13, draft_depth=3, accepted_ranks=(0, 1, 0)),
             StepEvent(0, 0, -1, 1, 0.0, 0.02, 1, 17)]  # a step of a backend that reports no tree
    res = Result(request_id="p", output_ids=list(range(9)), arrival_time=0.0, start_time=0.0,
                 token_times=[0.1] * 9, finish_reason="length", steps=steps, target_forward_passes=4)
    row = make_row(run_id="r", config_id=spec.short, backend="embedded", spec=spec, concurrency=1,
                   request_rate=None, request=req, metrics=sample_metrics(req, res))
    assert (row["topk"], row["num_draft_tokens"]) == (2, 6)
    assert row["step_drafted"] == [5, 5, 0] and row["step_accepted"] == [2, 3, 0]  # their meaning kept
    assert row["step_draft_depth"] == [3, 3, None] and row["step_accepted_ranks"] == [[1, 0], [0, 1, 0], None]
    table = pa.Table.from_pylist([row], schema=SCHEMA)
    assert table.column("step_accepted_ranks").to_pylist() == [[[1, 0], [0, 1, 0], None]]
