"""What `vllm bench serve` users expect, against the known-timing server: --client-processes
(exact closed-loop concurrency and seeded arrivals across worker processes, merged records),
--request-rate lists, --burstiness (gamma arrivals), --goodput (records and console), every
bad value of those flags refused in one line; and goodput and burstiness computed as vLLM's
benchmark computes them, on the same synthetic records."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from specbench.analysis.serving import goodput, parse_goodput
from specbench.arrivals import gamma_arrivals, poisson_arrivals
from specbench.backends.openai import OpenAIBackend
from specbench.backends.openai.known_timing import KnownTimingServer, Schedule
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.errors import ConfigError
from specbench.metrics import meets_slo
from specbench.types import Request

from cli_harness import specbench  # noqa: E402

TOKENS = 8


@pytest.fixture(scope="module")
def srv():
    s = KnownTimingServer(Schedule(ttft_s=0.02, itl_s=0.01)).start()
    yield s
    s.close()


def requests(n):
    return [Request(f"r{i}", (5, i + 1), SamplingParams(max_new_tokens=TOKENS, temperature=0.0, ignore_eos=True))
            for i in range(n)]


def in_flight_max(log) -> int:
    """Most streams the server had open at once (from its own log)."""
    events = sorted([(s["read"], 1) for s in log] + [(s["sent"][-1], -1) for s in log])
    most = cur = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    return most


def test_client_processes_keep_the_closed_loop_concurrency_exact_and_merge_every_result(srv):
    be = OpenAIBackend.connect(srv.url, request_timeout=20)
    be.prepare(requests(1)[0], None, ())
    be.client_processes = 2
    try:
        srv.reset()
        reqs = requests(12)
        results, st = be.run(reqs, SpeculativeConfig(), concurrency=3)
        log = [s for s in srv.log() if s["tokens"] == TOKENS]
        assert [r.request_id for r in results] == [r.id for r in reqs]
        assert all(r.finish_reason == "length" and len(r.output_ids) == TOKENS for r in results)
        assert len(log) == 12 and in_flight_max(log) == 3
        assert all(r.extra["loop_lag_s"] is not None for r in results)  # the worker's own lag
        assert all(0 <= r.extra["ttft_lag_s"] <= r.extra["loop_lag_s"] for r in results)
        assert set(st["client_loop_lag"]) == {"ttft_p50_ms", "ttft_p99_ms", "in_flight_p50_ms", "in_flight_p99_ms"}
        # open loop: every arrival is the seeded gamma schedule, whichever worker sent it
        srv.reset()
        results, _ = be.run(reqs, SpeculativeConfig(), concurrency=12, request_rate=40.0, rate_seed=5,
                            burstiness=0.5)
        arrivals = [r.arrival_time - results[0].arrival_time for r in results]
        assert arrivals == pytest.approx(gamma_arrivals(12, 40.0, 0.5, 5), abs=1e-9)
        assert all(r.start_time >= r.arrival_time for r in results)
    finally:
        be.close()


def vllm_gamma_intervals(n, rate, burstiness, rng):
    """How vllm bench serve draws its gaps: gamma of shape `burstiness`, scale 1/(rate*burstiness)."""
    theta = 1.0 / (rate * burstiness)
    return rng.gamma(shape=burstiness, scale=theta, size=n)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_follow_vllm_burstiness(burstiness):
    ours = np.diff(gamma_arrivals(4001, 10.0, burstiness, seed=3))
    theirs = vllm_gamma_intervals(4000, 10.0, burstiness, np.random.default_rng(0))
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3
    # a wrong scale (1/rate, not 1/(rate*burstiness)) is told apart, except at burstiness 1
    wrong = np.random.default_rng(1).gamma(shape=burstiness, scale=0.1, size=4000)
    if burstiness != 1.0:
        assert stats.ks_2samp(wrong, theirs).pvalue < 1e-6
    assert gamma_arrivals(50, 3.0, 1.0, 7) == poisson_arrivals(50, 3.0, 7)  # Poisson: the same schedule


def vllm_goodput(outputs, slos_ms, dur_s):
    """vLLM's calculate_metrics: successful requests whose ttft, tpot (0 for one output token)
    and e2el are each at most their SLO, per second of the benchmark's duration."""
    ttfts, tpots, e2els = [], [], []
    for o in outputs:
        if not o["success"]:
            continue
        tpots.append((o["latency"] - o["ttft"]) / (o["output_len"] - 1) if o["output_len"] > 1 else 0.0)
        ttfts.append(o["ttft"])
        e2els.append(o["latency"])
    metrics, bounds = [], []
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("e2el", e2els)):
        if name in slos_ms:
            metrics.append(values)
            bounds.append(slos_ms[name] / 1000)
    good = sum(all(b >= v for b, v in zip(bounds, vals)) for vals in zip(*metrics))
    return good / dur_s


