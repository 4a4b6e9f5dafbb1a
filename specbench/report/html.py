"""Render a report to one self-contained HTML file: Jinja2 templates (`templates/`), Plotly
figures, plotly.js inlined once in the page head, CSS and the small table-sorting script
inlined too. The file needs no network: no CDN, no fonts, no images to fetch.

`build_report(inputs)` returns the page as a string; `write_report(page, path)` writes it
atomically. `specbench.cli.report` is the command around them.

Boundary: presentation only; numbers come from `specbench.report.verdict` and figures from
`specbench.report.plots`.
"""

from __future__ import annotations

import datetime as _dt
import re
import shlex
from dataclasses import dataclass

from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import plotly.io as pio
import plotly.offline
from markupsafe import Markup

from specbench import analysis
from specbench.errors import ReportError
from specbench.config import RunConfig
from specbench.atomic import atomic_write
from specbench.records import package_version
from specbench.report import fmt, model_view, plots, study_tables, study_view, verdict
from specbench.report.sections import sections as page_sections
from specbench.report.inputs import ReportInputs, RunInput

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_REPORTS_DIR = Path("reports")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ms=fmt.ms, times=fmt.times, ci=fmt.ci, num=fmt.num, pct=fmt.pct,
                       mib=fmt.mib, signed_mib=fmt.signed_mib, signed_pct=fmt.signed_pct,
                       missing=fmt.missing)
    return env


# --------------------------------------------------------------------------------------
# Header: what was run


def _sampling(df: pd.DataFrame, cfg: RunConfig) -> str:
    combos = df.drop_duplicates("prompt_id")[["temperature", "top_p", "top_k", "max_new_tokens"]]
    distinct = combos.drop_duplicates()

    def one(t: float, p: float, k: int) -> str:
        if t == 0:
            return "greedy"
        parts = [f"temperature {t:g}"]
        if p < 1:
            parts.append(f"top-p {p:g}")
        if k > 0:
            parts.append(f"top-k {k}")
        return ", ".join(parts)

    tokens = sorted(set(int(x) for x in combos["max_new_tokens"]))
    cap = (f"max {tokens[0]} new tokens" if len(tokens) == 1
           else f"max {tokens[0]}–{tokens[-1]} new tokens")
    eos = ("; EOS ignored (forced lengths: acceptance differs from EOS-terminated outputs, which production "
           "sees)") if cfg.ignore_eos else ""
    if len(distinct[["temperature", "top_p", "top_k"]].drop_duplicates()) == 1:
        r = distinct.iloc[0]
        return f"{one(r['temperature'], r['top_p'], r['top_k'])}, {cap}{eos}"
    greedy = int((combos["temperature"] == 0).sum())
    return (f"per prompt: {greedy} greedy, {len(combos) - greedy} sampled "
            f"(temperature {combos['temperature'].min():g}–{combos['temperature'].max():g}), "
            f"{cap}{eos}")


def _methods(df: pd.DataFrame) -> str:
    spec = df[~df["is_baseline"]]
    if spec.empty:
        return "none (baseline only)"
    parts = []
    for method, g in spec.groupby("method", sort=False):
        ks = sorted(set(int(k) for k in g["num_speculative_tokens"]))
        parts.append(f"{method} (k = {', '.join(map(str, ks))})")
    return "; ".join(parts)


def _command(meta: dict[str, Any]) -> list[str]:
    argv = [str(a) for a in meta.get("command", [])]
    if argv and Path(argv[0]).name in ("specbench", "__main__.py", "specbench.exe"):
        argv = ["specbench", *argv[1:]]
    return argv


