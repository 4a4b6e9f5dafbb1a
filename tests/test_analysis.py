import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from specbench.analysis import (
    paired_bootstrap_speedup,
    per_position_acceptance,
    rich_summary_table,
    speedups,
    summarize,
)
from specbench.config import BASELINE, SamplingParams, SpeculativeConfig
from specbench.errors import RecordsError
from specbench.metrics import sample_metrics
from specbench.records import make_row
from specbench.types import Request, Result, StepEvent


def _row(pid, spec=BASELINE, *, ttft=0.1, tpot=0.01, n_out=5, arrival=0.0, concurrency=1,
         accepted=(), error=None, peak=None, config_id=None):
    """A records row for a request arriving at `arrival` (relative to the configuration
    start at 0) whose tokens come at ttft, ttft + tpot, ...; `accepted` lists accepted drafts
    per verification step (k = spec.num_speculative_tokens)."""
    req = Request(id=pid, prompt_ids=(1, 2), sampling=SamplingParams())
    k = spec.num_speculative_tokens
    steps = [StepEvent(k, a, -1 if a == k else a, a + 1, 0.0, 0.0) for a in accepted]
    if error:
        res = Result(pid, [], arrival, arrival, [], "error", error=error)
    else:
        times = [arrival + ttft + i * tpot for i in range(n_out)]
        res = Result(pid, list(range(n_out)), arrival, arrival, times, "length", steps=steps,
                     peak_memory_bytes=peak)
    m = sample_metrics(req, res, config_start=0.0)
    return make_row(run_id="r", config_id=config_id or f"{spec.short}-c{concurrency}",
                    backend="embedded", spec=spec, concurrency=concurrency, request_rate=None,
                    request=req, metrics=m)


K2 = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
K3 = SpeculativeConfig(method="ngram", num_speculative_tokens=3)


def test_summarize_percentiles_match_numpy():
    rng = np.random.default_rng(1)
    ttft = rng.uniform(0.05, 0.5, 40)
    tpot = rng.uniform(0.005, 0.05, 40)
    rows = [_row(f"p{i}", ttft=a, tpot=b, n_out=11) for i, (a, b) in enumerate(zip(ttft, tpot))]
    rows.append(_row("bad", error="boom"))
    s = summarize(pd.DataFrame(rows))
    assert len(s) == 1
    r = s.iloc[0]
    assert r["n"] == 41 and r["errors"] == 1
    e2e = ttft + 10 * tpot
    for q in (50, 95, 99):
        assert r[f"ttft_p{q}_s"] == pytest.approx(np.percentile(ttft, q))
        assert r[f"tpot_p{q}_s"] == pytest.approx(np.percentile(tpot, q))
        assert r[f"e2e_p{q}_s"] == pytest.approx(np.percentile(e2e, q))
    assert r["itl_p50_s"] == pytest.approx(np.percentile(np.repeat(tpot, 10), 50))
    assert r["output_tps_per_user"] == pytest.approx(np.mean(1 / tpot))
    assert r["output_tokens"] == 40 * 11
    assert r["wall_s"] == pytest.approx(e2e.max())
    assert r["output_tps"] == pytest.approx(440 / e2e.max())


def test_summarize_throughput_uses_wall_span_of_the_configuration():
    # Two requests of 5 tokens, arriving at 1.0 and 2.0, each finishing 0.1 + 4 * 0.01 later.
    rows = [_row("a", arrival=1.0), _row("b", arrival=2.0)]
    r = summarize(pd.DataFrame(rows)).iloc[0]
    assert r["wall_s"] == pytest.approx(1.14)
    assert r["output_tps"] == pytest.approx(10 / 1.14)
    assert r["requests_per_s"] == pytest.approx(2 / 1.14)
    assert r["output_tps_per_user"] == pytest.approx(100.0)


def test_acceptance_request_and_token_weighted():
    # Request a: 2 steps, accepted 2 and 2 of k=2 -> rate 1.0, length 3.
    # Request b: 4 steps, accepted 0,0,0,1 -> rate 1/8, length 1.25.
    rows = [_row("a", K2, accepted=(2, 2)), _row("b", K2, accepted=(0, 0, 0, 1))]
    r = summarize(pd.DataFrame(rows)).iloc[0]
    assert r["drafted_tokens"] == 12 and r["accepted_tokens"] == 5
    assert r["acceptance_rate_tok"] == pytest.approx(5 / 12)
    assert r["acceptance_rate_req"] == pytest.approx((1.0 + 1 / 8) / 2)
    assert r["mean_acceptance_length_tok"] == pytest.approx(1 + 5 / 6)
    assert r["mean_acceptance_length_req"] == pytest.approx((3 + 1.25) / 2)


