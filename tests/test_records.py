import datetime as dt
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specbench import records
from specbench.config import SamplingParams, SpeculativeConfig
from specbench.errors import RecordsError
from specbench.metrics import sample_metrics
from specbench.records import (
    COLUMNS,
    SCHEMA,
    RunMetadata,
    RunWriter,
    column_docs,
    default_run_dir,
    make_row,
    make_run_id,
    read_run,
)
from specbench.types import Request, Result, StepEvent

SPEC = SpeculativeConfig(method="draft_model", num_speculative_tokens=2, draft="tiny-draft")


def _row(pid: str, spec: SpeculativeConfig = SPEC, error: bool = False, **kw) -> dict:
    req = Request(id=pid, prompt_ids=(1, 2, 3), category="code", workload="w", kind="regression",
                  sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=7,
                                          max_new_tokens=8))
    if error:
        res = Result(request_id=pid, output_ids=[], arrival_time=1.0, start_time=1.0,
                     token_times=[], finish_reason="error", error="server said no")
    else:
        res = Result(request_id=pid, output_ids=[4, 5, 6, 7], arrival_time=1.0, start_time=1.1,
                     token_times=[1.5, 1.7, 1.7, 1.9], finish_reason="length",
                     steps=[StepEvent(2, 1, 1, 2, 0.01, 0.02), StepEvent(2, 2, -1, 3, 0.01, 0.02)],
                     target_forward_passes=3, peak_memory_bytes=2**30)
    m = sample_metrics(req, res, config_start=0.5, reference_ids=[4, 5, 9, 7])
    return make_row(run_id="r1", config_id=f"{spec.short}-c1", backend="embedded", spec=spec,
                    concurrency=1, request_rate=kw.get("request_rate"), request=req, metrics=m)


def _meta(run_id: str = "r1") -> RunMetadata:
    return RunMetadata.collect(run_id, {"target": "tiny", "k": [2]}, device="cpu", command=["specbench", "run"])


# The unit a column's name states (`ttft_s`, `peak_memory_bytes`, `output_tokens`) and the one its
# description states ("... in s"): the schema's `unit` metadata must say the same.
_NAME_UNITS = {"_s": "s", "_bytes": "bytes", "_tokens": "tokens"}
_DESCRIPTION_UNITS = {r"\bin s\b": "s", r"\bin bytes\b": "bytes", r"\brequests/s\b": "requests/s"}
_UNITS = {"s", "bytes", "tokens", "requests/s", "tokens/step", "tokens/pass"}


def test_schema_has_units_and_descriptions():
    for f in SCHEMA:
        assert f.metadata and f.metadata[b"description"], f.name
        unit = f.metadata.get(b"unit", b"").decode()
        description = f.metadata[b"description"].decode()
        for suffix, named in _NAME_UNITS.items():
            if f.name.endswith(suffix):
                assert unit == named, f"{f.name}: its name says {named}, its unit metadata says {unit!r}"
        for phrase, named in _DESCRIPTION_UNITS.items():
            if re.search(phrase, description):
                assert unit == named, f"{f.name}: its description says {named}, its unit metadata says {unit!r}"
        assert not unit or unit in _UNITS, f"{f.name}: unknown unit {unit!r}"
    for name in ("ttft_s", "tpot_s", "e2e_s", "queue_s", "itl_s", "peak_memory_bytes"):
        assert name in COLUMNS
    docs = column_docs()
    assert [d[0] for d in docs] == list(COLUMNS)
    assert ("itl_s", "list<float64>", "s") == docs[COLUMNS.index("itl_s")][:3]
    assert docs[COLUMNS.index("token_match_rate")][1:3] == ("float64?", "")
    assert docs[COLUMNS.index("request_rate")][2] == "requests/s"
    assert docs[COLUMNS.index("peak_memory_bytes")][2] == "bytes"


def test_make_row_fills_every_column():
    row = _row("a")
    assert set(row) == set(COLUMNS)
    assert row["is_baseline"] is False
    assert make_row(run_id="r", config_id="b", backend="hf", spec=SpeculativeConfig(), concurrency=1,
                    request_rate=None, request=Request("x", (1,), SamplingParams()),
                    metrics=sample_metrics(Request("x", (1,), SamplingParams()),
                                           Result("x", [1], 0, 0, [0.1], "stop")))["is_baseline"]


