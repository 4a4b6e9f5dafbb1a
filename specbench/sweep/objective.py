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
from specbench.sweep.space import Point, Space
from specbench.sweep.spec import SweepSpec
from specbench.sweep.storage import first_line
from specbench.sweep.summary import SPEEDUP_ATTRS, speedups_vs
from specbench.sweep.trials import (
    CONSTRAINT,
    RetryLater,
    TrialFailed,
    baseline_of,
    claim,
    complete_baseline,
    reuse,
)
from specbench.sweep.workers import Worker


class Events:
    """What the objective reports while it works (the CLI draws progress from it)."""

    def trial_started(self, number: int, config_id: str, n_requests: int) -> None: ...
    def request_done(self) -> None: ...
    def note(self, message: str) -> None: ...
    def settled(self, study: Any) -> None: ...  # the study's settled points changed (model skips)


def suggest(trial: Trial, space: Space) -> Point:
    """The configuration `trial` measures: method, concurrency, then k, the draft and (tree
    methods, where the space searches trees) topk and the tree size."""
    method = trial.suggest_categorical("method", ("none", *space.method))
    concurrency = trial.suggest_categorical("concurrency", space.concurrency)
    num_speculative_tokens, draft = 0, None
    if method != "none":
        if space.k_range:
            low, high, step = space.k_range
            num_speculative_tokens = trial.suggest_int("num_speculative_tokens", low, high, step=step)
        else:
            num_speculative_tokens = trial.suggest_categorical("num_speculative_tokens",
                                                               space.num_speculative_tokens)
    if method == "draft_model":
        draft = trial.suggest_categorical("draft", space.draft)
    elif method == "eagle3":
        draft = space.head  # one head: not a search dimension
    topk, num_draft_tokens = 1, None
    if method in TREE_METHODS and space.searches_trees:  # conditional: chains never see the size
        topk = trial.suggest_categorical("topk", space.topk)
        if topk > 1 and space.num_draft_tokens:
            num_draft_tokens = trial.suggest_categorical("num_draft_tokens", space.num_draft_tokens)
    return Point.of(method, num_speculative_tokens, draft, concurrency, topk, num_draft_tokens)


def make_objective(spec: SweepSpec, session: Any, study_dir: Path, events: Events | None = None,
                   worker: Worker | None = None) -> Callable[[Trial], Any]:
    """The objective of a sweep over `spec.space`, measuring with `session`; each trial is
    tagged with the worker (and host) running it."""
    events = events or Events()
    baseline_outputs: dict[int, dict[str, list[int]]] = {}  # concurrency -> prompt id -> ids

    def objective(trial: Trial) -> Any:
        if worker is not None:  # who runs this trial; `host` (set by measure) says who measured
            trial.set_user_attr("worker", worker.id)
        point = suggest(trial, spec.space)
        concurrency = point.concurrency
        original = claim(trial.study, trial, point.key)
        if original is not None:
            return reuse(trial, original)

        base_trial = None
        try:
            if not point.is_baseline and not spec.paired:  # unpaired: the baseline trial
                base_trial = _baseline_trial(trial, spec, concurrency)
                if base_trial is not None and concurrency not in baseline_outputs:
                    ref = measuring.baseline_outputs_from(study_dir, base_trial)
                    if ref:
                        baseline_outputs[concurrency] = ref
            result = measuring.measure(session, spec, point, trial.number, study_dir,
                                       baseline_outputs.get(concurrency), events,
                                       worker.id if worker is not None else None)
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
        if point.is_baseline and result.outputs:
            baseline_outputs[concurrency] = result.outputs
        return _values(trial, spec, point, result.attrs, base_trial)

    return objective


def _baseline_trial(trial: Trial, spec: SweepSpec, concurrency: int) -> Any:
    """The baseline a speculative trial is compared with: waited for when the speedup is an
    objective, else the one measured so far (or None)."""
    if "speedup" in spec.objectives:
        base_trial = baseline_of(trial.study, concurrency)
    else:
        base_trial = complete_baseline(trial.study, concurrency)
    if base_trial is not None:
        trial.set_user_attr("baseline_trial", base_trial.number)
    return base_trial


def _values(trial: Trial, spec: SweepSpec, point: Point, attrs: dict[str, Any], base_trial: Any) -> Any:
    """Store the speedups and the memory constraint on `trial`; return its objective values.
    A paired trial's speedups are against the baseline samples measured with it; the
    `speedup` objective is then its paired speedup (`analysis.sequential`)."""
    summary = attrs["summary"]
    base_summary = attrs.get("baseline_summary") or (base_trial.user_attrs["summary"] if base_trial else None)
    speedups = speedups_vs(base_summary, summary) if base_summary else {}
    if attrs.get("paired") is not None:
        speedups["paired_tpot_speedup"] = attrs["paired"].get("point")
    if speedups:
        trial.set_user_attr("speedups", speedups)
        for name, column in SPEEDUP_ATTRS.items():  # flat numbers: dashboard columns
            if speedups.get(column) is not None:
                trial.set_user_attr(name, round(speedups[column], 4))
    if spec.max_peak_memory_bytes is not None:
        peak = summary.get("peak_memory_bytes")
        over = (peak - spec.max_peak_memory_bytes) / 2**30 if peak is not None else 0.0
        trial.set_user_attr("constraint", over)
        trial.set_user_attr("feasible", over <= 0)
        trial.set_constraint(CONSTRAINT, over)  # samplers and best_trials honour it
    values = []
    for name in spec.objectives:
        column = OBJECTIVES[name].column
        if name == "speedup":
            v = 1.0 if point.is_baseline else speedups.get("paired_tpot_speedup", speedups.get(column))
        else:
            v = summary.get(column)
        if v is None or not math.isfinite(v):
            reason = (f"objective {name} is undefined for this run ({summary.get('errors')} of "
                      f"{summary.get('n')} requests failed)")
            trial.set_user_attr("fail_reason", reason)
            raise TrialFailed(reason)
        values.append(float(v))
    return values[0] if len(values) == 1 else values


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort after an OOM
        pass
