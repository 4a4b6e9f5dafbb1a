"""Fixtures for the report tests (helpers live in report_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from report_helpers import find_chromium, synthetic_run


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> Path:
    """A draft_model run, k = 2 and 4, concurrency 1 and 4, 12 prompts in 3 categories."""
    return synthetic_run(tmp_path_factory.mktemp("runs") / "20261129-101500-draft_model-k2_4")


@pytest.fixture(scope="session")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (apt-get install chromium, or set "
                    "SPECBENCH_CHROMIUM to a Chromium/Chrome binary)")
    return binary


@pytest.fixture(scope="session")
def tiny_run(tiny_pair, tmp_path_factory) -> Path:
    """A real `specbench run` on the tiny random models: draft_model, k = 2 and 4,
    concurrency 1 and 2, three prompts of the `real` set (code, chat, business) truncated to
    the tiny model's context, 8 new tokens."""
    from report_helpers import specbench

    out = tmp_path_factory.mktemp("real") / "tiny-run"
    res = specbench("run", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--dtype", "float32",
                    "--device", "cpu", "--warmup", "0", "--num-prompts", "3", "--truncate",
                    "--max-new-tokens", "8", "-k", "2,4", "--concurrency", "1,2", "--out", out)
    assert res.code == 0, res.output
    return out