def test_round_trip_preserves_values_and_list_columns(tmp_path):
    rows = [_row("a"), _row("b", error=True), _row("c", request_rate=2.5)]
    run_dir = tmp_path / "run"
    with RunWriter(run_dir, _meta()) as w:
        w.add(rows)
    df, meta = read_run(run_dir)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 3
    a = df.iloc[0]
    assert a["prompt_id"] == "a" and a["method"] == "draft_model" and a["draft_model"] == "tiny-draft"
    assert a["ttft_s"] == pytest.approx(0.5) and a["tpot_s"] == pytest.approx(0.4 / 3)
    assert a["arrival_s"] == pytest.approx(0.5) and a["finish_s"] == pytest.approx(1.4)
    assert list(a["itl_s"]) == pytest.approx([0.2, 0.0, 0.2])
    assert list(a["accepted_per_step"]) == [1, 2]
    assert list(a["rejection_positions"]) == [1, -1]
    assert list(a["output_token_ids"]) == [4, 5, 6, 7]
    assert a["token_match_rate"] == pytest.approx(0.75) and a["first_divergence"] == 2
    assert a["seed"] == 7 and a["top_k"] == 20 and a["temperature"] == pytest.approx(0.7)
    assert a["peak_memory_bytes"] == 2**30
    assert pd.isna(a["request_rate"]) and df.iloc[2]["request_rate"] == 2.5
    b = df.iloc[1]
    assert b["error"] == "server said no" and pd.isna(b["ttft_s"]) and len(b["itl_s"]) == 0
    assert pd.isna(b["acceptance_rate"])
    # the file carries the schema (types, descriptions) and the metadata
    schema = pq.read_schema(run_dir / "samples.parquet")
    assert schema.field("itl_s").type == pa.list_(pa.float64())
    assert schema.field("ttft_s").metadata[b"description"]
    assert schema.field("ttft_s").metadata[b"unit"] == b"s"
    assert meta["run_id"] == "r1" and meta["status"] == "complete"
    assert meta["config"] == {"target": "tiny", "k": [2]}
    assert meta["device"] == "cpu" and meta["command"] == ["specbench", "run"]
    assert set(meta["versions"]) == {"specbench", "torch", "transformers", "python"}
    dt.datetime.fromisoformat(meta["created_at"])
    assert json.loads((run_dir / "run.json").read_text()) == meta


def test_read_run_accepts_the_parquet_file(tmp_path):
    with RunWriter(tmp_path / "run", _meta()) as w:
        w.add([_row("a")])
    df, meta = read_run(tmp_path / "run" / "samples.parquet")
    assert len(df) == 1 and meta["status"] == "complete"


def test_flush_is_atomic_and_leaves_no_temp_file(tmp_path, monkeypatch):
    w = RunWriter(tmp_path / "run", _meta())
    w.add([_row("a")])
    w.flush()
    files = ["run.json", "samples.parquet", records.JOURNAL_FILE]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(files)
    # A failure in the middle of writing leaves the previous file intact and no temp file.
    w.add([_row("b")])

    def broken(self, table, *args, **kw):  # after the writer has put its header down
        raise OSError("disk full")

    monkeypatch.setattr(records.files.pq.ParquetWriter, "write_table", broken)
    with pytest.raises(RecordsError, match="samples.parquet: disk full; the run stopped: 2 completed sample"):
        w.flush()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(files)
    assert pq.read_table(tmp_path / "run" / "samples.parquet")["prompt_id"].to_pylist() == ["a"]
    # ... and the journal still holds both samples: nothing completed is lost.
    df, _ = read_run(tmp_path / "run")
    assert list(df["prompt_id"]) == ["a", "b"]


def test_a_run_still_being_written_reads_back_every_sample_so_far(tmp_path):
    w = RunWriter(tmp_path / "run", _meta())
    w.add([_row("a"), _row("b")])
    w.flush()
    w.add([_row("c")])  # not flushed yet: read back from the journal
    df, meta = read_run(tmp_path / "run")
    assert list(df["prompt_id"]) == ["a", "b", "c"]
    assert meta["status"] == "running"  # its writer (this process) is alive
    w.close(complete=True)
    df, meta = read_run(tmp_path / "run")
    assert list(df["prompt_id"]) == ["a", "b", "c"] and meta["status"] == "complete"
    assert not (tmp_path / "run" / records.JOURNAL_FILE).exists()


