"""The report page as HTML text: self-contained (plotly.js inlined once, nothing fetched),
header from run.json, plots with no data replaced by a note, outlier links that land on
sample rows, escaping, the study extension point, and no torch anywhere on the way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from report_helpers import sample_row, synthetic_run, write_run
from specbench.config import BASELINE, SpeculativeConfig
from specbench.report import StudyInput, build_report, load_inputs, sections

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def page(synthetic) -> str:
    return build_report(load_inputs([synthetic]), n_boot=300)


def plot_ids(html: str) -> list[str]:
    return re.findall(r'<div id="(plot-[a-z-]+)" class="plotly-graph-div"', html)


def test_page_is_self_contained_with_plotly_inlined_once(page):
    from plotly.offline import get_plotlyjs

    assert page.count("plotly.js v") == 1  # the library's banner
    assert page.count(get_plotlyjs()) == 1
    ours = page.replace(get_plotlyjs(), "")  # (the library mentions URLs it never loads here)
    assert not re.search(r"<script[^>]*\bsrc=", ours)
    assert not re.search(r"<link\b", ours)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", ours)
    assert not re.search(r"@import|url\(", ours)
    assert page.count("Plotly.newPlot(") == len(plot_ids(page))


def test_every_plot_of_a_full_run_is_drawn(page):
    names = [p.__name__ for _, builders in sections.sections() for p in builders]
    assert len(names) == 19  # the two draft-tree plots, by-scenario and by-turn are left out of a run of chains of single free prompts
    assert plot_ids(page) == [
        "plot-tpot-vs-k", "plot-speedup-heatmap", "plot-by-batch-size", "plot-tail-latency",
        "plot-memory", "plot-acceptance-length", "plot-survival", "plot-rejection-positions",
        "plot-by-category", "plot-by-context", "plot-by-output-position", "plot-model-parity",
        "plot-model-prediction", "plot-regression", "plot-batch-sizes"]
    assert "Not drawn:" not in page


def test_header_comes_from_run_json(page, synthetic):
    import json

    meta = json.loads((synthetic / "run.json").read_text())
    for text in ("tiny-target", "tiny-draft", "draft_model (k = 2, 4)", "real (real), 12 prompts",
                 "greedy, max 17 new tokens", "concurrency 1, 4, closed loop",
                 "cpu (x86_64), float32, backend embedded", meta["created_at"],
                 f"transformers {meta['versions']['transformers']}", synthetic.name):
        assert text in page, text
    if meta["git_revision"]:
        assert meta["git_revision"][:12] in page


def test_verdict_highlights_wins_and_losses(page):
    assert page.count('<tr class="win">') == 2 and page.count('<tr class="loss">') == 2
    assert "Yes, where it wins" in page
    assert "draft_model pays up to concurrency 1" in page
    assert "stops paying from concurrency 4" in page


def test_outlier_links_land_on_sample_rows(page):
    links = set(re.findall(r'href="#(sample-\d+)"', page))
    rows = set(re.findall(r'<tr id="(sample-\d+)"', page))
    assert len(rows) == 72 and links and links <= rows
    for title in ("Slowest TPOT", "Lowest acceptance rate", "Output differs from the baseline"):
        assert title in page


def test_baseline_only_run_omits_speculative_plots_with_a_note(tmp_path):
    rows = [sample_row("r", BASELINE, 1, f"p{i}", tpot=0.01 * (i + 1), peak=2**28)
            for i in range(3)]
    html = build_report(load_inputs([write_run(tmp_path / "r", rows)]), n_boot=200)
    assert "No verdict: these runs hold only baseline samples." in html
    drawn = plot_ids(html)
    assert drawn == ["plot-tail-latency", "plot-memory"]
    assert html.count("Not drawn: These runs have no speculative configuration.") >= 4
    assert "Not drawn: Every sample is in one category" in html
    assert "Not drawn: No speculative output was compared" in html
    assert "Not drawn: The runs record no batch-size statistics" in html


def test_concurrency_one_run_notes_the_trivial_batch_sizes(tmp_path):
    run = synthetic_run(tmp_path / "c1", concurrencies=(1,), n_prompts=6)
    html = build_report(load_inputs([run]), n_boot=200)
    assert "Not drawn: Every engine step ran a single request (concurrency 1)." in html
    assert "plot-batch-sizes" not in plot_ids(html)
    assert "run more --concurrency values" in html
    # the cliff was not measured: the page says so and gives the command that would measure it
    assert "The concurrency cliff was not measured" in html
    cmd = re.search(r'<div class="cliff">.*?<code>(.*?)</code>', html, re.S).group(1)
    assert cmd.startswith("specbench run --out ") and cmd.endswith("--concurrency 1,4,16 --num-prompts 32")


def test_several_concurrencies_need_no_cliff_note(page):
    assert "The concurrency cliff was not measured" not in page


def test_run_without_memory_or_divergence_omits_those_plots(tmp_path):
    k2 = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    rows = [sample_row("r", spec, 1, f"p{i}", tpot=0.01, accepted=(1,) if spec.speculative else (),
                       temperature=0.7)  # sampled: no match fields
            for spec in (BASELINE, k2) for i in range(3)]
    html = build_report(load_inputs([write_run(tmp_path / "r", rows)]), n_boot=200)
    assert "Not drawn: No sample reported peak memory." in html
    assert "Not drawn: No speculative output was compared" in html
    assert "temperature 0.7" in html


def test_untrusted_text_is_escaped(tmp_path):
    k2 = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    rows = [sample_row("r", spec, 1, pid, tpot=0.01, accepted=(1,) if spec.speculative else (),
                       category="<b>cat</b>")
            for spec in (BASELINE, k2) for pid in ("<script>alert(1)</script>", "ok")]
    html = build_report(load_inputs([write_run(tmp_path / "r", rows)]), n_boot=200)
    assert "<script>alert(1)</script>" not in html and "<b>cat</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_hand_built_study_gets_a_section_with_notes_instead_of_plots(synthetic):
    inputs = load_inputs([synthetic])
    inputs.studies.append(StudyInput(path=synthetic, name="k-and-concurrency",
                                     trials=pd.DataFrame({"number": [0], "state": ["RUNNING"]}),
                                     directions=["maximize"], runs=[]))
    html = build_report(inputs, n_boot=200)
    assert 'id="studies"' in html and "k-and-concurrency" in html
    assert "Not drawn: No trial has completed yet." in html
    assert "Not drawn: The study itself is not loaded" in html
    assert "No profile.yaml in the study directory" in html


def test_report_never_imports_torch(synthetic, tmp_path):
    """Build a report through the CLI in a fresh interpreter where importing torch (or
    transformers) fails: nothing on the report's path may need them."""
    out = tmp_path / "r.html"
    code = f"""
import sys
sys.modules["torch"] = None          # `import torch` now raises ImportError
sys.modules["transformers"] = None
import specbench.cli as cli
from specbench.cli import report
if not any(c.name == "report" for c in cli.app.registered_commands):
    report.register(cli.app)
sys.argv = ["specbench", "report", {str(synthetic)!r}, "--out", {str(out)!r}, "--n-boot", "200"]
try:
    cli.main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and out.stat().st_size > 1_000_000
