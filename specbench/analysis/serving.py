"""What `vllm bench serve` users read, from a run's records: goodput under SLOs and the TTFT
tail (p99, p99.9), per configuration.

Goodput is vLLM's: the requests meeting every SLO given (TTFT, TPOT, E2E latency, each at
most its bound; TPOT counts as 0 for a request of one output token) per second of the
configuration's wall time; failed requests never meet them. Records carry it per sample
(`meets_slo`, written by the runner) and run.json the SLOs (`goodput_slos_ms`).

Boundary: records frames and run statistics in, numbers and console lines out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from specbench.errors import ConfigError
from specbench.metrics import SLO_NAMES, meets_slo

__all__ = ["SLO_NAMES", "goodput", "meets_slo", "parse_goodput", "serving_lines"]


def parse_goodput(values: Sequence[str] | None, name: str = "--goodput") -> dict[str, float] | None:
    """`--goodput ttft:50 --goodput tpot:20` (or `ttft:50,tpot:20`) -> {"ttft": 50.0, ...} in
    ms; None when not given; one clear line for anything else, naming the option as `name`."""
    if not values:
        return None
    out: dict[str, float] = {}
    parts = []
    for v in values:
        chunks = str(v).split(",")
        if any(not c.strip() for c in chunks):  # dropping it would measure other SLOs than typed
            raise ConfigError(f"{name}: empty item in {str(v)!r} (give NAME:MS items, e.g. {name} ttft:200,tpot:50)")
        parts += [p for c in chunks for p in c.split()]
    for part in parts:
        key, sep, value = part.partition(":")
        if not sep or key not in SLO_NAMES:
            raise ConfigError(f"{name}: {part!r} is not NAME:MS with NAME one of {', '.join(SLO_NAMES)} "
                              "(e.g. --goodput ttft:200 --goodput tpot:50)")
        try:
            ms = float(value)
        except ValueError:
            ms = float("nan")
        if not (np.isfinite(ms) and ms >= 0):
            raise ConfigError(f"{name} {key}: {value!r} is not a number of milliseconds >= 0")
        if key in out:
            raise ConfigError(f"{name} {key} given twice")
        out[key] = ms
    return out


def wall_times(configuration_stats: Mapping[str, Any] | None) -> dict[str, float]:
    """Per configuration, the runner's `wall_s` (its own measuring time) from the run's
    configuration stats; configurations without one are left out."""
    return {k: float(v["wall_s"]) for k, v in (configuration_stats or {}).items()
            if isinstance(v, dict) and v.get("wall_s")}


def goodput(df: pd.DataFrame, wall_s: Mapping[str, float]) -> pd.DataFrame:
    """Per configuration: requests meeting the SLOs, and per second of its wall time."""
    rows = []
    if "meets_slo" not in df.columns:
        return pd.DataFrame(columns=["config_id", "good", "n", "goodput_rps"])
    for cid, g in df.groupby("config_id", sort=False):
        flags = g["meets_slo"].dropna()
        if flags.empty:
            continue
        good = int(flags.astype(bool).sum())
        wall = wall_s.get(str(cid))
        rows.append({"config_id": cid, "good": good, "n": len(g),
                     "goodput_rps": good / wall if wall else float("nan")})
    return pd.DataFrame(rows, columns=["config_id", "good", "n", "goodput_rps"])


def serving_lines(df: pd.DataFrame, configuration_stats: Mapping[str, Any] | None,
                  slos_ms: Mapping[str, float] | None) -> list[str]:
    """One console line per configuration: TTFT p50 / p99 / p99.9 and, with SLOs, goodput."""
    gp = goodput(df, wall_times(configuration_stats)).set_index("config_id") if slos_ms else None
    slo_text = ", ".join(f"{k} <= {v:g} ms" for k, v in (slos_ms or {}).items())
    lines = []
    for cid, g in df.groupby("config_id", sort=False):
        ok = g[g["finish_reason"] != "error"]["ttft_s"].dropna().to_numpy(dtype=float)
        if not len(ok):
            continue
        p50, p99, p999 = (float(np.percentile(ok, q)) * 1e3 for q in (50, 99, 99.9))
        line = f"{cid}: TTFT p50 {p50:.1f} / p99 {p99:.1f} / p99.9 {p999:.1f} ms"
        if gp is not None and cid in gp.index:
            r = gp.loc[cid]
            line += (f"; goodput {r['goodput_rps']:.2f} req/s ({int(r['good'])} of {int(r['n'])} "
                     f"requests met {slo_text})")
        lines.append(line)
    return lines
