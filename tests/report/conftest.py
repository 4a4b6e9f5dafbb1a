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


STUDY_PROMPTS = [
    {"id": "greet", "category": "chat", "prompt": "Say hello to the team."},
    {"id": "repeat", "category": "chat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "code", "category": "code", "prompt": "def add(a, b):\n    return"},
    {"id": "list", "category": "code", "prompt": "for i in range(10):\n    print(i)"},
]


@pytest.fixture(scope="session")
def tiny_study(tiny_pair, tmp_path_factory) -> Path:
    """A real `specbench sweep` on the tiny random models: grid over draft_model k = 2, 4 x
    concurrency 1, 2 (2 baselines + 4 trials), 4 prompts x 8 tokens, laid out as a sweep lays
    out a study: returns the directory holding `tiny.db` and `studies/tiny/` (runs/,
    profile.yaml)."""
    import json

    from report_helpers import specbench

    where = tmp_path_factory.mktemp("sweep")
    prompts = where / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in STUDY_PROMPTS))
    res = specbench("sweep", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--workload", prompts,
                    "--dtype", "float32", "--device", "cpu", "--warmup", "0", "--max-new-tokens", "8",
                    "--storage", f"sqlite:///{where / 'tiny.db'}", "--out", where / "studies" / "tiny",
                    "--study-name", "tiny", "--sampler", "grid", "--method", "draft_model",
                    "-k", "2,4", "--concurrency", "1,2")
    assert res.code == 0, res.output
    return where


@pytest.fixture(scope="session")
def edited_study(tiny_study, tmp_path_factory) -> Path:
    """The tiny study copied into a second storage with trial 3 marked infeasible (over a
    memory budget) and one failed trial added, as a sweep with a memory limit and an
    out-of-memory trial would leave them. Its runs stay in the tiny study's directory."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    where = tmp_path_factory.mktemp("edited")
    src = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tiny_study / 'tiny.db'}")
    dst = optuna.create_study(study_name="edited", storage=f"sqlite:///{where / 'edited.db'}",
                              directions=["maximize"])
    for k, v in src.user_attrs.items():
        dst.set_user_attr(k, v)
    ks = CategoricalDistribution((2, 4, 8))  # the space grows by k = 8 (the failed trial's)
    for t in src.trials:
        attrs = dict(t.user_attrs)
        if t.number == 3:
            attrs.update(feasible=False, constraint=0.75)
        dists = {k: (ks if k == "num_speculative_tokens" else d) for k, d in t.distributions.items()}
        dst.add_trial(create_trial(state=t.state, params=t.params, distributions=dists,
                                   values=t.values, user_attrs=attrs))
    spec = next(t for t in src.trials if t.params["method"] == "draft_model")
    dists = dict(spec.distributions)
    dists["num_speculative_tokens"] = ks
    dst.add_trial(create_trial(
        state=TrialState.FAIL,
        params={"method": "draft_model", "concurrency": 2, "num_speculative_tokens": 8,
                "draft": spec.params["draft"]},
        distributions={k: dists[k] for k in ("method", "concurrency", "num_speculative_tokens", "draft")},
        user_attrs={"fail_reason": "out of memory: CPU RAM exhausted"}))
    return where
