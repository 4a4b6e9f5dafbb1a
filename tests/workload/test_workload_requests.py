"""build_requests with the tiny byte-level tokenizer: chat templates, length limits, sampling
precedence and stable seeds."""

from __future__ import annotations

import pytest
import tiny

from specbench.config import SamplingParams
from specbench.errors import WorkloadError
from specbench.workload import Prompt, Workload, build_requests, load_workload, request_seed

BASE = SamplingParams()


def workload(*prompts: Prompt, kind: str = "custom",
             default_sampling: dict | None = None) -> Workload:
    return Workload(name="w", kind=kind, prompts=tuple(prompts),
                    default_sampling=default_sampling or {})


TEXT = Prompt(id="t", category="qa", text="What is 2+2?")
CHAT = Prompt(id="c", category="chat", messages=(
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}))


# ----------------------------------------------------------------------------- rendering


def test_chat_template_is_applied_to_text_prompts(tiny_tokenizer):
    (r,), skipped = build_requests(workload(TEXT), tiny_tokenizer, BASE)
    assert skipped == 0
    assert r.prompt_text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert list(r.prompt_ids) == tiny_tokenizer.encode(r.prompt_text, add_special_tokens=False)
    assert r.prompt_ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert r.messages == ({"role": "user", "content": "What is 2+2?"},)
    assert (r.id, r.category, r.workload, r.kind) == ("t", "qa", "w", "custom")


def test_chat_template_renders_system_and_user_messages(tiny_tokenizer):
    (r,), _ = build_requests(workload(CHAT), tiny_tokenizer, BASE)
    assert r.prompt_text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                             "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert r.messages == CHAT.messages


def test_without_chat_template_raw_text_is_sent(tiny_tokenizer):
    (r,), _ = build_requests(workload(TEXT), tiny_tokenizer, BASE, use_chat_template=False)
    assert r.prompt_text == "What is 2+2?" and r.messages is None
    assert list(r.prompt_ids) == tiny_tokenizer.encode("What is 2+2?")


def test_without_chat_template_messages_are_flattened(tiny_tokenizer):
    (r,), _ = build_requests(workload(CHAT), tiny_tokenizer, BASE, use_chat_template=False)
    assert r.prompt_text == "Be brief.\n\nHi there"


def test_tokenizer_without_chat_template_falls_back_to_raw_text():
    tok = tiny.make_tokenizer()
    tok.chat_template = None
    (r,), _ = build_requests(workload(TEXT), tok, BASE, use_chat_template=True)
    assert r.prompt_text == "What is 2+2?"
    assert r.messages == ({"role": "user", "content": "What is 2+2?"},)  # chat backends still can


def test_humaneval_uses_stub_raw_and_instruction_with_chat(tiny_tokenizer):
    w = load_workload("humaneval", num_prompts=1)
    (raw,), _ = build_requests(w, tiny_tokenizer, BASE, use_chat_template=False)
    (chat,), _ = build_requests(w, tiny_tokenizer, BASE)
    assert raw.prompt_text == w.prompts[0].text
    assert chat.prompt_text.startswith("<|im_start|>user\nComplete the following Python function")


def test_template_rejecting_system_role_folds_it_into_the_user_turn():
    tok = tiny.make_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]")
    (r,), _ = build_requests(workload(CHAT), tok, BASE)
    assert r.prompt_text == "[user] Be brief.\n\nHi there\n[assistant]"


# ----------------------------------------------------------------------------- length limits


def long_prompts() -> Workload:
    return workload(*(Prompt(id=f"p{n}", category="c", text="x" * n) for n in (10, 100, 300)))


def test_overlong_prompts_are_skipped_and_counted(tiny_tokenizer):
    # byte-level tokenizer, raw text: one token per character; limit = 200 - 50 = 150
    reqs, skipped = build_requests(long_prompts(), tiny_tokenizer, BASE.with_(max_new_tokens=50),
                                   use_chat_template=False, max_context=200)
    assert [r.id for r in reqs] == ["p10", "p100"] and skipped == 1


def test_overlong_prompts_are_left_truncated_with_truncate(tiny_tokenizer):
    w = workload(Prompt(id="p", category="c", text="a" * 100 + "QUESTION?" + "b" * 10))
    (r,), skipped = build_requests(w, tiny_tokenizer, BASE.with_(max_new_tokens=50),
                                   use_chat_template=False, max_context=80, truncate=True)
    assert skipped == 0 and len(r.prompt_ids) == 30
    assert r.prompt_text.endswith("QUESTION?" + "b" * 10) and r.messages is None


def test_max_context_counts_the_request_own_max_new_tokens(tiny_tokenizer):
    w = workload(Prompt(id="a", category="c", text="x" * 100, sampling={"max_new_tokens": 8}),
                 Prompt(id="b", category="c", text="x" * 100))
    reqs, skipped = build_requests(w, tiny_tokenizer, BASE.with_(max_new_tokens=64),
                                   use_chat_template=False, max_context=120)
    assert [r.id for r in reqs] == ["a"] and skipped == 1


