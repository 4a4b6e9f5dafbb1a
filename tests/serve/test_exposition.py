"""/metrics text of `specbench serve` (`specbench.server.exposition`) read back with the OpenAI
backend's parser and with prometheus_client's, as peers' scrapers read vLLM: the same counts
come back under vLLM's names, and the spec-decode series exist only when speculating."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from specbench.acceptance import SpecDecodingStats
from specbench.backends.openai import parse_prometheus, spec_decode_counters
from specbench.server.exposition import metrics_text
from specbench.server.worker import ServerCounters
from specbench.types import StepEvent


def counters() -> ServerCounters:
    spec = SpecDecodingStats.new(3)
    for d, a in ((3, 2), (3, 3), (0, 0), (2, 0)):
        spec.observe_steps([StepEvent(d, a, -1, a + 1, 0.0, 0.0)])
    return ServerCounters(spec=spec, prompt_tokens=11, generation_tokens=9, success={"stop": 2, "length": 1},
                          cancelled=1, steps=7, step_rows=12, running=2, waiting=3)


def test_counts_come_back_under_vllms_names():
    c = counters()
    text = metrics_text(c, 'tiny "model"', speculative=True)
    got = spec_decode_counters(parse_prometheus(text))
    assert got == {"num_drafts": 3.0, "num_draft_tokens": 8.0, "num_accepted_tokens": 5.0,
                   "num_accepted_tokens_per_pos": [2.0, 2.0, 1.0]}
    samples = parse_prometheus(text)
    assert samples["vllm:num_requests_waiting"][0] == ({"model_name": 'tiny \\"model\\"'}, 3.0)
    assert {lab["finished_reason"]: v for lab, v in samples["vllm:request_success_total"]} == {"stop": 2.0, "length": 1.0}
    # typed as prometheus_client reads it: each counter family by its name without `_total`
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["vllm:spec_decode_num_drafts"] == "counter" and families["vllm:num_requests_running"] == "gauge"


def test_spec_decode_series_only_when_speculating():
    text = metrics_text(counters(), "tiny", speculative=False)
    assert "spec_decode" not in text and spec_decode_counters(parse_prometheus(text)) is None
    assert "vllm:generation_tokens_total" in text
