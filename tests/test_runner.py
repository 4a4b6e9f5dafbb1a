"""The run plan: configurations at one concurrency alternate block by block in ABBA order
from a seeded start (one request per block at concurrency 1, two waves above it), repeats
are recorded and paired, each configuration's records read as if it had run alone, greedy
samples are matched against the baseline even when the baseline ran after them, and the
statistics of a configuration add up over its blocks."""

from __future__ import annotations

import time

import pytest

from specbench.config import SamplingParams, SpeculativeConfig
from specbench.errors import ConfigError
from specbench.runner import block_size, merge_stats, plan, run_plan
from specbench.types import Request, Result

SPEC = SpeculativeConfig(method="ngram", num_speculative_tokens=2)


class FakeBackend:
    """Answers every request with fixed tokens after a short sleep; logs every block."""

    name = "fake"

    def __init__(self, wrong_token_for=None):
        self.blocks: list[tuple[str, list[str]]] = []
        self.wrong_token_for = wrong_token_for

    def run(self, requests, spec, *, concurrency=1, request_rate=None, rate_seed=0, on_results=None):
        if on_results is not None:
            self.blocks.append((spec.short, [r.id for r in requests]))
        results = []
        for r in requests:
            t0 = time.perf_counter()
            time.sleep(0.001)
            ids = [1, 2, 3, 4]
            if spec.speculative and r.id == self.wrong_token_for:
                ids = [1, 2, 9, 4]
            res = Result(r.id, ids, t0, t0, [t0 + 0.001 * (i + 1) for i in range(4)], "length")
            results.append(res)
            if on_results is not None:
                on_results([(r, res)])
        return results, {"wall_s": 0.01, "steps": 4, "batch_sizes": {"1": 4}, "memory": {"target_kv_peak_bytes": 7}}


def requests(n):
    return [Request(id=f"p{i}", prompt_ids=(1, 2, 3), sampling=SamplingParams()) for i in range(n)]


def test_plan_puts_the_baseline_first_at_each_concurrency_then_each_distinct_configuration():
    k4 = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    configs = plan([SPEC, k4, SPEC, SpeculativeConfig(method="ngram", num_speculative_tokens=0)], [1, 8])
    assert [c.config_id for c in configs] == ["baseline-c1", "ngram-k2-c1", "ngram-k4-c1",
                                              "baseline-c8", "ngram-k2-c8", "ngram-k4-c8"]
    assert [c.is_baseline for c in configs] == [True, False, False, True, False, False]
    assert configs[4].spec is SPEC and configs[4].concurrency == 8


def test_plan_without_the_baseline_and_with_arrivals():
    configs = plan([SPEC], [2], baseline=False, request_rate=1.5)
    assert [c.config_id for c in configs] == ["ngram-k2-c2-r1.5"]
    assert configs[0].request_rate == 1.5 and not configs[0].is_baseline


@pytest.mark.parametrize("specs, concurrencies, baseline, needle", [
    ([SPEC], [1, 0], True, "--concurrency values must be >= 1, got 0"),
    ([SpeculativeConfig()], [1], False, "nothing to run"),
    ([], [4], False, "nothing to run"),
])
def test_plan_refuses_what_cannot_run(specs, concurrencies, baseline, needle):
    with pytest.raises(ConfigError, match=needle):
        plan(specs, concurrencies, baseline=baseline)


def test_configurations_alternate_request_by_request_in_abba_order():
    be = FakeBackend()
    configs = plan([SPEC], [1])
    run_plan(be, requests(4), configs, run_id="r", seed=3)
    order = [label for label, _ in be.blocks]
    assert [ids for _, ids in be.blocks] == [["p0"], ["p0"], ["p1"], ["p1"], ["p2"], ["p2"], ["p3"], ["p3"]]
    first, second = order[0], order[1]
    assert {first, second} == {"baseline", "ngram-k2"}
    assert order == [first, second, second, first, first, second, second, first]


def test_above_concurrency_1_blocks_hold_one_wave_and_no_interleave_runs_each_whole():
    be = FakeBackend()
    run_plan(be, requests(16), plan([SPEC], [4]), run_id="r")
    assert [len(ids) for _, ids in be.blocks] == [4] * 8
    assert block_size(4) == 4 and block_size(1) == 1
    be = FakeBackend()
    run_plan(be, requests(16), plan([SPEC], [4]), run_id="r", interleave=False, repeats=2)
    assert [len(ids) for _, ids in be.blocks] == [16, 16, 16, 16]
    assert [label for label, _ in be.blocks][:2] == [label for label, _ in be.blocks][2:][::-1]


