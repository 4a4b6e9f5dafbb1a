"""Backends on tiny float32 models: the embedded engine and transformers' generate() agree on
greedy outputs for every method, every `Result` is internally consistent, sampling with a
fixed seed is reproducible, and CPU peak memory is measured per window."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from specbench.backends.embedded import EmbeddedBackend
from specbench.backends.hf import HFBackend
from specbench.config import EngineConfig, SamplingParams, SpeculativeConfig
from specbench.memory import peak_bytes, reset_peak
from specbench.models.loading import load_model
from specbench.types import Request, Result

TEXTS = [
    "Write a function that reverses a list.",
    "abc abc abc abc abc abc",
    "The quick brown fox",
]
MAX_NEW = 16


@pytest.fixture(scope="module")
def loaded(tiny_pair):
    cfg = EngineConfig(device="cpu", dtype="float32")
    return load_model(str(tiny_pair[0]), cfg), load_model(str(tiny_pair[1]), cfg)


@pytest.fixture(scope="module")
def embedded(loaded):
    return EmbeddedBackend(*loaded)


@pytest.fixture(scope="module")
def hf(loaded):
    return HFBackend(*loaded)


def make_requests(tokenizer, sampling: SamplingParams) -> list[Request]:
    return [Request(id=f"p{i}", prompt_ids=tuple(tokenizer.encode(t)), sampling=sampling)
            for i, t in enumerate(TEXTS)]


def spec(method: str, k: int) -> SpeculativeConfig:
    return SpeculativeConfig(method=method, num_speculative_tokens=k,
                             draft="draft" if method == "draft_model" else None)


SPECS = [spec("none", 0), spec("draft_model", 3), spec("ngram", 3)]


def check_invariants(request: Request, result: Result, arrival: float) -> None:
    assert result.request_id == request.id
    assert result.error is None
    assert 1 <= len(result.output_ids) <= request.sampling.max_new_tokens
    assert len(result.token_times) == len(result.output_ids)
    assert all(a <= b for a, b in zip(result.token_times, result.token_times[1:]))
    assert result.arrival_time == arrival
    assert result.start_time >= result.arrival_time
    assert result.token_times[0] >= result.start_time
    assert result.prefill_time_s > 0
    assert isinstance(result.peak_memory_bytes, int) and result.peak_memory_bytes > 0
    assert result.finish_reason in {"stop", "length"}
    if result.finish_reason == "length":
        assert len(result.output_ids) == request.sampling.max_new_tokens
    assert result.target_forward_passes >= 1
    for step in result.steps:
        assert 0 <= step.accepted <= step.drafted
        assert step.first_rejection == (-1 if step.accepted == step.drafted else step.accepted)


@pytest.fixture(scope="module")
def greedy_results(loaded, embedded, hf):
    """{(backend, method): [(request, result, arrival), ...]} for greedy requests."""
    requests = make_requests(loaded[0].tokenizer, SamplingParams(max_new_tokens=MAX_NEW))
    out = {}
    for backend in (embedded, hf):
        for s in SPECS:
            rows = []
            for r in requests:
                arrival = time.perf_counter()
                rows.append((r, backend.generate(r, s, arrival_time=arrival), arrival))
            out[backend.name, s.method] = rows
    return out


@pytest.mark.parametrize("method", [s.method for s in SPECS])
def test_greedy_outputs_agree_between_embedded_and_hf(greedy_results, method):
    emb = [res.output_ids for _, res, _ in greedy_results["embedded", method]]
    ref = [res.output_ids for _, res, _ in greedy_results["hf", method]]
    assert emb == ref


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
@pytest.mark.parametrize("backend", ["embedded", "hf"])
def test_greedy_speculative_output_equals_baseline(greedy_results, backend, method):
    base = [res.output_ids for _, res, _ in greedy_results[backend, "none"]]
    spec_out = [res.output_ids for _, res, _ in greedy_results[backend, method]]
    assert spec_out == base


@pytest.mark.parametrize("method", [s.method for s in SPECS])
@pytest.mark.parametrize("backend", ["embedded", "hf"])
def test_result_invariants(greedy_results, backend, method):
    for request, result, arrival in greedy_results[backend, method]:
        check_invariants(request, result, arrival)


def test_embedded_steps_account_for_every_token(greedy_results):
    for method in ("none", "draft_model", "ngram"):
        for _, result, _ in greedy_results["embedded", method]:
            # the prefill emits the first token; each step emits the rest
            assert 1 + sum(s.emitted for s in result.steps) == len(result.output_ids)
            assert result.target_forward_passes == 1 + len(result.steps)
            if method == "none":
                assert all(s.drafted == 0 for s in result.steps)
            else:
                assert all(s.drafted <= 3 for s in result.steps)
    drafted = sum(s.drafted for _, r, _ in greedy_results["embedded", "draft_model"] for s in r.steps)
    assert drafted > 0


def test_hf_draft_model_uses_fewer_forward_passes_than_tokens(greedy_results):
    # the perturbed draft agrees with the target often, so assisted generation verifies
    # several tokens per target pass
    for _, result, _ in greedy_results["hf", "draft_model"]:
        assert result.target_forward_passes <= len(result.output_ids)
    total_passes = sum(r.target_forward_passes for _, r, _ in greedy_results["hf", "draft_model"])
    total_tokens = sum(len(r.output_ids) for _, r, _ in greedy_results["hf", "draft_model"])
    assert total_passes < total_tokens


def test_embedded_identical_draft_accepts_everything(loaded):
    target = loaded[0]
    backend = EmbeddedBackend(target, target)
    for r in make_requests(target.tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True)):
        res = backend.generate(r, spec("draft_model", 4), arrival_time=time.perf_counter())
        drafted = [s for s in res.steps if s.drafted]
        assert drafted and all(s.accepted == s.drafted for s in drafted)
        assert len(res.output_ids) == MAX_NEW and res.finish_reason == "length"


@pytest.mark.parametrize("method", ["none", "draft_model"])
def test_embedded_sampling_with_fixed_seed_is_reproducible(loaded, embedded, method):
    sampling = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_new_tokens=MAX_NEW,
                              ignore_eos=True)
    request = make_requests(loaded[0].tokenizer, sampling)[0]
    s = spec(method, 3)
    first = embedded.generate(request, s, arrival_time=time.perf_counter()).output_ids
    again = embedded.generate(request, s, arrival_time=time.perf_counter()).output_ids
    assert first == again
    others = [embedded.generate(Request(request.id, request.prompt_ids, sampling.with_(seed=seed)), s,
                                arrival_time=time.perf_counter()).output_ids
              for seed in (1, 2, 3)]
    assert any(o != first for o in others), "the seed has no effect on sampled output"


# ---- specbench.memory ------------------------------------------------------------------

CPU = torch.device("cpu")
MB = 2**20


def test_cpu_peak_is_a_positive_int():
    reset_peak(CPU)
    peak = peak_bytes(CPU)
    assert isinstance(peak, int) and peak > 0


def test_cpu_peak_rises_with_a_large_allocation():
    reset_peak(CPU)
    before = peak_bytes(CPU)
    block = np.ones(200 * MB // 8)  # ones(), not empty(): pages must be touched to count
    after = peak_bytes(CPU)
    del block
    assert after - before >= 150 * MB


def test_cpu_peak_reset_forgets_an_earlier_window():
    try:
        with open("/proc/self/clear_refs", "w"):
            pass
    except OSError:
        pytest.skip("this kernel does not let the process reset its RSS high-water mark")
    block = torch.ones(200 * MB // 4)
    high = peak_bytes(CPU)
    del block
    reset_peak(CPU)
    assert peak_bytes(CPU) <= high - 150 * MB


def test_hf_ignores_sampling_defaults_from_generation_config(tiny_pair, tmp_path):
    import shutil

    from transformers import GenerationConfig

    path = tmp_path / "target-with-penalty"
    shutil.copytree(tiny_pair[0], path)
    eos = GenerationConfig.from_pretrained(tiny_pair[0]).eos_token_id
    GenerationConfig(eos_token_id=eos, repetition_penalty=1.3).save_pretrained(path)
    target = load_model(str(path), EngineConfig(device="cpu", dtype="float32"))
    requests = make_requests(target.tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
    emb, ref = EmbeddedBackend(target), HFBackend(target)
    base = SpeculativeConfig()
    for r in requests:
        assert (emb.generate(r, base, arrival_time=time.perf_counter()).output_ids
                == ref.generate(r, base, arrival_time=time.perf_counter()).output_ids)


def test_hf_leaves_the_shared_draft_models_generation_config_as_loaded(loaded, hf):
    def settings():
        gc = loaded[1].model.generation_config
        return gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold

    before = settings()
    assert before[0] != 3  # else the check below could not tell
    request = make_requests(loaded[0].tokenizer, SamplingParams(max_new_tokens=6))[0]
    result = hf.generate(request, spec("draft_model", 3), arrival_time=time.perf_counter())
    assert result.error is None and result.output_ids
    assert settings() == before
