"""`specbench.formatting`: the missing-value rule, NaN-to-None, value equality and the
milliseconds format shared by the console, the compare gate and the report."""

from __future__ import annotations

import math

import numpy as np

from specbench.formatting import DASH, dash_or, missing, ms, plain, same


def test_missing_is_none_or_nan_never_a_string():
    assert missing(None) and missing(float("nan")) and missing(np.float32("nan"))
    assert not missing(0.0) and not missing("nan") and not missing("") and not missing([1])


def test_plain_gives_python_scalars_and_null_for_missing():
    assert plain(np.int64(3)) == 3 and type(plain(np.int64(3))) is int
    assert type(plain(np.float64(0.5))) is float
    assert plain(float("nan")) is None and plain(np.float64("nan")) is None
    assert plain(math.inf) == math.inf and plain(math.inf, finite=True) is None
    assert plain("x") == "x"


def test_same_treats_missing_alike_and_numbers_by_value():
    assert same(None, float("nan")) and same(np.float64("nan"), None)
    assert same(1, 1.0) and same(np.int64(2), 2.0) and same("a", "a")
    assert not same(None, 0) and not same(1, 2) and not same("a", "b") and not same(1, "1")


def test_ms_has_about_three_significant_digits():
    assert [ms(s) for s in (1.2345, 0.12345, 0.012345, 0.0012345)] == ["1234", "123", "12.3", "1.23"]
    assert ms(None) == DASH and ms(float("nan")) == DASH


def test_dash_or_formats_present_values_only():
    assert dash_or(0.1234, ".2f") == "0.12" and dash_or(None, ".2f") == DASH and dash_or(float("nan"), ".1f") == DASH