def test_baseline_acceptance_length_is_one_and_rate_nan():
    r = summarize(pd.DataFrame([_row("a"), _row("b")])).iloc[0]
    assert r["mean_acceptance_length_tok"] == 1.0 and r["mean_acceptance_length_req"] == 1.0
    assert np.isnan(r["acceptance_rate_tok"]) and np.isnan(r["acceptance_rate_req"])
    assert bool(r["is_baseline"])


def test_summarize_groups_by_config_and_concurrency_and_takes_peak_memory():
    rows = [_row("a", peak=100), _row("b", peak=300), _row("a", concurrency=4, peak=50),
            _row("a", K2, accepted=(1,))]
    s = summarize(pd.DataFrame(rows))
    assert list(s["config_id"]) == ["baseline-c1", "baseline-c4", "ngram-k2-c1"]
    assert list(s["n"]) == [2, 1, 1]
    assert s.iloc[0]["peak_memory_bytes"] == 300
    assert np.isnan(s.iloc[2]["peak_memory_bytes"])


def test_speedups_against_baseline_at_same_concurrency():
    rows = ([_row(f"p{i}", tpot=0.02) for i in range(3)]
            + [_row(f"p{i}", tpot=0.04, concurrency=8) for i in range(3)]
            + [_row(f"p{i}", K2, tpot=0.01, accepted=(2,)) for i in range(3)]
            + [_row(f"p{i}", K2, tpot=0.05, concurrency=8, accepted=(0,)) for i in range(3)]
            + [_row(f"p{i}", K3, tpot=0.01, concurrency=2) for i in range(3)])  # no baseline
    s = summarize(pd.DataFrame(rows))
    sp = speedups(s).set_index("config_id")
    assert set(sp.index) == {"ngram-k2-c1", "ngram-k2-c8", "ngram-k3-c2"}
    a = sp.loc["ngram-k2-c1"]
    assert a["baseline_config_id"] == "baseline-c1"
    assert a["tpot_p50_speedup"] == pytest.approx(2.0)
    # e2e = 0.1 + 4 * tpot
    assert a["e2e_p50_speedup"] == pytest.approx(0.18 / 0.14)
    assert a["output_tps_speedup"] == pytest.approx(0.18 / 0.14)
    assert a["output_tps_per_user_speedup"] == pytest.approx(2.0)
    b = sp.loc["ngram-k2-c8"]
    assert b["baseline_config_id"] == "baseline-c8"
    assert b["tpot_p50_speedup"] == pytest.approx(0.8)  # slower than the baseline: < 1
    assert np.isnan(sp.loc["ngram-k3-c2"]["tpot_p50_speedup"])


def test_paired_bootstrap_contains_true_ratio():
    rng = np.random.default_rng(0)
    n = 200
    difficulty = rng.lognormal(0, 0.5, n)  # prompts differ a lot; pairing cancels it
    base = pd.DataFrame([_row(f"p{i}", tpot=0.02 * d) for i, d in enumerate(difficulty)])
    noise = rng.lognormal(0, 0.05, n)
    spec = pd.DataFrame([_row(f"p{i}", K2, tpot=0.02 * d / 1.6 * e)
                         for i, (d, e) in enumerate(zip(difficulty, noise))])
    point, lo, hi = paired_bootstrap_speedup(base, spec, n_boot=1000, seed=0)
    assert lo < 1.6 < hi
    assert lo <= point <= hi
    assert hi - lo < 0.4
    # deterministic for a seed
    assert paired_bootstrap_speedup(base, spec, n_boot=1000, seed=0) == (point, lo, hi)


