"""The model-guided sampler (`[study] sampler = "model"`): measure where the answer is in
doubt, skip what the fitted speedup model already rules out.

After the baselines, a sweep measures each drafter family's corners (the smallest and largest
k at the lowest and highest concurrency), then fits `specbench.speedup_model` on every
trial's records and its held-out error `u` (at least `MIN_UNCERTAINTY`; `UNKNOWN_UNCERTAINTY`
while no point can be held out). At each concurrency the bar is the larger of `--min-speedup`
and the best speedup measured there so far. Each point not yet measured is then either

- skipped, when even its optimistic prediction, predicted × (1 + Z u), stays below the bar:
  it could neither pay nor beat what is measured (the console and the study say so, with the
  prediction), or
- a candidate, scored by its distance to the bar in units of the uncertainty,
  |log(predicted / bar)| / log(1 + u); the closest is measured next. Points the model would
  extrapolate to (beyond the k or batch sizes it was fitted on) are measured first.

Every measurement refits the model, so a skip is revised when the bar or the error moves: a
point skipped earlier becomes a candidate again if the refit no longer rules it out. The
sweep ends when nothing is left but skipped points (`all_measured` counts them as settled).

Boundary: chooses points from the study's trials and their records; Optuna and measuring
stay in `specbench.sweep.loop` and `specbench.sweep.measure`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from specbench import speedup_model as sm
from specbench.errors import RecordsError
from specbench.runner import Configuration
from specbench.sweep.space import Space, config_key, configuration, draft_model
from specbench.sweep.spec import SweepSpec
from specbench.sweep.trials import is_measured, settled_keys, trial_key

MIN_UNCERTAINTY = 0.05  # the model is never trusted closer than this
UNKNOWN_UNCERTAINTY = 0.25  # before any point could be held out
Z = 2.0  # skip only when the prediction is this many uncertainties below the bar


@dataclass
class Choice:
    config: Configuration | None  # measure this next (None: nothing left but skipped configurations)
    why: str
    skipped: dict[str, str] = field(default_factory=dict)  # configuration key -> reason


def label(key: str) -> str:
    """A configuration key as the console shows it: `draft_model k3 (draft-name) c4`, and a
    tree's shape after it (`eagle3 k3 c1 t2n6`)."""
    method, k, draft, c, *tree = key.split("|")
    return " ".join([method, k + (f" ({Path(draft).name})" if draft != "-" else ""), c, *tree])


def family(c: Configuration) -> str:
    return sm.family_of(c.spec.method, draft_model(c))


def corners(space: Space) -> list[Configuration]:
    """Per drafter family: the smallest and largest k at the lowest and highest concurrency."""
    ks = sorted(space.num_speculative_tokens)
    cs = sorted(space.concurrency)
    out: list[Configuration] = []
    for c in space.configurations():
        if (not c.is_baseline and c.spec.num_speculative_tokens in (ks[0], ks[-1])
                and c.concurrency in (cs[0], cs[-1]) and c not in out):
            out.append(c)
    return out


def _speedup(t: FrozenTrial) -> float | None:
    v = t.user_attrs.get("paired_speedup_x")
    if v is None:
        v = (t.user_attrs.get("speedups") or {}).get("tpot_speedup")
    return float(v) if v is not None and math.isfinite(float(v)) else None


