"""The objective of a sweep (built by `make_objective`, Optuna's factory style): suggest a
configuration, let the dedupe decide whether this trial measures it, measure it
(`specbench.sweep.measure`: one run directory per trial, `runner.run_configuration`), and
store in the trial's user attrs the run id, the run directory and the run's summary
(`analysis.summarize` of the Parquet it just wrote), so every value traces back to samples.

Failures: an exception while measuring (out of memory, a model that cannot load) fails the
trial with a one-line `fail_reason` user attr and the sweep goes on; that configuration is
not retried. An interrupted trial (Ctrl-C) fails without a reason and is enqueued again on
the next start, so a resumed sweep measures exactly what is missing. A storage that stops
answering is waited for (`--storage-retry`); it is never recorded as a failure of the
configuration.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import Trial

from specbench.config import TREE_METHODS
from specbench.errors import StorageError
from specbench.sweep import measure as measuring  # module: measuring.measure is looked up per trial
from specbench.sweep.options import OBJECTIVES
from specbench.runner import Configuration
from specbench.sweep.space import Space, config_key, configuration
from specbench.sweep.spec import SweepSpec
from specbench.sweep.storage import first_line
from specbench.sweep.summary import SPEEDUP_ATTRS, speedups_vs
from specbench.sweep.trials import (
    CONSTRAINT,
    RetryLater,
    TrialFailed,
    baseline_of,
    claim,
    claim_batch,
    complete_baseline,
    done_keys,
    reuse,
)
from specbench.sweep.workers import Worker


class Events:
    """What the objective reports while it works (the CLI draws progress from it)."""

    def trial_started(self, number: int, config_id: str, n_requests: int) -> None: ...
    def request_done(self) -> None: ...
    def note(self, message: str) -> None: ...
    def settled(self, study: Any) -> None: ...  # the study's settled configurations changed (model skips)


def _choose(space: Space, pick: Callable[[str, Any], Any]) -> Configuration:
    """The configuration a sequence of draws makes: method, concurrency, then k, the draft and (tree
    methods, where the space searches trees) topk and the tree size. `pick(name, distribution)`
    draws one parameter; `suggest` and `distributions` share this one order and its conditions."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    method = pick("method", CategoricalDistribution(("none", *space.method)))
    concurrency = pick("concurrency", CategoricalDistribution(space.concurrency))
    num_speculative_tokens, draft = 0, None
    if method != "none":
        if space.k_range:
            low, high, step = space.k_range
            num_speculative_tokens = pick("num_speculative_tokens", IntDistribution(low, high, step=step))
        else:
            num_speculative_tokens = pick("num_speculative_tokens",
                                          CategoricalDistribution(space.num_speculative_tokens))
    if method == "draft_model":
        draft = pick("draft", CategoricalDistribution(space.draft))
    elif method == "eagle3":
        draft = space.head  # one head: not a search dimension
    topk, num_draft_tokens = 1, None
    if method in TREE_METHODS and space.searches_trees:  # conditional: chains never see the size
        topk = pick("topk", CategoricalDistribution(space.topk))
        if topk > 1 and space.num_draft_tokens:
            num_draft_tokens = pick("num_draft_tokens", CategoricalDistribution(space.num_draft_tokens))
    return configuration(method, num_speculative_tokens, draft, concurrency, topk, num_draft_tokens)


def suggest(trial: Trial, space: Space) -> Configuration:
    """The configuration `trial` measures, drawn by its sampler."""
    from optuna.distributions import IntDistribution

    def pick(name: str, dist: Any) -> Any:
        if isinstance(dist, IntDistribution):
            return trial.suggest_int(name, dist.low, dist.high, step=dist.step)
        return trial.suggest_categorical(name, dist.choices)

    return _choose(space, pick)


