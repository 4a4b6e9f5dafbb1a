"""From a study's trials to answers: the best configuration per concurrency, the Pareto
front of a multi-objective sweep, and the recommended serving profile (YAML).

Every number comes from the trials' stored summaries, which are `analysis.summarize` of each
trial's own Parquet; every value in the profile carries the trial number and run id that
justify it.

One decision, which every output repeats (this YAML, the console, and the paste-ready files
of `specbench.sweep.serving`): per measured concurrency c (feasible trials only, and never a
trial that failed a physics check, `analysis.physics`), `levels` judges one drafter family
(method + draft: a server runs one) and picks its best configuration. Whether speculation pays
there is the one rule the console, the report and this profile share (`analysis.outcome`):
the TPOT speedup interval lies wholly above `min_speedup`. A paired trial's interval is its
own (baseline samples measured interleaved with it, `analysis.sequential`); a trial measured
alone (server sweeps) is compared with the baseline trial's Parquet (prompts paired, not
time), and where those files are not on this host the point gain decides (`gain >
min_speedup`); the band says which. Speculation is recommended from the lowest concurrency up
to the last band before the first that does not pay (`profile: speculative`), and nowhere
above it; `disable_by_batch_size` is that band's concurrency (vLLM: no drafting while more
requests than that are in flight); the crossover lies between that level and the next one
measured.

`write_profile` also writes the paste-ready serving configurations next to the YAML
(`specbench.sweep.serving`).

Boundary: reads a study's trials and their run files; measures nothing, prints nothing.
Longer than 400 lines because the decision per band and the evidence behind it are one object
that profile.yaml and every serving file are written from (one verdict everywhere).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from specbench.runner import Configuration
from specbench.sweep.space import Space, config_key, draft_model
from specbench.sweep.spec import SweepSpec
from specbench.sweep.trials import SKIPPED_ATTR, is_measured, params_key
from specbench.sweep.summary import speedups_vs
from specbench.sweep.urls import display_url
from specbench.errors import RecordsError
from specbench import analysis
from specbench.sweep.options import OBJECTIVES
from specbench.atomic import atomic_write

PROFILE_VERSION = 1
_EVIDENCE = ("tpot_p50_s", "tpot_p95_s", "ttft_p50_s", "e2e_p50_s", "output_tps",
             "output_tps_per_user", "acceptance_rate_tok", "mean_acceptance_length_tok",
             "peak_memory_bytes", "n", "errors")


def _r(v: Any) -> Any:
    """Six significant digits for floats (readable YAML, still traceable to the Parquet)."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def _feasible(t: FrozenTrial) -> bool:
    return bool(t.user_attrs.get("feasible", True))


