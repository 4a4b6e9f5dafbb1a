"""`specbench run --trace` on tiny float32 models: every configuration replays the trace at its
send times (arrival_s follows the timestamps, sent_s when each went out), prompts and outputs
have the trace's lengths, the console says lengths were forced, and flags a trace fixes are
refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_harness import specbench
from specbench.records import read_run

ROWS = [{"timestamp": 1000 + 100 * i, "input_length": 20 + 3 * i, "output_length": 5 + i,
         "hash_ids": [i % 2]} for i in range(6)]
FAST = ["--dtype", "float32", "--device", "cpu", "--warmup", "0"]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_every_configuration_replays_the_trace(tiny_pair, trace_file, tmp_path):
    res = specbench("run", "--target", str(tiny_pair[0]), "--method", "ngram", "-k", "2", "--trace", str(trace_file),
                    "--trace-speedup", "2", "--workload", "business", *FAST, "--out", str(tmp_path / "run"))
    assert res.code == 0, res.output
    df, meta = read_run(tmp_path / "run")
    assert sorted(df["config_id"].unique()) == ["baseline-c6-trace", "ngram-k2-c6-trace"]
    assert meta["config"]["ignore_eos"] and meta["config"]["trace"]["speedup"] == 2.0
    for _, g in df.groupby("config_id"):
        g = g.sort_values("prompt_id")
        assert list(g["input_tokens"]) == [r["input_length"] for r in ROWS]
        assert list(g["output_tokens"]) == [r["output_length"] for r in ROWS]
        gaps = np.diff(g["arrival_s"].to_numpy())
        assert gaps == pytest.approx([0.05] * 5, abs=1e-6)  # 100 ms apart, twice as fast
        assert (g["sent_s"] >= g["arrival_s"] - 1e-9).all()
    assert "--ignore-eos forced every output to max_new_tokens" in " ".join(res.out.split())


@pytest.mark.parametrize("extra,message", [
    (["--request-rate", "4"], "--trace sets the arrivals and output lengths: drop --request-rate"),
    (["--max-new-tokens", "9"], "--trace sets the arrivals and output lengths: drop --max-new-tokens"),
    (["--trace-speedup", "0"], "--trace-speedup must be"),
])
def test_flags_a_trace_fixes_are_refused_in_one_line(tiny_pair, trace_file, tmp_path, extra, message):
    res = specbench("run", "--target", str(tiny_pair[0]), "--trace", str(trace_file), *FAST, *extra,
                    "--out", str(tmp_path / "x"))
    assert res.code != 0 and message in res.err and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()


def test_a_bad_trace_fails_before_models_load(tiny_pair, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[1]) + "\n" + json.dumps(ROWS[0]) + "\n")
    res = specbench("run", "--target", str(tiny_pair[0]), "--trace", str(bad), *FAST, "--out", str(tmp_path / "x"))
    assert res.code != 0 and f"{bad}:2: field 'timestamp' 1000 is before the previous line's 1100" in res.err
    assert "loading target" not in res.output
    res = specbench("run", "--target", str(tiny_pair[0]), "--trace-speedup", "2", *FAST)
    assert res.code != 0 and "--trace-speedup scales a replayed trace: it needs --trace" in res.err
