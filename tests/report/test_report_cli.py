"""`specbench report` end to end: the file it writes (from synthetic runs and from a real run on
tiny models), where it writes it, and bad input refused with one line on stderr and exit 2."""

from __future__ import annotations

import re

import pyarrow.parquet as pq

from report_helpers import specbench, synthetic_run
from specbench.records import SAMPLES_FILE, read_run


def test_report_writes_one_html_file(synthetic, tmp_path):
    out = tmp_path / "reports" / "syn.html"
    res = specbench("report", synthetic, "--out", out, "--n-boot", "300")
    assert res.code == 0, res.output
    assert out.is_file() and out.stat().st_size > 1_000_000
    assert f"report: {out}" in " ".join(res.out.split())
    assert "72 samples from 1 run(s)" in res.out
    assert list(out.parent.iterdir()) == [out]  # no temp file left behind


def test_report_defaults_to_reports_dir_named_after_the_run(synthetic, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = specbench("report", synthetic / SAMPLES_FILE, "--n-boot", "200")  # the file works too
    assert res.code == 0, res.output
    assert (tmp_path / "reports" / f"{synthetic.name}.html").is_file()


def test_out_directory_gets_the_default_file_name(synthetic, tmp_path):
    res = specbench("report", synthetic, "--out", tmp_path, "--n-boot", "200")
    assert res.code == 0, res.output
    assert (tmp_path / f"{synthetic.name}.html").is_file()


# ---- a real run on tiny models --------------------------------------------------------------


def test_report_of_a_real_tiny_run(tiny_run, tmp_path):
    df, meta = read_run(tiny_run)
    assert set(df["config_id"]) == {f"{c}-c{n}" for n in (1, 2)
                                    for c in ("baseline", "draft_model-k2", "draft_model-k4")}
    out = tmp_path / "tiny.html"
    res = specbench("report", tiny_run, "--out", out)
    assert res.code == 0, res.output
    html = out.read_text()
    for cfg in df["config_id"].unique():
        assert cfg in html
    assert "Concurrency 1" in html and "Concurrency 2" in html
    assert meta["config"]["target"] in html and meta["device"] in html
    drawn = re.findall(r'<div id="(plot-[a-z-]+)" class="plotly-graph-div"', html)
    omitted = html.count('<p class="omitted">')
    assert len(drawn) + omitted == 15
    for name in ("tpot-vs-k", "speedup-heatmap", "tail-latency", "memory", "survival",
                 "rejection-positions", "batch-sizes", "by-batch-size", "by-context",
                 "by-output-position", "model-parity", "model-prediction"):
        assert f"plot-{name}" in drawn, name
    # greedy float32: every speculative output equals the baseline's
    assert "every compared output is identical to the baseline" in html


# ---- bad input ----------------------------------------------------------------------------


def test_missing_path_is_refused(tmp_path):
    missing = tmp_path / "no-such-run"
    specbench("report", missing, "--out", tmp_path / "r.html").refusal(str(missing), "no run at")
    assert not (tmp_path / "r.html").exists()


def test_directory_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "notes").mkdir()
    specbench("report", tmp_path / "notes", "--out", tmp_path / "r.html").refusal(
        "is not a specbench run", SAMPLES_FILE)


def test_file_that_is_not_parquet_is_refused(tmp_path):
    bad = tmp_path / "samples.parquet"
    bad.write_text("not parquet")
    specbench("report", bad, "--out", tmp_path / "r.html").refusal("not a readable Parquet file")


def test_parquet_with_missing_columns_names_them(synthetic, tmp_path):
    table = pq.read_table(synthetic / SAMPLES_FILE)
    cut = table.drop_columns(["ttft_s", "accepted_per_step"])  # keeps the run metadata
    path = tmp_path / "cut" / SAMPLES_FILE
    path.parent.mkdir()
    pq.write_table(cut, path)
    msg = specbench("report", path.parent, "--out", tmp_path / "r.html").refusal("missing column(s)")
    assert "ttft_s" in msg and "accepted_per_step" in msg


def test_mixed_workloads_are_refused_without_allow_mixed(synthetic, tmp_path):
    other = synthetic_run(tmp_path / "he-run", workload="high-entropy", kind="high-entropy",
                          n_prompts=6, seed=1)
    out = tmp_path / "mixed.html"
    specbench("report", synthetic, other, "--out", out).refusal("different workloads",
                                                                "real", "high-entropy", "--allow-mixed")
    assert not out.exists()
    res = specbench("report", synthetic, other, "--allow-mixed", "--out", out, "--n-boot", "200")
    assert res.code == 0, res.output
    html = out.read_text()
    # runs of different prompt sets side by side, each against its own baseline
    assert "he-run · draft_model-k4-c1" in html
    # categories are told apart by prompt set (in the plot data, where '/' is JSON-escaped)
    assert "real (real) \\u002f code" in html
    assert "high-entropy (high-entropy) \\u002f chat" in html


def test_baseline_without_baseline_rows_is_refused(synthetic, tmp_path):
    nobase = synthetic_run(tmp_path / "nobase", baseline=False, n_prompts=6)
    specbench("report", synthetic, "--baseline", nobase, "--out", tmp_path / "r.html").refusal(
        "--baseline", "no baseline rows")


def test_out_must_be_html(synthetic, tmp_path):
    specbench("report", synthetic, "--out", tmp_path / "r.txt").refusal("--out", ".html")


def test_no_paths_is_refused(tmp_path):
    specbench("report", "--out", tmp_path / "r.html").refusal("at least one run")


def _with_run_id(run_dir, where, run_id):
    """A copy of `run_dir` in `where` whose records claim `run_id` (as a run from another job might)."""
    import json

    import pyarrow as pa

    from specbench.records import METADATA_KEY

    table = pq.read_table(run_dir / SAMPLES_FILE)
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    meta["run_id"] = run_id
    table = table.set_column(table.schema.get_field_index("run_id"), "run_id",
                             pa.array([run_id] * table.num_rows))
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    where.mkdir(parents=True)
    pq.write_table(table, where / SAMPLES_FILE)
    return where


def test_a_run_id_from_the_records_never_leaves_the_reports_directory(synthetic, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for i, hostile in enumerate(["../../escaped", str(tmp_path / "absolute")]):
        res = specbench("report", _with_run_id(synthetic, tmp_path / f"run{i}", hostile), "--n-boot", "200")
        assert res.code == 0, res.output
    written = sorted(p.name for p in (work / "reports").iterdir())
    assert len(written) == 2 and all(n.endswith(".html") and "/" not in n for n in written), written
    assert [p for p in tmp_path.rglob("*.html") if p.parent != work / "reports"] == []


def test_an_out_that_cannot_be_written_is_refused_in_one_line(synthetic):
    specbench("report", synthetic, "--out", "/proc/specbench-report.html", "--n-boot", "200").refusal(
        "/proc/specbench-report.html", "cannot write there")


def test_an_empty_out_is_refused(synthetic, tmp_path, monkeypatch):
    # --out '' became Path('.'): the report was written into the current directory, exit 0
    monkeypatch.chdir(tmp_path)
    specbench("report", synthetic, "--out", "").refusal("--out is empty")
    assert not list(tmp_path.glob("*.html"))