def test_killed_process_keeps_flushed_configurations(tmp_path):
    # A real process that dies hard after two flushes (no close, no finally blocks).
    code = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_records import _row, _meta
from specbench.records import RunWriter

w = RunWriter({str(tmp_path / 'run')!r}, _meta())
for pid in ("a", "b"):
    w.add([_row(pid)])
    w.flush()
w.add([_row("c")])
os._exit(1)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    # The sample completed after the last flush survives too (the journal), and the status
    # says what happened.
    df, meta = read_run(tmp_path / "run")
    assert list(df["prompt_id"]) == ["a", "b", "c"] and meta["status"] == "killed"
    assert meta["recovered_from_journal"] == 3
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.fault("records", "SIGKILL while the first sample is written", sees="nothing",
                   kept="no run directory (only a hidden staging copy, removed by the next writer)")
def test_a_writer_killed_inside_its_first_sample_leaves_no_run_directory(tmp_path):
    # Killed after the first sample reached the journal but before the run directory appeared:
    # a reader of runs/ must never find a directory with nothing it can read.
    runs = tmp_path / "runs"
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_records import _row, _meta
from specbench.records import RunWriter

os.rename = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
RunWriter({str(runs / 't0001')!r}, _meta()).add([_row("a")])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    leftovers = list(runs.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".staging-"), leftovers
    # The next writer in that parent removes the dead writer's staging copy.
    with RunWriter(runs / "t0002", _meta()) as w:
        w.add([_row("b")])
    assert [p.name for p in runs.iterdir()] == ["t0002"]
    df, meta = read_run(runs / "t0002")
    assert list(df["prompt_id"]) == ["b"] and meta["status"] == "complete"


def test_the_writer_holds_a_bounded_number_of_rows(tmp_path, monkeypatch):
    # Every row held in memory grew a 30k-sample soak by about 3 KiB each (one Arrow table per
    # add had cost 60 KiB). Past SPILL_ROWS the writer spills them to a file it memory-maps on
    # flush; order and pairing marks survive, and close removes the spill files.
    from specbench.records import files

    monkeypatch.setattr(files, "SPILL_ROWS", 100)
    w = RunWriter(tmp_path / "run", _meta())
    rows = [_row(f"p{i}") for i in range(1000)]
    data = pa.Table.from_pylist(rows, schema=records.SCHEMA).nbytes
    before = pa.total_allocated_bytes()
    for i, row in enumerate(rows):
        w.add([row], unpaired=(i % 7 == 0))
    assert w.num_rows == 1000 and w._unpaired == {i for i in range(1000) if i % 7 == 0}
    assert pa.total_allocated_bytes() - before < data / 5  # all rows held would be `data`
    w.flush()
    assert pa.total_allocated_bytes() - before < data / 5  # and the flush lets its copy go
    assert pq.ParquetFile(tmp_path / "run" / records.SAMPLES_FILE).metadata.num_rows == 1000
    assert len(list((tmp_path / "run").glob(".samples.spill-*"))) == 10
    w.close(complete=True)
    assert not list((tmp_path / "run").glob(".samples.spill-*"))
    df, _ = read_run(tmp_path / "run")
    assert list(df["prompt_id"]) == [f"p{i}" for i in range(1000)]


def test_a_torn_journal_keeps_every_complete_sample(tmp_path):
    w = RunWriter(tmp_path / "run", _meta())
    for pid in "abc":
        w.add([_row(pid)])
    journal = tmp_path / "run" / records.JOURNAL_FILE
    data = journal.read_bytes()
    journal.write_bytes(data[:-40])  # the process died in the middle of the last write
    df, _ = read_run(tmp_path / "run")
    assert list(df["prompt_id"]) == ["a", "b"]


def test_records_get_the_umask_permissions_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        with RunWriter(tmp_path / "run", _meta()) as w:
            w.add([_row("a")])
    finally:
        os.umask(old)
    for name in ("samples.parquet", "run.json"):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755


def test_an_unwritable_directory_is_refused_before_anything_runs(tmp_path):
    # /proc takes no new directories, not even from root (CI runs as root).
    with pytest.raises(RecordsError, match="cannot write there"):
        RunWriter(Path("/proc/specbench-run"), _meta())


