"""One trial's measurement: one configuration run into its own run directory (`measure`), or
a level batch's configurations, every one still to measure at one concurrency, run with one
baseline into one run directory they share (`measure_level`).

The run directory (`<study dir>/runs/<run_id>/`) is an ordinary specbench run written with
`RunWriter` (samples.parquet + run.json, whose config names the study and the trial), so
`specbench report` and `specbench compare` read it like any other. The numbers the trial
keeps are `summary.stored_summary` of the Parquet as written, read back from disk.

`open_session` assembles what every trial of a process measures with, once.

Boundary: runs one configuration through `specbench.runner` with a session's backend (or the
trial's own server, `specbench.sweep.server`); knows nothing of Optuna or of the study's
other trials.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.config import RunConfig
from specbench.runner import BackendSwitch, Configuration
from specbench.sweep.space import config_key
from specbench.sweep.spec import SweepSpec
from specbench.sweep.summary import headline, jsonable, stored_summary
from specbench.sweep.urls import display_url
from specbench.session import open_session as open_embedded_session
from specbench.errors import RecordsError
from specbench.config import BASELINE


@dataclass
class Measurement:
    attrs: dict[str, Any]  # trial user attrs: config_id, run_id, run_dir, host, summary, HEADLINE
    outputs: dict[str, list[int]] = field(default_factory=dict)  # baseline: prompt id -> ids


def open_session(spec: SweepSpec, log: Callable[[str], None] | None = None) -> Any:
    """What this process's trials measure with: with `[server]` the tokenized requests only
    (`server.open_server_session`: the servers hold the weights), else a
    `specbench.session.Session` (the target loaded once, each draft on first use)."""
    if spec.server is not None:
        from specbench.sweep.server import open_server_session

        return open_server_session(spec, log=log)

    w = spec.workload
    return open_embedded_session(
        target=spec.target, engine_cfg=spec.engine, workload=w.source, base=spec.sampling.params(),
        overrides=spec.sampling.overrides, prompt_field=w.prompt_field, num_prompts=w.num_prompts,
        seed=spec.sampling.seed, chat_template=w.chat_template, truncate=w.truncate, log=log,
        tool_call_parser=w.tool_call_parser)


def baseline_outputs_from(study_dir: Path, baseline_trial: Any) -> dict[str, list[int]] | None:
    """Greedy reference outputs from a baseline trial's run directory, when it is on this
    host (token_match_rate is then filled in for speculative rows, as in `specbench run`)."""
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


def run_config(spec: SweepSpec, config: Any, workload: Any, *, backend: str, number: int,
               worker: str | None, host: str, configs: list[Any] | None = None) -> RunConfig:
    """run.json's configuration for one trial: what `specbench run` records, for the trial's one
    configuration (`config`, a `runner.Configuration`), and `sweep`, which names the study,
    the trial and the host that measured it."""
    sc = config.spec
    return RunConfig(
        target=spec.target, draft=sc.draft, method=sc.method,
        num_speculative_tokens=(sc.num_speculative_tokens,), ngram=(sc.ngram_min, sc.ngram_max),
        workload=workload.name, workload_kind=workload.kind, num_prompts=len(workload.prompts),
        sampling=spec.sampling.overrides, seed=spec.sampling.seed,
        ignore_eos=spec.sampling.ignore_eos, concurrency=(config.concurrency,),
        request_rate=config.request_rate, disable_by_batch_size=sc.disable_by_batch_size,
        dynamic_k=sc.dynamic_k, warmup=spec.workload.warmup, device=spec.engine.device,
        dtype=spec.engine.dtype, backend=backend,
        baseline=any(c.is_baseline for c in (configs or [config])),
        chat_template=spec.workload.chat_template,
        truncate=spec.workload.truncate,
        extra={"tool_call_parser": spec.workload.tool_call_parser} if spec.workload.tool_call_parser != "json" else {},
        configurations=tuple(c.config_id for c in (configs or [config])),
        # host: also run.json's `hostname`; here so a run names its study, trial and host together
        sweep={"study": spec.study.name, "storage": display_url(spec.storage_url), "trial": number,
               "objectives": list(spec.objectives), "host": host, "worker": worker,
               "pairing": spec.pairing},
    )


def measure(session: Any, spec: SweepSpec, config: Configuration, number: int, study_dir: Path,
            baseline_outputs: dict[str, list[int]] | None, events: Any,
            worker: str | None = None) -> Measurement:
    """Run every request of `session` under `config`; return what the trial stores.

    Paired (`spec.paired`): a speculative trial measures the baseline with it, interleaved in
    ABBA blocks (`runner.run_plan`), and stops early once the paired speedup is clear
    (`sequential`); its speedup comes from its own Parquet only. With a `[server]` section the
    trial's servers (its own and, paired, a baseline server: `server.ServerSwitch`) are
    launched for it and always stopped after; unpaired (`pairing = "none"`) it measures its
    configuration alone, compared later with the baseline trial."""
    from specbench.records import make_run_id

    label = f"t{number:04d}-{config.config_id}"
    if config.spec.draft is not None and len(spec.space.draft) > 1:
        label += f"-{Path(config.spec.draft).name}"
    run_id = make_run_id(label)
    launcher = None  # what is stopped after the trial, however it ends
    logs = study_dir / "server-logs"
    if spec.server is not None and spec.paired and not config.is_baseline:
        from specbench.sweep.server import ServerSwitch

        # the trial's server and a baseline server, launched by the plan as it needs them
        launcher = backend = ServerSwitch(spec, session, logs, run_id)
    elif spec.server is not None:  # a server per trial, launched for this configuration
        from specbench.sweep.server import start_server

        launcher, backend = start_server(spec, config, session, logs / f"{run_id}.log")
    else:
        backend = session.backend_for(config.spec.draft, config.spec.method)  # loads the draft or head on first use
    try:
        return _run(session, spec, config, number, study_dir / "runs" / run_id, study_dir,
                    baseline_outputs, events, backend, launcher, worker)
    finally:
        if launcher is not None:
            launcher.stop()


def _run(session: Any, spec: SweepSpec, config: Configuration, number: int, run_dir: Path, study_dir: Path,
         baseline_outputs: dict[str, list[int]] | None, events: Any, backend: Any,
         launcher: Any, worker: str | None) -> Measurement:
    from specbench.records import RunMetadata, RunWriter, read_run
    from specbench.runner import run_configuration, run_plan

    paired = spec.paired and not config.is_baseline
    configs = [Configuration(BASELINE, config.concurrency), config] if paired else [config]
    run_id = run_dir.name
    metadata = RunMetadata.collect(run_id, {})
    metadata.config = run_config(spec, config, session.workload, number=number, worker=worker,
                                 host=metadata.hostname, configs=configs,
                                 backend="openai" if launcher is not None else "embedded").to_dict()
    switch = launcher if launcher is backend else None  # a paired server trial's servers
    if switch is None:
        metadata.device = backend.device_name
    if launcher is not None and switch is None:
        metadata.note(openai=backend.describe(),
                      server={"command": shlex.join(launcher.argv), "log": str(launcher.log_path)})
    elif switch is None:
        metadata.note(dtype_resolved=session.dtype_name)
    writer = RunWriter(run_dir, metadata)
    outputs: dict[str, list[int]] | None = {} if config.is_baseline else baseline_outputs
    events.trial_started(number, config.config_id, len(session.requests) * len(configs))
    # alternate server launches: `[server] blocks` blocks, each switch a launch
    blocks = spec.server.blocks if paired and switch is not None and not switch.together else None
    watch = PairedWatch(spec, config, len(session.requests), blocks) if paired else None
    try:
        if paired:
            try:
                run_plan(backend, session.requests, configs, run_id=run_id, writer=writer,
                         warmup=spec.workload.warmup, seed=spec.sampling.seed + number, blocks=blocks,
                         on_result=lambda req, res: events.request_done(), stop=watch,
                         slos_ms=spec.goodput_slos_ms)
            finally:
                if switch is not None:  # every server the trial launched, in order
                    metadata.device = switch.last.device_name if switch.last is not None else None
                    metadata.note(openai=switch.last.describe() if switch.last is not None else None,
                                  server={"launches": switch.launches})
        else:
            run_configuration(backend, session.requests, config, run_id=run_id, writer=writer,
                              warmup=spec.workload.warmup, baseline_outputs=outputs,
                              on_result=lambda req, res: events.request_done(),
                              rate_seed=spec.sampling.seed, slos_ms=spec.goodput_slos_ms)
    except BaseException:
        writer.close(complete=False)
        raise
    writer.close(complete=True)
    df, meta = read_run(run_dir)
    summary = _with_goodput(stored_summary(df, config.config_id), df, meta, config.config_id, spec)
    attrs = {"config_id": config.config_id, "run_id": run_id,
             "run_dir": str(run_dir.relative_to(study_dir)), "host": metadata.hostname,
             "summary": summary, **headline(summary)}
    if watch is not None:
        attrs.update(watch.verdict(df, summary.get("mean_acceptance_length_tok")))
        attrs["baseline_summary"] = _with_goodput(stored_summary(df, watch.base_id), df, meta, watch.base_id, spec)
    return Measurement(attrs, outputs if config.is_baseline and outputs else {})


class _SessionSwitch(BackendSwitch):
    """The embedded backend of each configuration of a level (`measure_level`): one per
    drafter, from the session; each configuration is fresh (warmed up) on its first block."""

    name = "embedded"

    def __init__(self, session: Any):
        self.session, self.seen = session, set()

    def get(self, config: Configuration) -> tuple[Any, bool]:
        fresh = config.config_id not in self.seen
        self.seen.add(config.config_id)
        return self.session.backend_for(config.spec.draft, config.spec.method), fresh


def measure_level(session: Any, spec: SweepSpec, configs: list[Configuration], number: int, study_dir: Path,
                  events: Any, worker: str | None = None) -> dict[str, Measurement]:
    """Measure every configuration of `configs` (one concurrency level, embedded) in one run
    with one baseline: the baseline and the configurations in rotation over blocks of one
    wave (A B C, C B A, ...), each configuration leaving the rotation once its paired interval
    decides (`[budget] sequential`), the level ending when none is left. Returns each
    configuration's trial attrs by its `config_key` (the baseline's too, whether or not it is
    among `configs`): every trial's speedup comes from the one Parquet they share, against
    the baseline samples measured in the same blocks. Where one baseline serves N configurations a level costs
    (N + 1) x prompts instead of 2 x N x prompts, before any configuration stops early."""
    from specbench.records import RunMetadata, RunWriter, make_run_id, read_run
    from specbench.runner import run_plan

    concurrency = configs[0].concurrency
    assert all(c.concurrency == concurrency for c in configs), "one concurrency level per batch"
    specs = [c for c in configs if not c.is_baseline]
    base = Configuration(BASELINE, concurrency)
    plan = [base, *specs]
    run_id = make_run_id(f"t{number:04d}-level-c{concurrency}")
    run_dir = study_dir / "runs" / run_id
    metadata = RunMetadata.collect(run_id, {})
    metadata.config = run_config(spec, plan[-1], session.workload, number=number, worker=worker,
                                 host=metadata.hostname, configs=plan, backend="embedded").to_dict()
    # run.json names every k and the methods of the level (the first in the method field)
    metadata.config["num_speculative_tokens"] = sorted({c.spec.num_speculative_tokens for c in specs})
    metadata.config["method"] = "+".join(sorted({c.spec.method for c in specs})) or "none"
    metadata.config["sweep"]["level_batch"] = {"trial": number, "configurations": [c.config_id for c in plan]}
    metadata.device = session.backend_for(None).device_name
    metadata.note(dtype_resolved=session.dtype_name)
    switch = _SessionSwitch(session)
    watches = {c.config_id: PairedWatch(spec, c, len(session.requests)) for c in specs}
    writer = RunWriter(run_dir, metadata)
    events.trial_started(number, f"c{concurrency}: baseline + {len(specs)} configurations",
                         len(session.requests) * len(plan))

    def stop(rows: list[dict], done: int) -> dict[str, str] | None:
        import pandas as pd

        frame = None
        out = {}
        for cid, watch in watches.items():
            if watch.stopped is not None or not watch.due(done):
                continue
            frame = pd.DataFrame(rows) if frame is None else frame
            why = watch(frame, done)
            if why:
                out[cid] = why
        return out or None

    try:
        run_plan(switch, session.requests, plan, run_id=run_id, writer=writer, warmup=spec.workload.warmup,
                 seed=spec.sampling.seed + number, on_result=lambda req, res: events.request_done(),
                 stop=stop, slos_ms=spec.goodput_slos_ms)
    except BaseException:
        writer.close(complete=False)
        raise
    writer.close(complete=True)
    df, meta = read_run(run_dir)
    common = {"run_id": run_id, "run_dir": str(run_dir.relative_to(study_dir)), "host": metadata.hostname,
              "level_batch": {"trial": number, "configurations": len(plan)}}
    base_summary = _with_goodput(stored_summary(df, base.config_id), df, meta, base.config_id, spec)
    out = {config_key(base): Measurement({"config_id": base.config_id, **common, "summary": base_summary,
                                          **headline(base_summary)})}
    for config in specs:
        summary = _with_goodput(stored_summary(df, config.config_id), df, meta, config.config_id, spec)
        attrs = {"config_id": config.config_id, **common, "summary": summary, **headline(summary),
                 "baseline_summary": base_summary}
        attrs.update(watches[config.config_id].verdict(df, summary.get("mean_acceptance_length_tok")))
        out[config_key(config)] = Measurement(attrs)
    return out


def _with_goodput(summary: dict[str, Any], df: Any, meta: dict[str, Any], config_id: str,
                  spec: SweepSpec) -> dict[str, Any]:
    """With [objective] goodput: `goodput_rps`, the configuration's requests meeting every SLO
    per second of its own measuring time (the runner's wall_s: in a paired trial the blocks it
    ran, not its baseline's), as `specbench run` reports it."""
    if not spec.goodput_slos_ms:
        return summary
    from specbench.analysis.serving import goodput, wall_times

    wall = wall_times((meta.get("config") or {}).get("configuration_stats"))
    gp = goodput(df[df["config_id"] == config_id], wall)
    value = float(gp["goodput_rps"].iloc[0]) if len(gp) else float("nan")
    return {**summary, "goodput_rps": jsonable(value)}


class PairedWatch:
    """The sequential look at a paired trial (`runner.run_plan`'s `stop` hook): after every
    AB BA pair of blocks (`analysis.sequential.look_points`), the paired TPOT speedup of the
    prompts both configurations have measured, under `SequentialRule`; a decided look stops
    the trial when `[budget] sequential` is on. `verdict` is what the trial stores."""

    def __init__(self, spec: SweepSpec, config: Any, n_prompts: int, blocks: int | None = None):
        """`blocks`: the plan's block count where it sets one (`runner.run_plan`'s `blocks`),
        else blocks are `runner.block_size` long."""
        from specbench.analysis.sequential import Monitor, SequentialRule, look_points
        from specbench.runner import block_size

        self.config, self.sequential = config, spec.budget.sequential
        self.base_id = Configuration(BASELINE, config.concurrency).config_id
        self.rule = SequentialRule(planned=n_prompts, min_speedup=spec.profile.min_speedup)
        self.monitor = Monitor(self.rule)
        self.block = max(1, -(-n_prompts // blocks)) if blocks else block_size(config.concurrency)
        self.points = set(look_points(n_prompts, self.block, self.rule.min_prompts))
        self.stopped: str | None = None

    def ratios(self, frame: Any) -> tuple[Any, Any]:
        """(per-prompt log TPOT ratios, the block of each or None): the prompts both
        configurations have measured, clustered by block above concurrency 1."""
        from specbench.analysis import per_prompt
        from specbench.analysis.paired import block_groups
        from specbench.analysis.sequential import log_ratios

        by = {cid: g for cid, g in frame.groupby("config_id", sort=False)}
        if self.base_id not in by or self.config.config_id not in by:
            return [], None
        base, spec = per_prompt(by[self.base_id], "tpot_s"), per_prompt(by[self.config.config_id], "tpot_s")
        shared = base.index.intersection(spec.index)  # log_ratios' order
        return log_ratios(base, spec), block_groups(by[self.config.config_id], shared)

    def due(self, done: int) -> bool:
        """A look is taken after `done` prompts (sequential stopping on, a planned look, not
        the last prompt: the verdict takes that one)."""
        return self.sequential and done in self.points and done < self.rule.planned

    def __call__(self, rows: Any, done: int) -> str | None:
        """`rows`: the rows so far (a list of dicts or a frame)."""
        import pandas as pd

        if not self.due(done):
            return None
        d, blocks = self.ratios(rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows))
        look = self.monitor.update(d, clusters=blocks)
        if look.stopped:
            self.stopped = (f"{'pays' if look.outcome == 'win' else 'loses'}: paired TPOT speedup "
                            f"{look.point:.3f}x [{look.lo:.3f}, {look.hi:.3f}] after {look.n} of "
                            f"{self.rule.planned} prompts")
        return self.stopped

    def verdict(self, df: Any, mal: float | None) -> dict[str, Any]:
        """The trial's paired speedup (the last look, taken at the end when no look stopped
        it) with the physics checks against its mean acceptance length `mal`, from the
        trial's own Parquet."""
        from specbench.analysis import physics

        d, blocks = self.ratios(df)
        final = self.monitor.looks[-1] if self.stopped else None
        if final is None:  # measured to the end: the last look spends what is left
            final = self.monitor.update(d, final=True, clusters=blocks)
        unit = ", blocks as the unit (cluster-robust)" if blocks is not None else ""
        flags = physics.speedup_bound(final.point, mal)
        steps = physics.step_ratio(df[df["config_id"] == self.base_id],
                                   df[df["config_id"] == self.config.config_id])
        paired = {**{k: jsonable(v) for k, v in final.as_dict().items()},
                  "planned": self.rule.planned, "looks": len(self.monitor.looks),
                  "stopped": self.stopped, "sequential": self.sequential,
                  "verify_step_over_decode_step": jsonable(steps),
                  "blocks": len(set(blocks.tolist())) if blocks is not None else None,  # None: prompts
                  "rule": (f"group-sequential {1 - self.rule.alpha:.0%} t-interval of the per-prompt log "
                           f"TPOT ratio{unit}, {self.rule.spending} error spending over "
                           f"{self.rule.planned} prompts, looks after every AB BA pair of "
                           f"{self.block}-prompt blocks")}
        out: dict[str, Any] = {"paired": paired, "paired_speedup_x": round(final.point, 4)
                               if final.point == final.point else None}
        if flags:
            out["inconsistent"] = flags
        return out

