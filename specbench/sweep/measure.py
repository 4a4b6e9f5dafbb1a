"""One trial's measurement: one configuration run into its own run directory.

The run directory (`<study dir>/runs/<run_id>/`) is an ordinary specbench run written with
`RunWriter` (samples.parquet + run.json, whose config names the study and the trial), so
`specbench report` and `specbench compare` read it like any other. The numbers the trial
keeps are `analysis.summarize` of the Parquet as written, read back from disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.sweep.spec import Point, SweepSpec


# Headline figures stored flat on each trial (optuna-dashboard shows flat numbers as sortable
# columns): user attr name (units in the name) -> (summary column, scale, decimals)
HEADLINE = {
    "tpot_p50_ms": ("tpot_p50_s", 1e3, 3), "tpot_p95_ms": ("tpot_p95_s", 1e3, 3),
    "ttft_p50_ms": ("ttft_p50_s", 1e3, 3), "e2e_p50_s": ("e2e_p50_s", 1.0, 4),
    "output_tok_per_s": ("output_tps", 1.0, 2),
    "output_tok_per_s_per_user": ("output_tps_per_user", 1.0, 2),
    "acceptance_rate_pct": ("acceptance_rate_tok", 100.0, 2),
    "tokens_per_step": ("mean_acceptance_length_tok", 1.0, 3),
    "peak_memory_gib": ("peak_memory_bytes", 1 / 2**30, 3),
}


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """The HEADLINE figures of a stored summary (absent when undefined, e.g. no drafts)."""
    out = {}
    for name, (column, scale, decimals) in HEADLINE.items():
        v = summary.get(column)
        if v is not None and math.isfinite(v):
            out[name] = round(float(v) * scale, decimals)
    return out


@dataclass
class Measurement:
    attrs: dict[str, Any]  # trial user attrs: config_id, run_id, run_dir, host, summary, HEADLINE
    outputs: dict[str, list[int]] = field(default_factory=dict)  # baseline: prompt id -> ids


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def baseline_outputs_from(study_dir: Path, baseline_trial: Any) -> dict[str, list[int]] | None:
    """Greedy reference outputs from a baseline trial's run directory, when it is on this
    host (token_match_rate is then filled in for speculative rows, as in `specbench run`)."""
    from specbench.errors import RecordsError
    from specbench.records import read_run

    rel = baseline_trial.user_attrs.get("run_dir")
    if not rel or not (study_dir / rel).is_dir():
        return None
    try:
        df, _ = read_run(study_dir / rel)
    except RecordsError:
        return None
    ok = df[df["error"].isna()]
    return {r.prompt_id: [int(t) for t in r.output_token_ids] for r in ok.itertuples()}


def measure(session: Any, spec: SweepSpec, point: Point, number: int, study_dir: Path,
            study_name: str, storage: str, baseline_outputs: dict[str, list[int]] | None,
            events: Any, worker: str | None = None) -> Measurement:
    """Run every request of `session` once at `point`; return what the trial stores. With a
    `[server]` section the trial's own server is launched first and always stopped after."""
    from specbench.records import make_run_id
    from specbench.runner import Configuration

    config = Configuration(point.speculative_config(), point.concurrency)
    label = f"t{number:04d}-{config.config_id}"
    if point.draft is not None and len(spec.space.draft) > 1:
        label += f"-{Path(point.draft).name}"
    run_id = make_run_id(label)
    run_dir = study_dir / "runs" / run_id
    launcher = None
    if spec.server is not None:  # a server per trial, launched for this configuration
        from specbench.sweep.server import start_server

        launcher, backend = start_server(spec, point, session, study_dir / "server-logs" / f"{run_id}.log")
    else:
        backend = session.backend_for(point.draft, point.method)  # loads the draft or head on first use
    try:
        return _measure(session, spec, point, number, study_dir, study_name, storage,
                        baseline_outputs, events, config, run_id, run_dir, backend, launcher, worker)
    finally:
        if launcher is not None:
            launcher.stop()


def _measure(session: Any, spec: SweepSpec, point: Point, number: int, study_dir: Path,
             study_name: str, storage: str, baseline_outputs: dict[str, list[int]] | None,
             events: Any, config: Any, run_id: str, run_dir: Path, backend: Any,
             launcher: Any, worker: str | None) -> Measurement:
    import shlex

    from specbench import analysis
    from specbench.records import RunMetadata, RunWriter, read_run
    from specbench.runner import run_configuration
    from specbench.sweep.study import hostname

    wl = session.workload
    run_cfg = {
        "target": spec.target, "draft": point.draft, "method": point.method,
        "num_speculative_tokens": [point.num_speculative_tokens], "ngram": [1, 4],
        "workload": wl.name, "workload_kind": wl.kind, "num_prompts": len(wl.prompts),
        "sampling": dict(spec.sampling), "seed": spec.seed, "ignore_eos": spec.ignore_eos,
        "concurrency": [point.concurrency], "request_rate": None, "disable_by_batch_size": None,
        "dynamic_k": False, "warmup": spec.warmup, "device": spec.device, "dtype": spec.dtype,
        "backend": "openai" if launcher is not None else "embedded", "baseline": point.is_baseline,
        "chat_template": spec.chat_template,
        "truncate": spec.truncate, "configurations": [config.config_id],
        # host: also run.json's `hostname`; here so a run names its study, trial and host together
        "sweep": {"study": study_name, "storage": storage, "trial": number,
                  "objectives": list(spec.objectives), "host": hostname(), "worker": worker},
    }
    metadata = RunMetadata.collect(run_id, run_cfg)
    metadata.device = backend.device_name
    if launcher is not None:
        metadata.config["openai"] = backend.describe()
        metadata.config["server"] = {"command": shlex.join(launcher.argv), "log": str(launcher.log_path)}
    else:
        metadata.config["dtype_resolved"] = session.dtype_name
    writer = RunWriter(run_dir, metadata)
    outputs: dict[str, list[int]] | None = {} if point.is_baseline else baseline_outputs
    events.trial_started(number, config.config_id, len(session.requests))
    try:
        run_configuration(backend, session.requests, config, run_id=run_id, writer=writer,
                          warmup=spec.warmup, baseline_outputs=outputs,
                          on_result=lambda req, res: events.request_done(), rate_seed=spec.seed)
    except BaseException:
        writer.close(complete=False)
        raise
    writer.close(complete=True)
    df, _ = read_run(run_dir)
    row = analysis.summarize(df).iloc[0]
    summary = {k: _jsonable(row[k]) for k in analysis.SUMMARY_COLUMNS}
    attrs = {"config_id": config.config_id, "run_id": run_id,
             "run_dir": str(run_dir.relative_to(study_dir)), "host": hostname(),
             "summary": summary, **headline(summary)}
    return Measurement(attrs, outputs if point.is_baseline and outputs else {})
