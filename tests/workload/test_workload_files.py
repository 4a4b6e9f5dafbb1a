"""User prompt files and hf: datasets: every format, every chat shape, every bad input."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from specbench.errors import ConfigError, SpecbenchError, WorkloadError
from specbench.workload import Prompt, load_workload


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def error_of(spec: str, **kwargs) -> str:
    with pytest.raises(WorkloadError) as info:
        load_workload(spec, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "user-facing errors are one line"
    return message


ROWS = [
    {"id": "a", "prompt": "first prompt", "category": "qa"},
    {"id": "b", "prompt": "second prompt"},
    {"prompt": "third prompt", "temperature": 0.5, "seed": 9},
]


# ----------------------------------------------------------------------------- formats


def test_jsonl_reads_prompt_id_category_and_sampling(tmp_path):
    w = load_workload(str(write_jsonl(tmp_path / "p.jsonl", ROWS)))
    assert w.kind == "custom" and w.name == str(tmp_path / "p.jsonl")
    assert [p.id for p in w.prompts] == ["a", "b", "p-2"]  # default id: file stem + row index
    assert [p.text for p in w.prompts] == ["first prompt", "second prompt", "third prompt"]
    assert [p.category for p in w.prompts] == ["qa", "default", "default"]
    assert w.prompts[2].sampling == {"temperature": 0.5, "seed": 9}
    assert w.prompts[0].sampling == {} and w.default_sampling == {}


def test_jsonl_skips_blank_lines_and_gzip_works(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    assert [p.id for p in load_workload(str(path)).prompts] == ["a", "b"]


def test_json_list_of_objects(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    w = load_workload(str(path))
    assert [p.text for p in w.prompts] == ["first prompt", "second prompt", "third prompt"]


def test_parquet_with_missing_sampling_values(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "question": ["q one", "q two"],
        "top_p": [None, 0.9],
        "max_new_tokens": [None, 32],
        "temperature": [None, 0.7],
    })
    pq.write_table(table, tmp_path / "p.parquet")
    w = load_workload(str(tmp_path / "p.parquet"))
    assert [p.text for p in w.prompts] == ["q one", "q two"]
    assert w.prompts[0].sampling == {}
    assert w.prompts[1].sampling == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32}
    # A NaN is a value someone wrote, not a missing one: refused like --temperature nan.
    pq.write_table(pa.table({"question": ["q"], "temperature": [float("nan")]}), tmp_path / "nan.parquet")
    with pytest.raises(WorkloadError, match="row 0: field 'temperature' must be a finite number"):
        load_workload(str(tmp_path / "nan.parquet"))


def test_csv_converts_string_sampling_fields_and_empty_cells(tmp_path):
    path = tmp_path / "p.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text", "category", "temperature", "top_k", "seed"])
        writer.writerow(["x1", "hello, world\nsecond line", "chat", "0.7", "40", "3"])
        writer.writerow(["x2", "plain", "", "", "", ""])
    w = load_workload(str(path))
    assert w.prompts[0].text == "hello, world\nsecond line"
    assert w.prompts[0].sampling == {"temperature": 0.7, "top_k": 40, "seed": 3}
    assert isinstance(w.prompts[0].sampling["top_k"], int)
    assert w.prompts[1].category == "default" and w.prompts[1].sampling == {}


def test_tsv_and_chat_list_stored_as_json_text_in_a_cell(tmp_path):
    path = tmp_path / "p.tsv"
    msgs = json.dumps([{"role": "user", "content": "hi from a cell"}])
    path.write_text(f"messages\n{msgs}\n", encoding="utf-8")
    (p,) = load_workload(str(path)).prompts
    assert p.messages == ({"role": "user", "content": "hi from a cell"},)


@pytest.mark.parametrize("field", ["prompt", "text", "question", "instruction", "input"])
def test_default_prompt_fields_are_found(tmp_path, field):
    w = load_workload(str(write_jsonl(tmp_path / "p.jsonl", [{field: "the prompt", "other": 1}])))
    assert w.prompts[0].text == "the prompt"


def test_alpaca_instruction_gets_its_input_appended(tmp_path):
    rows = [{"instruction": "Translate to German.", "input": "Good morning", "output": "..."}]
    (p,) = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows))).prompts
    assert p.text == "Translate to German.\n\nGood morning"


def test_explicit_prompt_field_wins_over_defaults(tmp_path):
    rows = [{"prompt": "not this", "body": "this one"}]
    (p,) = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows)), prompt_field="body").prompts
    assert p.text == "this one"


# ----------------------------------------------------------------------------- chat shapes


def test_openai_messages_keep_system_and_first_user_turn(tmp_path):
    rows = [{"id": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Question one?"},
        {"role": "assistant", "content": "Answer."},
        {"role": "user", "content": "Question two?"},
    ]}]
    (p,) = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows))).prompts
    assert p.text is None
    assert p.messages == ({"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Question one?"})
    assert p.display_text == "Question one?"


def test_sharegpt_conversations_map_human_gpt_roles(tmp_path):
    rows = [
        {"id": "s1", "conversations": [{"from": "human", "value": "Tell me a joke"},
                                       {"from": "gpt", "value": "Why..."}]},
        # a split conversation starting with the assistant: the first *user* turn is kept
        {"id": "s2", "conversations": [{"from": "gpt", "value": "...continued"},
                                       {"from": "human", "value": "And another"}]},
        # no user turn at all: skipped
        {"id": "s3", "conversations": [{"from": "gpt", "value": "only me"}]},
    ]
    w = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows)))
    assert [p.id for p in w.prompts] == ["s1", "s2"]
    assert w.prompts[0].messages == ({"role": "user", "content": "Tell me a joke"},)
    assert w.prompts[1].messages == ({"role": "user", "content": "And another"},)


def test_mt_bench_turns_take_the_first_turn_and_question_id(tmp_path):
    rows = [{"question_id": 81, "category": "writing",
             "turns": ["Compose a travel blog post.", "Rewrite it in the first person."]}]
    (p,) = load_workload(str(write_jsonl(tmp_path / "question.jsonl", rows))).prompts
    assert (p.id, p.category, p.text) == ("81", "writing", "Compose a travel blog post.")


def test_openai_content_parts_are_joined(tmp_path):
    rows = [{"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                       {"type": "text", "text": "part two"}]}]}]
    (p,) = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows))).prompts
    assert p.messages[0]["content"] == "part one\npart two"


def test_empty_prompts_are_skipped(tmp_path):
    rows = [{"prompt": "   "}, {"prompt": None}, {"prompt": "kept"},
            {"messages": [{"role": "user", "content": ""}]}]
    w = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows)))
    assert [(p.id, p.text) for p in w.prompts] == [("p-2", "kept")]


# ----------------------------------------------------------------------------- sampling a file


def test_num_prompts_is_a_seeded_deterministic_sample_and_a_prefix(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(50)]))
    a = [p.id for p in load_workload(path, num_prompts=10, seed=1).prompts]
    b = [p.id for p in load_workload(path, num_prompts=10, seed=1).prompts]
    c = [p.id for p in load_workload(path, num_prompts=10, seed=2).prompts]
    bigger = [p.id for p in load_workload(path, num_prompts=20, seed=1).prompts]
    assert a == b and a != c and len(set(a)) == 10
    assert bigger[:10] == a
    assert len(load_workload(path, num_prompts=500).prompts) == 50


def test_num_prompts_below_one_is_a_config_error(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", ROWS))
    with pytest.raises(ConfigError, match="--num-prompts"):
        load_workload(path, num_prompts=0)


# ----------------------------------------------------------------------------- bad input


def test_unknown_workload_name_lists_valid_ones():
    message = error_of("reall")
    assert "unknown workload 'reall'" in message
    for name in ("real", "high-entropy", "regression", "humaneval", "sharegpt", "business", "hf:"):
        assert name in message


def test_missing_file(tmp_path):
    assert error_of(str(tmp_path / "nope.jsonl")) == f"{tmp_path / 'nope.jsonl'}: file not found"


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": "broken"\n', encoding="utf-8")
    message = error_of(str(path))
    assert message.startswith(f"{path}:2: invalid JSON")


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('["a list"]\n', encoding="utf-8")
    assert error_of(str(path)).startswith(f"{path}:1: expected an object")


def test_missing_prompt_field_names_the_fields_present(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": 1, "body": "x", "label": "y"}])
    message = error_of(str(path))
    assert message.startswith(f"{path}:1: no prompt field")
    assert "fields present: id, body, label" in message and "--prompt-field" in message


def test_explicit_prompt_field_missing_names_the_fields_present(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
    message = error_of(str(path), prompt_field="body")
    assert message == f"{path}:1: no field 'body' (--prompt-field); fields present: prompt"


def test_empty_file_is_an_empty_prompt_set(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n", encoding="utf-8")
    assert error_of(str(path)) == f"{path}: empty prompt set (no rows)"


def test_all_rows_empty_is_an_empty_prompt_set(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": ""}, {"prompt": " "}])
    assert "empty prompt set (all 2 rows have an empty prompt)" in error_of(str(path))


def test_unsupported_extension(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello\n", encoding="utf-8")
    message = error_of(str(path))
    assert message.startswith(f"{path}: unsupported file extension; valid: .jsonl")
    assert ".parquet" in message and ".csv" in message


def test_directory_is_not_a_prompt_file(tmp_path):
    assert "is a directory" in error_of(str(tmp_path))


def test_json_that_is_not_a_list(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"prompt": "x"}', encoding="utf-8")
    assert "expected a JSON list of objects" in error_of(str(path))


def test_invalid_sampling_value_names_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}, {"prompt": "y", "top_p": 1.5}])
    assert error_of(str(path)) == f"{path}:2: field 'top_p' must be in (0, 1], got 1.5"
    path = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "x", "temperature": "hot"}])
    assert error_of(str(path)) == f"{path}:1: field 'temperature' must be a number, got 'hot'"
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "x", "max_new_tokens": 2.5}])
    assert "must be an integer" in error_of(str(path))


def test_unknown_role_names_valid_roles(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"messages": [{"role": "narrator", "content": "x"}]}])
    message = error_of(str(path))
    assert message.startswith(f"{path}:1: field 'messages'[0]: unknown role 'narrator'")
    assert "user" in message and "human" in message


def test_duplicate_ids_are_rejected(tmp_path):
    rows = [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    expected = f"{path}:2: duplicate id 'x' (first at {path}:1); ids must be unique"
    assert error_of(str(path)) == expected


def test_errors_are_specbench_errors_with_exit_code():
    with pytest.raises(SpecbenchError) as info:
        load_workload("nope")
    assert info.value.exit_code == 2


# ----------------------------------------------------------------------------- hf: datasets


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An isolated datasets cache, so tests never read or write the user's."""
    import datasets

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    return cache


