"""A study's trials and profile as rows: the helpers that read Optuna's trial table (a trial's
parameters, its one-line description, the trials that measured), the report's trial table,
the recommended profile with each value next to the trial and run it came from, and the
serving configurations ready to paste. The study's figures are `specbench.report.study_view`.

Boundary: table rows from a `StudyInput` and the report's runs; no plots, no HTML.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd

from specbench.config import tree_nodes
from specbench.formatting import plain
from specbench.report import fmt
from specbench.report.inputs import ReportInputs, StudyInput


def run_anchor(run_id: str) -> str:
    return "run-" + re.sub(r"[^A-Za-z0-9_-]+", "_", str(run_id))


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


def family(method: Any, draft: Any) -> str:
    from specbench.speedup_model import family_of

    return family_of(str(method), draft if isinstance(draft, str) else None)


def param(t: Any, name: str) -> Any:
    return plain(getattr(t, f"params_{name}", None))


def describe_trial(t: Any) -> str:
    method = param(t, "method")
    c = param(t, "concurrency")
    c = int(c) if c is not None else c
    if method is None:
        return "–"
    if method == "none":
        return f"baseline c={c}"
    draft = param(t, "draft")
    d = f" ({str(draft).rsplit('/', 1)[-1]})" if draft else ""
    topk = param(t, "topk")
    tree = ""
    if topk is not None and int(topk) > 1:  # a draft tree: its width in tokens per target pass
        k, n = int(param(t, "num_speculative_tokens")), param(t, "num_draft_tokens")
        tree = f" topk={int(topk)} n={1 + tree_nodes(k, int(topk), int(n) if n is not None else None)}"
    return f"{method}{d} k={int(param(t, 'num_speculative_tokens'))}{tree} c={c}"


TRIAL_DEFAULTS = {"number": None, "state": None, "run_id": None, "run_dir": None, "host": None,
                  "config_id": None, "feasible": True, "constraint": None, "fail_reason": None,
                  "duplicate_of": None, "values_0": np.nan}


def trials(study: StudyInput) -> pd.DataFrame:
    """The study's trial table with every column this module reads (hand-built tables may
    lack some)."""
    t = study.trials.copy()
    for col, default in TRIAL_DEFAULTS.items():
        if col not in t:
            t[col] = default
    t["feasible"] = t["feasible"].fillna(True).astype(bool)
    return t


def measured(table: pd.DataFrame) -> pd.DataFrame:
    """Trials that ran their own measurement (complete or failed), not reuses."""
    dup = table["duplicate_of"] if "duplicate_of" in table else pd.Series(None, index=table.index)
    return table[dup.isna() & table["state"].isin(["COMPLETE", "FAIL"])]


TRIAL_HEADERS = ["trial", "state", "configuration", "objective", "feasible", "reused", "failure reason",
                 "run"]


def trial_rows(study: StudyInput, inputs: ReportInputs) -> list[dict[str, Any]]:
    present = set(inputs.run_ids)
    rows = []
    names = study.objectives or [f"objective {i}" for i in range(len(study.directions))]
    for t in trials(study).sort_values("number").itertuples():
        values = ", ".join(f"{n} {getattr(t, f'values_{i}'):.4g}" for i, n in enumerate(names)
                           if not fmt.missing(getattr(t, f"values_{i}", None)))
        feasible = "yes" if t.feasible else (
            f"no: {t.constraint:+.2f} GiB over budget" if not fmt.missing(t.constraint) else "no")
        run = t.run_id if isinstance(t.run_id, str) else None
        rows.append({
            "number": int(t.number), "state": t.state, "config": describe_trial(t),
            "objective": values or "–",
            "feasible": feasible if t.state == "COMPLETE" else "–",
            "reused": f"= trial {int(t.duplicate_of)}" if not fmt.missing(t.duplicate_of) else "",
            "reason": t.fail_reason or "", "run": run,
            "anchor": run_anchor(run) if run and run in present else None,
            "where": None if not run or run in present else (f"on {t.host}" if t.host else "not here"),
        })
    return rows


def _ev_link(ev: dict[str, Any] | None, present: set[str], role: str) -> dict[str, Any] | None:
    if not ev:
        return None
    run = ev.get("run_id")
    return {"role": role, "trial": ev.get("trial"), "run": run,
            "anchor": run_anchor(run) if run in present else None}


def profile_rows(study: StudyInput, inputs: ReportInputs) -> list[dict[str, Any]]:
    """(field, value, evidence) rows of the profile: every value next to its trial and run."""
    prof = study.profile
    if not prof:
        return []
    present = set(inputs.run_ids)
    rows: list[dict[str, Any]] = []
    bands = prof.get("bands") or []
    first = bands[0] if bands else {}
    first_ev = _ev_link(first.get("speculative"), present, "best speculative")
    rows.append({"field": "recommendation", "value": prof.get("recommendation"),
                 "why": "from the bands below", "ev": []})
    cfg = prof.get("speculative_config") or {}
    for key in ("method", "model", "num_speculative_tokens", "topk", "num_draft_tokens"):
        if key in cfg:
            rows.append({"field": f"speculative_config.{key}", "value": cfg[key],
                         "why": f"best speculative configuration at concurrency "
                                f"{first.get('measured_at_concurrency')}",
                         "ev": [first_ev] if first_ev else []})
    dbbs = prof.get("disable_by_batch_size") or {}
    ev = [e for e in (_ev_link(dbbs.get("last_paying"), present, "last paying"),
                      _ev_link(dbbs.get("first_not_paying"), present, "first not paying")) if e]
    rows.append({"field": "disable_by_batch_size", "value": dbbs.get("value"),
                 "why": dbbs.get("why", ""), "ev": ev})
    for b in bands:
        bs = b["batch_size"]
        what = (f"{b['profile']}" + (f" {b.get('method')} k={b.get('num_speculative_tokens')}"
                                     if b["profile"] == "speculative" else "")
                + (f" topk={b['topk']} n={b['num_draft_tokens']}" if b.get("topk") else ""))
        ev = [e for e in (_ev_link(b.get("speculative"), present, "speculative"),
                          _ev_link(b.get("baseline"), present, "baseline")) if e]
        rows.append({"field": f"batch size {bs['min']}–{bs['max'] if bs['max'] is not None else '∞'}",
                     "value": what, "why": b.get("why", ""), "ev": ev})
    return rows


def serving_snippets(study: StudyInput) -> dict[str, Any] | None:
    """The paste-ready serving configurations of the study's profile."""
    if not study.profile:
        return None
    import yaml

    from specbench.sweep.serving import serving_profiles, vllm_flag

    try:
        s = serving_profiles(study.profile)
    except (KeyError, TypeError, ValueError) as exc:
        return {"error": f"profile.yaml cannot be turned into serving configurations: {exc}",
                "vllm": None, "vllm_legacy": None, "sglang": None, "rollout": None, "bands": [],
                "notes": []}
    import shlex

    return {
        "error": None,
        "vllm": vllm_flag(s["vllm"]) if s["vllm"] else None,
        "vllm_json": json.dumps(s["vllm"], indent=2) if s["vllm"] else None,
        "vllm_legacy": vllm_flag(s["vllm_legacy"]) if s["vllm_legacy"] else None,
        "sglang": shlex.join(s["sglang"]) if s["sglang"] else None,
        "rollout": yaml.safe_dump(s["rollout"], sort_keys=False, allow_unicode=True, width=100),
        "bands": s["bands"], "notes": s["notes"],
    }
