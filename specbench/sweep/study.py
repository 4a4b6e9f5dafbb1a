"""The study and its sampler: a sweep's Optuna study, created once and resumed by every worker.

`open_study` creates the study in its storage (`specbench.sweep.storage`) or loads it when it
exists with the same setup (search space, objectives, models, workload, sampling), and
refuses a different one; `make_sampler` gives every worker the sampler of the spec. One
trial = one run: the objective (`specbench.sweep.objective`) suggests `method`,
`concurrency`, `num_speculative_tokens` and `draft` (parameter names equal the variable
names and the records' column names); what a trial's attrs say is
`specbench.sweep.trials`; the loop that runs trials is `specbench.sweep.loop`.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from specbench.errors import ConfigError
from specbench.sweep.spec import SweepSpec

# re-exported: specbench.report.study imports these from here
from specbench.sweep.storage import normalize_storage_url  # noqa: F401
from specbench.sweep.urls import display_url

SETUP_ATTR = "specbench_setup"
CREATION_WAIT_S = 10.0  # how long a worker waits for the setup of a study another worker just created
# Optuna metric names (shown by optuna-dashboard), units in the names as in the records
METRIC_NAMES = {"tpot_p50": "tpot_p50_s", "tpot_p95": "tpot_p95_s",
                "output_tps_per_user": "output_tok_per_s_per_user", "output_tps": "output_tok_per_s",
                "speedup": "speedup_tpot_p50_x", "goodput": "goodput_req_per_s"}

optuna.logging.set_verbosity(optuna.logging.ERROR)  # the CLI reports trials itself


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k in ("space", "sampling"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def open_study(spec: SweepSpec, storage: optuna.storages.BaseStorage,
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create the study, or load it when it exists with the same setup (search space,
    objectives, models, workload, sampling). A different setup is refused."""
    wanted = json.loads(json.dumps(spec.setup()))
    url = display_url(spec.storage_url)

    def check(existing: dict[str, Any]) -> None:
        if existing == wanted:
            return
        a, b = _flat(existing), _flat(wanted)
        diffs = [f"{k}: {a.get(k)!r} in the study, {b.get(k)!r} here"
                 for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        what = "search space" if all(d.startswith("space.") for d in diffs) else "setup"
        raise ConfigError(
            f"study {spec.study.name!r} in {url} was created with a different {what} "
            f"({'; '.join(diffs)}); resume it with the spec it was created with, or start a new "
            "study with --study-name NEW_NAME")

    try:
        study_id = storage.get_study_id_from_name(spec.study.name)
    except KeyError:
        study_id = None
    if study_id is not None:
        existing = storage.get_study_user_attrs(study_id).get(SETUP_ATTR)
        # Another worker may have created the study a moment ago and not yet stored its setup
        # (create_study and set_user_attr are two writes): give it a few seconds.
        deadline = time.monotonic() + CREATION_WAIT_S
        while existing is None and time.monotonic() < deadline:
            time.sleep(0.2)
            existing = storage.get_study_user_attrs(study_id).get(SETUP_ATTR)
        if existing is None:
            raise ConfigError(f"study {spec.study.name!r} in {url} was not created by specbench "
                              "sweep; choose another --study-name")
        check(existing)
        directions = [d.name.lower() for d in storage.get_study_directions(study_id)]
        if directions != spec.directions:
            raise ConfigError(f"study {spec.study.name!r} in {url} optimizes {directions}, not "
                              f"{spec.directions}; start a new study with --study-name NEW_NAME")
    study = optuna.create_study(study_name=spec.study.name, storage=storage, sampler=sampler,
                                directions=spec.directions, load_if_exists=True)
    existing = study.user_attrs.get(SETUP_ATTR)
    if existing is None:
        study.set_user_attr(SETUP_ATTR, wanted)
        with warnings.catch_warnings():  # experimental since Optuna 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAMES[o] for o in spec.objectives])
    else:  # another worker created it a moment ago
        check(existing)
    return study


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler, also after enqueued trials (baselines, retries): they carry no
    grid id, and GridSampler.after_trial looks one up when one grid point is left."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        if "grid_id" in trial.system_attrs:
            super().after_trial(study, trial, state, values)
        elif self.is_exhausted(study):
            study.stop()


def make_sampler(spec: SweepSpec, n_existing: int = 0) -> optuna.samplers.BaseSampler:
    """grid: Optuna's GridSampler over the speculative points (same seed in every worker, so
    workers walk one shuffled grid). tpe/random: seeded by the spec's seed plus the trials
    already in the study, so a single-worker sweep is reproducible and a resumed one does
    not replay its first proposals."""
    if spec.study.sampler == "grid":
        return _GridSampler(spec.space.grid(), seed=spec.study.seed)
    seed = spec.study.seed + n_existing
    if spec.study.sampler in ("random", "model"):  # model: every trial is enqueued (sweep.guided)
        return optuna.samplers.RandomSampler(seed=seed)
    # Constraints reach TPE through Trial.set_constraint (Optuna 5 replaced constraints_func).
    return optuna.samplers.TPESampler(seed=seed)