def test_hf_save_to_disk_dataset(tmp_path, hf_cache):
    import datasets

    ds = datasets.Dataset.from_list([{"question": "q0"}, {"question": "q1"}])
    ds.save_to_disk(tmp_path / "ds")
    w = load_workload(f"hf:{tmp_path / 'ds'}")
    assert [(p.id, p.text) for p in w.prompts] == [("ds-0", "q0"), ("ds-1", "q1")]
    assert w.kind == "custom" and w.name == f"hf:{tmp_path / 'ds'}"


def test_hf_save_to_disk_dataset_dict_picks_split(tmp_path, hf_cache):
    import datasets

    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"text": "train row"}]),
        "test": datasets.Dataset.from_list([{"text": "test row"}]),
    })
    dd.save_to_disk(tmp_path / "dd")
    assert load_workload(f"hf:{tmp_path / 'dd'}").prompts[0].text == "train row"  # default: train
    assert load_workload(f"hf:{tmp_path / 'dd'}:test").prompts[0].text == "test row"
    message = error_of(f"hf:{tmp_path / 'dd'}:dev")
    assert "no split 'dev'; available: train, test" in message


def test_hf_local_directory_of_data_files(tmp_path, hf_cache):
    d = tmp_path / "raw"
    d.mkdir()
    write_jsonl(d / "train.jsonl", [{"turns": ["first turn", "second"], "category": "math"}])
    (p,) = load_workload(f"hf:{d}").prompts
    assert (p.text, p.category, p.id) == ("first turn", "math", "raw-0")