def test_a_file_in_the_way_is_refused_in_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RecordsError, match="cannot write there"):
        RunWriter(tmp_path / "file" / "run", _meta())


def test_closing_before_the_first_sample_leaves_no_directory(tmp_path):
    w = RunWriter(tmp_path / "run", _meta())
    w.close(complete=False)
    assert not (tmp_path / "run").exists()


def test_exception_inside_writer_context_marks_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with RunWriter(tmp_path / "run", _meta()) as w:
            w.add([_row("a")])
            w.flush()
            raise KeyboardInterrupt
    df, meta = read_run(tmp_path / "run")
    assert len(df) == 1 and meta["status"] == "interrupted" and meta["finished_at"]


def test_empty_run_is_valid(tmp_path):
    with RunWriter(tmp_path / "run", _meta()):
        pass
    df, meta = read_run(tmp_path / "run")
    assert len(df) == 0 and list(df.columns) == list(COLUMNS) and meta["status"] == "complete"


def test_existing_nonempty_dir_refused_without_overwrite(tmp_path):
    run_dir = tmp_path / "run"
    with RunWriter(run_dir, _meta()) as w:
        w.add([_row("a")])
    with pytest.raises(RecordsError, match="--overwrite") as exc:
        RunWriter(run_dir, _meta())
    assert str(run_dir) in str(exc.value)
    (run_dir / "notes.txt").write_text("mine")
    with RunWriter(run_dir, _meta("r2"), overwrite=True) as w:
        w.add([_row("z")])
    df, meta = read_run(run_dir)
    assert list(df["prompt_id"]) == ["z"] and meta["run_id"] == "r2"
    assert (run_dir / "notes.txt").read_text() == "mine"  # only our files are replaced


def test_existing_empty_dir_is_accepted(tmp_path):
    (tmp_path / "run").mkdir()
    RunWriter(tmp_path / "run", _meta()).close(complete=True)
    assert (tmp_path / "run" / "samples.parquet").is_file()


def test_add_rejects_malformed_rows(tmp_path):
    w = RunWriter(tmp_path / "run", _meta())
    row = _row("a")
    del row["ttft_s"]
    with pytest.raises(ValueError, match="ttft_s"):
        w.add([row])
    bad = _row("a")
    bad["prompt_id"] = None
    with pytest.raises(ValueError, match="prompt_id"):
        w.add([bad])


def test_missing_columns_error_names_them(tmp_path):
    with RunWriter(tmp_path / "run", _meta()) as w:
        w.add([_row("a")])
    table = pq.read_table(tmp_path / "run" / "samples.parquet")
    table = table.drop_columns(["ttft_s", "itl_s"])
    pq.write_table(table, tmp_path / "old.parquet")
    with pytest.raises(RecordsError, match="ttft_s, itl_s"):
        read_run(tmp_path / "old.parquet")


@pytest.mark.parametrize("kind", ["missing", "empty_dir", "not_parquet", "foreign_parquet"])
def test_not_a_run_path_is_an_error(tmp_path, kind):
    path = tmp_path / "thing"
    if kind == "empty_dir":
        path.mkdir()
    elif kind == "not_parquet":
        path = tmp_path / "x.parquet"
        path.write_text("hello")
    elif kind == "foreign_parquet":
        path = tmp_path / "x.parquet"
        pq.write_table(pa.table({"a": [1]}), path)
    with pytest.raises(RecordsError, match=str(path.name)):
        read_run(path)


def test_make_run_id_and_default_dir():
    now = dt.datetime(2026, 11, 29, 10, 15, 0, tzinfo=dt.timezone.utc)
    assert make_run_id("draft_model-k4", now=now) == "20261129-101500-draft_model-k4"
    assert make_run_id("a b/c", now=now) == "20261129-101500-a_b_c"
    assert default_run_dir("x").as_posix() == "runs/x"


def test_metadata_git_revision(tmp_path):
    assert RunMetadata.collect("r", {}, cwd=tmp_path).git_revision is None
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], cwd=tmp_path, check=True)
    rev = RunMetadata.collect("r", {}, cwd=tmp_path).git_revision
    assert rev and len(rev) == 40 and np.all([c in "0123456789abcdef" for c in rev])