def make_objective(spec: SweepSpec, session: Any, study_dir: Path, events: Events | None = None,
                   worker: Worker | None = None) -> Callable[[Trial], Any]:
    """The objective of a sweep over `spec.space`, measuring with `session`; each trial is
    tagged with the worker (and host) running it."""
    events = events or Events()
    baseline_outputs: dict[int, dict[str, list[int]]] = {}  # concurrency -> prompt id -> ids

    def objective(trial: Trial) -> Any:
        if worker is not None:  # who runs this trial; `host` (set by measure) says who measured
            trial.set_user_attr("worker", worker.id)
        config = suggest(trial, spec.space)
        concurrency = config.concurrency
        original = claim(trial.study, trial, config_key(config))
        if original is not None:
            return reuse(trial, original)
        mates = []
        if spec.level_batch:  # the rest of this level, measured with it, one baseline for all
            todo = level_mates(trial.study, spec, config)
            owned = set(claim_batch(trial.study, trial, [config_key(c) for c in todo]))
            mates = [c for c in todo if config_key(c) in owned]

        base_trial = None
        who = worker.id if worker is not None else None
        try:
            if spec.level_batch and (mates or not config.is_baseline):
                # a drafter that cannot load fails its own configuration, not the level's others
                mates = [c for c in mates if _loads(session, c, trial.study, spec, trial.number, who)]
                session.backend_for(config.spec.draft, config.spec.method)  # this trial's own: fails it here
                results = measuring.measure_level(session, spec, [config, *mates], trial.number, study_dir,
                                                  events, who)
                for c in mates:  # each configuration its own trial, as if measured alone
                    _add_trial(trial.study, spec, c, results[config_key(c)].attrs, trial.number, who)
                result = results[config_key(config)]
            else:
                if not config.is_baseline and not spec.paired:  # unpaired: the baseline trial
                    base_trial = _baseline_trial(trial, spec, concurrency)
                    if base_trial is not None and concurrency not in baseline_outputs:
                        ref = measuring.baseline_outputs_from(study_dir, base_trial)
                        if ref:
                            baseline_outputs[concurrency] = ref
                result = measuring.measure(session, spec, config, trial.number, study_dir,
                                           baseline_outputs.get(concurrency), events, who)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        except RetryLater as exc:
            trial.set_user_attr("fail_reason", str(exc))
            trial.set_user_attr("retry", True)
            raise
        except TrialFailed as exc:
            trial.set_user_attr("fail_reason", str(exc))
            raise
        except (StorageError, optuna.exceptions.UpdateFinishedTrialError):
            raise  # says nothing about the configuration: never recorded as its failure
        except Exception as exc:  # noqa: BLE001 - out of memory, model errors: record, go on
            reason = first_line(exc)
            if type(exc).__name__ == "OutOfMemoryError" and not reason.startswith("out of memory"):
                reason = f"out of memory: {reason}"
            trial.set_user_attr("fail_reason", reason)
            _release_memory()
            raise TrialFailed(reason) from None
        for k, v in result.attrs.items():
            trial.set_user_attr(k, v)
        if config.is_baseline and result.outputs:
            baseline_outputs[concurrency] = result.outputs
        return _values(trial, spec, config, result.attrs, base_trial)

    return objective


def _baseline_trial(trial: Trial, spec: SweepSpec, concurrency: int) -> Any:
    """The baseline a speculative trial is compared with: waited for when the speedup is an
    objective, else the one measured so far (or None)."""
    if "speedup" in spec.objectives:
        base_trial = baseline_of(trial.study, spec.space, concurrency)
    else:
        base_trial = complete_baseline(trial.study, spec.space, concurrency)
    if base_trial is not None:
        trial.set_user_attr("baseline_trial", base_trial.number)
    return base_trial


def outcome(spec: SweepSpec, config: Configuration, attrs: dict[str, Any],
            base_trial: Any = None) -> tuple[dict[str, Any], float | None, list[float] | str]:
    """What a measured trial stores besides `attrs` (its speedups, the memory constraint),
    its constraint value (None: unconstrained) and its objective values, or why they are
    undefined. A paired trial's speedups are against the baseline samples measured with it;
    the `speedup` objective is then its paired speedup (`analysis.sequential`)."""
    summary = attrs["summary"]
    base_summary = attrs.get("baseline_summary") or (base_trial.user_attrs["summary"] if base_trial else None)
    speedups = speedups_vs(base_summary, summary) if base_summary else {}
    if attrs.get("paired") is not None:
        speedups["paired_tpot_speedup"] = attrs["paired"].get("point")
    out: dict[str, Any] = {}
    if speedups:
        out["speedups"] = speedups
        for name, column in SPEEDUP_ATTRS.items():  # flat numbers: dashboard columns
            if speedups.get(column) is not None:
                out[name] = round(speedups[column], 4)
    over = None
    if spec.max_peak_memory_bytes is not None:
        peak = summary.get("peak_memory_bytes")
        over = (peak - spec.max_peak_memory_bytes) / 2**30 if peak is not None else 0.0
        out["constraint"], out["feasible"] = over, over <= 0
    values = []
    for name in spec.objectives:
        column = OBJECTIVES[name].column
        if name == "speedup":
            v = 1.0 if config.is_baseline else speedups.get("paired_tpot_speedup", speedups.get(column))
        else:
            v = summary.get(column)
        if v is None or not math.isfinite(v):
            return out, over, (f"objective {name} is undefined for this run ({summary.get('errors')} of "
                               f"{summary.get('n')} requests failed)")
        values.append(float(v))
    return out, over, values


