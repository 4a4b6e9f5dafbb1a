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


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): tiny random Qwen2 models on disk sharing a tokenizer."""
    return tiny.save_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return tiny.make_tokenizer()
