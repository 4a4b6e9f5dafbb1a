"""Group-sequential paired speedup: measure prompts in blocks, look after each pair of blocks,
and stop a configuration as soon as its paired speedup interval lies wholly above the
threshold (it pays) or wholly below 1 (it loses), with the overall error rate still the
stated one.

The statistic is the per-prompt log TPOT ratio d_i = log(TPOT_baseline,i / TPOT_config,i) of
prompts measured by both configurations interleaved in time (the trial's own ABBA blocks);
the speedup is exp(mean d), the geometric mean of the per-prompt speedups. At look j, with
n_j prompts of the planned N measured (information fraction t_j = n_j / N), the interval is

    mean(d) +- t_{1 - a_j / 2, n_j - 1} * sd(d) / sqrt(n_j)

where a_j = A(t_j) - A(t_{j-1}) is the share of the error budget spent at that look under a
Lan-DeMets spending function A (Pocock's type by default, A(t) = alpha * ln(1 + (e - 1) t),
which stops early for clear effects; O'Brien-Fleming's type, A(t) = 2 - 2 Phi(z_{1-alpha/2} /
sqrt(t)), spends almost nothing early). By the union bound the chance that any look's interval
misses the true speedup is at most sum a_j = A(1) = alpha, however many looks are taken, so
"pays" is declared wrongly (the true speedup at the threshold, an interval wholly above it) in
at most alpha / 2 of the configurations; looking after every block with a fixed 95% interval
does not have that property (tests/test_sequential.py shows both by simulation).

The interval assumes the log ratios are roughly normal at each look (a t-interval); a look
needs `min_prompts` pairs.

Blocks, not prompts, are the independent unit above concurrency 1. The prompts of one block
run together under one configuration, then together under the other: a burst of load during
one of the two shifts every ratio of that block the same way, which a prompt-level interval
takes for agreement (it stays narrow around a wrong value). Given each prompt's block
(`clusters`), the standard error is the cluster-robust (CR1) one over blocks,

    se^2 = G / (G - 1) * sum_b (S_b - n_b * mean(d))^2 / n^2     (S_b: block b's sum of d)

with G - 1 degrees of freedom: exactly sd / sqrt(n) when every block is one prompt, and as
wide as the blocks disagree otherwise. A configuration measured in too few blocks (an
interim look needs `min_blocks`, the last two) comes out even, not confidently wrong.

Boundary: numbers in, numbers out (numpy, scipy); knows nothing of runs or trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np
from scipy.special import stdtrit

SPENDING = ("pocock", "obrien-fleming")
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Look:
    """One look at the paired samples so far."""

    n: int  # paired prompts
    point: float  # geometric-mean TPOT speedup
    lo: float
    hi: float
    level: float  # the two-sided error this look's interval spends
    outcome: str  # win | loss | continue (more prompts planned) | even (the last look)

    @property
    def stopped(self) -> bool:
        return self.outcome != "continue"

    def as_dict(self) -> dict:
        return {"n": self.n, "point": self.point, "lo": self.lo, "hi": self.hi, "level": self.level,
                "outcome": self.outcome}


@dataclass(frozen=True)
class SequentialRule:
    """Looks at `planned` prompts in all (the information fraction's denominator)."""

    planned: int
    min_speedup: float = 1.0
    alpha: float = 0.05
    spending: str = "pocock"
    min_prompts: int = 4
    min_blocks: int = 3  # an interim look's blocks (2 degrees of freedom) when blocks are clusters

    def __post_init__(self) -> None:
        if self.spending not in SPENDING:
            raise ValueError(f"spending must be one of {', '.join(SPENDING)}, got {self.spending!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")
        if self.planned < 1:
            raise ValueError(f"planned must be >= 1, got {self.planned}")

    def spent(self, n: int) -> float:
        """Error spent once `n` of the planned prompts are measured (A(t), t = n / planned)."""
        t = min(max(n / self.planned, 0.0), 1.0)
        if t <= 0:
            return 0.0
        if self.spending == "pocock":
            return self.alpha * math.log(1.0 + (math.e - 1.0) * t)
        z = _NORMAL.inv_cdf(1.0 - self.alpha / 2.0)
        return 2.0 - 2.0 * _NORMAL.cdf(z / math.sqrt(t))

    def level(self, n: int, previous: int) -> float:
        """The error this look spends: at `n` prompts, the last look having been at `previous`."""
        return self.spent(n) - self.spent(previous)

    def look(self, d: np.ndarray, previous: int = 0, final: bool | None = None,
             clusters: np.ndarray | None = None) -> Look:
        """Decide on the log ratios `d` measured so far; `previous` is the prompt count at the
        last look (0 for the first). The last look (`final`; by default once the planned
        prompts are in) spends what is left of the budget. An interim look before
        `min_prompts` pairs (and, with `clusters`, the block of each ratio, before
        `min_blocks` blocks) spends nothing; the last needs two of each."""
        d = np.asarray(d, dtype=float)
        keep = np.isfinite(d)
        d = d[keep]
        g = None if clusters is None else np.asarray(clusters)[keep]
        n = len(d)
        blocks = n if g is None else len(np.unique(g))
        final = n >= self.planned if final is None else final
        if n < 2 or blocks < 2 or (not final and (n < self.min_prompts
                                                  or (g is not None and blocks < self.min_blocks))):
            point = math.exp(float(d.mean())) if n else float("nan")
            return Look(n, point, float("nan"), float("nan"), 0.0, "even" if final else "continue")
        level = self.level(n, previous) if not final else self.alpha - self.spent(previous)
        return _interval(d, level, self.min_speedup, final, g)


class Monitor:
    """A `SequentialRule` applied look by look to one configuration: remembers how much of
    the error budget earlier looks spent and the last look."""

    def __init__(self, rule: SequentialRule):
        self.rule, self.previous, self.looks = rule, 0, []

    def update(self, d: np.ndarray, final: bool | None = None, clusters: np.ndarray | None = None) -> Look:
        look = self.rule.look(d, self.previous, final, clusters)
        if look.level > 0:
            self.previous = look.n
        self.looks.append(look)
        return look


@lru_cache(maxsize=4096)
def _t_quantile(q: float, dof: int) -> float:
    return float(stdtrit(dof, q))  # Student's t quantile (scipy.special: no scipy.stats import)


def cluster_se(d: np.ndarray, clusters: np.ndarray | None) -> tuple[float, int]:
    """(standard error of mean(d), degrees of freedom): sd / sqrt(n) with n - 1 without
    clusters, else the CR1 cluster-robust error over the G clusters with G - 1."""
    n = len(d)
    if clusters is None:
        return float(d.std(ddof=1)) / math.sqrt(n), n - 1
    labels, index = np.unique(clusters, return_inverse=True)
    g = len(labels)
    resid = np.bincount(index, weights=d - d.mean(), minlength=g)  # S_b - n_b * mean
    return math.sqrt(g / (g - 1) * float(np.sum(resid ** 2))) / n, g - 1


def half_width(d: np.ndarray, clusters: np.ndarray | None, level: float) -> float:
    """Half the width of the two-sided t-interval of mean(d) at error `level` (on the log
    scale): `cluster_se` times Student's t quantile at its degrees of freedom."""
    se, dof = cluster_se(d, clusters)
    return _t_quantile(1.0 - level / 2.0, dof) * se


def _interval(d: np.ndarray, level: float, min_speedup: float, final: bool,
              clusters: np.ndarray | None = None) -> Look:
    n = len(d)
    mean = float(d.mean())
    half = half_width(d, clusters, level) if level > 0 else math.inf
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    if lo > min_speedup:
        outcome = "win"
    elif hi < 1.0:
        outcome = "loss"
    else:
        outcome = "even" if final else "continue"
    return Look(n, math.exp(mean), lo, hi, level, outcome)


def look_points(n_prompts: int, block: int, min_prompts: int = 4) -> list[int]:
    """The prompt counts at which a configuration measured in ABBA blocks of `block` prompts
    is looked at: after every second block (an AB BA pair, so both orders weigh alike) once
    `min_prompts` are in, and at the end."""
    points = []
    done = 0
    turns = 0
    while done < n_prompts:
        done = min(done + block, n_prompts)
        turns += 1
        if done == n_prompts or (turns % 2 == 0 and done >= min_prompts):
            points.append(done)
    return points


def log_ratios(base: "object", spec: "object") -> np.ndarray:
    """Per-prompt log(base / spec) of two aligned per-prompt TPOT series (pandas), prompts
    measured by both."""
    shared = base.index.intersection(spec.index)
    b = base.loc[shared].to_numpy(dtype=float)
    s = spec.loc[shared].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(b / s)
