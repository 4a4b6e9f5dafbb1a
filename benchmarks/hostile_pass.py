"""A hostile pass over specbench's command line: hundreds of bad or odd inputs, each run as
`python -m specbench ...` in a subprocess with a timeout, and classified.

Every bad input must be refused with one clear line naming the flag, file or field (click's
own `Usage: ... / Error: ...` block for an unknown option or a non-number counts as one line),
never a traceback or a hang, and a refused command must not touch what is already written
(a finished run in --out, an existing report or study).

    python benchmarks/hostile_pass.py            # every case, a table of outcomes, the failures
    python benchmarks/hostile_pass.py --only run # one command
    python benchmarks/hostile_pass.py --list     # the cases, without running them

Nothing reaches the network (offline Hugging Face, no package index, dead proxies) and no
model is ever loaded: the "valid" part of each command line names a model directory that does
not exist, so a command that gets past validation stops at "no such file" for that model (and
is then counted as `silent`: the bad input was accepted). Outcomes:

    ok         exit 2-ish, one error line that names what the case expects (flag/file/field)
    traceback  a Python traceback in the output
    hang       ran past --timeout
    multiline  more than one error line, or other output besides it
    exit0      exit 0 where an error was expected
    silent     the bad input got past validation (the error names something else, or none)
    clobbered  a refused command changed files that were there before
    notrun     the command line is over the kernel's argument limit (not a failure)

Self-contained: the standard library and specbench (for a synthetic finished run to compare,
report and protect). Cases run in a scratch directory, one at a time by default.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MISSING_MODEL = "no-such-model-dir"  # the sentinel: a message naming it = validation passed
OUTCOMES = ("ok", "traceback", "hang", "multiline", "exit0", "silent", "clobbered", "notrun")
COMMANDS = ("run", "sweep", "report", "compare", "serve", "models", "workloads")


@dataclass
class Case:
    command: str
    args: list[str]
    needles: tuple[str, ...]  # the error line must contain one of these (case-insensitive)
    expect: str = "error"  # error | either (valid or refused, but never a traceback/hang)
    protect: tuple[Path, ...] = ()  # trees that must be byte-identical afterwards
    note: str = ""
    # another writer holding this output while the case runs: (directory, owner, lock file
    # name), as specbench.records.lock.OutLock takes it (a concurrent run, sweep or report)
    held: tuple[Path, str | None, str] | None = None

    def line(self) -> str:
        return "specbench " + " ".join(shlex.quote(a if len(a) < 120 else a[:60] + f"...<{len(a)} chars>")
                                       for a in self.args)


@dataclass
class Result:
    case: Case
    outcome: str
    rc: int | None
    seconds: float
    detail: str = ""


# ---- fixtures --------------------------------------------------------------------------------------


def build_fixtures(root: Path) -> dict[str, Path]:
    """Files the cases point at: good and bad prompt files, sweep specs, finished runs."""
    fx: dict[str, Path] = {}

    def put(name: str, data: bytes | str) -> Path:
        p = root / "files" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        fx[name] = p
        return p

    put("good.jsonl", json.dumps({"prompt": "hello"}) + "\n" + json.dumps({"prompt": "world"}) + "\n")
    put("empty.jsonl", "")
    put("blank.jsonl", "\n\n   \n")
    put("garbage.jsonl", os.urandom(2048))
    put("garbage.json", b"\xff\xfe\x00garbage")
    put("garbage.parquet", b"PAR1" + os.urandom(512))
    put("garbage.csv", b"\x00\x01\x02" + os.urandom(256))
    put("badjson.jsonl", '{"prompt": "a"\n')
    put("badline2.jsonl", json.dumps({"prompt": "a"}) + "\n{not json}\n")
    put("array.jsonl", "[1, 2, 3]\n")
    put("number.jsonl", "42\n")
    put("string.jsonl", '"just a string"\n')
    put("null.jsonl", "null\n")
    put("prompt_int.jsonl", json.dumps({"prompt": 123}) + "\n")
    put("prompt_null.jsonl", json.dumps({"prompt": None}) + "\n")
    put("prompt_list.jsonl", json.dumps({"prompt": [1, "a", None]}) + "\n")
    put("prompt_dict.jsonl", json.dumps({"prompt": {"a": 1}}) + "\n")
    put("prompt_empty.jsonl", json.dumps({"prompt": ""}) + "\n")
    put("no_prompt.jsonl", json.dumps({"body": "hi"}) + "\n")
    put("messages_bad.jsonl", json.dumps({"messages": [{"role": 3, "content": None}]}) + "\n")
    put("messages_str.jsonl", json.dumps({"messages": "hello"}) + "\n")
    put("messages_empty.jsonl", json.dumps({"messages": []}) + "\n")
    put("sampling_bad.jsonl", json.dumps({"prompt": "a", "sampling": {"temperature": "hot"}}) + "\n")
    put("sampling_nan.jsonl", '{"prompt": "a", "temperature": NaN}\n')
    put("sampling_neg.jsonl", json.dumps({"prompt": "a", "max_new_tokens": -5}) + "\n")
    put("sampling_huge.jsonl", '{"prompt": "a", "max_new_tokens": ' + "9" * 400 + "}\n")
    put("sampling_list.jsonl", json.dumps({"prompt": "a", "sampling": [1, 2]}) + "\n")
    put("id_dup.jsonl", json.dumps({"id": "x", "prompt": "a"}) + "\n" + json.dumps({"id": "x", "prompt": "b"}) + "\n")
    put("id_list.jsonl", json.dumps({"id": [1], "prompt": "a"}) + "\n")
    put("category_dict.jsonl", json.dumps({"category": {"a": 1}, "prompt": "a"}) + "\n")
    put("nested.jsonl", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    put("nested_obj.jsonl", '{"prompt": "a", "x": ' + '{"a":' * 50_000 + "1" + "}" * 50_000 + "}\n")
    put("hugeint.jsonl", '{"prompt": "a", "seed": ' + "9" * 5000 + "}\n")
    put("utf16.jsonl", json.dumps({"prompt": "hello"}).encode("utf-16"))
    put("latin1.jsonl", '{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    put("bom.jsonl", b"\xef\xbb\xbf" + json.dumps({"prompt": "hi"}).encode() + b"\n")
    put("json_obj.json", json.dumps({"prompt": "a"}))
    put("json_num.json", "3")
    put("json_prompts_bad.json", json.dumps({"prompts": "not a list"}))
    put("json_list_mixed.json", json.dumps(["a", 3, None, {"prompt": "b"}]))
    put("json_empty_list.json", "[]")
    put("csv_noheader.csv", "")
    put("csv_nocol.csv", "body\nhello\n")
    put("csv_ragged.csv", 'prompt,x\n"a,1\n"b\n')
    put("prompts.txt", "hello\n")
    put("prompts.yaml", "- prompt: a\n")
    put("noext", json.dumps({"prompt": "a"}) + "\n")
    # sweep specs
    put("spec_empty.toml", "")
    put("spec_garbage.toml", os.urandom(1024))
    put("spec_invalid.toml", "[study\nname = \n")
    put("spec_unknown_section.toml", "[nosuch]\nx = 1\n")
    put("spec_unknown_key.toml", "[study]\nnosuch = 1\n")
    put("spec_section_scalar.toml", "study = 3\n")
    put("spec_type_name.toml", "[study]\nname = 3\n")
    put("spec_type_k.toml", '[space]\nnum_speculative_tokens = "many"\n')
    put("spec_k_empty.toml", "[space]\nnum_speculative_tokens = []\n")
    put("spec_k_range_bad.toml", "[space]\nnum_speculative_tokens = {low = 5, high = 1, step = 1}\n")
    put("spec_k_range_zero_step.toml", "[space]\nnum_speculative_tokens = {low = 1, high = 4, step = 0}\n")
    put("spec_k_range_keys.toml", "[space]\nnum_speculative_tokens = {lo = 1}\n")
    put("spec_k_range_huge.toml", "[space]\nnum_speculative_tokens = {low = 1, high = 1000000000, step = 1}\n")
    put("spec_k_nested.toml", "[space]\nnum_speculative_tokens = [[1, 2], [3]]\n")
    put("spec_k_bool.toml", "[space]\nnum_speculative_tokens = [true]\n")
    put("spec_k_float.toml", "[space]\nnum_speculative_tokens = [1.5]\n")
    put("spec_k_str_range.toml", '[space]\nnum_speculative_tokens = "1..4"\n')
    put("spec_conc_neg.toml", "[space]\nconcurrency = [-1]\n")
    put("spec_conc_huge.toml", "[space]\nconcurrency = [9223372036854775807]\n")
    put("spec_method_bad.toml", '[space]\nmethod = ["warp"]\n')
    put("spec_method_empty.toml", "[space]\nmethod = []\n")
    put("spec_method_list_int.toml", "[space]\nmethod = [1]\n")
    put("spec_temp_nan.toml", "[sampling]\ntemperature = nan\n")
    put("spec_temp_inf.toml", "[sampling]\ntemperature = inf\n")
    put("spec_temp_neg.toml", "[sampling]\ntemperature = -1.0\n")
    put("spec_topp_zero.toml", "[sampling]\ntop_p = 0.0\n")
    put("spec_mnt_zero.toml", "[sampling]\nmax_new_tokens = 0\n")
    put("spec_mnt_float.toml", "[sampling]\nmax_new_tokens = 2.5\n")
    put("spec_mnt_bool.toml", "[sampling]\nmax_new_tokens = true\n")
    put("spec_objective_bad.toml", '[objective]\nname = "fastest"\n')
    put("spec_objective_list_empty.toml", "[objective]\nname = []\n")
    put("spec_objective_dup.toml", '[objective]\nname = ["speedup", "speedup"]\n')
    put("spec_goodput_bad.toml", '[objective]\ngoodput = "ttft"\n')
    put("spec_sampler_bad.toml", '[study]\nsampler = "annealing"\n')
    put("spec_device_bad.toml", '[models]\ndevice = "tpu"\n')
    put("spec_dtype_bad.toml", '[models]\ndtype = "int3"\n')
    put("spec_workload_missing.toml", '[workload]\nsource = "/nonexistent/prompts.jsonl"\n')
    put("spec_num_prompts_zero.toml", "[workload]\nnum_prompts = 0\n")
    put("spec_name_empty.toml", '[study]\nname = ""\n')
    put("spec_name_slash.toml", '[study]\nname = "../../escape"\n')
    put("spec_name_newline.toml", '[study]\nname = "a\\nb"\n')
    put("spec_heartbeat_grace.toml", "[study]\nheartbeat_interval = 100\ngrace_period = 10\n")
    put("spec_server_placeholder.toml", '[server]\ncommand = "serve {nosuch}"\n')
    put("spec_server_brace.toml", '[server]\ncommand = "serve {port"\n')
    put("spec_server_url_bad.toml", '[server]\ncommand = "x {port}"\nbase_url = "ftp://{port}"\n')
    put("spec_server_empty_cmd.toml", '[server]\ncommand = ""\n')
    put("spec_server_pairing_bad.toml", '[server]\ncommand = "x {port}"\npairing = "sometimes"\n')
    put("spec_endpoint_bad.toml", '[server]\ncommand = "x {port}"\nendpoint = "embeddings"\n')
    put("spec_profile_dir.toml", '[profile]\nout = "/"\n')
    put("spec_min_speedup_neg.toml", "[profile]\nmin_speedup = -1\n")
    put("spec_nested_deep.toml", "[study]\nname = " + "[" * 5000 + "]" * 5000 + "\n")
    put("spec_dup_key.toml", '[study]\nname = "a"\nname = "b"\n')
    put("spec_array_of_tables.toml", "[[study]]\nname = \"a\"\n")
    put("spec_date.toml", "[study]\nname = 1979-05-27\n")
    put("spec_budget_neg.toml", "[budget]\nn_trials = -3\n")
    put("spec_budget_timeout_nan.toml", "[budget]\ntimeout = nan\n")
    put("spec_mem_zero.toml", "[objective]\nmax_peak_memory_gb = 0\n")
    put("spec_utf16.toml", '[study]\nname = "x"\n'.encode("utf-16"))
    put("spec.yaml", "study:\n  name: x\n")
    put("spec.json", '{"study": {"name": "x"}}')
    # models
    put("garbage.gguf", b"GGUF" + os.urandom(256))
    put("empty.gguf", b"")
    put("notgguf.gguf", b"hello world")
    put("model.bin", os.urandom(64))
    # model directories whose config.json is broken JSON, a list, empty, or binary garbage
    for name, content in (("model_badcfg", "{broken"), ("model_listcfg", "[]"), ("model_emptycfg", "{}"),
                          ("model_bincfg", os.urandom(512))):
        d = root / "files" / name
        d.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (d / "config.json").write_bytes(content)
        else:
            (d / "config.json").write_text(content)
        fx[name] = d
    empty_dir = root / "files" / "emptydir"
    empty_dir.mkdir(parents=True, exist_ok=True)
    fx["emptydir"] = empty_dir
    a_file = put("plainfile", "not a directory\n")
    fx["plainfile"] = a_file
    # runs
    fx["run_a"] = _synthetic_run(root / "runs" / "run-a")
    fx["run_b"] = _synthetic_run(root / "runs" / "run-b")
    fx["finished"] = _synthetic_run(root / "runs" / "finished")  # protected: never changes
    bad_run = root / "runs" / "badmeta"
    bad_run.mkdir(parents=True)
    (bad_run / "samples.parquet").write_bytes(b"PAR1" + os.urandom(300) + b"PAR1")
    (bad_run / "run.json").write_text("{not json")
    fx["badmeta"] = bad_run
    nometa = root / "runs" / "onlyjson"
    nometa.mkdir(parents=True)
    (nometa / "run.json").write_text(json.dumps({"run_id": "x"}))
    fx["onlyjson"] = nometa
    empty_parquet = root / "runs" / "emptyparquet"
    empty_parquet.mkdir(parents=True)
    (empty_parquet / "samples.parquet").write_bytes(b"")
    fx["emptyparquet"] = empty_parquet
    text_column = _synthetic_run(root / "runs" / "textcolumn")  # issue 44: ttft_s holding strings
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(text_column / "samples.parquet")
    i = table.column_names.index("ttft_s")
    table = table.set_column(i, "ttft_s", pa.array(["fast"] * table.num_rows))
    pq.write_table(table, text_column / "samples.parquet")
    fx["textcolumn"] = text_column
    report = put("existing.html", "<html>an existing report</html>\n")
    fx["existing.html"] = report
    study = root / "study-existing"
    (study / "runs").mkdir(parents=True)
    (study / "runs" / "keep.txt").write_text("trial output\n")
    fx["study"] = study
    put("existing-profile.yaml", "recommendation: keep me\n")
    put("existing.db", b"SQLite format 3\x00" + os.urandom(1024))
    put("notsqlite.db", b"this is not a database\n" * 10)
    # issue 42: structured output, conversations and arrival traces
    row = {"prompt": "hi"}
    for name, extra in (("schema_bad.jsonl", {"response_format": {"type": "json_schema", "json_schema": {
                            "name": "n", "schema": {"type": "bogus"}}}}),
                        ("format_bad.jsonl", {"response_format": {"type": "xml"}}),
                        ("tool_noname.jsonl", {"tools": [{"type": "function", "function": {"parameters": {}}}]}),
                        ("tool_choice_unknown.jsonl", {"tools": [{"type": "function", "function": {"name": "f"}}],
                                                       "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                        ("structured_two.jsonl", {"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                        ("regex_bad.jsonl", {"structured_outputs": {"regex": "[a-"}}),
                        ("structured_str.jsonl", {"structured_outputs": "{not json"})):
        put(name, json.dumps(row) + "\n" + json.dumps({**row, **extra}) + "\n")
    put("turns_same_role.jsonl", json.dumps({"messages": [{"role": "user", "content": "a"},
                                                          {"role": "user", "content": "b"}]}) + "\n")
    ok_line = json.dumps({"timestamp": 0, "input_length": 8, "output_length": 4}) + "\n"
    put("trace_good.jsonl", ok_line)
    put("trace_decreasing.jsonl", json.dumps({"timestamp": 500, "input_length": 8, "output_length": 4}) + "\n" + ok_line)
    put("trace_negative.jsonl", ok_line + json.dumps({"timestamp": 9, "input_length": -8, "output_length": 4}) + "\n")
    put("trace_hashshort.jsonl", ok_line + json.dumps({"timestamp": 9, "input_length": 900, "output_length": 4,
                                                       "hash_ids": [1]}) + "\n")
    put("trace_nolength.jsonl", ok_line + json.dumps({"timestamp": 9, "input_length": 8}) + "\n")
    put("trace_garbage.jsonl", os.urandom(512))
    put("trace_empty.jsonl", "")
    return fx


def _synthetic_run(path: Path) -> Path:
    """A finished run directory (baseline + ngram k=2 at concurrency 1, 4 prompts), written
    through specbench's records API as `specbench run` would, without a model."""
    from specbench.config import BASELINE, SamplingParams, SpeculativeConfig
    from specbench.metrics import sample_metrics
    from specbench.records import RunMetadata, RunWriter, make_row
    from specbench.types import Request, Result, StepEvent

    rows = []
    for spec in (BASELINE, SpeculativeConfig(method="ngram", num_speculative_tokens=2)):
        for i in range(4):
            n_out, tpot = 9, 0.02 if spec.speculative else 0.03
            req = Request(id=f"p{i}", prompt_ids=(1, 2, 3), sampling=SamplingParams(temperature=0.0, max_new_tokens=n_out),
                          category="code", workload="real", kind="real")
            steps = ([StepEvent(2, 1, 1, 2, 1e-3, 2e-3, batch_size=1, context_tokens=4 + 2 * j) for j in range(4)]
                     if spec.speculative else
                     [StepEvent(0, 0, 0, 1, 0.0, 2e-3, batch_size=1, context_tokens=4 + j) for j in range(n_out - 1)])
            times = [0.05 + j * tpot for j in range(n_out)]
            res = Result(f"p{i}", list(range(n_out)), 0.0, 0.0, times, "length", steps=steps,
                         target_forward_passes=1 + len(steps), prefill_time_s=0.02, peak_memory_bytes=None)
            m = sample_metrics(req, res, config_start=0.0, reference_ids=None)
            rows.append(make_row(run_id=path.name, config_id=f"{spec.short}-c1", backend="embedded", spec=spec,
                                 concurrency=1, request_rate=None, request=req, metrics=m))
    cfg = {"target": "tiny-target", "draft": None, "dtype": "float32", "dtype_resolved": "float32",
           "backend": "embedded", "method": "ngram", "workload": "real", "workload_kind": "real",
           "num_speculative_tokens": [2], "concurrency": [1], "num_prompts": 4, "sampling": {},
           "configuration_stats": {}}
    meta = RunMetadata.collect(path.name, cfg, device="cpu (x86_64)", command=["specbench", "run", "--out", str(path)])
    writer = RunWriter(path, meta)
    writer.add(rows)
    writer.close(complete=True)
    return path