def records(trials: list[FrozenTrial], study_dir: Path) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every measured trial's rows, labelled `t<number>:<config_id>`, and each speculative
    label's baseline label: the baseline measured with it (paired), else the baseline trial's
    at its concurrency."""
    from specbench.records import read_run

    frames, base_of_c = [], {}
    pairs: dict[str, str] = {}
    seen: set[str] = set()  # a level batch's trials share one run: read once
    for t in trials:
        if t.state != TrialState.COMPLETE or not is_measured(t) or "run_dir" not in t.user_attrs:
            continue
        if t.user_attrs["run_dir"] in seen:
            continue
        seen.add(t.user_attrs["run_dir"])
        try:
            df, _ = read_run(study_dir / t.user_attrs["run_dir"])
        except (RecordsError, OSError):
            continue
        df = df.assign(label=f"t{t.user_attrs.get('batch_of', t.number)}:" + df["config_id"].astype(str))
        frames.append(df)
        bases = df.loc[df["is_baseline"], "label"].unique()
        specs = df.loc[~df["is_baseline"], "label"].unique()
        for s in specs:
            if len(bases):
                pairs[str(s)] = str(bases[0])
        if not len(specs) and len(bases):
            base_of_c[int(df["concurrency"].iloc[0])] = str(bases[0])
    if not frames:
        return pd.DataFrame(), {}
    frame = pd.concat(frames, ignore_index=True)
    for s in frame.loc[~frame["is_baseline"], "label"].unique():
        if str(s) not in pairs:
            c = int(frame.loc[frame["label"] == s, "concurrency"].iloc[0])
            if c in base_of_c:
                pairs[str(s)] = base_of_c[c]
    return frame, pairs


def choose(spec: SweepSpec, trials: list[FrozenTrial], study_dir: Path, retry_before: int = -1) -> Choice:
    """The next configuration to measure, and the configurations skipped for now (see the
    module docstring); `retry_before` is the study's `retry_mark`."""
    done = settled_keys(trials, spec.space, retry_before)
    busy = {trial_key(t, spec.space) for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)}
    todo = [c for c in spec.space.configurations()
            if not c.is_baseline and config_key(c) not in done and config_key(c) not in busy]
    if not todo:
        return Choice(None, "every point is measured or being measured")
    for x in corners(spec.space):
        if x in todo:
            return Choice(x, "a corner of k × concurrency (measured before the model is trusted)")
    frame, pairs = records(trials, study_dir)
    try:
        if frame.empty:
            raise RecordsError("no records yet")
        steps = sm.model_steps(frame, label="label")
        measured = sm.measured_points(frame, pairs, label="label", n_boot=200)
        ev = sm.evaluate(steps, measured, stall=sm.stalls(frame))
    except RecordsError as exc:
        return Choice(todo[0], f"in grid order: the model cannot be fitted ({exc})")
    u = ev.heldout_error if math.isfinite(ev.heldout_error) else UNKNOWN_UNCERTAINTY
    u = max(MIN_UNCERTAINTY, u)
    bar = {c: spec.profile.min_speedup for c in spec.space.concurrency}
    for t in trials:
        key = trial_key(t, spec.space)
        if t.state == TrialState.COMPLETE and key and not key.startswith("none|"):
            s = _speedup(t)
            c = spec.space.from_params(t.params).concurrency if t.params else None
            if s is not None and c in bar and not t.user_attrs.get("inconsistent"):
                bar[c] = max(bar[c], s)
    choice = rank(todo, ev.model, u, bar)
    if spec.level_batch:  # a level's run carries its baseline: with nothing left to run, none is needed
        for c in spec.space.concurrency:
            base = config_key(configuration(concurrency=c))
            rest = [config_key(x) for x in spec.space.configurations() if x.concurrency == c and not x.is_baseline]
            if base not in done and all(k in done or k in choice.skipped for k in rest):
                choice.skipped[base] = (f"every configuration at concurrency {c} is ruled out by the "
                                        "model: no baseline to measure them against")
    return choice


def rank(todo: list[Configuration], model: Any, u: float, bar: dict[int, float]) -> Choice:
    """The rule itself: skip each configuration whose optimistic prediction, predicted ×
    (1 + Z u), stays below the bar at its concurrency; of the rest, measure first one the
    model cannot speak for (no fit of its family, extrapolated), then the one closest to the
    bar in units of the uncertainty. `model`: `predict`, `extrapolated`, `families` as
    `speedup_model.SpeedupModel` has them."""
    skipped: dict[str, str] = {}
    scored: list[tuple[float, int, Configuration, str]] = []
    for i, x in enumerate(todo):
        f, k, c = family(x), x.spec.num_speculative_tokens, x.concurrency
        if f not in model.families:
            scored.append((-1.0, i, x, f"no model of {f} yet"))
            continue
        if model.extrapolated(f, k, c):
            scored.append((-0.5, i, x, "beyond the k or batch sizes the model was fitted on"))
            continue
        pred = model.predict(f, k, c)
        if not math.isfinite(pred) or pred <= 0:
            scored.append((-0.5, i, x, "the model predicts nothing there"))
            continue
        if pred * (1 + Z * u) < bar[c]:
            skipped[config_key(x)] = (f"predicted {pred:.2f}× (held-out error {u:.0%}), below the "
                                      f"{bar[c]:.2f}× needed at concurrency {c}: not measured")
            continue
        score = abs(math.log(pred / bar[c])) / math.log1p(u)
        scored.append((score, i, x, f"predicted {pred:.2f}× against {bar[c]:.2f}× needed "
                                    f"({score:.1f} uncertainties away)"))
    if not scored:
        return Choice(None, "every point left is predicted below the bar", skipped)
    _, _, x, why = min(scored, key=lambda s: (s[0], s[1]))
    return Choice(x, why, skipped)