def test_paired_bootstrap_resamples_blocks_where_a_burst_moved_a_whole_block():
    # concurrency 8: three blocks of 8 prompts; each block's ratios agree closely, but the
    # blocks disagree (a burst of load in one configuration's half of a block moves all 8)
    rng = np.random.default_rng(3)
    shift = np.repeat([0.8, 1.0, 0.9], 8)
    base_tpot = rng.uniform(0.02, 0.03, 24)
    spec_tpot = base_tpot * shift * rng.lognormal(0, 0.01, 24)

    def frames(blocks):
        base = pd.DataFrame([_row(f"p{i}", tpot=t, concurrency=8) for i, t in enumerate(base_tpot)])
        spec = pd.DataFrame([_row(f"p{i}", K2, tpot=t, concurrency=8) for i, t in enumerate(spec_tpot)])
        base["block"], spec["block"] = blocks, blocks
        return base, spec

    _, p_lo, p_hi = paired_bootstrap_speedup(*frames(np.arange(24)), n_boot=2000)  # a block per prompt
    _, b_lo, b_hi = paired_bootstrap_speedup(*frames(np.arange(24) // 8), n_boot=2000)
    # prompts as the unit: "pays" from one block's burst; blocks as the unit: undecided
    assert p_lo > 1.0 and b_lo < 1.0 and b_hi - b_lo > 1.3 * (p_hi - p_lo)
    # records without blocks (before schema 6), and --repeats, keep the prompt as the unit
    base, spec = frames(None)
    assert paired_bootstrap_speedup(base, spec, n_boot=2000)[1:] == pytest.approx((p_lo, p_hi))


def test_paired_bootstrap_identical_data_is_one_and_narrow():
    rng = np.random.default_rng(2)
    df = pd.DataFrame([_row(f"p{i}", tpot=t) for i, t in enumerate(rng.uniform(0.01, 0.03, 50))])
    point, lo, hi = paired_bootstrap_speedup(df, df.copy(), stat="mean")
    assert point == pytest.approx(1.0) and lo == pytest.approx(1.0) and hi == pytest.approx(1.0)


def test_paired_bootstrap_pairs_only_shared_prompts():
    base = pd.DataFrame([_row("a", tpot=0.02), _row("b", tpot=0.04), _row("only_base", tpot=9.0)])
    spec = pd.DataFrame([_row("a", K2, tpot=0.01), _row("b", K2, tpot=0.02),
                         _row("only_spec", K2, tpot=0.001), _row("c", K2, error="x")])
    point, lo, hi = paired_bootstrap_speedup(base, spec, n_boot=200)
    assert point == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    with pytest.raises(RecordsError, match="shared prompt"):
        paired_bootstrap_speedup(base, pd.DataFrame([_row("zzz", K2)]))
    with pytest.raises(ValueError, match="stat"):
        paired_bootstrap_speedup(base, spec, stat="mode")


def test_per_position_acceptance():
    # k=3, steps accepted: 3, 1, 0, 2 -> position 0: 3/4, 1: 2/4, 2: 1/4
    rows = [_row("a", K3, accepted=(3, 1)), _row("b", K3, accepted=(0, 2))]
    got = per_position_acceptance(pd.DataFrame(rows))
    assert got == pytest.approx([0.75, 0.5, 0.25])
    # pooled per step, so it averages to the token-weighted acceptance rate
    s = summarize(pd.DataFrame(rows)).iloc[0]
    assert got.mean() == pytest.approx(s["acceptance_rate_tok"])
    assert per_position_acceptance(pd.DataFrame([_row("a")])).size == 0


def test_rich_table_renders_within_120_columns():
    rows = ([_row(f"p{i}", peak=3 * 2**30) for i in range(3)]
            + [_row(f"p{i}", K2, tpot=0.005, accepted=(2, 1), peak=4 * 2**30,
                    config_id="draft_model-k4-c1-rate2.5-extra-long-name") for i in range(3)]
            + [_row("z", K3, concurrency=16, error="oom")])
    s = summarize(pd.DataFrame(rows))
    console = Console(width=120, record=True, color_system=None)
    console.print(rich_summary_table(s, speedups(s)))
    text = console.export_text()
    assert all(len(line) <= 120 for line in text.splitlines())
    assert "draft_model-k4-c1" in text and "…" not in text  # long names fold, never cut
    assert "TTFT" in text and "TPOT" in text and "E2E" in text
    assert "100 / 100 / 100" in text  # TTFT p50/p95/p99 in ms
    assert "2.00" in text  # TPOT speedup
    assert "4096" in text  # peak MiB


def test_analysis_does_not_import_torch():
    code = "import sys, specbench.analysis; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_summary_of_a_run_read_back_from_disk(tmp_path):
    from specbench.records import RunMetadata, RunWriter, read_run

    rows = ([_row(f"p{i}", peak=2**20) for i in range(4)]
            + [_row(f"p{i}", K3, tpot=0.005, accepted=(3, 1)) for i in range(4)]
            + [_row("e", K3, error="boom")])
    with RunWriter(tmp_path / "run", RunMetadata.collect("r", {})) as w:
        w.add(rows)
    df, _ = read_run(tmp_path / "run")
    s = summarize(df)
    expected = summarize(pd.DataFrame(rows))
    pd.testing.assert_frame_equal(s, expected, check_dtype=False)
    assert per_position_acceptance(df[df["method"] == "ngram"]) == pytest.approx([1.0, 0.5, 0.5])
    assert speedups(s).iloc[0]["tpot_p50_speedup"] == pytest.approx(2.0)


def test_empty_records_summarize_to_empty_frames():
    from specbench.records import SCHEMA

    empty = SCHEMA.empty_table().to_pandas()
    s = summarize(empty)
    assert len(s) == 0 and "tpot_p50_s" in s.columns
    assert len(speedups(s)) == 0
    Console(width=120, file=None, record=True).print(rich_summary_table(s, speedups(s)))


def _verdict_run(speedups_by_c: dict[int, float], n: int = 12, noise: float = 0.02, seed: int = 0) -> pd.DataFrame:
    """A run with a baseline and ngram-k3 at each concurrency whose TPOT is the baseline's
    divided by the given speedup, per prompt, with a little noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, speedup in speedups_by_c.items():
        for i in range(n):
            base = 0.02 * (1 + 0.5 * rng.random())
            rows.append(_row(f"p{i}", tpot=base, n_out=9, concurrency=c))
            rows.append(_row(f"p{i}", K3, tpot=base / speedup * (1 + noise * rng.standard_normal()),
                             n_out=9, concurrency=c, accepted=(1, 2)))
    return pd.DataFrame(rows)


def test_where_speculation_pays_names_the_cliff_from_the_paired_intervals():
    from specbench.analysis import speedup_verdicts, where_speculation_pays

    v = speedup_verdicts(_verdict_run({1: 1.6, 4: 1.1, 16: 0.7}))
    assert list(v["outcome"]) == ["win", "win", "loss"]
    lines = where_speculation_pays(v)
    assert lines[0].startswith("ngram k=3: pays up to concurrency 4 and stops paying from 16")
    assert re.search(r"c16 0\.7\dx \[0\.\d\d, 0\.\d\d\] loses", lines[0]), lines[0]


def test_a_speedup_whose_interval_straddles_one_is_even_not_pays():
    """The console once said "pays" at a measured 0.96x (its rule was 'tok/s > 1'); now a
    configuration pays only when its whole paired interval lies above the minimum."""
    from specbench.analysis import outcome, speedup_verdicts, where_speculation_pays

    v = speedup_verdicts(_verdict_run({1: 1.02}, noise=0.2))
    assert v["outcome"].iloc[0] == "even"
    assert v["tpot_speedup_lo"].iloc[0] < 1 < v["tpot_speedup_hi"].iloc[0]
    assert where_speculation_pays(v)[0].startswith("ngram k=3: does not pay at any concurrency measured")
    # A stated minimum effect raises the bar: a clear 1.1x win is only even against 1.2x.
    assert outcome(1.1, 1.05, 1.15) == "win" and outcome(1.1, 1.05, 1.15, min_speedup=1.2) == "even"
    assert outcome(0.9, 0.85, 0.95) == "loss" and outcome(float("nan"), 1, 2) == "unclear"


def test_the_paired_interval_covers_the_truth_and_pseudo_replication_does_not():
    """With per-prompt speedups that vary, the interval (prompts resampled whole, repeats
    averaged) covers the population speedup at least as often as it claims (measured: 120 of
    120 for a 95% interval; the percentile bootstrap of a median ratio is a little
    conservative); treating each repeat as its own prompt (pseudo-replication) gives intervals
    far too narrow (78 of 120). The test runs both,
    so it would fail if the interval were built the broken way."""
    rng = np.random.default_rng(5)
    big = rng.lognormal(0.0, 0.4, 400_000)
    theta_big = rng.lognormal(np.log(1.3), 0.25, 400_000)
    truth = np.median(big) / np.median(big / theta_big)

    def dataset(n=25, repeats=8):
        d = rng.lognormal(0.0, 0.4, n)
        theta = rng.lognormal(np.log(1.3), 0.25, n)
        rows = []
        for i in range(n):
            for r in range(repeats):
                rows.append({"prompt_id": f"p{i}", "repeat": r, "error": None, "finish_reason": "length",
                             "b": d[i] * (1 + 0.05 * rng.standard_normal()),
                             "s": d[i] / theta[i] * (1 + 0.05 * rng.standard_normal())})
        return pd.DataFrame(rows)

    def frames(df, pseudo):
        key = df["prompt_id"] + ("-" + df["repeat"].astype(str) if pseudo else "")
        base = pd.DataFrame({"prompt_id": key, "error": None, "finish_reason": "length", "tpot_s": df["b"]})
        spec = pd.DataFrame({"prompt_id": key, "error": None, "finish_reason": "length", "tpot_s": df["s"]})
        return base, spec

    hits = {False: 0, True: 0}
    trials = 120
    for t in range(trials):
        df = dataset()
        for pseudo in (False, True):
            _, lo, hi = paired_bootstrap_speedup(*frames(df, pseudo), n_boot=400, seed=t)
            hits[pseudo] += lo <= truth <= hi
    assert hits[False] / trials >= 0.88, hits
    assert hits[True] / trials <= 0.80, hits


def test_requests_whose_answer_came_in_one_burst_are_left_out_of_per_user_speed():
    """A whole answer arriving at once (decode time ~0) would make tok/s per user thousands
    of times the total: such requests are counted, not averaged."""
    from specbench.analysis import MIN_DECODE_S, burst_lines

    steady = [_row(f"s{i}", tpot=0.02, n_out=11) for i in range(3)]  # 50 tok/s each
    burst = [_row("b", tpot=1e-6, n_out=11)]  # 10 tokens in 10 us: 1,000,000 tok/s
    s = summarize(pd.DataFrame(steady + burst)).iloc[0]
    assert s["output_tps_per_user"] == pytest.approx(50.0) and s["output_tps_per_user_excluded"] == 1
    assert 1e-5 < MIN_DECODE_S
    lines = burst_lines(summarize(pd.DataFrame(steady + burst)))
    assert len(lines) == 1 and "1 of 4 request(s)" in lines[0]
    # without the rule the same rows average to a figure no user saw
    with_burst = np.mean([(r["output_tokens"] - 1) / (r["e2e_s"] - r["ttft_s"]) for r in steady + burst])
    assert with_burst > 1e5
    s = summarize(pd.DataFrame(steady)).iloc[0]
    assert s["output_tps_per_user_excluded"] == 0 and burst_lines(summarize(pd.DataFrame(steady))) == []


def test_chunk_itl_percentiles_beside_per_token_itl():
    # speculative rows: 2 tokens per step arrive together, so per-token ITL has zero gaps
    rows = [_row(f"p{i}", K2, accepted=(1, 1)) for i in range(2)]
    for r in rows:
        r["itl_s"] = [0.01, 0.0, 0.01, 0.0]
        r["chunk_itl_s"] = [0.01, 0.01]
    s = summarize(pd.DataFrame(rows)).iloc[0]
    assert s["itl_p50_s"] == pytest.approx(0.005) and s["chunk_itl_p50_s"] == pytest.approx(0.01)


def test_table_shows_acceptance_with_its_scope_never_a_baseline_looking_one():
    rows = ([_row(f"p{i}") for i in range(2)]
            + [_row(f"p{i}", K2, accepted=(2, 1)) for i in range(2)]  # per request
            + [_row(f"p{i}", K3) for i in range(2)])  # speculative, nothing per request
    s = summarize(pd.DataFrame(rows))
    stats = {"ngram-k3-c1": {"acceptance_scope": "server",
                             "server_spec_decode": {"num_drafts": 8, "acceptance_rate": 0.6875,
                                                    "mean_acceptance_length": 3.0625}}}

    def table(stats):
        console = Console(width=120, record=True, color_system=None)
        console.print(rich_summary_table(s, speedups(s), stats))
        return {line.split("│")[1].strip(): line for line in console.export_text().splitlines()
                if line.startswith("│") and "%" not in line and line.count("│") > 8}

    rows_ = table(stats)
    assert "0.75 / 0.75" in rows_["ngram-k2-c1"] and "request" in rows_["ngram-k2-c1"]
    assert "0.688" in rows_["ngram-k3-c1"] and "3.06" in rows_["ngram-k3-c1"] and "server" in rows_["ngram-k3-c1"]
    assert "1.00 /" not in rows_["ngram-k3-c1"] and "none" not in rows_["ngram-k3-c1"]
    rows_ = table(None)  # no server figures either: says so
    assert "none" in rows_["ngram-k3-c1"] and "1.00 /" not in rows_["ngram-k3-c1"]
    assert "1.00 /" not in rows_["baseline-c1"]


def test_above_concurrency_1_the_verdict_counts_blocks_and_says_so_when_they_are_too_few():
    from specbench.analysis import speedup_verdicts, where_speculation_pays

    df = _verdict_run({4: 1.02}, n=8, noise=0.2)
    df["block"] = [int(p[1:]) // 4 for p in df["prompt_id"]]  # one wave of 4 a block: 2 blocks
    v = speedup_verdicts(df)
    assert v["paired_blocks"].iloc[0] == 2 and v["outcome"].iloc[0] == "even"
    assert "c4 " in where_speculation_pays(v)[0] and "even (2 blocks of 4: --num-prompts buys more)" in \
        where_speculation_pays(v)[0]
    df["block"] = None  # records before blocks: prompts are the unit, nothing said
    v = speedup_verdicts(df)
    assert pd.isna(v["paired_blocks"].iloc[0]) and "blocks" not in where_speculation_pays(v)[0]


def test_a_configuration_measured_in_one_block_keeps_the_prompt_as_the_unit():
    # --no-interleave, or an unpaired sweep trial: every prompt in block 0, no second block to
    # tell a burst from the effect; the interval is the prompt-level one, not undefined
    rng = np.random.default_rng(3)
    base_tpot = rng.uniform(0.02, 0.03, 12)
    spec_tpot = base_tpot / 1.2 * rng.lognormal(0, 0.05, 12)
    base = pd.DataFrame([_row(f"p{i}", tpot=t, concurrency=4) for i, t in enumerate(base_tpot)])
    spec = pd.DataFrame([_row(f"p{i}", K2, tpot=t, concurrency=4) for i, t in enumerate(spec_tpot)])
    base["block"], spec["block"] = None, None
    without = paired_bootstrap_speedup(base, spec)
    base["block"], spec["block"] = 0, 0
    one = paired_bootstrap_speedup(base, spec)
    assert np.isfinite(one[1]) and one == pytest.approx(without)


def test_a_chain_and_a_tree_of_the_same_k_get_a_verdict_each():
    """eagle3 k=3 as a chain and as a tree in one run: two sentences, the tree's named by its
    shape; merged, the tree's 'pays' would read as the chain's."""
    from specbench.analysis import speedup_verdicts, where_speculation_pays

    chain = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head")
    tree = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="head", topk=4, num_draft_tokens=8)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        base = 0.02 * (1 + 0.5 * rng.random())
        rows.append(_row(f"p{i}", tpot=base, n_out=9))
        rows.append(_row(f"p{i}", chain, tpot=base * 1.3 * (1 + 0.02 * rng.standard_normal()), n_out=9,
                         accepted=(0, 1)))
        rows.append(_row(f"p{i}", tree, tpot=base / 1.6 * (1 + 0.02 * rng.standard_normal()), n_out=9,
                         accepted=(2, 1)))
    lines = where_speculation_pays(speedup_verdicts(pd.DataFrame(rows)))
    assert len(lines) == 2, lines
    assert lines[0].startswith("eagle3 k=3: does not pay at any concurrency measured"), lines
    assert lines[1].startswith("eagle3 k=3 t4n8: pays at every concurrency measured"), lines


@pytest.mark.parametrize("request_rate, burstiness", [(None, 1.0), (2.0, 1.0), (0.5, 0.25), (1e6, 3.0)])
def test_series_strips_exactly_the_load_a_configuration_id_carries(request_rate, burstiness):
    """`series` undoes what runner.Configuration.config_id appends (concurrency, and in an open
    loop the rate and a burstiness other than 1), for every drafting shape, and nothing more; the
    report's series and the run's verdict sentences both read it."""
    from specbench.analysis import series
    from specbench.report.inputs import series as report_series
    from specbench.runner import Configuration

    shapes = [SpeculativeConfig(), SpeculativeConfig(method="ngram", num_speculative_tokens=4),
              SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft="h", topk=4, num_draft_tokens=8),
              SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft="d", disable_by_batch_size=8)]
    for spec in shapes:
        for c in (1, 16):
            cid = Configuration(spec, c, request_rate=request_rate, burstiness=burstiness).config_id
            assert series(cid) == spec.short, cid
    assert report_series is series  # one function, not a copy
