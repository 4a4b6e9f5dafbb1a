from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_fakes import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """(path, float32 reference model): a tiny qwen2 GGUF with Q8_0 FFN blocks."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf")
