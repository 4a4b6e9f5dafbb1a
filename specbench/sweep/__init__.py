"""`specbench sweep`: an Optuna study over num_speculative_tokens x concurrency x method
(x draft model); each trial is one real run whose Parquet lands in the study directory, and
the study ends in a recommended serving profile.

- `spec`: the sweep specification (TOML file + flags), the search space, the objectives.
- `storage`: the study storage (RDB or journal file) with heartbeats and retried calls.
- `study`: study, sampler, the objective (factory), cross-worker dedupe, the loop.
- `workers`: the workers sharing a study, and which of them writes the profile.
- `measure`: one trial's run (RunWriter into `<study dir>/runs/<run_id>`).
- `server`: sweeps across servers (`[server]`): one launched server per trial, openai backend.
- `profile`: best configuration per concurrency, Pareto front, the serving profile (YAML).
- `serving`: vLLM / SGLang configurations, rollout and monitoring, ready to paste.

Boundary: a sweep reads records through `specbench.analysis`; it never touches the engine
directly, only `specbench.runner` and a `specbench.session.Session`. Nothing here prints.
"""

from specbench.sweep.profile import best_so_far, build_profile, levels, pareto_front, write_profile
from specbench.sweep.spec import OBJECTIVES, Point, Space, SweepSpec, build_spec, load_spec_file
from specbench.sweep.study import (
    Events,
    TrialFailed,
    make_sampler,
    open_storage,
    open_study,
    progress_counts,
    run_sweep,
)
from specbench.sweep.workers import Worker

__all__ = [
    "OBJECTIVES", "Events", "Point", "Space", "SweepSpec", "TrialFailed", "best_so_far",
    "build_profile", "build_spec", "levels", "load_spec_file", "make_sampler", "open_storage",
    "open_study", "pareto_front", "progress_counts", "run_sweep", "Worker", "write_profile",
]