def test_goodput_is_vllms_on_the_same_synthetic_records():
    rng = random.Random(4)
    outputs, rows = [], []
    for i in range(300):
        n = rng.choice([1, 2, 16, 64])
        ttft, tpot = rng.uniform(0.01, 0.3), rng.uniform(0.005, 0.05)
        e2e = ttft + tpot * (n - 1)
        ok = rng.random() > 0.1
        outputs.append({"success": ok, "ttft": ttft, "latency": e2e, "output_len": n})
        rows.append({"config_id": "c", "finish_reason": "length" if ok else "error", "ttft_s": ttft,
                     "tpot_s": tpot if n > 1 else None, "e2e_s": e2e})
    for slos in ({"ttft": 100}, {"ttft": 150, "tpot": 20}, {"ttft": 200, "tpot": 30, "e2el": 900}, {"e2el": 1000}):
        df = pd.DataFrame(rows)
        df["meets_slo"] = [meets_slo(r, slos) for r in rows]
        ours = goodput(df, {"c": 12.5}).iloc[0]["goodput_rps"]
        assert ours == pytest.approx(vllm_goodput(outputs, slos, 12.5))
        # counting the failed requests too (a broken variant) would differ on these records
        broken = [dict(o, success=True) for o in outputs]
        assert vllm_goodput(broken, slos, 12.5) != pytest.approx(ours)
    # the bound is inclusive, as vLLM's `s >= r`
    at = {"finish_reason": "stop", "ttft_s": 0.1, "tpot_s": 0.02, "e2e_s": 1.0}
    assert meets_slo(at, {"ttft": 100, "tpot": 20, "e2el": 1000}) is True
    assert meets_slo(dict(at, ttft_s=0.1000001), {"ttft": 100}) is False
    assert meets_slo({"finish_reason": "error", "ttft_s": 0.001, "tpot_s": 0.001, "e2e_s": 0.01}, {"ttft": 100}) is False
    assert meets_slo({"finish_reason": "stop", "ttft_s": 0.001}, None) is None


@pytest.mark.parametrize("value, message", [
    (["ttft"], "NAME:MS"), (["itl:5"], "NAME:MS"), (["ttft:-1"], ">= 0"), (["ttft:abc"], "milliseconds"),
    (["ttft:5,ttft:6"], "twice"), (["ttft:5,,tpot:5"], "empty item"), ([""], "empty item"), ([","], "empty item"),
])
def test_goodput_flag_refuses_bad_values(value, message):
    with pytest.raises(ConfigError, match=message):
        parse_goodput(value)
    assert parse_goodput(["ttft:50", "tpot:20,e2el:1000"]) == {"ttft": 50.0, "tpot": 20.0, "e2el": 1000.0}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(4)))
    return path


def test_cli_rate_sweep_burstiness_goodput_and_client_processes(srv, prompts, tiny_pair, tmp_path):
    out_dir = tmp_path / "run"
    code, out, err = specbench("run", "--backend", "openai", "--base-url", srv.url, "--tokenizer", tiny_pair[0],
                               "--workload", prompts, "--method", "none", "--warmup", "0", "--max-new-tokens", "4",
                               "--no-chat-template", "--ignore-eos", "--concurrency", "4", "--request-rate", "20,40",
                               "--burstiness", "0.5", "--goodput", "ttft:10000", "--goodput", "tpot:1",
                               "--client-processes", "2", "--out", out_dir)
    assert code == 0, out + err
    df = pd.read_parquet(out_dir / "samples.parquet")
    assert set(df["config_id"]) == {"baseline-c4-r20-b0.5", "baseline-c4-r40-b0.5"} and len(df) == 8
    assert set(df["request_rate"]) == {20.0, 40.0}
    assert df["meets_slo"].notna().all() and df["client_loop_lag_s"].notna().all()
    assert (df["attempts"] == 1).all()
    assert (df["token_count_delta"] == 0).all()
    run = json.loads((out_dir / "run.json").read_text())["config"]
    assert run["request_rates"] == [20.0, 40.0] and run["burstiness"] == 0.5
    assert run["goodput_slos_ms"] == {"ttft": 10000.0, "tpot": 1.0} and run["client_processes"] == 2
    text = " ".join(out.split())
    assert "baseline-c4-r20-b0.5: TTFT p50" in text and "p99.9" in text and "goodput" in text
    code, out, err = specbench("report", out_dir, "--out", tmp_path / "r.html", "--n-boot", "100")
    assert code == 0, out + err
    html = (tmp_path / "r.html").read_text()
    assert "gamma (burstiness 0.5) arrivals at 20, 40 req/s" in html
    row = html[html.index("<dt>goodput</dt>"):][:400]
    assert "ttft &lt;= 10000 ms" in row and "tpot &lt;= 1 ms" in row and "baseline-c4-r40-b0.5" in row


@pytest.mark.parametrize("flags, message", [
    (["--request-rate", "abc"], "--request-rate: 'abc' is not a number"),
    (["--request-rate", "0"], "--request-rate must be >= 0.001"),
    (["--request-rate", "inf"], "--request-rate must be a finite number"),
    (["--burstiness", "2"], "--burstiness shapes open-loop arrivals: it needs --request-rate"),
    (["--request-rate", "2", "--burstiness", "0"], "--burstiness must be > 0"),
    (["--goodput", "ttfx:5"], "--goodput: 'ttfx:5' is not NAME:MS"),
    (["--client-processes", "-1"], "--client-processes must be >= 0"),
    (["--client-processes", "2", "--backend", "embedded"], "--client-processes needs --backend openai"),
    (["--request-rate", "2", "--burstiness", "0.5", "--backend", "embedded"], "--burstiness 0.5 needs --backend openai"),
])
def test_cli_refuses_bad_serving_flags_in_one_line(prompts, flags, message):
    base = ["run", "--workload", prompts, "--warmup", "0", "--no-chat-template"]
    if "--backend" not in flags:
        base += ["--backend", "openai", "--base-url", "http://127.0.0.1:9"]
    code, out, err = specbench(*base, *flags)
    assert code == 2, out + err
    assert message in " ".join(err.split()) and "Traceback" not in err