def _values(trial: Trial, spec: SweepSpec, config: Configuration, attrs: dict[str, Any], base_trial: Any) -> Any:
    """Store `outcome` on `trial`; return its objective values."""
    extra, over, values = outcome(spec, config, attrs, base_trial)
    for k, v in extra.items():
        trial.set_user_attr(k, v)
    if over is not None:
        trial.set_constraint(CONSTRAINT, over)  # samplers and best_trials honour it
    if isinstance(values, str):
        trial.set_user_attr("fail_reason", values)
        raise TrialFailed(values)
    return values[0] if len(values) == 1 else values


def distributions(space: Space, config: Configuration) -> dict[str, Any]:
    """The Optuna distributions of `config`'s params, as `suggest` draws them (a trial added
    for a level batch's configuration must be one `suggest` could have made)."""
    params, out = space.params(config), {}

    def pick(name: str, dist: Any) -> Any:
        out[name] = dist
        return params[name]

    _choose(space, pick)
    return out


def level_mates(study: optuna.Study, spec: SweepSpec, config: Configuration) -> list[Configuration]:
    """The configurations of `config`'s concurrency level still to measure, the baseline
    among them: not settled, and (model-guided sampler) not ruled out by the model."""
    done = done_keys(study, spec)
    mine = config_key(config)
    return [c for c in spec.space.configurations()
            if c.concurrency == config.concurrency and config_key(c) != mine and config_key(c) not in done]


def _loads(session: Any, config: Configuration, study: optuna.Study, spec: SweepSpec, batch_of: int,
           worker: str | None) -> bool:
    """Load `config`'s drafter (the session keeps it) before its level is measured; one that
    cannot load is recorded as its own failed trial, with the reason, and left out."""
    try:
        session.backend_for(config.spec.draft, config.spec.method)
        return True
    except Exception as exc:  # noqa: BLE001 - a missing or broken draft: that configuration fails
        _release_memory()
        _record(study, spec, config, {"fail_reason": first_line(exc)}, batch_of, worker)
        return False


def _add_trial(study: optuna.Study, spec: SweepSpec, config: Configuration, attrs: dict[str, Any],
               batch_of: int, worker: str | None) -> None:
    """Record a level batch's configuration as its own finished trial (`batch_of`: the trial
    that measured it), so every trial of a study is one configuration."""
    extra, over, values = outcome(spec, config, attrs)
    user = {**attrs, **extra}
    if isinstance(values, str):
        user["fail_reason"] = values
    _record(study, spec, config, user, batch_of, worker, None if isinstance(values, str) else values,
            {f"constraints:{CONSTRAINT}": over} if over is not None else {})


def _record(study: optuna.Study, spec: SweepSpec, config: Configuration, user: dict[str, Any], batch_of: int,
            worker: str | None, values: list[float] | None = None, system: dict[str, Any] | None = None) -> None:
    """Add `config` to the study as a finished trial measured by trial `batch_of`: complete
    with `values`, failed without (its `fail_reason` in `user`)."""
    from optuna.trial import TrialState, create_trial

    user = {**user, "config_key": config_key(config), "batch_of": batch_of, **({"worker": worker} if worker else {})}
    study.add_trial(create_trial(
        state=TrialState.FAIL if values is None else TrialState.COMPLETE, params=spec.space.params(config),
        distributions=distributions(spec.space, config), values=values, user_attrs=user,
        system_attrs=system or {}))


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort after an OOM
        pass
