"""The report in a real browser: headless Chromium (Debian's `chromium` package) opens the
generated file from disk with networking off; the page logs no console errors and throws no
exceptions, fetches nothing but itself, every plot container holds a rendered Plotly figure,
the sample table sorts, an outlier link lands on its row, and a full-page screenshot is saved
in the test's tmp directory. Skipped only when no Chromium is installed."""

from __future__ import annotations

import pytest

from report_helpers import load_in_chromium, specbench

# Sort the sample table by TPOT (twice), then follow the first outlier link.
INTERACT = """
(() => {
  const table = document.querySelector('table.samples');
  const col = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent === 'TPOT ms');
  const th = table.tHead.rows[0].cells[col];
  const values = () => Array.from(table.tBodies[0].rows)
      .map(r => r.cells[col].dataset.v).filter(v => v !== undefined).map(Number);
  th.click();
  const asc = values();
  th.click();
  const desc = values();
  const link = document.querySelector('.outliers a');
  link.click();
  const target = document.querySelector(':target');
  return {asc, desc, href: link.getAttribute('href'), target: target ? target.id : null,
          sort: th.getAttribute('aria-sort')};
})()
"""


@pytest.mark.parametrize("which", ["synthetic", "tiny_run"])
def test_report_renders_in_headless_chromium(which, request, chromium, tmp_path):
    run = request.getfixturevalue(which)
    html = tmp_path / f"{which}.html"
    res = specbench("report", run, "--out", html, "--n-boot", "500")
    assert res.code == 0, res.output

    page = load_in_chromium(chromium, html, tmp_path / "chromium", script=INTERACT)

    assert page.console_errors == [] and page.exceptions == []
    fetched = [u for u in page.requests if not u.startswith(("file://", "data:"))]
    assert fetched == [], fetched
    assert len(page.plots) + page.omitted == 10
    assert len(page.plots) >= 7
    for p in page.plots:
        assert p["id"] and p["id"].startswith("plot-"), p
        assert p["svgs"] >= 1 and p["traces"] >= 1 and p["marks"] >= 1, p
        assert p["width"] > 600 and p["height"] >= 250, p
    shot = page.screenshot
    assert shot is not None and shot.stat().st_size > 100_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    got = page.extra
    assert got["asc"] == sorted(got["asc"]) and got["desc"] == sorted(got["desc"], reverse=True)
    assert len(got["asc"]) > 0 and got["sort"] == "descending"
    assert got["target"] == got["href"].lstrip("#")