def _with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag value` set (replacing `flag X` or `flag=X`, else appended)."""
    out, i, done = [], 0, False
    while i < len(argv):
        a = argv[i]
        if a == flag and i + 1 < len(argv):
            out += [flag, value]
            i, done = i + 2, True
            continue
        if a.startswith(flag + "="):
            out.append(f"{flag}={value}")
            i, done = i + 1, True
            continue
        out.append(a)
        i += 1
    return out if done else out + [flag, value]


def cliff_note(inputs: ReportInputs) -> dict[str, str] | None:
    """A run report whose speculative configurations ran at one concurrency only did not
    measure the concurrency cliff: say so, with the command that would."""
    spec = inputs.frame[~inputs.frame["is_baseline"]]
    if inputs.studies or spec.empty or spec["concurrency"].nunique() > 1:
        return None
    c = int(spec["concurrency"].iloc[0])
    levels = sorted({1, 4, 16, c})
    run = inputs.runs[0]
    argv = _command(run.meta)
    if len(argv) < 2 or argv[1] != "run":
        argv = ["specbench", "run"]
    argv = _with_option(argv, "--concurrency", ",".join(map(str, levels)))
    n_prompts = int(inputs.frame["prompt_id"].nunique())
    kinds = set(inputs.frame["workload_kind"].astype(str))
    if n_prompts < 2 * levels[-1] and "custom" not in kinds:
        argv = _with_option(argv, "--num-prompts", str(2 * levels[-1]))
    text = (f"The concurrency cliff was not measured: every speculative configuration ran at "
            f"concurrency {c} only, so this report cannot say at which batch size speculation "
            "stops paying. Measure it with:")
    return {"text": text, "command": shlex.join(argv)}


def run_header(run: RunInput, run_id: str) -> list[tuple[str, str]]:
    """(field, value) pairs describing one run, from its run.json metadata and its rows."""
    meta, df = run.meta, run.frame
    cfg = run.config
    versions = meta.get("versions") or {}
    drafts = sorted(str(d) for d in df["draft_model"].dropna().unique())
    workloads = df.drop_duplicates("workload")
    concs = sorted(set(int(c) for c in df["concurrency"]))
    rate = df["request_rate"].dropna()
    dtype = cfg.dtype_used
    rev = meta.get("git_revision")
    status = str(meta.get("status", "unknown"))
    rows = [
        ("run", run_id),
        ("status", status if status == "complete" else f"{status} (some configurations may be "
                                                        "incomplete)"),
        ("target model", str(cfg.target or "?")),
        ("draft model", ", ".join(drafts) if drafts else "–"),
        ("method", _methods(df)),
        ("workload", "; ".join(f"{w.workload} ({w.workload_kind}), "
                               f"{df.loc[df['workload'] == w.workload, 'prompt_id'].nunique()} prompts"
                               for w in workloads.itertuples())),
        ("sampling", _sampling(df, cfg)),
        ("load", f"concurrency {', '.join(map(str, concs))}"
                 + (f", {'Poisson' if not cfg.extra.get('burstiness') else 'gamma (burstiness ' + format(cfg.extra['burstiness'], 'g') + ')'}"
                    f" arrivals at {', '.join(f'{r:g}' for r in sorted(rate.unique()))} req/s" if len(rate) else
                    ", closed loop")),
        ("device", f"{meta.get('device') or '?'}" + (f", {dtype}" if dtype else "")
                   + f", backend {', '.join(sorted(df['backend'].unique()))}"),
        *_goodput_rows(df, cfg),
        ("git revision", rev[:12] if rev else "–"),
        ("host", str(meta.get("hostname", "–"))),
        ("samples", f"{len(df)} ({int((~analysis.ok_mask(df)).sum())} failed)"),
        ("when", f"{meta.get('created_at', '?')} → {meta.get('finished_at') or '?'} (UTC)"),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)),
        ("command", shlex.join(_command(meta)) or "–"),
    ]
    return rows


def _goodput_rows(df: pd.DataFrame, cfg: RunConfig) -> list[tuple[str, str]]:
    """With --goodput: the SLOs and each configuration's goodput (vLLM's definition)."""
    from specbench.analysis.serving import goodput, wall_times

    slos = cfg.extra.get("goodput_slos_ms")
    if not slos:
        return []
    gp = goodput(df, wall_times(dict(cfg.configuration_stats)))
    per = "; ".join(f"{r.config_id} {r.goodput_rps:.2f} req/s ({r.good} of {r.n})" for r in gp.itertuples())
    return [("goodput", f"requests meeting {', '.join(f'{k} <= {v:g} ms' for k, v in slos.items())}: {per or '–'}")]


# --------------------------------------------------------------------------------------
# Per-sample table


@dataclass
class Cell:
    text: str
    sort: Any = None  # numeric sort key; None sorts as text


def _cell_ms(v: Any) -> Cell:
    return Cell(fmt.ms(v), None if fmt.missing(v) else float(v))


def _cell_num(v: Any, text: str) -> Cell:
    return Cell(text, None if fmt.missing(v) else float(v))


SAMPLE_HEADERS = ["#", "configuration", "conc", "prompt", "category", "out tok", "TTFT ms",
                  "TPOT ms", "E2E ms", "accept rate", "accept len", "match", "1st diverg.",
                  "finish"]


def sample_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for i, r in frame.iterrows():
        ok = fmt.missing(r["error"])
        finish = str(r["finish_reason"]) + ("" if ok else f": {r['error']}")
        div = r["first_divergence"]
        rows.append({
            "anchor": verdict.sample_anchor(int(i)),
            "failed": not ok or r["finish_reason"] in ("error", "cancelled"),
            "cells": [
                Cell(str(i), int(i)), Cell(str(r["label"])),
                Cell(str(r["concurrency"]), int(r["concurrency"])),
                Cell(str(r["prompt_id"])), Cell(str(r["category"])),
                Cell(str(r["output_tokens"]), int(r["output_tokens"])),
                _cell_ms(r["ttft_s"]), _cell_ms(r["tpot_s"]), _cell_ms(r["e2e_s"]),
                _cell_num(r["acceptance_rate"], fmt.pct(r["acceptance_rate"])),
                _cell_num(r["mean_acceptance_length"] if not r["is_baseline"] else None,
                          fmt.num(r["mean_acceptance_length"]) if not r["is_baseline"] else fmt.DASH),
                _cell_num(r["token_match_rate"], fmt.pct(r["token_match_rate"])),
                _cell_num(div, fmt.DASH if fmt.missing(div) else
                          ("none" if int(div) < 0 else str(int(div)))),
                Cell(finish),
            ],
        })
    return rows


# --------------------------------------------------------------------------------------


def _figure_html(plot: plots.Plot) -> Markup:
    assert plot.figure is not None
    height = plot.figure.layout.height or 420
    return Markup(pio.to_html(plot.figure, full_html=False, include_plotlyjs=False,
                              div_id=f"plot-{plot.name}", config=PLOT_CONFIG,
                              default_width="100%", default_height=f"{height}px"))


def default_title(inputs: ReportInputs) -> str:
    workloads = ", ".join(dict.fromkeys(str(w) for w in inputs.frame["workload"]))
    targets = ", ".join(dict.fromkeys(str(r.config.target or "?")
                                      for r in inputs.runs))
    study = (" · study " + ", ".join(st.name for st in inputs.studies)) if inputs.studies else ""
    return f"Speculative decoding on {workloads} · {targets}{study}"


def _item(p: plots.Plot) -> dict[str, Any]:
    return {"plot": p, "html": _figure_html(p) if p.figure is not None else None}


def _run_block(run: RunInput, rid: str, inputs: ReportInputs) -> dict[str, Any]:
    sweep = run.config.sweep or {}
    configs = ", ".join(dict.fromkeys(str(c) for c in run.frame["config_id"]))
    summary = f"{rid} · {configs}" + (f" · study {sweep.get('study')}, trial {sweep.get('trial')}"
                                      if sweep else "")
    return {"id": study_tables.run_anchor(rid), "summary": summary,
            "status": str(run.meta.get("status", "unknown")), "rows": run_header(run, rid)}


def _study_block(study: Any, inputs: ReportInputs, table: pd.DataFrame) -> dict[str, Any]:
    items = [_item(build(study)) for build in study_view.STUDY_PLOTS]
    items.insert(2, _item(study_view.trial_heatmap(study, inputs, table)))
    t = study.trials
    counts = t["state"].value_counts().to_dict() if len(t) and "state" in t else {}
    return {
        "name": study.name, "id": "study-" + study_tables.slug(study.name),
        "storage": study.storage, "directory": str(study.study_dir) if study.study_dir else None,
        "objectives": ", ".join(f"{o} ({d})" for o, d in zip(study.objectives, study.directions)),
        "pairing": (study.setup or {}).get("pairing"),
        "counts": ", ".join(f"{n} {s.lower()}" for s, n in counts.items()) or "no trials",
        "notes": study.notes, "items": items,
        "trial_headers": study_tables.TRIAL_HEADERS, "trials": study_tables.trial_rows(study, inputs),
        "profile": study_tables.profile_rows(study, inputs),
        "serving": study_tables.serving_snippets(study),
    }


def build_report(inputs: ReportInputs, *, title: str | None = None, n_boot: int = verdict.N_BOOT,
                 seed: int = 0) -> str:
    """The whole report page as one HTML string."""
    table = verdict.verdict_table(inputs, n_boot=n_boot, seed=seed)
    sections = []
    for name, builders in page_sections():
        # a builder returns None where its plot does not apply (trees, in a run of chains)
        items = [_item(p) for build in builders if (p := build(inputs, table)) is not None]
        if items:
            sections.append({"title": name, "id": name.split()[0].lower(), "items": items})
    studies = [_study_block(st, inputs, table) for st in inputs.studies]
    notes = list(inputs.notes)
    for run, rid in zip(inputs.runs, inputs.run_ids):
        if run.meta.get("status") != "complete":
            notes.append(f"run {rid} did not complete (status: {run.meta.get('status')}); its "
                         "last configuration may have fewer samples")
    verdict_groups = [(int(c), g.to_dict("records")) for c, g in table.groupby("concurrency")]
    page = _env().get_template("report.html.j2").render(
        title=title or default_title(inputs),
        generated_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        versions={"specbench": package_version("specbench"), "plotly": package_version("plotly")},
        recommendation=verdict.recommendation(table),
        method_sentences=verdict.method_sentences(table),
        verdict_groups=verdict_groups,
        confidence=int(verdict.CONFIDENCE * 100),
        n_boot=n_boot,
        notes=notes,
        runs=[_run_block(r, rid, inputs) for r, rid in zip(inputs.runs, inputs.run_ids)],
        runs_open=len(inputs.runs) <= 3,
        cliff=cliff_note(inputs),
        model=model_view.summary(inputs, table),
        sections=sections,
        studies=studies,
        outliers=verdict.outliers(inputs.frame),
        sample_headers=SAMPLE_HEADERS,
        samples=sample_rows(inputs.frame),
        plotly_js=Markup(plotly.offline.get_plotlyjs()),
    )
    return page


def safe_file_name(text: str) -> str:
    """A file name made from text read out of records (a run id, a study name): runs come from
    other jobs' artifacts, so '/', '..' and anything but letters, digits, '.', '_' and '-'
    never reach the path; the result stays inside the reports directory."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._")
    return name[:120] or "report"


def default_out(inputs: ReportInputs) -> Path:
    if inputs.studies:
        return DEFAULT_REPORTS_DIR / f"study-{safe_file_name(study_tables.slug(inputs.studies[0].name))}.html"
    return DEFAULT_REPORTS_DIR / f"{safe_file_name(inputs.run_ids[0])}.html"


def write_report(page: str, out: Path) -> Path:
    """Write `page` to `out` atomically (temp file beside it, then rename); returns `out`.
    A place that cannot be written is a one-line ReportError naming it."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda fh: fh.write(page.encode("utf-8")))
    except OSError as exc:
        raise ReportError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return out