@pytest.mark.parametrize("version", [1, 2])
def test_runs_of_older_schema_versions_read_added_columns_as_nulls(tmp_path, version):
    """A run written before a column existed reads back with that column null (repeat: 0,
    scenario: free); a column that is missing without having been added since is still an error."""
    added = records.added_since(version)
    assert "chunk_itl_s" in added and ("step_drafted" in added) == (version == 1)
    table = pa.Table.from_pylist([_row("a"), _row("b")], schema=SCHEMA)
    table = table.drop_columns(sorted(added))
    meta = {**_meta().to_dict(), "schema_version": version}
    table = table.replace_schema_metadata({records.METADATA_KEY: json.dumps(meta).encode()})
    pq.write_table(table, tmp_path / records.SAMPLES_FILE)
    df, got = read_run(tmp_path)
    assert set(COLUMNS) <= set(df.columns) and got["schema_version"] == version
    for name in added - {"repeat", "scenario"}:
        assert df[name].isna().all(), name
    if "repeat" in added:  # a run from before repeats measured every prompt once: repeat 0
        assert (df["repeat"] == 0).all()
    assert (df["scenario"] == "free").all()  # a run from before structured output: free prompts
    assert list(df["itl_s"].iloc[0]) == pytest.approx([0.2, 0.0, 0.2])  # older columns intact
    pq.write_table(table.drop_columns(["itl_s"]), tmp_path / records.SAMPLES_FILE)
    with pytest.raises(RecordsError, match="missing column.*itl_s"):
        read_run(tmp_path)


def test_chunk_itl_is_the_gaps_between_distinct_arrivals():
    """Per-token ITL keeps the zero gaps inside a burst; chunk ITL has one gap per pair of
    arrivals (what `vllm bench serve` calls ITL)."""
    row = _row("a")  # tokens at 1.5, 1.7, 1.7, 1.9: three arrivals
    assert row["itl_s"] == pytest.approx([0.2, 0.0, 0.2])
    assert row["chunk_itl_s"] == pytest.approx([0.2, 0.2])


