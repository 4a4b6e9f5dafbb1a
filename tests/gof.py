"""Goodness-of-fit helper shared by the losslessness tests."""

import numpy as np
from scipy import stats


def gof_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = list(counts[big]) + ([counts[~big].sum()] if (~big).any() else [])
    exp = list(expected[big]) + ([expected[~big].sum()] if (~big).any() else [])
    obs, exp = np.asarray(obs, float), np.asarray(exp, float)
    if obs[exp == 0].sum() > 0:  # a token the target can never emit was emitted
        return 0.0
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