# ---- cases -----------------------------------------------------------------------------------------

HUGE = "9" * 400
NUMBER_BAD = ["", ",", "nan", "inf", "-inf", "1e400", HUGE, "-" + HUGE, "abc", "１２", "1,2", "9" * 5000]
INT_ONLY_BAD = ["1.5"]
NEGATIVE = ["-1", "-0.5"]
STRING_BAD = ["", " ", "x" * 10_000, "ñandú-😀", "a\nb", "\x1b[31mred", "[bold]x[/]", ":fire:", "none,ngram",
              "../../etc/passwd"]


def cases(fx: dict[str, Path], scratch: Path) -> list[Case]:
    out: list[Case] = []
    n = [0]

    def fresh(name: str) -> str:
        n[0] += 1
        return str(scratch / f"{name}-{n[0]}")

    missing_model = str(scratch / MISSING_MODEL)
    good = str(fx["good.jsonl"])

    # --- run ---------------------------------------------------------------------------------
    def run(*args: str, needles=(), expect="error", protect=(), out_dir=None, note=""):
        base = ["run", "--target", missing_model, "--method", "ngram", "--workload", good,
                "--out", fresh("run-out") if out_dir is None else out_dir]
        out.append(Case("run", base + list(args), tuple(needles), expect, tuple(protect), note))

    run_numeric = {
        "--num-prompts": "int", "--max-new-tokens": "int", "--temperature": "float", "--top-p": "float",
        "--top-k": "int", "--seed": "int", "--burstiness": "float", "--client-processes": "int",
        "--disable-by-batch-size": "int", "--topk": "int", "--num-draft-tokens": "int", "--warmup": "int",
        "--time-budget": "float", "--repeats": "int", "--request-timeout": "float", "--retries": "int",
    }
    for flag, kind in run_numeric.items():
        for v in NUMBER_BAD + (INT_ONLY_BAD if kind == "int" else []):
            run(flag, v, needles=(flag,))
        for v in NEGATIVE:
            run(flag, v, needles=(flag,), expect="either")
    for flag in ("-k", "--concurrency", "--request-rate"):
        name = {"-k": "--num-speculative-tokens"}.get(flag, flag)
        for v in [x for x in NUMBER_BAD if x != "1,2"] + ["-1", "0", "1,,2", "2,", ",4", "1;2", "1 2", "1..4", "[1,2]"]:
            run(flag, v, needles=(name, flag), expect="either" if v == "１２" else "error")  # int('１２') == 12
    for v in ["", ",", "ttft", "ttft:", ":5", "ttft:abc", "ttft:-1", "ttft:nan", "ttft:inf", "ttft:" + HUGE,
              "nosuch:5", "ttft:5,,tpot:5", "ttft:5:6", "TTFT:5", "ttft:5,ttft:6", "ttft=5"]:
        run("--goodput", v, needles=("--goodput",))
    for flag, choices in (("--method", "ngram"), ("--device", "cpu"), ("--dtype", "float32"), ("--onednn", "off"),
                          ("--capture", "off"), ("--backend", "embedded"), ("--endpoint", "chat")):
        for v in STRING_BAD:
            extra = ["--backend", "openai", "--base-url", "http://127.0.0.1:9"] if flag == "--endpoint" else []
            run(*extra, flag, v, needles=(flag, "method", "device", "dtype", "onednn", "capture", "backend", "endpoint"))
    for v in ["", "{", "[]", "3", "null", '"ngram"', '{"method": 3}', '{"method": "warp"}',
              '{"num_speculative_tokens": "4"}', '{"num_speculative_tokens": 1e400}', '{"num_speculative_tokens": NaN}',
              '{"num_speculative_tokens": ' + HUGE + '}', '{"method": "ngram", "nosuch": 1}',
              '{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
              '{"method": "ngram", "num_speculative_tokens": true}', '[' * 60_000 + ']' * 60_000,
              '{"method": "draft_model"}', '{"method": "eagle3", "model": 3}', '{"method": "ngram",}',
              '{"method": "ngram"} trailing', '{"method": "suffix", "suffix_decoding_max_tree_depth": -1}',
              '{"speculative_token_tree": "[(0,)]"}', '{"speculative_token_tree": [[0, 0, 0]]}',
              '{"method": "draft_model", "model": "x", "topk": 0}', '{"method": "ngram", "disable_by_batch_size": -1}',
              # issue 44: ranks past any node's children, one too large for an int64, a 4,160-node tree
              '{"method": "draft_model", "model": "x", "speculative_token_tree": [[0], [299], [400]]}',
              '{"method": "draft_model", "model": "x", "speculative_token_tree": [[0], [' + "1" + "0" * 23 + ']]}',
              json.dumps({"method": "draft_model", "model": "x", "speculative_token_tree":
                          [[i] for i in range(64)] + [[i, j] for i in range(64) for j in range(64)]}),
              "\x00"[:0] + "{\"method\": \"ngram\", \"num_speculative_tokens\": 4}" * 2]:
        run("--speculative-config", v, needles=("--speculative-config", "speculative", "needs a draft model",
                                                 "prompt_lookup", "tree"))
    for name in ("missing.jsonl", "emptydir", "empty.jsonl", "blank.jsonl", "garbage.jsonl", "garbage.json",
                 "garbage.parquet", "garbage.csv", "badjson.jsonl", "badline2.jsonl", "array.jsonl", "number.jsonl",
                 "string.jsonl", "null.jsonl", "prompt_int.jsonl", "prompt_null.jsonl", "prompt_list.jsonl",
                 "prompt_dict.jsonl", "prompt_empty.jsonl", "no_prompt.jsonl", "messages_bad.jsonl",
                 "messages_str.jsonl", "messages_empty.jsonl", "sampling_bad.jsonl", "sampling_nan.jsonl",
                 "sampling_neg.jsonl", "sampling_huge.jsonl", "sampling_list.jsonl", "id_dup.jsonl", "id_list.jsonl",
                 "category_dict.jsonl", "nested.jsonl", "nested_obj.jsonl", "hugeint.jsonl", "utf16.jsonl",
                 "latin1.jsonl", "json_num.json", "json_prompts_bad.json", "json_list_mixed.json",
                 "json_empty_list.json", "csv_noheader.csv", "csv_nocol.csv", "csv_ragged.csv", "prompts.txt",
                 "prompts.yaml", "noext", "plainfile"):
        path = str(fx.get(name, scratch / name))
        stem = Path(path).name
        # bom.jsonl, latin1, json_obj: arguably fine; everything here must be refused or named
        expect = "either" if name in ("latin1.jsonl", "id_dup.jsonl", "category_dict.jsonl", "csv_ragged.csv",
                                      "nested_obj.jsonl", "hugeint.jsonl", "messages_str.jsonl") else "error"
        out.append(Case("run", ["run", "--target", missing_model, "--method", "ngram", "--workload", path,
                                "--out", fresh("run-out")], (stem, "--workload"), expect))
    for v in ["", " ", "nosuch-set", "hf:", "hf:" + "x" * 300, "hf:a:b:c", "real,business", "~nonexistent/x.jsonl",
              "x" * 5000, "ñ.jsonl", "-", "/dev/null", "/proc/self/mem", str(scratch)]:
        out.append(Case("run", ["run", "--target", missing_model, "--method", "ngram", "--workload", v,
                                "--out", fresh("run-out")], ("--workload", "workload", "prompt set", "hf:", v[:20] or "''"),
                        "error"))
    for v in ["", " ", "nosuch", "a\nb", "x" * 5000]:
        run("--prompt-field", v, needles=("--prompt-field", "field"))
    # the output directory
    finished = str(fx["finished"])
    run(needles=("finished", "--overwrite"), protect=(fx["finished"],), out_dir=finished,
        note="an existing finished run, no --overwrite")
    run("--warmup", "-1", "--overwrite", needles=("--warmup",), protect=(fx["finished"],), out_dir=finished)
    run("--overwrite", "--speculative-config", "{", needles=("--speculative-config",), protect=(fx["finished"],),
        out_dir=finished)
    run("--overwrite", "-k", "0", needles=("--num-speculative-tokens", "-k"), protect=(fx["finished"],), out_dir=finished)
    run("--overwrite", needles=(MISSING_MODEL,), protect=(fx["finished"],), out_dir=finished, expect="either",
        note="--overwrite with a model that cannot load must keep the old run")
    for v in ["", " ", str(fx["plainfile"]), str(fx["plainfile"]) + "/sub", "/proc/nope", "/", "x" * 5000]:
        run(needles=("--out", "out", v[:20] or "''"), out_dir=v, expect="either" if v == "/" else "error")
    # combinations
    combos = [
        (["--base-url", "http://x"], ("--base-url",)), (["--model", "m"], ("--model",)),
        (["--api-key-env", "K"], ("--api-key-env",)), (["--tokenizer", "t"], ("--tokenizer",)),
        (["--endpoint", "chat"], ("--endpoint",)), (["--retries", "2"], ("--retries",)),
        (["--burstiness", "0.5"], ("--burstiness",)), (["--client-processes", "2"], ("--client-processes",)),
        (["--backend", "openai"], ("--base-url",)), (["--backend", "openai", "--base-url", ""], ("--base-url",)),
        (["--backend", "openai", "--base-url", "ftp://x"], ("--base-url",)),
        (["--backend", "openai", "--base-url", "http://"], ("--base-url",)),
        (["--backend", "openai", "--base-url", "http://[::1"], ("--base-url",)),
        (["--backend", "openai", "--base-url", "http://127.0.0.1:99999"], ("--base-url", "port")),
        (["--backend", "openai", "--base-url", "http://x", "--api-key-env", ""], ("--api-key-env",)),
        (["--backend", "openai", "--base-url", "http://x", "--api-key-env", "NO_SUCH_ENV_VAR_X"], ("--api-key-env", "NO_SUCH_ENV_VAR_X")),
        (["--backend", "openai", "--base-url", "http://x", "--method", "none", "--no-baseline"], ("--no-baseline", "baseline")),
        (["--method", "none", "--no-baseline"], ("--no-baseline", "baseline", "nothing")),
        (["--method", "ngram", "--draft", "x"], ("--draft",)),
        (["--method", "eagle3"], ("--draft", "eagle3")),
        (["--method", "medusa"], ("--draft", "medusa")),
        (["--topk", "2", "--method", "ngram"], ("--topk", "topk")),
        (["--num-draft-tokens", "3", "--method", "ngram"], ("--num-draft-tokens", "num_draft_tokens")),
        (["--dynamic-k", "--method", "none"], ("--dynamic-k",)),
        (["--disable-by-batch-size", "2", "--method", "none"], ("--disable-by-batch-size",)),
        (["--speculative-config", '{"method":"ngram"}', "--method", "draft_model"], ("--method", "--speculative-config")),
        (["--backend", "hf", "--concurrency", "4"], ("--concurrency", "hf")),
        (["--backend", "hf", "--request-rate", "2"], ("--request-rate", "hf")),
        (["--backend", "hf", "--topk", "2", "--method", "draft_model", "--draft", "x"], ("--topk", "hf")),
        (["--device", "cuda:99"], ("--device", "cuda")),
        (["--device", "cuda:-1"], ("--device",)), (["--device", "cuda:" + HUGE], ("--device",)),
        (["--device", "cpu:0"], ("--device",)), (["--temperature", "0", "--top-p", "0.5"], ("--top-p",)),
        (["--num-draft-tokens", "2", "--topk", "4", "-k", "4", "--method", "draft_model", "--draft", "x"], ("--num-draft-tokens",)),
        (["-k", "1,2", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'], ("-k", "--num-speculative-tokens", "--speculative-config")),
        (["--time-budget", "0.0000001"], (MISSING_MODEL,)),
    ]
    for extra, needles in combos:
        # valid: --speculative-config overrides --method/-k (documented), top-p beside greedy, a
        # pruned tree, trees on the hf backend, a tiny time budget
        legit = ("--method draft_model", "--top-p 0.5", "--num-draft-tokens 2", "-k 1,2", "--backend hf --topk",
                 "--time-budget", '"speculative_token_tree": "')
        line = " ".join(extra)
        run(*extra, needles=needles, expect="either" if any(x in line for x in legit) else "error")
    for v in ["--target", "--nosuch", "-z"]:
        run(v, needles=(v, "option", "--target"))
    # issue 42: structured-output fields, conversations, traces (file, line and field named)
    for name in ("schema_bad.jsonl", "format_bad.jsonl", "tool_noname.jsonl", "tool_choice_unknown.jsonl",
                 "structured_two.jsonl", "regex_bad.jsonl", "structured_str.jsonl", "turns_same_role.jsonl"):
        replay = ["--turns", "2"] if name.startswith("turns") else []  # later turns are read only for a replay
        out.append(Case("run", ["run", "--target", missing_model, "--method", "ngram", "--workload", str(fx[name]),
                                *replay, "--out", fresh("run-out")], (f"{name}:",), "error"))
    for name in ("trace_decreasing.jsonl", "trace_negative.jsonl", "trace_hashshort.jsonl", "trace_nolength.jsonl",
                 "trace_garbage.jsonl", "trace_empty.jsonl", "missing-trace.jsonl"):
        run("--trace", str(fx.get(name, scratch / name)), needles=(name,))
    trace = str(fx["trace_good.jsonl"])
    for extra, needles in ((["--request-rate", "2"], ("--trace", "--request-rate")),
                           (["--max-new-tokens", "9"], ("--trace", "--max-new-tokens")),
                           (["--burstiness", "0.5"], ("--trace", "--burstiness")),
                           (["--turns", "2"], ("--turns", "--trace"))):
        run("--trace", trace, *extra, needles=needles)
    for v in NUMBER_BAD + ["0", "-1"]:
        run("--trace", trace, "--trace-speedup", v, needles=("--trace-speedup",))
    run("--trace-speedup", "2", needles=("--trace-speedup", "--trace"))
    for v in NUMBER_BAD + INT_ONLY_BAD + ["0", "-1", "1001"]:
        run("--turns", v, needles=("--turns",))

    # --- serve -------------------------------------------------------------------------------
    def serve(*args, needles=(), expect="error"):
        out.append(Case("serve", ["serve", "--target", missing_model, "--port", "0", *args], tuple(needles), expect))

    for flag, kind in (("--port", "int"), ("--max-concurrency", "int"), ("--max-num-seqs", "int"),
                       ("--read-timeout", "float"), ("-k", "int")):
        name = {"-k": "--num-speculative-tokens"}.get(flag, flag)
        for v in NUMBER_BAD + (INT_ONLY_BAD if kind == "int" else []) + ["-1", "0"]:
            if flag == "--port" and v == "0":
                continue
            serve(flag, v, needles=(name, flag), expect="either" if (flag, v) == ("-k", "0") else "error")
    for flag in ("--method", "--device", "--dtype", "--onednn", "--capture"):
        for v in STRING_BAD:
            serve(flag, v, needles=(flag, flag[2:]))
    for v in ["", " ", "not a host", "999.1.1.1", "::gg", "x" * 300, "a\nb", "-1"]:
        serve("--host", v, needles=("--host",))
    for v in ["", "{", "[]", '{"method": "warp"}', '{"num_speculative_tokens": -2}', "[" * 100_000]:
        serve("--speculative-config", v, needles=("--speculative-config",))
    serve("--served-model-name", "", needles=("--served-model-name",))
    serve("--served-model-name", "a\nb", needles=("--served-model-name",))
    serve("--max-num-seqs", "100", "--max-concurrency", "4", needles=("--max-num-seqs",), expect="either")
    serve("--method", "ngram", "--draft", "x", needles=("--draft",))
    serve("--method", "eagle3", needles=("--draft", "eagle3"))

    # --- sweep -------------------------------------------------------------------------------
    def sweep(*args, needles=(), expect="error", spec=None, protect=(), out_dir=None, profile=None, storage=None):
        method = [] if "--method" in args or spec else ["--method", "ngram"]  # the missing target has no draft
        base = ["sweep", *([str(spec)] if spec else []), "--target", missing_model, *method,
                "--storage", f"sqlite:///{fresh('sweep')}.db" if storage is None else storage, "--out", fresh("study") if out_dir is None else out_dir,
                "--profile", fresh("profile") + ".yaml" if profile is None else profile, "--workload", good]
        out.append(Case("sweep", base + list(args), tuple(needles), expect, tuple(protect)))

    sweep_numeric = {
        "--sampler-seed": "int", "--heartbeat-interval": "int", "--grace-period": "int", "--storage-retry": "float",
        "--num-prompts": "int", "--warmup": "int", "--max-new-tokens": "int", "--temperature": "float",
        "--top-p": "float", "--top-k": "int", "--seed": "int", "--max-peak-memory-gb": "float", "--n-trials": "int",
        "--timeout": "float", "--min-speedup": "float", "--server-ready-timeout": "float",
    }
    for flag, kind in sweep_numeric.items():
        for v in NUMBER_BAD + (INT_ONLY_BAD if kind == "int" else []):
            sweep(flag, v, needles=(flag,))
    for flag in ("-k", "--concurrency"):
        name = {"-k": "--num-speculative-tokens"}.get(flag, flag)
        for v in ["", ",", "0", "-1", "nan", HUGE, "1,,2", "abc", "5..1", "1..", "..4", "1..4..0", "1..4:0"]:
            sweep(flag, v, needles=(name, flag, "num_speculative_tokens", "concurrency"))
    for flag, key in (("--method", "method"), ("--objective", "objective"), ("--sampler", "sampler"),
                      ("--device", "device"), ("--dtype", "dtype"), ("--endpoint", "endpoint"),
                      ("--server-pairing", "pairing")):
        for v in ["", " ", ",", "warp", "x" * 5000, "a\nb", "ñ😀", "none"]:
            if (flag, v) == ("--method", "none"):
                continue
            extra = ["--server-command", "x {port}"] if flag in ("--endpoint", "--server-pairing") else []
            sweep(*extra, flag, v, needles=(flag, key))
    for v in ["", " ", "ttft", "ttft:-1", "nosuch:5", "ttft:5,,tpot:5", "ttft:nan"]:
        sweep("--goodput", v, needles=("--goodput", "goodput"))
    for v in ["", " ", "../x", "a/b", "a\nb", "x" * 5000, "."]:
        sweep("--study-name", v, needles=("--study-name", "name"))
    for v in ["", " ", "mysql://", "postgresql:host/db", "sqlite:relative.db", "nosuch://x", "sqlite:///",
              "sqlite:////proc/nope/x.db", "sqlite:///" + str(fx["plainfile"]) + "/x.db", str(fx["notsqlite.db"]),
              "sqlite:///" + str(fx["emptydir"]), "journal:" + str(fx["emptydir"]), "http://127.0.0.1:9/db"]:
        sweep(needles=("--storage", "storage", v[:15] or "''"), storage=v)
    for v in ["", " ", str(fx["plainfile"]), str(fx["plainfile"]) + "/x", "/proc/nope"]:
        sweep(needles=("--out", v[:15] or "''"), out_dir=v)
    for v in ["", str(fx["emptydir"]), str(fx["plainfile"]) + "/p.yaml", "/proc/nope/p.yaml"]:
        sweep(needles=("--profile", v[:15] or "''"), profile=v)
    for v in ["", "{nosuch}", "{port", "x", "a\nb"]:
        sweep("--server-command", v, needles=("--server-command", "command", "server"))
    for v in ["", "ftp://x", "http://", "{nosuch}", "http://127.0.0.1:{port"]:
        sweep("--server-command", "x {port}", "--server-base-url", v, needles=("--server-base-url", "base_url"))
    sweep("--server-baseline-command", "x {port}", needles=("--server-baseline-command", "--server-command"))
    sweep("--endpoint", "chat", needles=("--endpoint", "server"))
    sweep("--tokenizer", "x", needles=("--tokenizer", "server"))
    sweep("--server-pairing", "together", needles=("--server-pairing", "server"))
    sweep("--head", "x", "--method", "ngram", needles=("--head",))
    sweep("--method", "eagle3", needles=("--head", "eagle3"))
    sweep("--heartbeat-interval", "100", "--grace-period", "10", needles=("--grace-period", "heartbeat"))
    sweep("--objective", "speedup,speedup", needles=("--objective", "objective"))
    sweep("--objective", "goodput", needles=("--goodput", "goodput"))
    sweep("--sampler", "grid", "--n-trials", "1", needles=("--n-trials",), expect="either")
    for name in [n for n in fx if n.startswith("spec")] + ["missing.toml", "emptydir", "garbage.jsonl", "plainfile"]:
        path = fx.get(name, scratch / name)
        expect = "either" if name in ("spec_empty.toml", "spec_k_range_huge.toml", "spec_conc_huge.toml",
                                      "spec_heartbeat_grace.toml", "spec.yaml", "spec.json") else "error"
        sweep(needles=(Path(path).name,), expect=expect, spec=path)
    sweep("--warmup", "-1", needles=("--warmup",), out_dir=str(fx["study"]), protect=(fx["study"],),
          profile=str(fx["existing-profile.yaml"]))
    sweep("--sampler", "warp", needles=("--sampler",), out_dir=str(fx["study"]), protect=(fx["study"],),
          profile=str(fx["existing-profile.yaml"]))
    sweep(needles=("existing.db", "--storage"), storage="sqlite:///" + str(fx["existing.db"]),
          protect=(fx["existing.db"],))

    # --- report ------------------------------------------------------------------------------
    def report(*args, needles=(), expect="error", protect=()):
        out.append(Case("report", ["report", *args], tuple(needles), expect, tuple(protect)))

    run_a = str(fx["run_a"])
    for v in NUMBER_BAD + INT_ONLY_BAD + ["-1", "0", "99"]:
        report(run_a, "--n-boot", v, "--out", fresh("r") + ".html", needles=("--n-boot",))
    for name in ("missing", "emptydir", "plainfile", "garbage.parquet", "badmeta", "onlyjson", "emptyparquet",
                 "empty.jsonl", "garbage.jsonl", "existing.db", "notsqlite.db", "spec_invalid.toml"):
        p = str(fx.get(name, scratch / name))
        report(p, "--out", fresh("r") + ".html", needles=(Path(p).name,))
    report(needles=("RUN", "run", "study", "give"), expect="error")
    for v in [str(fx["plainfile"]) + "/x.html", "/proc/nope/x.html", fresh("r") + ".txt", fresh("r"), "", " ",
              "x" * 5000 + ".html"]:
        report(run_a, "--out", v, needles=("--out", v[:15] or "''"), expect="error")
    report(str(fx["badmeta"]), "--out", str(fx["existing.html"]), needles=("badmeta",), protect=(fx["existing.html"],))
    report(str(fx["textcolumn"]), "--out", str(fx["existing.html"]), needles=("ttft_s",), protect=(fx["existing.html"],))
    report(run_a, "--n-boot", "5", "--out", str(fx["existing.html"]), needles=("--n-boot",), protect=(fx["existing.html"],))
    report(run_a, "--baseline", str(scratch / "missing-run"), "--out", fresh("r") + ".html", needles=("missing-run", "--baseline"))
    report(run_a, "--baseline", str(fx["badmeta"]), "--out", fresh("r") + ".html", needles=("badmeta", "--baseline"))
    report("--storage", "nosuch://x", needles=("--storage", "storage"))
    report("--storage", "", needles=("--storage",))
    report("--storage", "sqlite:///" + str(fx["notsqlite.db"]), needles=("--storage", "notsqlite"))
    report("--storage", "sqlite:///" + str(scratch / "nonexistent.db"), needles=("nonexistent", "--storage"))
    report("--study-name", "x", needles=("--study-name",))
    report(str(fx["existing.db"]), needles=("existing.db",))
    report(run_a, "--study-dir", str(fx["plainfile"]), "--out", fresh("r") + ".html", needles=("--study-dir",), expect="either")
    report(run_a, "--title", "x" * 100_000, "--out", fresh("r") + ".html", needles=("--title",), expect="either")
    report(run_a, "--title", "<script>alert(1)</script>\n", "--out", fresh("r") + ".html", needles=("--title",), expect="either")
    report(run_a, str(fx["run_b"]), "--out", fresh("r") + ".html", needles=("",), expect="either")

    # --- compare -----------------------------------------------------------------------------
    def compare(*args, needles=(), expect="error", protect=()):
        out.append(Case("compare", ["compare", *args], tuple(needles), expect, tuple(protect)))

    run_b = str(fx["run_b"])
    compare(str(fx["textcolumn"]), run_b, needles=("ttft_s",))
    for flag, kind in (("--n-boot", "int"), ("--seed", "int"), ("--confidence", "float")):
        for v in NUMBER_BAD + (INT_ONLY_BAD if kind == "int" else []) + ["-1", "0"]:
            compare(run_a, run_b, flag, v, needles=(flag,), expect="either" if (flag, v) == ("--seed", "0") else "error")
    for v in ["", ",", "nosuch", "tpot_p50,,ttft_p50", "TPOT_P50", "a\nb", "x" * 5000]:
        compare(run_a, run_b, "--metric", v, needles=("--metric", "metric"))
    for v in ["", ",", "5", "-5%", "nan", "inf%", "1e400", "tpot_p50=", "=5%", "nosuch=5%", "tpot_p50=abc",
              "tpot_p50=5%=6", "%", "5%%", "٥%"]:  # float('٥') == 5.0: Python reads any Unicode digit
        compare(run_a, run_b, "--max-regression", v, needles=("--max-regression",), expect="either" if v == "٥%" else "error")
    for v in ["", "-1%", "nan", "inf", "1e400%", "%", "abc", "200%", "1,2"]:
        compare(run_a, run_b, "--min-effect", v, needles=("--min-effect",), expect="either" if v == "200%" else "error")
    for flag in ("--gate", "--format", "--interval"):
        for v in ["", " ", "ALL", "nosuch", "a\nb", "x" * 5000]:
            compare(run_a, run_b, flag, v, needles=(flag,))
    for v in [fresh("c") + ".txt", fresh("c"), str(fx["emptydir"]), str(fx["plainfile"]) + "/x.json",
              "/proc/nope/x.json", run_a + "/report.json", ""]:
        compare(run_a, run_b, "-o", v, needles=("--output", v[:15] or "''"))
    for name in ("missing", "emptydir", "plainfile", "garbage.parquet", "badmeta", "onlyjson", "emptyparquet",
                 "existing.db"):
        p = str(fx.get(name, scratch / name))
        compare(p, run_b, needles=(Path(p).name,))
        compare(run_a, p, needles=(Path(p).name,))
    compare(run_a, needles=("CURRENT", "current", "missing"))
    compare(needles=("BASELINE", "baseline", "missing"))
    compare(run_a, run_b, "--interval", "repeats", needles=("--interval", "repeats"))
    compare(run_a, run_b, "-o", str(fx["existing.html"]) + ".json", "--gate", "nosuch", needles=("--gate",))
    compare(str(fx["badmeta"]), run_b, "-o", str(fx["existing.html"]).replace(".html", ".md"), needles=("badmeta",),
            protect=(fx["existing.html"],))

    # --- models ------------------------------------------------------------------------------
    def models(*args, needles=(), expect="error"):
        out.append(Case("models", ["models", *args], tuple(needles), expect))

    for v in ["", " ", "nosuch-model", "x" * 5000, "a\nb", "ñ😀", str(scratch / "missing.gguf"), str(fx["emptydir"]),
              str(fx["plainfile"]), str(fx["model.bin"]), str(fx["garbage.gguf"]), str(fx["empty.gguf"]),
              str(fx["notgguf.gguf"]), str(fx["model_badcfg"]), str(fx["model_listcfg"]), str(fx["model_emptycfg"]),
              str(fx["model_bincfg"]), "/dev/null", "hf:Qwen/x", "qwen2.5-coder-1.5b-instruct/../x"]:
        needle = (Path(v).name or v)[:20] if v.strip() else "''"
        models("info", v, needles=(needle, "model", "NAME"))
        if v not in ("nosuch-model",):
            models("pull", v, "--no-check", "-q", needles=(needle, "pull", "NAME"))
    models("nosuch", needles=("nosuch", "command"))
    models("info", needles=("NAME", "name"))
    models("pull", needles=("NAME", "name"))
    models("list", "extra", needles=("extra", "argument"))

    # --- workloads ---------------------------------------------------------------------------
    def workloads(*args, needles=(), expect="error"):
        out.append(Case("workloads", ["workloads", *args], tuple(needles), expect))

    for v in NUMBER_BAD + INT_ONLY_BAD + ["-1", "0"]:
        workloads("show", good, "-n", v, needles=("--num-prompts", "-n"))
    for v in NUMBER_BAD[:12] + ["-1"]:
        workloads("show", good, "--seed", v, needles=("--seed",))
    for name in ("missing.jsonl", "emptydir", "empty.jsonl", "blank.jsonl", "garbage.jsonl", "garbage.json",
                 "garbage.parquet", "garbage.csv", "badjson.jsonl", "badline2.jsonl", "array.jsonl", "number.jsonl",
                 "null.jsonl", "prompt_int.jsonl", "prompt_null.jsonl", "prompt_list.jsonl", "prompt_dict.jsonl",
                 "prompt_empty.jsonl", "no_prompt.jsonl", "messages_bad.jsonl", "messages_str.jsonl",
                 "messages_empty.jsonl", "sampling_bad.jsonl", "sampling_nan.jsonl", "sampling_neg.jsonl",
                 "sampling_huge.jsonl", "sampling_list.jsonl", "id_list.jsonl", "nested.jsonl", "utf16.jsonl",
                 "json_num.json", "json_prompts_bad.json", "json_list_mixed.json", "json_empty_list.json",
                 "csv_noheader.csv", "csv_nocol.csv", "prompts.txt", "prompts.yaml", "noext", "plainfile"):
        p = str(fx.get(name, scratch / name))
        workloads("show", p, needles=(Path(p).name,), expect="either" if name == "messages_str.jsonl" else "error")
    for v in ["", " ", "nosuch", "hf:", "hf:a:b:c", "real,business", "x" * 5000, "a\nb", "/dev/null"]:
        workloads("show", v, needles=("workload", "prompt set", "hf:", v[:10] or "''", "NAME"))
    for v in ["", "nosuch", "a\nb"]:
        workloads("show", good, "--prompt-field", v, needles=("--prompt-field", "field"))
    workloads("show", needles=("NAME",))
    workloads("nosuch", needles=("nosuch",))

    # --- concurrent writers (issue 44): another process holds the output while the case runs --
    def held(case: Case, directory: Path, owner: str | None = None, name: str = ".specbench.lock") -> None:
        case.held = (directory, owner, name)
        out.append(case)

    busy = Path(fresh("busy-run"))
    held(Case("run", ["run", "--target", missing_model, "--method", "ngram", "-k", "2", "--workload", good,
                      "--out", str(busy)], ("being written",)), busy)
    import shutil
    for extra in ([], ["--overwrite"]):  # each case its own copy: cases may run at once (--jobs)
        finished_copy = Path(fresh("finished-held"))
        shutil.copytree(fx["finished"], finished_copy)
        held(Case("run", ["run", "--target", missing_model, "--method", "ngram", "--workload", good, "--out",
                          str(finished_copy), *extra], ("being written",), protect=(finished_copy,)), finished_copy)
    for owner in ("study another", None):  # a sweep of another study, a run
        study = Path(fresh("busy-study"))
        sweep("--study-name", "mine", out_dir=str(study), needles=("being written",))
        out[-1].held = (study, owner, ".specbench.lock")
    page = Path(fresh("busy-report")) / "r.html"
    held(Case("report", ["report", run_a, "--out", str(page)], ("being written",)), page.parent, None,
         f".{page.name}.lock")
    return out


# ---- running and classifying -----------------------------------------------------------------------


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    paths = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
    for p in paths:
        h.update(str(p.relative_to(path) if p != path else p.name).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def environment(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    dead = "http://127.0.0.1:9"
    env.update({
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "SPECBENCH_CACHE": str(scratch / "cache"), "HF_HOME": str(scratch / "hf"),
        "PIP_NO_INDEX": "1", "PIP_INDEX_URL": dead, "http_proxy": dead, "https_proxy": dead,
        "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "no_proxy": "", "NO_PROXY": "",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    env.pop("NO_SUCH_ENV_VAR_X", None)
    return env


USAGE_LINES = ("Usage:", "Try '")


def classify(case: Case, rc: int | None, out: str, err: str, clobbered: list[str]) -> tuple[str, str]:
    text = out + err
    if rc is None:
        return "hang", ""
    if "Traceback (most recent call last)" in text:
        return "traceback", _last(text)
    if clobbered:
        return "clobbered", ", ".join(clobbered)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("error:", "Error:"))]
    others = [ln for ln in lines if ln not in errors and not ln.startswith(USAGE_LINES)
              and not ln.lstrip().startswith(("loading ", "⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"))]
    if rc == 0:
        return ("ok", "") if case.expect == "either" else ("exit0", _last(text))
    if not errors:
        return "multiline", _last(text)  # a failure without an error line
    message = errors[-1]
    accepted = MISSING_MODEL in message and MISSING_MODEL not in case.needles
    if accepted:
        return ("ok", "") if case.expect == "either" else ("silent", message[:300])
    if len(errors) > 1 or others:
        return "multiline", " | ".join((errors + others)[:4])[:300]
    low = message.lower()
    if case.needles and not any(n.lower() in low for n in case.needles):
        return ("ok", "") if case.expect == "either" and not case.needles[0] else ("silent", message[:300])
    return "ok", ""


def _last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "(no output)")[:300]


HOLD = """
import signal, sys, time
from pathlib import Path
from specbench.records.lock import OutLock
lock = OutLock(Path(sys.argv[1]), owner=sys.argv[2] or None, name=sys.argv[3])
signal.signal(signal.SIGTERM, lambda *_: (lock.release(), sys.exit(0)))
print("held", flush=True)
time.sleep(3600)
"""


def hold(case: Case, env: dict[str, str]) -> subprocess.Popen | None:
    """The other writer of a `held` case, holding its output until terminated."""
    if case.held is None:
        return None
    directory, owner, name = case.held
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), owner or "", name], env=env,
                            stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "held":
        raise RuntimeError(f"could not hold {directory} for {case.line()}")
    return proc


def run_case(case: Case, scratch: Path, env: dict[str, str], timeout: float) -> Result:
    before = {str(p): tree_digest(p) for p in case.protect}
    holder = hold(case, env)
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "specbench", *case.args], cwd=scratch / "cwd", env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", ""
    except OSError as exc:  # an argument over the kernel's limit: the case cannot be run at all
        return Result(case, "notrun", -1, 0.0, f"not run: {exc}")
    seconds = time.perf_counter() - started
    if holder is not None:  # the other writer finishes (its lock goes with it) before the files are compared
        holder.terminate()
        holder.wait(timeout=30)
    clobbered = [p for p, digest in before.items() if not Path(p).exists() or tree_digest(Path(p)) != digest]
    outcome, detail = classify(case, rc, out, err, clobbered)
    return Result(case, outcome, rc, seconds, detail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=COMMANDS, action="append", help="only this command's cases (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--match", help="only cases whose command line contains this text")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--json", type=Path, help="also write every result to this JSON file")
    a = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="specbench-hostile-"))
    (scratch / "cwd").mkdir()
    fx = build_fixtures(scratch)
    todo = [c for c in cases(fx, scratch) if (not a.only or c.command in a.only)
            and (not a.match or a.match in " ".join(c.args))]
    if a.list:
        for c in todo:
            print(f"{c.command:9} {c.expect:6} {c.line()}")
        print(f"{len(todo)} cases")
        return 0
    env = environment(scratch)
    results: list[Result] = []
    started = time.perf_counter()

    def one(c: Case) -> Result:
        return run_case(c, scratch, env, a.timeout)

    if a.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(a.jobs) as pool:
            for i, r in enumerate(pool.map(one, todo), 1):
                results.append(r)
                _progress(i, len(todo), r)
    else:
        for i, c in enumerate(todo, 1):
            r = one(c)
            results.append(r)
            _progress(i, len(todo), r)

    table: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        table[r.case.command][r.outcome] += 1
    print()
    print(f"{'command':10}" + "".join(f"{o:>10}" for o in OUTCOMES) + f"{'total':>8}")
    for cmd in COMMANDS:
        if cmd in table:
            print(f"{cmd:10}" + "".join(f"{table[cmd][o]:>10}" for o in OUTCOMES) + f"{sum(table[cmd].values()):>8}")
    total = Counter(r.outcome for r in results)
    print(f"{'all':10}" + "".join(f"{total[o]:>10}" for o in OUTCOMES) + f"{len(results):>8}")
    print(f"{len(results)} cases in {time.perf_counter() - started:.0f} s")
    failures = [r for r in results if r.outcome not in ("ok", "notrun")]
    if failures:
        print(f"\n{len(failures)} failing case(s):")
        for r in failures:
            print(f"  [{r.outcome}] {r.case.line()}\n      -> {r.detail}")
    if a.json:
        a.json.write_text(json.dumps([{"command": r.case.command, "args": r.case.args, "outcome": r.outcome,
                                       "rc": r.rc, "seconds": round(r.seconds, 2), "detail": r.detail}
                                      for r in results], indent=1))
    if not a.keep:
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"scratch: {scratch}")
    return 1 if failures else 0


def _progress(i: int, n: int, r: Result) -> None:
    mark = "." if r.outcome == "ok" else r.outcome[0].upper()
    print(mark, end="" if i % 80 else f" {i}/{n}\n", flush=True, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
