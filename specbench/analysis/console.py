"""The console view of a run's analysis (`specbench run` prints it): a latency table and a
throughput and speculation table, where acceptance figures come from (request or server
scope), requests left out of the per-user speed, and one sentence per method on where
speculation pays.

Boundary: summary and verdict frames in, rich tables and lines of text out; printing is the
command's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from specbench.analysis.summary import MIN_DECODE_S, PERCENTILES, series
from specbench.formatting import dash_or, ms


def _ms3(row: pd.Series, name: str) -> str:
    return " / ".join(ms(row[f"{name}_p{q}_s"]) for q in PERCENTILES)


def acceptance_cells(row: pd.Series, stats: dict[str, Any] | None) -> tuple[str, str, str]:
    """(accept rate, accept length, scope) as the console shows them for one summary row.

    Per-request figures (records' acceptance columns: the embedded engine, `specbench serve`,
    vLLM with --per-request-spec-decode-metrics) read "tok / req" with scope `request`;
    without them, the server's /metrics deltas for the configuration (`stats`, the run's
    configuration_stats entry) with scope `server`. Nothing measured reads "–", never a
    baseline-looking 1.00; baselines draft nothing and read "–" too."""
    if row["is_baseline"]:
        return "–", "–", "–"
    if row["drafted_tokens"] and row["drafted_tokens"] > 0:
        return (f"{dash_or(row['acceptance_rate_tok'], '.2f')} / {dash_or(row['acceptance_rate_req'], '.2f')}",
                f"{dash_or(row['mean_acceptance_length_tok'], '.2f')} / "
                f"{dash_or(row['mean_acceptance_length_req'], '.2f')}", "request")
    srv = (stats or {}).get("server_spec_decode") or {}
    if srv.get("num_drafts"):
        return (dash_or(srv.get("acceptance_rate"), ".3f"), dash_or(srv.get("mean_acceptance_length"), ".2f"),
                "server")
    return "–", "–", "none"


def _table(title: str, *columns: str, words: tuple[str, ...] = ()) -> Table:
    """A table whose first column is the configuration (folded when long) and whose other
    columns are right-aligned numbers, except `words` (left-aligned)."""
    t = Table(title=title, title_justify="left")
    t.add_column("config", overflow="fold")
    for name in columns:
        t.add_column(name, justify="left" if name in words else "right")
    return t


def rich_summary_table(summary: pd.DataFrame, speedups: pd.DataFrame,
                       configuration_stats: dict[str, dict] | None = None) -> Table:
    """Console view of `summary` and `speedups`: a latency table above a throughput and
    speculation table, wrapped in one borderless grid so each stays under 120 columns.
    `configuration_stats` (run.json's, by config_id) supplies server-wide acceptance where
    the records hold none (see `acceptance_cells`)."""
    latency = _table("Latency (ms: p50 / p95 / p99)", "conc", "n", "err", "TTFT", "TPOT", "E2E")
    spec = _table("Throughput and speculation", "conc", "tok/s\nper user", "tok/s\ntotal",
                  "accept rate\ntok / req", "accept len\ntok / req", "accept\nscope", "speedup\nTPOT",
                  "speedup\ntok/s", "peak\nMiB", words=("accept\nscope",))

    sp = speedups.set_index("config_id") if len(speedups) else None
    for _, r in summary.iterrows():
        latency.add_row(str(r["config_id"]), str(r["concurrency"]), str(r["n"]),
                        str(r["errors"]), _ms3(r, "ttft"), _ms3(r, "tpot"), _ms3(r, "e2e"))
        if r["is_baseline"]:
            tpot_x = tps_x = "1.00"
        elif sp is not None and r["config_id"] in sp.index:
            x = sp.loc[r["config_id"]]
            if isinstance(x, pd.DataFrame):  # same config_id at several concurrencies
                x = x[x["concurrency"] == r["concurrency"]].iloc[0]
            tpot_x, tps_x = dash_or(x["tpot_p50_speedup"], ".2f"), dash_or(x["output_tps_speedup"], ".2f")
        else:
            tpot_x = tps_x = "–"
        peak = r["peak_memory_bytes"]
        per_user = dash_or(r["output_tps_per_user"], ".1f")
        excluded = r.get("output_tps_per_user_excluded")
        if excluded is not None and not pd.isna(excluded) and int(excluded):
            per_user += f" ({int(excluded)} burst)"
        rate, length, scope = acceptance_cells(r, (configuration_stats or {}).get(str(r["config_id"])))
        spec.add_row(
            str(r["config_id"]),
            str(r["concurrency"]),
            per_user,
            dash_or(r["output_tps"], ".1f"),
            rate,
            length,
            scope,
            tpot_x,
            tps_x,
            dash_or(peak / 2**20 if not pd.isna(peak) else peak, ".0f"),
        )

    grid = Table.grid(padding=(1, 0))
    grid.add_column()
    grid.add_row(latency)
    grid.add_row(spec)
    return grid


def burst_lines(summary: pd.DataFrame) -> list[str]:
    """One line per configuration with requests left out of tok/s per user (decode < 1 ms)."""
    lines = []
    for _, r in summary.iterrows():
        k = r.get("output_tps_per_user_excluded")
        if k is not None and not pd.isna(k) and int(k):
            lines.append(f"{r['config_id']}: {int(k)} of {int(r['n'] - r['errors'])} request(s) left out of "
                         f"tok/s per user: their answer arrived in one burst (decode time under "
                         f"{MIN_DECODE_S * 1e3:g} ms), so no per-user rate can be measured")
    return lines


def _shape(config_id: str, method: str, k) -> str:
    """What a configuration's label adds to its method and k (a tree's `t4n8`, `dyn`,
    `off8`), so that a chain and a tree of the same k get a sentence each."""
    head = f"{method}-k{int(k)}"
    rest = series(config_id)
    return rest[len(head):].lstrip("-") if rest.startswith(head) else ""


def where_speculation_pays(verdicts: pd.DataFrame) -> list[str]:
    """One sentence per speculative method, k and draft shape (from `speedup_verdicts`): at which
    concurrency levels it pays (the paired TPOT speedup's whole interval above the minimum),
    and from which level on it stops."""
    lines = []
    verdicts = verdicts.assign(_shape=[_shape(cid, m, k) for cid, m, k in zip(
        verdicts["config_id"], verdicts["method"], verdicts["num_speculative_tokens"])])
    for (method, k, shape), grp in verdicts.groupby(["method", "num_speculative_tokens", "_shape"], sort=True):
        grp = grp.sort_values("concurrency")
        blocks = grp["paired_blocks"] if "paired_blocks" in grp else [None] * len(grp)
        levels = [(int(c), o, p, lo, hi, n) for c, o, p, lo, hi, n in zip(
            grp["concurrency"], grp["outcome"], grp["tpot_speedup"], grp["tpot_speedup_lo"], grp["tpot_speedup_hi"],
            blocks)]
        pays = [c for c, o, *_ in levels if o == "win"]
        after = [c for c, o, *_ in levels if o != "win" and pays and c > max(pays)]
        if levels and len(pays) == len(levels):
            verdict = "pays at every concurrency measured"
        elif not pays:
            verdict = "does not pay at any concurrency measured"
        elif after:
            verdict = f"pays up to concurrency {max(pays)} and stops paying from {min(after)}"
        else:
            verdict = f"pays at concurrency {', '.join(map(str, pays))} only"

        def level(c, o, p, lo, hi, n):
            word = {"win": "pays", "loss": "loses", "even": "even", "unclear": "unclear"}[o]
            if o == "even" and n is not None and not pd.isna(n):  # blocks are the unit: say how few
                word += f" ({int(n)} blocks of {c}: --num-prompts buys more)"
            ci = f" [{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
            return f"c{c} {p:.2f}x{ci} {word}" if np.isfinite(p) else f"c{c} no baseline"

        detail = ", ".join(level(*x) for x in levels)
        name = f"{method} k={int(k)}" + (f" {shape}" if shape else "")
        lines.append(f"{name}: {verdict} (TPOT speedup vs baseline, 95% CI: {detail})")
    return lines