def candidates(study: optuna.Study) -> list[FrozenTrial]:
    """Complete trials that ran their own measurement, one per configuration."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE and is_measured(t)]


def nothing_measured(study: optuna.Study) -> str | None:
    """Why no profile can be built (no configuration measured, and the first failure), or None."""
    if candidates(study):
        return None
    failed = [t for t in study.get_trials(deepcopy=False) if "fail_reason" in t.user_attrs]
    first = f" (first: trial {failed[0].number}: {failed[0].user_attrs['fail_reason']})" if failed else ""
    return (f"no configuration was measured: {len(failed)} trial(s) failed{first}; no profile written. "
            "Fix the cause, then rerun with --retry-failed")


def config_of(space: Space, t: FrozenTrial) -> Configuration:
    """The configuration a trial measured, from its params (eagle3: with the space's head)."""
    return space.from_params(t.params)


def _better(spec: SweepSpec, a: float, b: float) -> bool:
    return a > b if spec.directions[0] == "maximize" else a < b


def _gain(spec: SweepSpec, spec_value: float, base_value: float) -> float | None:
    if spec.objectives[0] == "speedup":
        return spec_value
    if not base_value or not spec_value:
        return None
    return spec_value / base_value if spec.directions[0] == "maximize" else base_value / spec_value


@dataclass
class Level:
    """What was measured at one concurrency, and the verdict there."""

    concurrency: int
    baseline: FrozenTrial | None
    best: FrozenTrial | None  # best feasible, consistent speculative trial of the chosen drafter
    gain: float | None  # of `best` over `baseline` (> 1 = speculation better)
    pays: bool
    # paired TPOT speedup of `best` over its baseline: (point, lo, hi); None without samples
    interval: tuple[float, float, float] | None = None
    paired: bool = False  # the interval comes from baseline samples measured with `best`
    flagged: list[FrozenTrial] = field(default_factory=list)  # failed a physics check
    # where `best` is a draft tree: the family's best chain here, and whether it pays (what
    # a server without trees, vLLM, can run instead)
    chain: FrozenTrial | None = None
    chain_pays: bool = False


def _samples(spec: SweepSpec, t: FrozenTrial) -> Any:
    from specbench.records import read_run

    run_dir = t.user_attrs.get("run_dir")
    if not run_dir:
        return None
    try:
        return read_run(Path(spec.study.out) / run_dir)[0]
    except RecordsError:
        return None


def tpot_interval(spec: SweepSpec, best: FrozenTrial, base: FrozenTrial) -> tuple[float, float, float] | None:
    """The paired bootstrap TPOT speedup of `best` over `base` from their run files (trials
    measured apart: server sweeps)."""

    b, s = _samples(spec, base), _samples(spec, best)
    if b is None or s is None:
        return None
    try:
        return analysis.paired_bootstrap_speedup(b, s, metric="tpot_s", stat="median")
    except RecordsError:
        return None


def _paired(t: FrozenTrial) -> tuple[float, float, float] | None:
    p = t.user_attrs.get("paired")
    if not p or p.get("point") is None:
        return None
    nan = float("nan")
    return (float(p["point"]), nan if p.get("lo") is None else float(p["lo"]),
            nan if p.get("hi") is None else float(p["hi"]))


def flagged(t: FrozenTrial) -> list[str]:
    """The physics checks a trial failed (`specbench.analysis.physics`)."""
    return list(t.user_attrs.get("inconsistent") or [])


def _verdict(spec: SweepSpec, t: FrozenTrial, base: FrozenTrial | None) -> tuple[bool, Any, bool]:
    """(pays, interval, paired) of one speculative trial: its own paired interval when it
    measured its baseline with it, else the bootstrap interval against the baseline trial."""
    interval, paired = _paired(t), True
    if interval is None:
        interval, paired = (tpot_interval(spec, t, base) if base is not None else None), False
    if interval is None:  # no samples on this host to pair: the point gain decides, as said
        gain = _gain(spec, t.values[0], _base_value(spec, t, base))
        return gain is not None and gain > spec.profile.min_speedup, None, False
    return analysis.outcome(*interval, min_speedup=spec.profile.min_speedup) == "win", interval, paired


def _base_value(spec: SweepSpec, t: FrozenTrial, base: FrozenTrial | None) -> float | None:
    """The primary objective of the baseline `t` is compared with: its own paired baseline
    samples when it measured them, else the baseline trial's value."""
    paired = t.user_attrs.get("baseline_summary")
    if paired is not None and spec.objectives[0] != "speedup":
        return paired.get(OBJECTIVES[spec.objectives[0]].column)
    return base.values[0] if base is not None else None


def _family(c: Configuration) -> tuple[str, str | None]:
    return c.spec.method, draft_model(c)


def levels(spec: SweepSpec, trials: list[FrozenTrial]) -> list[Level]:
    """One `Level` per measured concurrency. A server runs one drafter, so every level is
    judged with the drafter family (method + draft) of the best paying configuration at the
    lowest concurrency where any pays; at each level its best configuration is the best
    paying one of that family (by the primary objective), else its best one. Trials that
    failed a physics check never count."""
    conf = {t.number: config_of(spec.space, t) for t in trials}  # each trial's params read once
    per: dict[int, tuple[FrozenTrial | None, list[FrozenTrial], list[FrozenTrial]]] = {}
    for c in spec.space.concurrency:
        here = [t for t in trials if conf[t.number].concurrency == c and _feasible(t)]
        base = next((t for t in here if conf[t.number].is_baseline), None)
        spec_trials = [t for t in here if not conf[t.number].is_baseline]
        per[c] = (base, [t for t in spec_trials if not flagged(t)], [t for t in spec_trials if flagged(t)])
    verdicts = {t.number: _verdict(spec, t, per[conf[t.number].concurrency][0])
                for base, ok, _ in per.values() for t in ok}

    def best_of(ts: list[FrozenTrial]) -> FrozenTrial | None:
        best = None
        for t in ts:
            if best is None or _better(spec, t.values[0], best.values[0]):
                best = t
        return best

    family = None
    for c in spec.space.concurrency:
        paying = best_of([t for t in per[c][1] if verdicts[t.number][0]])
        if paying is not None:
            family = _family(conf[paying.number])
            break
    out = []
    for c in spec.space.concurrency:
        base, ok, bad = per[c]
        mine = [t for t in ok if family is None or _family(conf[t.number]) == family]
        best = best_of([t for t in mine if verdicts[t.number][0]]) or best_of(mine)
        gain = _gain(spec, best.values[0], _base_value(spec, best, base)) if best else None
        pays, interval, paired = verdicts[best.number] if best else (False, None, False)
        chain, chain_pays = None, False
        if best is not None and conf[best.number].spec.is_tree:
            chains = [t for t in mine if not conf[t.number].spec.is_tree]
            chain = best_of([t for t in chains if verdicts[t.number][0]]) or best_of(chains)
            chain_pays = bool(chain is not None and verdicts[chain.number][0])
        out.append(Level(c, base, best, gain, pays, interval, paired, bad, chain, chain_pays))
    return [lv for lv in out if lv.baseline or lv.best or lv.flagged]


def pareto_front(spec: SweepSpec, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Feasible trials no other feasible trial beats on every objective."""
    signs = [1.0 if d == "maximize" else -1.0 for d in spec.directions]
    feasible = [t for t in trials if _feasible(t)]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        av = [s * v for s, v in zip(signs, a.values)]
        bv = [s * v for s, v in zip(signs, b.values)]
        return all(x >= y for x, y in zip(av, bv)) and any(x > y for x, y in zip(av, bv))

    front = [t for t in feasible if not any(dominates(o, t) for o in feasible if o is not t)]
    return sorted(front, key=lambda t: t.number)


def best_so_far(spec: SweepSpec, study: optuna.Study) -> str:
    """One line for the progress display."""
    trials = candidates(study)
    if not trials:
        return "no measured trial yet"
    if len(spec.objectives) > 1:
        return f"Pareto front: {len(pareto_front(spec, trials))} configuration(s)"
    feasible = [t for t in trials if _feasible(t)]
    if not feasible:
        return "no feasible trial yet"
    best = feasible[0]
    for t in feasible[1:]:
        if _better(spec, t.values[0], best.values[0]):
            best = t
    return f"best {spec.objectives[0]} {best.values[0]:.4g}: {_describe(config_of(spec.space, best))}"


def _describe(c: Configuration) -> str:
    if c.is_baseline:
        return f"baseline c{c.concurrency}"
    sc, d = c.spec, draft_model(c)
    draft = f" ({Path(d).name})" if d else ""
    tree = f" topk={sc.topk} n={sc.verify_width}" if sc.is_tree else ""
    return f"{sc.method} k={sc.num_speculative_tokens}{tree}{draft} c{c.concurrency}"


def evidence(t: FrozenTrial, space: Space, baseline: FrozenTrial | None = None,
             objectives: tuple[str, ...] = ()) -> dict[str, Any]:
    """The measured numbers of one trial, with what links them to samples."""
    s = t.user_attrs["summary"]
    out: dict[str, Any] = {"trial": t.number, "run_id": t.user_attrs["run_id"],
                           "run_dir": t.user_attrs.get("run_dir"), "host": t.user_attrs.get("host")}
    c = config_of(space, t)
    out["config"] = {"method": c.spec.method, "num_speculative_tokens": c.spec.num_speculative_tokens,
                     "draft": draft_model(c), "concurrency": c.concurrency}
    if c.spec.is_tree:  # SGLang's --speculative-eagle-topk and --speculative-num-draft-tokens
        out["config"].update(topk=c.spec.topk, num_draft_tokens=c.spec.verify_width)
    base_summary = t.user_attrs.get("baseline_summary") or (baseline.user_attrs["summary"] if baseline else None)
    if base_summary is not None and not c.is_baseline:
        sp = speedups_vs(base_summary, s)
        out["speedup_tpot_p50"] = _r(sp.get("tpot_p50_speedup"))
        out["speedup_output_tps"] = _r(sp.get("output_tps_speedup"))
        out["speedup_output_tps_per_user"] = _r(sp.get("output_tps_per_user_speedup"))
    if t.user_attrs.get("baseline_summary") is not None and not c.is_baseline:
        bs = t.user_attrs["baseline_summary"]
        out["paired_baseline"] = {k: _r(bs.get(k)) for k in ("tpot_p50_s", "output_tps", "n")}
    if t.user_attrs.get("paired"):
        pr = t.user_attrs["paired"]
        out["paired"] = {"speedup_tpot": _r(pr.get("point")), "ci": [_r(pr.get("lo")), _r(pr.get("hi"))],
                         "prompts": pr.get("n"), "planned": pr.get("planned"), "blocks": pr.get("blocks"),
                         "stopped": pr.get("stopped"), "rule": pr.get("rule")}
    if flagged(t):
        out["inconsistent"] = flagged(t)
    for k in _EVIDENCE:
        v = s.get(k)
        out[k] = int(v) if k in ("peak_memory_bytes", "n", "errors") and v is not None else _r(v)
    if objectives:
        out["objective"] = {name: _r(v) for name, v in zip(objectives, t.values)}
    return out


def build_profile(spec: SweepSpec, study: optuna.Study) -> dict[str, Any]:
    """The recommended serving profile as a plain dict (see the module docstring)."""
    all_trials = study.get_trials(deepcopy=False)
    trials = candidates(study)

    def ev(t: FrozenTrial | None, baseline: FrozenTrial | None = None) -> dict[str, Any] | None:
        return evidence(t, spec.space, baseline, spec.objectives) if t is not None else None

    lv = levels(spec, trials)
    first_stop = next((i for i, x in enumerate(lv) if not x.pays), None)
    paying = lv[:first_stop] if first_stop is not None else lv
    threshold = paying[-1].concurrency if paying and first_stop is not None else None
    bands, prev = [], 0
    for i, x in enumerate(lv):
        bands.append(_band(spec, x, prev + 1, None if i == len(lv) - 1 else x.concurrency, i < len(paying), ev))
        prev = x.concurrency
    spec_cfg = _speculative_config(spec, paying[0].best, threshold) if paying else None
    failed = [{"trial": t.number, "config": params_key(spec.space, t.params),
               "reason": t.user_attrs.get("fail_reason", "interrupted")}
              for t in all_trials if t.state == TrialState.FAIL]
    profile: dict[str, Any] = {
        "specbench_profile": PROFILE_VERSION,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "study": _study_counts(spec, study, all_trials, trials, failed),
        "models": {"target": spec.target, "drafts": list(spec.space.draft)},
        "workload": {"source": spec.workload.source, "num_prompts": spec.workload.num_prompts,
                     "chat_template": spec.workload.chat_template},
        "sampling": {**spec.sampling.overrides, "seed": spec.sampling.seed,
                     "ignore_eos": spec.sampling.ignore_eos},
        "objective": {"primary": spec.objectives[0], "direction": spec.directions[0],
                      "all": list(spec.objectives), "min_speedup": spec.profile.min_speedup,
                      "max_peak_memory_bytes": spec.max_peak_memory_bytes},
        "recommendation": "speculative" if paying else "baseline",
        "speculative_config": spec_cfg,
        "disable_by_batch_size": {
            "value": threshold, "why": _threshold_why(lv, paying, first_stop),
            "last_paying": ev(paying[-1].best, paying[-1].baseline) if paying else None,
            "first_not_paying": ev(lv[first_stop].best, lv[first_stop].baseline) if first_stop is not None else None,
        },
        "bands": bands,
    }
    if spec_cfg:
        profile["verify_with"] = (
            f"specbench run --target {spec.target} --workload {spec.workload.source} "
            f"--speculative-config '{json.dumps(spec_cfg)}' --concurrency "
            f"{','.join(str(x.concurrency) for x in lv)}")
    if len(spec.objectives) > 1:
        base_at = {x.concurrency: x.baseline for x in lv}
        profile["pareto_front"] = [ev(t, base_at.get(config_of(spec.space, t).concurrency))
                                   for t in pareto_front(spec, trials)]
    profile["failed_trials"] = failed
    return profile


def _band(spec: SweepSpec, x: Any, lo: int, hi: int | None, speculative: bool,
          ev: Callable[..., dict[str, Any] | None]) -> dict[str, Any]:
    """One batch-size band [lo, hi] (hi None: and above), measured at `x.concurrency`: the
    profile it serves (`speculative`: below the first concurrency where speculation stops
    paying), its best configuration, its gain and why, and the trials it rests on."""
    band: dict[str, Any] = {
        "batch_size": {"min": lo, "max": hi},
        "measured_at_concurrency": x.concurrency,
        "profile": "speculative" if speculative else "baseline",
        "pays": bool(x.pays),  # this band alone (the paired-interval rule); `profile` stops at the first that does not
    }
    if speculative:
        c = config_of(spec.space, x.best)
        band.update(method=c.spec.method, num_speculative_tokens=c.spec.num_speculative_tokens,
                    draft=draft_model(c))
        if c.spec.is_tree:
            band.update(topk=c.spec.topk, num_draft_tokens=c.spec.verify_width)
    band["gain"] = _r(x.gain)
    if x.gain is None:
        band["why"] = ("no feasible baseline measured at this concurrency" if x.baseline is None
                       else "no feasible speculative configuration measured at this concurrency")
    else:
        band["why"] = _band_why(spec, x, band)
        if not speculative and x.pays:
            band["why"] += "; kept baseline: speculation already stopped paying at a lower concurrency"
    band["speculative"] = ev(x.best, x.baseline)
    band["baseline"] = ev(x.baseline)
    if x.chain is not None:  # the best is a tree: servers without trees (vLLM) run this chain
        band["chain"] = {**ev(x.chain, x.baseline), "pays": x.chain_pays}
    if x.flagged:
        band["flagged"] = [{"trial": t.number, "config": config_key(config_of(spec.space, t)), "why": flagged(t)}
                           for t in x.flagged]
    return band


def _band_why(spec: SweepSpec, x: Any, band: dict[str, Any]) -> str:
    """Whether speculation pays in a measured band, and by which rule: the paired interval
    wholly above the minimum speedup, or (no run files here) the point gain alone. Sets the
    band's `tpot_speedup_ci` where there is an interval."""
    verdict = "pays" if x.pays else "does not pay"
    if x.interval is not None:
        point, lo, hi = x.interval
        how = ("measured with its baseline interleaved" if x.paired
               else "against the baseline trial, measured at another time")
        rule = (f"paired TPOT speedup {point:.3f}x, 95% CI [{lo:.3f}, {hi:.3f}] ({how}), "
                f"{'wholly above' if x.pays else 'not wholly above'} {spec.profile.min_speedup:g}x")
        blocks = (x.best.user_attrs.get("paired") or {}).get("blocks") if x.paired else None
        if blocks:  # above concurrency 1 the interval counts blocks, not prompts
            rule += f", from {blocks} blocks"
            if not x.pays and not hi < 1.0:
                rule += " (undecided: more prompts, --num-prompts, buy more blocks)"
        band["tpot_speedup_ci"] = [_r(point), _r(lo), _r(hi)]
    else:
        rule = f"no run files here for an interval: point gain vs threshold {spec.profile.min_speedup:g}x"
    return (f"best speculative {_describe(config_of(spec.space, x.best))}: {spec.objectives[0]} gain "
            f"{x.gain:.3f}x over the baseline; speculation {verdict} ({rule})")


def _speculative_config(spec: SweepSpec, best: FrozenTrial, threshold: int | None) -> dict[str, Any]:
    """The serving `speculative_config` of the lowest paying band's best configuration, off
    above `threshold` (the last concurrency where speculation pays, when one stops paying)."""
    sc = config_of(spec.space, best).spec
    spec_cfg: dict[str, Any] = {"method": sc.method}
    if sc.draft:  # the draft model, or eagle3's head
        spec_cfg["model"] = sc.draft
    spec_cfg["num_speculative_tokens"] = sc.num_speculative_tokens
    if sc.is_tree:  # specbench's --speculative-config and SGLang take these; vLLM has no trees
        spec_cfg.update(topk=sc.topk, num_draft_tokens=sc.verify_width)
    if threshold is not None:
        spec_cfg["disable_by_batch_size"] = threshold
    return spec_cfg


def _threshold_why(lv: list, paying: list, first_stop: int | None) -> str:
    """Where speculation stops paying across the measured concurrencies, in one sentence."""
    if not lv:
        return "nothing measured yet"
    if not paying:
        return (f"speculation does not pay at the lowest concurrency measured ({lv[0].concurrency}): "
                "serve without it")
    if first_stop is None:
        return (f"speculation pays at every concurrency measured (up to {lv[-1].concurrency}); "
                "measure higher concurrency to find where it stops")
    threshold, nxt = paying[-1].concurrency, lv[first_stop]
    return (f"speculation pays up to concurrency {threshold} (gain {paying[-1].gain:.3f}x) and "
            f"not at {nxt.concurrency} (gain {_fmt(nxt.gain)}); the crossover lies in "
            f"({threshold}, {nxt.concurrency}]: measure concurrency values in between to narrow it")


def _study_counts(spec: SweepSpec, study: optuna.Study, all_trials: list, trials: list,
                  failed: list) -> dict[str, Any]:
    """Where the study is and what its trials came to."""
    return {
        "name": spec.study.name, "storage": display_url(spec.storage_url),
        "directory": str(spec.study.out), "trials": len(all_trials), "measured": len(trials),
        "reused": sum(1 for t in all_trials if "duplicate_of" in t.user_attrs),
        "failed": len(failed),
        "infeasible": sum(1 for t in trials if not _feasible(t)),
        # --sampler model: configurations not measured because the fitted model ruled
        # them out (configuration key -> its prediction), never recommended
        **({"skipped_by_model": dict(study.user_attrs.get(SKIPPED_ATTR) or {})}
           if spec.study.sampler == "model" else {}),
    }


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}x"


def write_profile(path: Path, profile: dict[str, Any]) -> dict[str, Path]:
    """YAML, keys in the order built, with a header saying what it is; then the paste-ready
    serving files next to it (`specbench.sweep.serving.write_serving`), whose paths it
    returns."""
    import yaml


    header = ("# Recommended serving profile written by `specbench sweep`.\n"
              "# Every number is measured: trial = Optuna trial number, run_id/run_dir = the run\n"
              "# (samples.parquet) under the study directory it was computed from. Times in s.\n")
    text = header + yaml.safe_dump(profile, sort_keys=False, allow_unicode=True, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))  # old profile or new, never half
    from specbench.sweep.serving import write_serving

    return write_serving(path, profile)