def test_server_reported_acceptance_fills_the_acceptance_columns():
    from specbench.types import ReportedAcceptance

    req = Request(id="a", prompt_ids=(1,), sampling=SamplingParams(max_new_tokens=8))
    rep = ReportedAcceptance("vllm", 3, 12, 5, (4, 0, 1), (4, 4, 4))
    res = Result(request_id="a", output_ids=[1] * 8, arrival_time=0.0, start_time=0.0,
                 token_times=[0.1 * i for i in range(1, 9)], finish_reason="length", reported_acceptance=rep)
    m = sample_metrics(req, res)
    assert (m["num_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (3, 12, 5)
    assert m["accepted_per_step"] == [4, 0, 1] and m["rejection_positions"] == [-1, 0, 1]
    assert m["mean_acceptance_length"] == pytest.approx(1 + 5 / 3) and m["step_drafted"] == []
    summary_only = Result(request_id="a", output_ids=[1] * 8, arrival_time=0.0, start_time=0.0,
                          token_times=res.token_times, finish_reason="length",
                          reported_acceptance=ReportedAcceptance("vllm", 3, 12, 5))
    m = sample_metrics(req, summary_only)
    assert m["accepted_tokens"] == 5 and m["accepted_per_step"] == [] and m["rejection_positions"] == []


def test_metadata_holds_a_run_config_and_what_setup_and_the_runner_add(tmp_path):
    from specbench.config import RunConfig

    cfg = RunConfig(target="t", method="ngram", num_speculative_tokens=(2,), concurrency=(1,), backend="embedded",
                    configurations=("baseline-c1", "ngram-k2-c1"))
    meta = RunMetadata.collect("r", cfg, device="cpu", command=["specbench", "run"])
    assert meta.config == cfg.to_dict() and meta.run_config == cfg
    meta.note(dtype_resolved="float32", engine={"forward_path": "transformers eager"})
    meta.add_configuration_stats({"baseline-c1": {"wall_s": 1.0}})
    meta.add_configuration_stats({"ngram-k2-c1": {"wall_s": 2.0}, "baseline-c1": {"wall_s": 1.5}})
    with pytest.raises(AssertionError, match="not RunConfig fields"):
        meta.note(tokens_per_second=3.0)
    with RunWriter(tmp_path / "run", meta, overwrite=False):
        pass
    _, written = read_run(tmp_path / "run")
    got = RunConfig.from_dict(written["config"])
    assert got == meta.run_config and got.dtype_used == "float32"
    assert got.engine == {"forward_path": "transformers eager"} and got.num_speculative_tokens == (2,)
    assert got.configuration_stats == {"baseline-c1": {"wall_s": 1.5}, "ngram-k2-c1": {"wall_s": 2.0}}
    assert "openai" not in written["config"] and "interrupted_by" not in written["config"]


def test_unpaired_rows_are_paired_across_spill_files(tmp_path, monkeypatch):
    # samples.parquet is written a spill file at a time: the match fields of rows written
    # before their baseline are settled across every part first (rows [4,5,6,7] match a
    # baseline [4,5,6,7] fully, where their own reference said 0.75).
    from specbench.records import files

    monkeypatch.setattr(files, "SPILL_ROWS", 3)
    w = RunWriter(tmp_path / "run", _meta())
    spec_rows = [_row(f"p{i}") for i in range(5)]
    assert {r["token_match_rate"] for r in spec_rows} == {0.75}
    w.add(spec_rows[:2], unpaired=True)
    w.add(spec_rows[2:], unpaired=True)
    base = []
    for i in range(5):
        row = _row(f"p{i}")
        row.update(is_baseline=True, token_match_rate=None, first_divergence=None)
        base.append(row)
    for row in base:
        w.add([row])
    assert len(w._spills) >= 2
    w.close(complete=True)
    t = pq.read_table(tmp_path / "run" / records.SAMPLES_FILE).to_pydict()
    assert t["prompt_id"] == [f"p{i}" for i in range(5)] * 2
    assert t["token_match_rate"][:5] == [1.0] * 5 and t["first_divergence"][:5] == [-1] * 5  # -1: identical


def _retype(path, column: str, values) -> None:
    """Rewrite one column of a samples.parquet as something else wrote it (metadata kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    i = table.column_names.index(column)
    table = table.set_column(i, column, pa.array(values))
    pq.write_table(table, path)


def test_a_column_of_the_wrong_type_is_one_line_naming_it(tmp_path):
    """Issue 44, item 8: text in ttft_s reached report/compare as a TypeError."""
    with RunWriter(tmp_path / "run", _meta()) as w:
        w.add([_row("a"), _row("b")])
    path = tmp_path / "run" / "samples.parquet"
    _retype(path, "ttft_s", ["fast", "slow"])
    with pytest.raises(RecordsError) as exc:
        read_run(path)
    assert "'ttft_s'" in str(exc.value) and "double" in str(exc.value) and "\n" not in str(exc.value)
    # a type that converts without loss is read as the schema's
    _retype(path, "ttft_s", [1, 2])
    df, _ = read_run(path)
    assert df["ttft_s"].dtype == "float64" and df["ttft_s"].tolist() == [1.0, 2.0]


def test_a_turn_after_a_diverged_turn_is_not_paired_with_the_baselines():
    """A replayed conversation's turn 2 holds each configuration's own turn-1 answer: where the
    speculative turn 1 differed from the baseline's, turn 2 answered another prompt, so it gets
    no match fields; where turn 1 matched, turn 2 is compared as any prompt."""
    from specbench.records.files import pair_with_baseline

    def row(config: str, conv: str, turn: int, out: list[int]) -> dict:
        r = _row(f"{conv}#t{turn}" if turn > 1 else conv, SPEC if config == "spec" else SpeculativeConfig())
        r.update(conversation_id=conv, turn=turn, output_token_ids=out, token_match_rate=None, first_divergence=None)
        return r

    rows = [row("base", "a", 1, [1, 2]), row("base", "a", 2, [5, 6]), row("base", "b", 1, [1, 2]),
            row("base", "b", 2, [5, 6]),
            row("spec", "a", 2, [5, 6]), row("spec", "a", 1, [1, 3]),  # turn 1 diverged
            row("spec", "b", 2, [5, 7]), row("spec", "b", 1, [1, 2])]  # turn 1 matched
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    got = pair_with_baseline(table, range(4, 8)).to_pylist()
    by = {(r["prompt_id"], r["is_baseline"]): r for r in got}
    assert by[("a", False)]["first_divergence"] == 1 and by[("a#t2", False)]["first_divergence"] is None
    assert by[("b", False)]["first_divergence"] == -1 and by[("b#t2", False)]["first_divergence"] == 1