def test_hf_dataset_id_from_the_local_cache_loads_offline(tmp_path, hf_cache):
    """A hub dataset id resolves from the datasets cache without the network (as after an
    earlier online download). The cache entry is built the way datasets lays it out."""
    import shutil

    import datasets

    src = tmp_path / "src.jsonl"
    write_jsonl(src, [{"prompt": "cached prompt"}])
    datasets.load_dataset("json", data_files={"train": str(src)}, cache_dir=str(tmp_path / "b"))
    (built,) = [p for p in (tmp_path / "b" / "json").glob("*/*/*") if p.is_dir()]
    entry = hf_cache / "someuser___tiny-prompts" / "default" / "0.0.0" / "abc123"
    shutil.copytree(built, entry)
    for f in entry.glob("json-*.arrow"):
        f.rename(entry / f.name.replace("json-", "tiny-prompts-", 1))
    info = json.loads((entry / "dataset_info.json").read_text())
    info.update(config_name="default", dataset_name="tiny-prompts")
    (entry / "dataset_info.json").write_text(json.dumps(info))

    w = load_workload("hf:someuser/tiny-prompts:train")
    assert [(p.id, p.text) for p in w.prompts] == [("tiny-prompts-0", "cached prompt")]


def test_hf_dataset_not_available_offline(hf_cache):
    message = error_of("hf:nobody-here/no-such-dataset")
    assert message.startswith("hf:nobody-here/no-such-dataset: dataset not available offline")


def test_hf_missing_local_directory(tmp_path, hf_cache):
    assert "not found" in error_of(f"hf:{tmp_path / 'missing'}")


def test_hf_bad_spec():
    assert "expected hf:NAME[:split]" in error_of("hf:")


def test_prompt_is_a_frozen_value():
    p = Prompt(id="x", category="c", text="t")
    with pytest.raises(AttributeError):
        p.id = "y"  # type: ignore[misc]
    assert Prompt(id="x", category="c", messages=[{"role": "user", "content": "m"}]).messages == (
        {"role": "user", "content": "m"},)


def test_default_field_detection_skips_empty_columns(tmp_path):
    rows = [{"text": "", "messages": [{"role": "user", "content": "from messages"}]},
            {"prompt": None, "question": "from question"}]
    w = load_workload(str(write_jsonl(tmp_path / "p.jsonl", rows)))
    assert [p.display_text for p in w.prompts] == ["from messages", "from question"]


def test_hf_directory_without_data(tmp_path, hf_cache):
    (tmp_path / "empty").mkdir()
    assert "holds no dataset" in error_of(f"hf:{tmp_path / 'empty'}")
