"""A small fitted model of speculative decoding speed, from the per-step records: predict the
TPOT speedup at (k, concurrency) points that were not measured, and say how wrong it is on the
points that were.

The model, one per drafter family (method + draft model):

- Acceptance. alpha_i = P(draft token i accepted | tokens 0..i-1 accepted), estimated as
  accepted / at-risk counts pooled over drafting steps (a step that drafted d tokens and
  accepted a has positions 0..min(a, d-1) at risk and accepted 0..a-1, so steps that drafted
  fewer than k tokens near the end of an output are counted right). Per prompt category where
  a position has at least `MIN_AT_RISK` steps at risk, the pooled estimate otherwise; past
  the longest draft observed the last estimate is reused. Expected tokens per row-step
  (accepted + the correction/bonus token): E_k = 1 + sum_{j=1..k} prod_{i<j} alpha_i, mixed
  over categories by their share of drafting steps.
- Step cost, seconds per batched step of B rows with k draft tokens each:
      verify(B, k) = v0 + v1 B + v2 B k     (one target pass over B x (k+1) tokens; one fit
                                             for every family, it is the same target)
      draft_f(B, k) = d0 + d1 k + d2 B k    (k sequential draft passes over B rows)
      step = verify + draft_f + o            (o: per-step bookkeeping, run.json's overhead_s
                                             / steps when known, else 0)
  fitted by non-negative least squares on the per-row step records (verify on the verify
  times of every step, the baseline's plain decode steps being verify(B, 0); draft on each
  family's draft times), each row weighted 1 / B so a batched step counts once.
- Goodput (SmartSpec's sense): accepted plus bonus tokens per second of step time,
  goodput_f(B, k) = B E_k / step_f(B, k); the baseline's is B / step(B, 0).
- Speedup at (k, c), a per-request TPOT ratio (each row of a B-row step waits one step time
  and gets E_k tokens):
      (S_0 + w_c) / (S_k / E_k + w_c),   S_k = sum_B p_c(B) step_f(B, k)
  where p_c is the share of batched steps at batch size B measured at concurrency c (the
  baseline's steps there), or all at B = c where nothing was measured at c, and w_c the
  stall per output token: the time a baseline request at c spent outside its own decode
  steps (other requests' prefills), which speculation does not shorten (`stalls`; 0 where
  the baseline at c was not measured).

What it leaves out, on purpose: queueing, acceptance changing with batch size (greedy
acceptance does not), stalls at unmeasured concurrency. The measured error below
includes all of that, so it is an honest error, not a fit residual: `evaluate` gives, for each
measured speculative configuration, the prediction of the model fitted on everything and the
prediction of the model fitted without that configuration's records (held out), against the
measured TPOT speedup (median TPOT of the baseline / of the configuration, prompts paired,
with its bootstrap interval).

Boundary: records columns in, numbers out (numpy, pandas, scipy); no plots, no torch.

One module of about 450 lines on purpose: the model is one set of definitions read top to
bottom (acceptance, step cost, their combination, the measured error), each a screen or two,
and this docstring states them all; split across files, each part would need the others'.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from specbench import analysis, steps as steps_mod
from specbench.errors import RecordsError

MIN_AT_RISK = 30  # steps at risk at a position before a category gets its own alpha there
MIN_PROMPT_AT_RISK = 10  # the same for one prompt
MIN_STEPS = 20  # batched steps needed to fit the step cost at all
# Below this R² the verify-time fit explains too little of the step times for its predictions
# to be more than rough; a zero cost per row and draft token (the term that makes drafting
# cost more at higher batch sizes) means the data could not see that cost at all.
WEAK_FIT_R2 = 0.5
_EXCLUDED = re.compile(r"-k\d+dyn|-off\d+")  # dynamic k / disable_by_batch_size: k varies


Features = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class CostForm:
    """Which terms the step-cost model has (see the module docstring); tests swap in wrong
    forms to show the reported error catches them."""

    name: str
    verify: Features
    draft: Features
    verify_terms: tuple[str, ...]
    draft_terms: tuple[str, ...]


def _ones(b: np.ndarray) -> np.ndarray:
    return np.ones_like(b, dtype=float)


LINEAR = CostForm(
    "linear",
    verify=lambda b, k: np.stack([_ones(b), b, b * k], axis=1),
    draft=lambda b, k: np.stack([_ones(b), k, b * k], axis=1),
    verify_terms=("v0: per step", "v1: per row", "v2: per row and draft token"),
    draft_terms=("d0: per step", "d1: per draft token", "d2: per row and draft token"),
)


def family_of(method: str, draft: object) -> str:
    """`draft_model (name)` / `ngram`: what shares one acceptance and one draft cost."""
    if isinstance(draft, str) and draft:
        return f"{method} ({Path(draft).name})"
    return str(method)


# --------------------------------------------------------------------------------------
# Acceptance


@dataclass
class Acceptance:
    """alpha per position, pooled and per category (see the module docstring)."""

    alpha: np.ndarray  # pooled conditional acceptance per position
    at_risk: np.ndarray  # steps at risk per position (pooled)
    by_category: dict[str, np.ndarray] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)  # share of drafting steps
    # per prompt: its own alpha where it has MIN_PROMPT_AT_RISK steps at risk, else its category's
    by_prompt: dict[str, np.ndarray] = field(default_factory=dict)

    def expected_by_prompt(self, k: int) -> np.ndarray:
        """E_k of every prompt seen (empty when none was)."""
        return np.asarray([_expected(a, k) for a in self.by_prompt.values()], dtype=float)

    def alpha_at(self, i: int, category: str | None = None) -> float:
        a = self.by_category.get(category, self.alpha) if category is not None else self.alpha
        return _alpha(a, i)

    def expected_tokens(self, k: int, category: str | None = None) -> float:
        """E_k for one category, or mixed over categories by their weights."""
        if category is None and self.weights:
            return float(sum(w * self.expected_tokens(k, c) for c, w in self.weights.items()))
        return _expected(self.by_category.get(category, self.alpha) if category is not None else self.alpha, k)

    def survival(self, k: int) -> np.ndarray:
        """Unconditional per-position acceptance (vLLM's acceptance per position), mixed."""
        cats = self.weights or {None: 1.0}
        out = np.zeros(k)
        for c, w in cats.items():
            s = 1.0
            for i in range(k):
                s *= self.alpha_at(i, c)
                out[i] += w * s
        return out


def _alpha(a: np.ndarray, i: int) -> float:
    """alpha at position i; past the longest draft observed, the last estimate (0: none)."""
    return float(a[min(i, a.size - 1)]) if a.size else 0.0


def _expected(a: np.ndarray, k: int) -> float:
    """E_k = 1 + sum_{j=1..k} prod_{i<j} alpha_i."""
    total, survive = 1.0, 1.0
    for i in range(k):
        survive *= _alpha(a, i)
        total += survive
    return total


def _own_alpha(sub: pd.DataFrame, size: int, min_at_risk: int, fallback: np.ndarray) -> np.ndarray:
    """alpha per position from `sub`'s drafting steps where `min_at_risk` steps are at risk
    there, else `fallback`'s."""
    drafted = sub["drafted"].to_numpy(dtype=int)
    r, a = _counts(drafted, np.minimum(sub["accepted"].to_numpy(dtype=int), drafted), size)
    own = r >= min_at_risk
    return np.where(own, a / np.where(own, r, 1), fallback)


def _counts(drafted: np.ndarray, accepted: np.ndarray, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    pos = np.arange(kmax)[None, :]
    d, a = drafted[:, None], accepted[:, None]
    at_risk = ((pos < d) & (pos <= a)).sum(axis=0)
    acc = (pos < a).sum(axis=0)
    return at_risk.astype(float), acc.astype(float)


def fit_acceptance(steps: pd.DataFrame) -> Acceptance:
    """From exploded drafting steps (`specbench.steps.explode` with `category` kept)."""
    d = steps[steps["drafted"] > 0]
    if d.empty:
        return Acceptance(np.zeros(0), np.zeros(0))
    drafted = d["drafted"].to_numpy(dtype=int)
    accepted = np.minimum(d["accepted"].to_numpy(dtype=int), drafted)
    kmax = int(drafted.max())
    at_risk, acc = _counts(drafted, accepted, kmax)
    seen = at_risk > 0
    alpha = np.where(seen, acc / np.where(seen, at_risk, 1), 0.0)[: int(seen.sum()) or 1]
    at_risk = at_risk[: alpha.size]
    out = Acceptance(alpha, at_risk)
    cats = d["category"].astype(str)
    total = len(d)
    for cat, idx in cats.groupby(cats).groups.items():
        sub = d.loc[idx]
        out.by_category[str(cat)] = _own_alpha(sub, alpha.size, MIN_AT_RISK, alpha)
        out.weights[str(cat)] = len(sub) / total
    if "prompt_id" in d:
        for pid, idx in d.groupby(d["prompt_id"].astype(str)).groups.items():
            sub = d.loc[idx]
            fallback = out.by_category.get(str(sub["category"].iloc[0]), alpha)
            out.by_prompt[str(pid)] = _own_alpha(sub, alpha.size, MIN_PROMPT_AT_RISK, fallback)
    return out


# --------------------------------------------------------------------------------------
# Step cost


@dataclass
class StepCost:
    form: CostForm
    verify_coef: np.ndarray
    draft_coef: dict[str, np.ndarray]
    overhead_s: float
    r2: float  # of the verify-time fit, over all steps (weighted)
    n_steps: float  # batched steps in the fit (sum of the 1/B weights)
    max_batch: int  # largest batch size in the fit
    max_k: dict[str, int]  # largest k per family in the fit

    def verify(self, b: float, k: float) -> float:
        return float(self.form.verify(np.array([b], float), np.array([k], float))[0] @ self.verify_coef)

    @property
    def weak_r2(self) -> bool:
        """The verify-time fit's R² is below WEAK_FIT_R2 (a constant y has none: not weak)."""
        return bool(np.isfinite(self.r2) and self.r2 < WEAK_FIT_R2)

    def weak(self) -> list[str]:
        """Why the fit should not be trusted for more than rough predictions (empty: it may)."""
        why = []
        if self.weak_r2:
            why.append(f"the verify-time fit explains little of the step times (R² {self.r2:.3f} < {WEAK_FIT_R2})")
        k = max(self.max_k.values(), default=0)
        if self.form is LINEAR and k > 0:
            # the per-row-and-draft-token term's share of a verify step at the largest b and k fitted
            share = self.verify_coef[2] * self.max_batch * k / max(self.verify(self.max_batch, k), 1e-12)
            if share < 0.01:
                why.append(f"its cost per row and draft token (v2) came out zero ({100 * share:.2f}% of a verify "
                           f"step at batch size {self.max_batch}, k {k}): the steps measured could not tell what "
                           "verifying more tokens costs")
        return why

    def draft(self, family: str, b: float, k: float) -> float:
        if k <= 0:
            return 0.0
        coef = self.draft_coef.get(family)
        if coef is None:
            return float("nan")
        return float(self.form.draft(np.array([b], float), np.array([k], float))[0] @ coef)

    def step(self, family: str | None, b: float, k: float) -> float:
        d = self.draft(family, b, k) if family is not None and k > 0 else 0.0
        return self.verify(b, k) + d + self.overhead_s


def _nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """Weighted non-negative least squares; returns (coefficients, weighted R^2)."""
    coef, _ = nnls(x * np.sqrt(w)[:, None], y * np.sqrt(w))
    pred = x @ coef
    ybar = np.average(y, weights=w)
    ss_tot = float(np.sum(w * (y - ybar) ** 2))
    # a (numerically) constant y leaves nothing to explain: no R^2
    r2 = (1.0 - float(np.sum(w * (y - pred) ** 2)) / ss_tot
          if ss_tot > 1e-12 * float(np.sum(w * y**2)) else float("nan"))
    return coef, r2


def fit_cost(steps: pd.DataFrame, form: CostForm = LINEAR, overhead_s: float = 0.0) -> StepCost:
    """NNLS over every row-step that reports its batch size (see the module docstring): the
    verify cost on every step's verify time, each family's draft cost on its drafting
    steps' draft time. `steps` needs a `family` column."""
    d = steps[steps["batch_size"].notna() & (steps["batch_size"] > 0)
              & steps["verify_s"].notna() & steps["draft_s"].notna()]
    if d["batch_size"].size == 0 or float((1.0 / d["batch_size"]).sum()) < MIN_STEPS:
        raise RecordsError(f"the step-cost model needs at least {MIN_STEPS} steps with batch sizes "
                           "and draft/verify times (HTTP backends do not report them)")
    b = d["batch_size"].to_numpy(dtype=float)
    k = d["drafted"].to_numpy(dtype=float)
    w = 1.0 / b  # each batched step once, whatever its number of rows
    verify_coef, r2 = _nnls(form.verify(b, k), d["verify_s"].to_numpy(dtype=float), w)
    draft_coef: dict[str, np.ndarray] = {}
    max_k: dict[str, int] = {}
    drafting = (d["drafted"] > 0).to_numpy()
    for f in dict.fromkeys(d.loc[drafting, "family"]):
        m = drafting & (d["family"] == f).to_numpy()
        draft_coef[f], _ = _nnls(form.draft(b[m], k[m]), d["draft_s"].to_numpy(dtype=float)[m], w[m])
        max_k[f] = int(k[m].max())
    return StepCost(form, verify_coef, draft_coef, float(overhead_s), r2, float(w.sum()),
                    int(b.max()), max_k)


# --------------------------------------------------------------------------------------
# The model


@dataclass
class SpeedupModel:
    acceptance: dict[str, Acceptance]
    cost: StepCost
    batch_mix: dict[int, dict[int, float]]  # concurrency -> batch size -> share of steps
    stall: dict[int, float] = field(default_factory=dict)  # concurrency -> s per output token
    per_prompt: bool = True  # predict the median prompt's TPOT (what is measured), not the mean's

    @property
    def families(self) -> list[str]:
        return [f for f in self.acceptance if f in self.cost.draft_coef]

    def mix(self, concurrency: int) -> dict[int, float]:
        return self.batch_mix.get(int(concurrency)) or {int(concurrency): 1.0}

    def predict(self, family: str, k: int, concurrency: int) -> float:
        """Predicted TPOT speedup of `family` with k drafts at `concurrency` (> 1 = faster)."""
        mix = self.mix(concurrency)
        base = sum(p * self.cost.step(None, b, 0) for b, p in mix.items())
        spec = sum(p * self.cost.step(family, b, k) for b, p in mix.items())
        wait = self.stall.get(int(concurrency), 0.0)
        if spec <= 0:
            return float("nan")
        acc = self.acceptance[family]
        per_prompt = acc.expected_by_prompt(k) if self.per_prompt else np.zeros(0)
        if per_prompt.size:
            # what is measured is median TPOT over prompts, baseline / speculative: each
            # prompt's TPOT is spec / E_k(prompt) + wait, so the median prompt's E_k decides
            return float((base + wait) / np.median(spec / per_prompt + wait))
        return (base + wait) / (spec / acc.expected_tokens(k) + wait)

    def goodput(self, family: str | None, b: int, k: int) -> float:
        """Tokens per second of step time for a batch of b rows (family None: baseline)."""
        e = 1.0 if family is None or k == 0 else self.acceptance[family].expected_tokens(k)
        t = self.cost.step(family, b, k)
        return b * e / t if t > 0 else float("nan")

    def best_k(self, family: str, b: int, kmax: int) -> int:
        """The k in 0..kmax with the highest goodput at batch size b (0 = do not speculate)."""
        rates = [self.goodput(None, b, 0)] + [self.goodput(family, b, k) for k in range(1, kmax + 1)]
        return int(np.nanargmax(rates))

    def extrapolated(self, family: str, k: int, concurrency: int) -> bool:
        """Beyond the batch sizes or k the cost fit saw."""
        return max(self.mix(concurrency)) > self.cost.max_batch or k > self.cost.max_k.get(family, 0)


def model_steps(frame: pd.DataFrame, label: str = "config_id") -> pd.DataFrame:
    """Exploded steps of the configurations the model can use, with `family`, `k`, `label`,
    `concurrency`, `category` and `is_baseline` (dynamic-k and disable-by-batch-size
    configurations are left out: their k varies from step to step)."""
    ids = frame.get("run_config_id", frame["config_id"]).astype(str)
    usable = frame[~ids.str.contains(_EXCLUDED)]
    fam = [family_of(m, d) if not b else "baseline"
           for m, d, b in zip(usable["method"], usable["draft_model"], usable["is_baseline"])]
    usable = usable.assign(family=fam, _label=usable[label].astype(str))
    s = steps_mod.explode(usable, keep=["family", "_label", "concurrency", "category",
                                        "is_baseline", "num_speculative_tokens"])
    return s.rename(columns={"_label": "label"})


def batch_mix(steps: pd.DataFrame) -> dict[int, dict[int, float]]:
    """Per concurrency, the share of batched steps at each batch size (baseline steps)."""
    base = steps[steps["is_baseline"] & steps["batch_size"].notna()]
    out: dict[int, dict[int, float]] = {}
    for c, g in base.groupby("concurrency"):
        w = (1.0 / g["batch_size"]).groupby(g["batch_size"].astype(int)).sum()
        out[int(c)] = {int(b): float(v / w.sum()) for b, v in w.items()}
    return out


def stalls(frame: pd.DataFrame, overhead_s: float = 0.0) -> dict[int, float]:
    """Per concurrency, the time a baseline request waits outside its own decode steps per
    output token (other requests' prefills, scheduling): ((e2e - ttft) - its steps' draft +
    verify + overhead time) / (output tokens - 1), averaged over the baseline requests there
    and never below 0. Measured on the baseline only, so a held-out configuration does not
    inform its own prediction."""
    base = frame[frame["is_baseline"] & analysis.ok_mask(frame) & frame["tpot_s"].notna()]
    out: dict[int, float] = {}
    for c, g in base.groupby("concurrency"):
        waits = []
        for r in g.itertuples():
            d = steps_mod.as_array(r.step_draft_time_s)
            v = steps_mod.as_array(r.step_verify_time_s)
            if not len(v) or r.output_tokens < 2:
                continue
            busy = float(np.nansum(d) + np.nansum(v)) + overhead_s * len(v)
            waits.append(max(0.0, (r.e2e_s - r.ttft_s) - busy) / (r.output_tokens - 1))
        if waits:
            out[int(c)] = float(np.mean(waits))
    return out


def fit(steps: pd.DataFrame, *, form: CostForm = LINEAR, overhead_s: float = 0.0,
        stall: dict[int, float] | None = None, per_prompt: bool = True) -> SpeedupModel:
    """Fit on `model_steps` output (or any frame with the same columns); `stall` is
    `stalls(records)` (none: requests never wait outside their steps)."""
    acc = {f: fit_acceptance(g) for f, g in steps[~steps["is_baseline"]].groupby("family", sort=False)}
    return SpeedupModel({f: a for f, a in acc.items() if a.alpha.size},
                        fit_cost(steps, form, overhead_s), batch_mix(steps), dict(stall or {}), per_prompt)


# --------------------------------------------------------------------------------------
# Measured against predicted


MEASURED_COLUMNS = ["label", "baseline_label", "family", "k", "concurrency", "measured",
                    "measured_lo", "measured_hi", "paired_prompts"]


def measured_points(frame: pd.DataFrame, pairs: dict[str, str | None] | None = None,
                    label: str = "config_id", n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Measured TPOT speedup (with its paired-bootstrap interval) of each speculative
    configuration the model can use. `pairs` maps a label to its baseline's label; without it
    each configuration is paired with the baseline at the same concurrency and request rate."""
    ids = frame.get("run_config_id", frame["config_id"]).astype(str)
    frame = frame[~ids.str.contains(_EXCLUDED)]
    by_label = {str(k): g for k, g in frame.groupby(label, sort=False)}
    if pairs is None:
        summ = analysis.summarize(frame.assign(config_id=frame[label]))
        sp = analysis.speedups(summ)
        pairs = dict(zip(sp["config_id"].astype(str), sp["baseline_config_id"]))
    rows = []
    for lbl, g in by_label.items():
        first = g.iloc[0]
        if first["is_baseline"] or not pairs.get(lbl) or pairs[lbl] not in by_label:
            continue
        base = by_label[pairs[lbl]]
        try:
            point, lo, hi = analysis.paired_bootstrap_speedup(base, g, n_boot=n_boot, seed=seed)
        except RecordsError:
            continue
        shared = (set(base.loc[analysis.ok_mask(base) & base["tpot_s"].notna(), "prompt_id"])
                  & set(g.loc[analysis.ok_mask(g) & g["tpot_s"].notna(), "prompt_id"]))
        rows.append({"label": lbl, "baseline_label": pairs[lbl],
                     "family": family_of(first["method"], first["draft_model"]),
                     "k": int(first["num_speculative_tokens"]), "concurrency": int(first["concurrency"]),
                     "measured": point, "measured_lo": lo, "measured_hi": hi,
                     "paired_prompts": len(shared)})
    return pd.DataFrame(rows, columns=MEASURED_COLUMNS)


@dataclass
class Evaluation:
    model: SpeedupModel
    points: pd.DataFrame  # MEASURED_COLUMNS + predicted, heldout, error, heldout_error
    fit_error: float  # mean |predicted / measured - 1| over the points (in-sample)
    heldout_error: float  # the same with each point predicted by a model fitted without it
    notes: list[str]


def evaluate(steps: pd.DataFrame, measured: pd.DataFrame, *, form: CostForm = LINEAR,
             overhead_s: float = 0.0, stall: dict[int, float] | None = None,
             per_prompt: bool = True) -> Evaluation:
    """Fit on everything, then once more per measured point without that configuration's
    steps, and compare both predictions with the measurement (see the module docstring)."""
    model = fit(steps, form=form, overhead_s=overhead_s, stall=stall, per_prompt=per_prompt)
    notes: list[str] = []
    pts = measured.copy()
    pred, held = [], []
    for r in pts.itertuples():
        pred.append(model.predict(r.family, r.k, r.concurrency) if r.family in model.families
                    else float("nan"))
        rest = steps[steps["label"] != r.label]
        try:
            m = fit(rest, form=form, overhead_s=overhead_s, stall=stall, per_prompt=per_prompt)
            if r.family not in m.families:
                raise RecordsError(f"no other configuration of {r.family} to learn from")
            # the held-out point's concurrency keeps its baseline's batch mix (measured)
            held.append(m.predict(r.family, r.k, r.concurrency))
        except RecordsError as exc:
            held.append(float("nan"))
            notes.append(f"{r.label}: no held-out prediction ({exc})")
    pts["predicted"] = pred
    pts["heldout"] = held
    pts["error"] = pts["predicted"] / pts["measured"] - 1.0
    pts["heldout_error"] = pts["heldout"] / pts["measured"] - 1.0

    def mean_abs(col: str) -> float:
        v = pts[col].abs().dropna()
        return float(v.mean()) if len(v) else float("nan")

    return Evaluation(model, pts, mean_abs("error"), mean_abs("heldout_error"), notes)


def overhead_per_step(configuration_stats: list[dict]) -> float:
    """Pooled per-step bookkeeping time from run.json configuration stats (0 when absent)."""
    over = sum(float(s.get("overhead_s") or 0.0) for s in configuration_stats)
    n = sum(int(s.get("steps") or 0) for s in configuration_stats if s.get("overhead_s") is not None)
    return over / n if n else 0.0


def next_points(model: SpeedupModel, measured: pd.DataFrame, ks: list[int],
                concurrencies: list[int], n: int = 3) -> pd.DataFrame:
    """Unmeasured (family, k, concurrency) points whose predicted speedup is closest to 1x:
    where one more measurement is most likely to change the decision (a sweep can enqueue
    them)."""
    done = {(r.family, int(r.k), int(r.concurrency)) for r in measured.itertuples()}
    rows = []
    for f in model.families:
        for k in ks:
            for c in concurrencies:
                if (f, k, c) in done:
                    continue
                p = model.predict(f, k, c)
                rows.append({"family": f, "k": k, "concurrency": c, "predicted": p,
                             "extrapolated": model.extrapolated(f, k, c)})
    out = pd.DataFrame(rows, columns=["family", "k", "concurrency", "predicted", "extrapolated"])
    if out.empty:
        return out
    out["distance"] = (np.log(out["predicted"].clip(lower=1e-9))).abs()
    return out.sort_values(["extrapolated", "distance"]).head(n).drop(columns="distance").reset_index(drop=True)
