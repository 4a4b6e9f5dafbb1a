"""The shipped prompt sets: contents, seeded sampling, category coverage, per-prompt sampling."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest

from specbench.structured import constraint_of
from specbench.workload import NAMED, SAMPLING_FIELDS, list_workloads, load_workload, packaged
from specbench.workload.packaged import iter_json_array

BUSINESS_CATEGORIES = {"customer-service", "json-rewrite", "report", "summarize", "code-explain"}


def ids(workload) -> list[str]:
    return [p.id for p in workload.prompts]


def test_list_workloads_names_kinds_counts_and_defaults():
    infos = {i.name: i for i in list_workloads()}
    assert list(infos) == ["real", "high-entropy", "regression", "humaneval", "sharegpt",
                           "business", "json", "tools", "long-context"]
    assert {n: i.kind for n, i in infos.items()} == {
        "real": "real", "high-entropy": "high-entropy", "regression": "regression",
        "humaneval": "real", "sharegpt": "real", "business": "real", "json": "real", "tools": "real",
        "long-context": "real"}
    assert infos["json"].count == 16 and infos["tools"].count == 14
    assert infos["humaneval"].count == 164
    assert infos["sharegpt"].count == packaged.SHAREGPT_DEFAULT_COUNT
    assert infos["real"].count == 164 + packaged.SHAREGPT_DEFAULT_COUNT + infos["business"].count
    assert infos["high-entropy"].default_sampling == {"temperature": 0.8, "top_p": 0.95}
    assert all(i.description and i.source for i in infos.values())


def test_the_structured_sets_ask_for_what_their_categories_say():
    """json: every prompt a response_format (json_object only in that category); tools: tools
    and a tool_choice that constrains (required, or a named tool in `named`); each compiles
    for llguidance and a well-formed output of its shape passes the check."""
    from specbench.backends.grammar import Compiler
    import tiny

    compiler = Compiler(tiny.make_tokenizer(), 259)
    for p in load_workload("json").prompts:
        fmt = p.structured["response_format"]
        assert (fmt["type"] == "json_object") == (p.category == "json-object"), p.id
        compiler.matcher(constraint_of(p.structured), p.id)
    for p in load_workload("tools").prompts:
        choice = p.structured["tool_choice"]
        assert (choice != "required") == (p.category == "named") and len(p.structured["tools"]) >= 2, p.id
        assert p.messages[-1]["role"] == "user"
        c = constraint_of(p.structured)
        assert c.scenario == "tools"
        compiler.matcher(c, p.id)


def test_long_context_prompts_are_real_code_at_four_sizes():
    """Three standard-library source chains sized for 4K-32K-token context windows (the code
    90% of the window at 4.4 characters a token, as Qwen2.5 reads this code), cut at a line
    end, the question after the code; the sizes double, and a seeded sample of 4 covers every
    size."""
    w = load_workload("long-context")
    assert len(w.prompts) == 12 and len({p.id for p in w.prompts}) == 12
    for p in w.prompts:
        text = p.messages[0]["content"]
        nominal = int(p.category.removeprefix("ctx-").removesuffix("k")) * 1024
        code = text[text.index("```python") + 10:text.rindex("```")]
        assert nominal * 0.9 * 4.4 - 200 < len(code) <= nominal * 0.9 * 4.4 and code.endswith("\n"), p.id
        assert text.rstrip().endswith((".", "why."))
    assert {p.category for p in load_workload("long-context", num_prompts=4).prompts} == {
        "ctx-4k", "ctx-8k", "ctx-16k", "ctx-32k"}


def test_business_set_covers_every_business_category():
    w = load_workload("business")
    assert w.kind == "real" and len(w.prompts) >= 25
    counts = Counter(p.category for p in w.prompts)
    assert set(counts) == BUSINESS_CATEGORIES and min(counts.values()) >= 4
    # long-context prompts carry their source text
    assert max(len(p.display_text) for p in w.prompts if p.category == "summarize") > 2000
    # customer-service prompts are chat with a policy/template system prompt
    cs = [p for p in w.prompts if p.category == "customer-service"]
    assert all(p.messages and p.messages[0]["role"] == "system" for p in cs)


def test_high_entropy_set_has_sampled_defaults_and_open_ended_categories():
    w = load_workload("high-entropy")
    assert w.kind == "high-entropy" and len(w.prompts) >= 20
    assert w.default_sampling["temperature"] > 0
    assert {p.category for p in w.prompts} == {"creative", "reasoning", "cross-domain"}


def test_regression_prompts_each_fix_all_sampling_fields():
    w = load_workload("regression")
    assert w.kind == "regression" and len(w.prompts) >= 10
    for p in w.prompts:
        assert set(p.sampling) == set(SAMPLING_FIELDS), p.id
    temps = [p.sampling["temperature"] for p in w.prompts]
    assert any(t == 0 for t in temps) and any(t > 0 for t in temps)  # greedy and sampled
    assert len({p.sampling["seed"] for p in w.prompts if p.sampling["temperature"] > 0}) > 1


def test_regression_sample_keeps_per_prompt_sampling():
    full = {p.id: p.sampling for p in load_workload("regression").prompts}
    for p in load_workload("regression", num_prompts=4, seed=5).prompts:
        assert p.sampling == full[p.id]


def test_humaneval_has_raw_stub_and_chat_instruction():
    w = load_workload("humaneval")
    assert len(w.prompts) == 164 and {p.category for p in w.prompts} == {"code-completion"}
    p = w.prompts[0]
    assert p.id == "humaneval-0" and p.text.startswith("from typing import List")
    assert p.messages[0]["role"] == "user" and p.text in p.messages[0]["content"]


def test_sharegpt_sample_is_seeded_deduplicated_and_a_prefix():
    a = load_workload("sharegpt", num_prompts=30, seed=1)
    b = load_workload("sharegpt", num_prompts=30, seed=1)
    c = load_workload("sharegpt", num_prompts=30, seed=2)
    small = load_workload("sharegpt", num_prompts=10, seed=1)
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert ids(small) == ids(a)[:10]
    assert len(set(ids(a))) == 30 and len({p.display_text for p in a.prompts}) == 30
    for p in a.prompts:
        assert p.category == "chat" and p.id.startswith("sharegpt-")
        assert p.messages[-1]["role"] == "user"
        assert 0 < len(p.messages[-1]["content"].strip()) <= packaged.SHAREGPT_MAX_CHARS


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_small_real_sample_covers_code_chat_and_business(seed):
    w = load_workload("real", num_prompts=6, seed=seed)
    cats = [p.category for p in w.prompts]
    assert len(cats) == 6 and w.kind == "real" and w.name == "real"
    assert cats.count("code-completion") == 2 and cats.count("chat") == 2
    business = [c for c in cats if c in BUSINESS_CATEGORIES]
    assert len(business) == 2 and len(set(business)) == 2  # two different business kinds


def test_real_sample_is_deterministic_and_depends_on_seed():
    def sample(seed: int) -> list[str]:
        return ids(load_workload("real", num_prompts=12, seed=seed))

    assert sample(7) == sample(7) and sample(7) != sample(8)


def test_full_real_set_interleaves_all_sources_with_unique_ids():
    w = load_workload("real")
    n_business = len(load_workload("business").prompts)
    assert len(w.prompts) == 164 + packaged.SHAREGPT_DEFAULT_COUNT + n_business
    assert len(set(ids(w))) == len(w.prompts)
    head = [p.category for p in w.prompts[:3]]
    assert head[0] == "code-completion" and head[1] == "chat" and head[2] in BUSINESS_CATEGORIES


def test_big_real_sample_fills_from_code_and_chat_when_business_runs_out():
    w = load_workload("real", num_prompts=150, seed=0)
    cats = Counter(p.category for p in w.prompts)
    assert len(w.prompts) == 150
    assert sum(cats[c] for c in BUSINESS_CATEGORIES) == len(load_workload("business").prompts)


def test_named_sets_accept_underscores_and_case():
    assert load_workload("High_Entropy").name == "high-entropy"


def test_workloads_dir_can_be_overridden(tmp_path, monkeypatch):
    (tmp_path / "regression.jsonl").write_text(json.dumps(
        {"id": "r", "prompt": "x", "temperature": 0, "top_p": 1, "top_k": 0, "seed": 1,
         "max_new_tokens": 8}) + "\n", encoding="utf-8")
    monkeypatch.setenv("SPECBENCH_WORKLOADS_DIR", str(tmp_path))
    assert ids(load_workload("regression")) == ["r"]
    assert next(i for i in list_workloads() if i.name == "business").count is None  # not there


def test_every_named_set_is_documented_in_the_workloads_readme():
    from specbench.workload.registry import workloads_dir

    readme = (workloads_dir() / "README.md").read_text(encoding="utf-8")
    for name in NAMED:
        assert f"`{name}`" in readme


# ----------------------------------------------------------------------------- streaming JSON


def test_iter_json_array_across_chunk_boundaries():
    items = [{"id": i, "text": "x" * (i * 7)} for i in range(40)]
    text = json.dumps(items, indent=2)
    assert list(iter_json_array(io.StringIO(text), chunk_chars=16)) == items


def test_iter_json_array_stops_at_a_truncated_last_element():
    text = json.dumps([{"a": 1}, {"a": 2}, {"a": 3}])
    cut = text[: text.rindex("3")]  # inside the last object, as in the packaged ShareGPT file
    assert list(iter_json_array(io.StringIO(cut), chunk_chars=5)) == [{"a": 1}, {"a": 2}]


def test_iter_json_array_empty():
    assert list(iter_json_array(io.StringIO("[]"))) == []
    assert list(iter_json_array(io.StringIO("  [ \n ] "))) == []
