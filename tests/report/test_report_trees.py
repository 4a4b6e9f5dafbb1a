"""The report's draft-tree section on a synthetic run (no models): acceptance by depth and by
branch rank computed exactly from the recorded steps, the TPOT speedup against tokens verified
per pass with one line per concurrency, and no tree section in a report of chains."""

from __future__ import annotations

import re

import numpy as np
import pytest

from report_helpers import write_run
from specbench.config import BASELINE, SamplingParams, SpeculativeConfig
from specbench.metrics import sample_metrics
from specbench.records import make_row
from specbench.report import build_report, load_inputs
from specbench.report.tree_plots import depth_and_rank, speedup_by_tree_size, tree_acceptance
from specbench.report.verdict import verdict_table
from specbench.types import Request, Result, StepEvent

CHAIN = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft="d")
TREE = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft="d", topk=2, num_draft_tokens=7)
# per step: (accepted, ranks of the accepted path); the tree's second step takes branch 1 twice
TREE_STEPS = [(3, (0, 0, 1)), (2, (1, 1)), (0, ()), (1, (0,))]
CHAIN_STEPS = [(2, (0, 0)), (0, ()), (1, (0,)), (1, (0,))]


def row(run_id, spec, c, pid, steps, tpot):
    req = Request(id=pid, prompt_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=11))
    events = [StepEvent(spec.draft_nodes if spec.speculative else 0, a, -1, a + 1, 1e-3, 2e-3, batch_size=c,
                        context_tokens=4, draft_depth=3 if spec.speculative else None,
                        accepted_ranks=r if spec.speculative else None) for a, r in steps]
    n = 1 + sum(e.emitted for e in events)
    times = [0.05 + i * tpot for i in range(n)]
    res = Result(pid, list(range(n)), 0.0, 0.0, times, "length", steps=events,
                 target_forward_passes=1 + len(events))
    return make_row(run_id=run_id, config_id=f"{spec.short}-c{c}", backend="embedded", spec=spec,
                    concurrency=c, request_rate=None, request=req,
                    metrics=sample_metrics(req, res, config_start=0.0))


@pytest.fixture
def tree_run(tmp_path):
    rows = []
    for c, (chain_gain, tree_gain) in {1: (1.3, 1.6), 4: (1.1, 0.9)}.items():
        for i in range(6):
            pid = f"p{i}"
            base = 0.02 * (1 + 0.1 * i)
            rows.append(row("r", BASELINE, c, pid, [(0, ())] * 10, base))
            rows.append(row("r", CHAIN, c, pid, CHAIN_STEPS, base / chain_gain))
            rows.append(row("r", TREE, c, pid, TREE_STEPS, base / tree_gain))
    return write_run(tmp_path / "r", rows, config={"method": "draft_model", "num_speculative_tokens": [3],
                                                   "concurrency": [1, 4]})


def test_depth_and_rank_are_counted_from_the_steps(tree_run):
    inputs = load_inputs([tree_run])
    f = inputs.frame
    tree_rows = f[f["topk"] == 2]
    survival, share = depth_and_rank(tree_rows)
    # accepted path depths 3, 2, 0, 1 in every request: reached depth 1 in 3/4, 2 in 2/4, 3 in 1/4
    assert survival == pytest.approx([0.75, 0.5, 0.25])
    # accepted nodes' ranks 0,0,1 1,1 0: three of rank 0, three of rank 1
    assert share == pytest.approx([0.5, 0.5])
    chain_survival, chain_share = depth_and_rank(f[(f["topk"] == 1) & ~f["is_baseline"]])
    assert chain_survival == pytest.approx([0.75, 0.25]) and chain_share == pytest.approx([1.0])


def test_the_tree_section_draws_both_plots(tree_run):
    inputs = load_inputs([tree_run])
    table = verdict_table(inputs, n_boot=200)
    acc = tree_acceptance(inputs, table)
    assert acc.figure is not None and acc.note is None
    assert {t.type for t in acc.figure.data} == {"scatter", "bar"}
    size = speedup_by_tree_size(inputs, table)
    lines = {t.name: (list(t.x), list(np.round(t.y, 2))) for t in size.figure.data}
    # one line per concurrency: chain k = 3 verifies 4 tokens per pass, the tree 7
    assert lines == {"concurrency 1": ([4, 7], [1.3, 1.6]), "concurrency 4": ([4, 7], [1.1, 0.9])}
    page = build_report(inputs, n_boot=200)
    ids = re.findall(r'<div id="(plot-[a-z-]+)" class="plotly-graph-div"', page)
    assert "plot-tree-acceptance" in ids and "plot-tree-size" in ids


def test_a_report_of_chains_has_no_tree_section(tmp_path):
    rows = [row("c", spec, 1, f"p{i}", CHAIN_STEPS if spec.speculative else [(0, ())] * 6, 0.02)
            for i in range(4) for spec in (BASELINE, CHAIN)]
    inputs = load_inputs([write_run(tmp_path / "c", rows)])
    assert tree_acceptance(inputs, verdict_table(inputs, n_boot=100)) is None
    assert "Draft trees" not in build_report(inputs, n_boot=100)
