"""Per-step records as tables (specbench.steps): one row per step with output position,
context and each row's share of its batched step; acceptance token- and request-weighted;
decode time per token per batch size; bins."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specbench import steps as st
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.metrics import sample_metrics
from specbench.records import make_row
from specbench.types import Request, Result, StepEvent

K4 = SpeculativeConfig("draft_model", 4, draft="d")


def row(pid: str, events: list[StepEvent], n_prompt: int = 10, category: str = "code") -> dict:
    req = Request(id=pid, prompt_ids=tuple(range(n_prompt)), sampling=SamplingParams(max_new_tokens=64),
                  category=category)
    n_out = 1 + sum(e.emitted for e in events)
    res = Result(pid, [1] * n_out, 0.0, 0.0, [0.1 * i for i in range(n_out)], "length",
                 steps=events, target_forward_passes=1 + len(events))
    return make_row(run_id="r", config_id="draft_model-k4-c2", backend="embedded", spec=K4,
                    concurrency=2, request_rate=None, request=req, metrics=sample_metrics(req, res))


def ev(drafted, accepted, b, ctx=None, d=0.01, v=0.03):
    emitted = accepted + 1
    return StepEvent(drafted, accepted, -1 if accepted == drafted else accepted, emitted, d, v,
                     batch_size=b, context_tokens=ctx)


@pytest.fixture
def frame() -> pd.DataFrame:
    # a long request that accepts little and a short one that accepts everything
    long = [ev(4, 0, 2, 11 + i) for i in range(8)]
    short = [ev(4, 4, 2, 11), ev(4, 4, 1, 16)]
    return pd.DataFrame([row("long", long), row("short", short, category="chat")])


def test_explode_gives_positions_context_and_batch_shares(frame):
    s = st.explode(frame, keep=["category"])
    assert len(s) == 10
    short = s[s["prompt_id"] == "short"]
    assert short["output_pos"].tolist() == [1, 6]  # 1 from the prefill, then 5 from step one
    assert short["context"].tolist() == [11, 16]
    assert short["share_s"].tolist() == pytest.approx([0.04 / 2, 0.04 / 1])
    assert set(s["category"]) == {"code", "chat"}


def test_context_falls_back_to_input_plus_output_when_not_reported(frame):
    f = frame.copy()
    f["step_context_tokens"] = [[None] * len(x) for x in f["step_context_tokens"]]
    s = st.explode(f)
    assert s["context"].tolist() == (s["output_pos"] + 10).tolist()


def test_token_and_request_weighted_acceptance_differ_by_hand(frame):
    s = st.explode(frame)
    a = st.acceptance(s, ["batch_size"]).set_index("batch_size")
    b2 = a.loc[2.0]  # 8 steps of the long request (0 accepted), 1 of the short (4 accepted)
    assert b2["steps"] == 9 and b2["requests"] == 2
    assert b2["mal_tok"] == pytest.approx(1 + 4 / 9)
    assert b2["mal_req"] == pytest.approx((1.0 + 5.0) / 2)
    assert b2["rate_tok"] == pytest.approx(4 / 36)
    assert b2["rate_req"] == pytest.approx((0 + 1) / 2)
    assert st.weightings_differ(a, "mal_req", "mal_tok")
    assert not st.weightings_differ(a.assign(x=a["mal_tok"]), "x", "mal_tok")


def test_time_per_token_counts_each_batched_step_once(frame):
    s = st.explode(frame)
    t = st.time_per_token(s, ["batch_size"]).set_index("batch_size")
    # batch 2: 9 row-steps x 0.04 s / 2 rows, emitting 8 x 1 + 5 tokens
    assert t.loc[2.0, "s_per_token"] == pytest.approx(9 * 0.02 / 13)
    assert t.loc[1.0, "s_per_token"] == pytest.approx(0.04 / 5)


def test_schema_one_runs_have_no_steps(frame):
    f = frame.copy()
    for col in st.STEP_LISTS:
        f[col] = None
    assert st.explode(f).empty and list(st.explode(f).columns[:3]) == ["sample", "prompt_id", "batch_size"]


def test_bins():
    edges = st.pow2_bins(np.array([40, 70, 130, 900]))
    assert edges.tolist() == [32, 64, 128, 256, 512, 1024]
    assert st.bin_labels(edges)[:2] == ["32–63", "64–127"]
    many = st.pow2_bins(np.array([1, 2 ** 30]), max_bins=6)
    assert len(many) - 1 <= 6 and many[0] <= 1 and many[-1] > 2 ** 30
    lin = st.linear_bins(np.arange(1, 100))
    assert lin[0] == 1 and lin[-1] >= 99 and len(lin) - 1 <= 16
    cats = st.assign_bins(pd.Series([32, 63, 64, 1023]), edges)
    assert cats.astype(str).tolist() == ["32–63", "32–63", "64–127", "512–1023"]
