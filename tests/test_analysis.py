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


def test_where_speculation_pays_names_the_cliff():
    import pandas as pd

    from specbench.analysis import where_speculation_pays

    df = pd.DataFrame({
        "method": ["draft_model"] * 3 + ["ngram"] * 2,
        "num_speculative_tokens": [4] * 3 + [3] * 2,
        "concurrency": [1, 4, 16, 1, 4],
        "output_tps_speedup": [1.6, 1.1, 0.7, 0.9, 0.8],
    })
    lines = where_speculation_pays(df)
    assert lines[0].startswith("draft_model k=4: pays up to concurrency 4 and stops paying from 16")
    assert "c16 0.70x" in lines[0]
    assert lines[1].startswith("ngram k=3: does not pay at any concurrency measured")


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