def test_a_decided_configuration_leaves_the_rotation_and_the_level_ends_when_none_is_left():
    # a level batch: the baseline and three configurations in rotation; `stop` takes k2 out
    # after 2 prompts, k4 after 3, k3 after 4; the baseline runs on while any is left
    k2, k3, k4 = (SpeculativeConfig(method="ngram", num_speculative_tokens=k) for k in (2, 3, 4))
    configs = plan([k2, k3, k4], [1])
    leave = {2: {"ngram-k2-c1": "pays"}, 3: {"ngram-k4-c1": "loses"}, 4: {"ngram-k3-c1": "pays"}}
    seen = []

    def stop(rows, done):
        seen.append(done)
        return leave.get(done)

    be = FakeBackend()
    stats = run_plan(be, requests(8), configs, run_id="r", stop=stop)
    ran = {}
    for label, ids in be.blocks:
        ran.setdefault(label, []).extend(ids)
    assert ran["ngram-k2"] == ["p0", "p1"] and ran["ngram-k4"] == ["p0", "p1", "p2"]
    assert ran["ngram-k3"] == ["p0", "p1", "p2", "p3"]
    assert ran["baseline"] == ["p0", "p1", "p2", "p3"]  # nothing left to compare after p3: the level ends
    assert seen == [1, 2, 3, 4]
    assert stats["ngram-k2-c1"]["stopped_early"] == {"measured": 2, "planned": 8, "why": "pays"}
    assert stats["ngram-k4-c1"]["stopped_early"]["measured"] == 3
    assert stats["baseline-c1"]["stopped_early"]["why"] == "every configuration compared with the baseline is decided"
    # a string still stops the whole level at once
    be = FakeBackend()
    run_plan(be, requests(8), configs, run_id="r", stop=lambda rows, done: "stop" if done == 2 else None)
    assert {label for label, _ in be.blocks} == {"baseline", "ngram-k2", "ngram-k3", "ngram-k4"}
    assert len(be.blocks) == 8


def test_statistics_of_a_configuration_add_up_over_its_blocks_and_repeats():
    stats = run_plan(FakeBackend(), requests(3), plan([SPEC], [1]), run_id="r", repeats=2)
    assert set(stats) == {"baseline-c1", "ngram-k2-c1"}
    assert stats["baseline-c1"]["wall_s"] == pytest.approx(0.06) and stats["baseline-c1"]["steps"] == 24
    assert stats["baseline-c1"]["batch_sizes"] == {"1": 24}
    assert stats["baseline-c1"]["memory"]["target_kv_peak_bytes"] == 7  # a peak: the max, not a sum


def test_rows_pair_by_prompt_and_repeat_and_match_even_when_the_baseline_runs_later(tmp_path):
    from specbench.records import RunMetadata, RunWriter, read_run

    be = FakeBackend(wrong_token_for="p1")
    writer = RunWriter(tmp_path / "run", RunMetadata.collect("run", {}))
    run_plan(be, requests(4), plan([SPEC], [1]), run_id="run", writer=writer, repeats=2, seed=1)
    writer.close(complete=True)
    df, _ = read_run(tmp_path / "run")
    assert len(df) == 16 and sorted(set(df["repeat"])) == [0, 1]
    spec = df[~df["is_baseline"]].set_index(["prompt_id", "repeat"])
    assert spec["token_match_rate"].notna().all()  # every one compared, whichever ran first
    assert spec.loc[("p1", 0), "first_divergence"] == 2 and spec.loc[("p0", 1), "first_divergence"] == -1
    for _, g in df.groupby("config_id"):
        g = g.sort_values("arrival_s")
        # One clock per configuration: its blocks follow each other without the others' time.
        assert (g["arrival_s"].diff().dropna() >= 0).all()
        assert g["finish_s"].max() < 16 * 0.01 + 0.05


def test_bad_repeats_are_refused():
    with pytest.raises(ConfigError, match="--repeats"):
        run_plan(FakeBackend(), requests(2), plan([SPEC], [1]), run_id="r", repeats=0)


def test_merge_stats_adds_counts_takes_memory_peaks_and_keeps_labels():
    a = {"wall_s": 1.0, "batch_sizes": {"1": 2}, "peak_memory_bytes": 10, "scope": "request",
         "memory": {"draft_weight_bytes": 5}}
    b = {"wall_s": 2.0, "batch_sizes": {"1": 1, "2": 3}, "peak_memory_bytes": 7, "scope": "request",
         "memory": {"draft_weight_bytes": 5}}
    m = merge_stats(merge_stats(None, a), b)
    assert m == {"wall_s": 3.0, "batch_sizes": {"1": 3, "2": 3}, "peak_memory_bytes": 10, "scope": "request",
                 "memory": {"draft_weight_bytes": 5}}
    assert a["batch_sizes"] == {"1": 2}  # inputs untouched
