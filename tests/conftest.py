import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import tiny  # noqa: E402

# The tests run tiny models whose ops are far too small to gain from a second thread.
torch.set_num_threads(1)

# The modules that take most of the full suite's minutes (servers, databases, vLLM, the
# statistical tests, subprocess kills). `pytest -m "not slow"` leaves them out: the fast lane
# for local work. The full suite (the README's test command, and CI) runs everything.
SLOW_MODULES = frozenset({
    "cli/test_run_concurrency.py", "cli/test_run_durability.py",
    "engine/test_batching.py", "engine/test_constrained.py", "engine/test_eagle3.py", "engine/test_eagle3_training.py",
    "engine/test_lossless_sampling.py", "engine/test_tree_greedy.py", "engine/test_tree_sampling.py",
    "engine/test_static.py",
    "engine/test_lossless_suffix_medusa.py", "engine/test_medusa_training.py", "engine/test_ngram_vllm.py",
    "models/test_eagle3_speculators.py", "models/test_eagle3_vllm.py",
    "openai/test_openai_backend.py",
    "report/test_report_browser.py", "report/test_report_cli.py",
    "serve/test_serve.py", "serve/test_serve_batching.py", "serve/test_serve_hostile.py", "serve/test_serve_static.py",
    "serve/test_serve_static_tree.py",
    "serve/test_serve_load.py", "sweep/test_concurrent_writers.py",
    "sweep/test_sweep_journal.py", "sweep/test_sweep_killed_worker.py", "sweep/test_sweep_postgres.py",
    "sweep/test_sweep_run.py", "sweep/test_sweep_server.py", "sweep/test_sweep_server_faults.py",
    "sweep/test_sweep_serving.py", "sweep/test_sweep_vllm.py",
    "sweep/test_sweep_workers.py",
})
_TESTS = Path(__file__).parent


# Started first, longest first: the suite runs on two workers, a module on one of them
# (pyproject's addopts), and ends when the busier worker does, so a long module must not be
# handed out last. pytest-xdist hands modules out in this order only under
# --no-loadscope-reorder (addopts): by default (since 3.5) it orders them by their number of
# tests, which put test_sweep_vllm.py (one test, two minutes) last and left one worker idle
# for its last 114 s. The modules of 12 s or more, by their wall time in the full suite with
# every reference virtualenv (.ci/run's), 2-core EPYC, December 2026: 131 s (test_static) down
# to 12 s; the rest (under 12 s each) follow in collection order.
LONGEST = (
    "engine/test_static.py", "sweep/test_sweep_vllm.py", "sweep/test_sweep_postgres.py",
    "models/test_eagle3_vllm.py", "sweep/test_sweep_server.py", "openai/test_client_fidelity.py",
    "engine/test_lossless_sampling.py", "openai/test_openai_backend.py", "engine/test_tree_sampling.py",
    "serve/test_serve_load.py", "engine/test_tree_greedy.py", "sweep/test_sweep_server_faults.py",
    "cli/test_run_durability.py", "sweep/test_sweep_killed_worker.py", "sweep/test_sweep_run.py",
    "sweep/test_sweep_level.py", "report/test_report_browser.py", "serve/test_serve_hostile.py",
    "engine/test_eagle3_training.py", "engine/test_eagle3.py", "sweep/test_concurrent_writers.py",
    "serve/test_serve.py", "sweep/test_sweep_workers.py", "engine/test_batching.py",
    "engine/test_lossless_suffix_medusa.py", "sweep/test_sweep_journal.py",
)


def _module(item) -> str:
    return Path(item.fspath).relative_to(_TESTS).as_posix()


def pytest_collection_modifyitems(config, items):
    present = {p.relative_to(_TESTS).as_posix() for p in _TESTS.rglob("test_*.py")}
    missing = (SLOW_MODULES | set(LONGEST)) - present
    assert not missing, f"SLOW_MODULES or LONGEST name modules that do not exist: {sorted(missing)}"
    for item in items:
        if _module(item) in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    rank = {m: i for i, m in enumerate(LONGEST)}
    items.sort(key=lambda it: rank.get(_module(it), len(rank)))  # stable: collection order otherwise


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): tiny random Qwen2 models on disk sharing a tokenizer."""
    return tiny.save_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return tiny.make_tokenizer()


def pytest_configure(config):
    # A fault test says which fault of which component it exercises, what the user sees and
    # what is kept, so a fault matrix (fault x component) can be generated from the tests
    # that prove it: `pytest -m fault --collect-only` lists them with their marks.
    config.addinivalue_line(
        "markers", "fault(component, fault, sees, kept): the fault a test injects and what it shows")
