"""`specbench sweep`: an Optuna study over num_speculative_tokens x concurrency x method
(x draft model); each trial is one real run whose Parquet lands in the study directory, and
the study ends in a recommended serving profile.

The specification (no Optuna):
- `options`: every option declared once (section dataclasses: flag, TOML type, help,
  default, bounds); the TOML schema, the flag names and the CLI's Typer options come from it.
- `specfile`: reading a spec file (TOML) with file:line errors.
- `spec`: `build_spec` merges file and flags into a validated `SweepSpec`.
- `space`: the search space and its configurations (`runner.Configuration`: a
  SpeculativeConfig at one concurrency, what `specbench run` measures), keyed for dedupe.
- `urls`: how a storage is spelled.

The study:
- `storage`: the study storage (RDB or journal file) with heartbeats and retried calls.
- `study`: create or resume the study; the sampler.
- `trials`: what trials say (settled, measured, pending) and the cross-worker dedupe.
- `objective`: the objective (factory): suggest, dedupe, measure, store.
- `loop`: `run_sweep`, the loop over trials, waiting for other workers.
- `workers`: the workers sharing a study, and which of them writes the profile.
- `measure`: one trial's run (RunWriter into `<study dir>/runs/<run_id>`), and the session
  trials measure with.
- `summary`: what a trial keeps of its run (summary, headline figures, speedups).
- `server`: sweeps across servers (`[server]`): one launched server per trial, openai backend.
- `profile`: best configuration per concurrency, Pareto front, the serving profile (YAML).
- `serving`: vLLM / SGLang configurations, rollout and monitoring, ready to paste.

Layers: options <- specfile, spec <- storage <- study, trials <- objective <- loop; measure,
summary, server and serving sit below objective; profile reads trials. Boundary: a sweep
reads records through `specbench.analysis`; it never touches the engine directly, only
`specbench.runner` and a `specbench.session.Session`. Nothing here prints.
"""

import importlib
from typing import Any

# name -> the module that defines it; imported on first use (PEP 562), so the CLI can read
# the option declarations without importing Optuna
_EXPORTS = {
    "run_sweep": "loop", "Events": "objective", "OBJECTIVES": "options",
    "best_so_far": "profile", "build_profile": "profile", "levels": "profile",
    "pareto_front": "profile", "write_profile": "profile", "Space": "space", "configuration": "space",
    "config_key": "space",
    "SweepSpec": "spec", "build_spec": "spec", "load_spec_file": "specfile",
    "open_storage": "storage", "make_sampler": "study", "open_study": "study",
    "TrialFailed": "trials", "progress_counts": "trials", "Worker": "workers",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
