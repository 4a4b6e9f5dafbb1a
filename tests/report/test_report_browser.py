"""The report in a real browser: headless Chromium (Debian's `chromium` package) opens the
generated file from disk with networking off; the page logs no console errors and throws no
exceptions, fetches nothing but itself, every plot container holds a rendered Plotly figure
whose legend covers no subplot title, the sample table sorts, an outlier link lands on its
row, a study report's trial links open their run's section, no in-page link is broken, and a
full-page screenshot is saved in the test's tmp directory. Skipped only when no Chromium is
installed."""

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


# Follow the first trial's run link: the run's section is the target and opens.
STUDY_INTERACT = """
(async () => {
  const link = document.querySelector('a.trial-run');
  link.click();
  await new Promise(r => setTimeout(r, 200));
  const target = document.getElementById(link.getAttribute('href').slice(1));
  const box = target.getBoundingClientRect();
  return {links: document.querySelectorAll('a.trial-run').length, tag: target.tagName,
          open: target.open, hash: location.hash, visible: box.height > 0 && box.top < innerHeight,
          broken: Array.from(document.querySelectorAll('a[href^="#"]'))
              .filter(a => a.getAttribute('href').length > 1 &&
                           !document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1))))
              .map(a => a.getAttribute('href'))};
})()
"""

PLOTS = {"synthetic": (15, 12), "tiny_run": (15, 9), "tiny_study": (19, 12)}  # (blocks, drawn at least)


@pytest.mark.parametrize("which", ["synthetic", "tiny_run", "tiny_study"])
def test_report_renders_in_headless_chromium(which, request, chromium, tmp_path):
    source = request.getfixturevalue(which)
    if which == "tiny_study":
        source = source / "studies" / "tiny"
    html = tmp_path / f"{which}.html"
    res = specbench("report", source, "--out", html, "--n-boot", "500")
    assert res.code == 0, res.output

    script = STUDY_INTERACT if which == "tiny_study" else INTERACT
    page = load_in_chromium(chromium, html, tmp_path / "chromium", script=script)

    assert page.console_errors == [] and page.exceptions == []
    fetched = [u for u in page.requests if not u.startswith(("file://", "data:"))]
    assert fetched == [], fetched
    blocks, drawn = PLOTS[which]
    assert len(page.plots) + page.omitted == blocks
    assert len(page.plots) >= drawn
    for p in page.plots:
        assert p["id"] and p["id"].startswith("plot-"), p
        assert p["svgs"] >= 1 and p["traces"] >= 1 and p["marks"] >= 1, p
        assert p["width"] > 600 and p["height"] >= 200, p
        assert p["legend_overlaps_titles"] == 0, p  # no legend over a subplot title
    shot = page.screenshot
    assert shot is not None and shot.stat().st_size > 100_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    got = page.extra
    if which == "tiny_study":
        assert got["links"] == 6 and got["tag"] == "DETAILS" and got["open"] and got["visible"], got
        assert got["broken"] == [], got
        return
    assert got["asc"] == sorted(got["asc"]) and got["desc"] == sorted(got["desc"], reverse=True)
    assert len(got["asc"]) > 0 and got["sort"] == "descending"
    assert got["target"] == got["href"].lstrip("#")