def test_all_prompts_too_long_is_an_error(tiny_tokenizer):
    with pytest.raises(WorkloadError, match="all 3 prompts are longer than max_context"):
        build_requests(long_prompts(), tiny_tokenizer, BASE, use_chat_template=False, max_context=5)


# ----------------------------------------------------------------------------- sampling


def test_set_defaults_beat_base_defaults(tiny_tokenizer):
    w = workload(TEXT, kind="high-entropy", default_sampling={"temperature": 0.8, "top_p": 0.95})
    (r,), _ = build_requests(w, tiny_tokenizer, BASE)
    assert (r.sampling.temperature, r.sampling.top_p) == (0.8, 0.95)


def test_explicit_overrides_beat_set_defaults(tiny_tokenizer):
    w = workload(TEXT, kind="high-entropy", default_sampling={"temperature": 0.8, "top_p": 0.95})
    (r,), _ = build_requests(w, tiny_tokenizer, BASE, overrides={"temperature": 0.0})
    assert (r.sampling.temperature, r.sampling.top_p) == (0.0, 0.95)


def test_base_values_differing_from_defaults_count_as_explicit(tiny_tokenizer):
    w = workload(TEXT, default_sampling={"temperature": 0.8, "top_k": 5})
    (r,), _ = build_requests(w, tiny_tokenizer, BASE.with_(temperature=0.3))
    assert (r.sampling.temperature, r.sampling.top_k) == (0.3, 5)


def test_per_prompt_sampling_beats_everything(tiny_tokenizer):
    fixed = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "seed": 1234, "max_new_tokens": 33}
    w = workload(Prompt(id="r", category="c", text="x", sampling=fixed), kind="regression",
                 default_sampling={"temperature": 0.1})
    (r,), _ = build_requests(w, tiny_tokenizer, BASE.with_(seed=5, stop_token_ids=(7,)),
                             overrides={"temperature": 0.0, "top_k": 1, "seed": 5},
                             max_new_tokens=500)
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens) == (0.7, 0.9, 50, 1234, 33)
    assert s.stop_token_ids == (7,)  # fields prompts do not carry come from base


def test_regression_set_sampling_survives_cli_overrides(tiny_tokenizer):
    w = load_workload("regression")
    reqs, _ = build_requests(w, tiny_tokenizer, BASE, overrides={"temperature": 1.0, "seed": 3},
                             max_new_tokens=7)
    for p, r in zip(w.prompts, reqs, strict=True):
        assert r.kind == "regression"
        for name, value in p.sampling.items():
            assert getattr(r.sampling, name) == value, (p.id, name)


def test_max_new_tokens_argument_overrides_base_and_set_defaults(tiny_tokenizer):
    w = workload(TEXT, default_sampling={"max_new_tokens": 99})
    (r,), _ = build_requests(w, tiny_tokenizer, BASE, max_new_tokens=12)
    assert r.sampling.max_new_tokens == 12


# ----------------------------------------------------------------------------- seeds


def test_request_seed_is_stable_across_processes():
    # crc32-based, not hash(): these values must never change between runs or Python versions
    assert request_seed(0, "p-1") == 1569744347
    assert request_seed(None, "p-1") == request_seed(0, "p-1")
    assert request_seed(7, "p-1") == 1873852875


def test_seeds_depend_on_prompt_id_not_order(tiny_tokenizer):
    prompts = [Prompt(id=f"p{i}", category="c", text=f"prompt {i}") for i in range(5)]
    fwd, _ = build_requests(workload(*prompts), tiny_tokenizer, BASE)
    rev, _ = build_requests(workload(*reversed(prompts)), tiny_tokenizer, BASE)
    assert {r.id: r.sampling.seed for r in fwd} == {r.id: r.sampling.seed for r in rev}
    assert len({r.sampling.seed for r in fwd}) == 5
    assert fwd[0].sampling.seed == request_seed(0, "p0")


def test_base_seed_changes_derived_seeds_but_prompt_seed_is_kept(tiny_tokenizer):
    w = workload(TEXT, Prompt(id="s", category="c", text="x", sampling={"seed": 42}))
    a, _ = build_requests(w, tiny_tokenizer, BASE.with_(seed=1))
    b, _ = build_requests(w, tiny_tokenizer, BASE.with_(seed=2))
    assert a[0].sampling.seed == request_seed(1, "t") != b[0].sampling.seed
    assert a[1].sampling.seed == b[1].sampling.seed == 42


def test_baseline_and_speculative_builds_get_identical_requests(tiny_tokenizer):
    w = load_workload("high-entropy", num_prompts=5, seed=3)
    a, _ = build_requests(w, tiny_tokenizer, BASE.with_(seed=11))
    b, _ = build_requests(w, tiny_tokenizer, BASE.with_(seed=11))
    assert a == b
