"""Medusa and suffix decoding as vLLM's `--speculative-config` JSON: what `specbench serve`
states on its model card parses back to the same configuration (knobs included), and
`--backend openai` labels a server's records with the card's suffix knobs."""

from __future__ import annotations

import json

import pytest

from specbench.backends.openai.label import served_spec
from specbench.config import SpeculativeConfig, parse_speculative_config
from specbench.errors import ConfigError
from specbench.server.responses import speculative_config

SUFFIX = SpeculativeConfig(method="suffix", num_speculative_tokens=6, suffix_decoding_max_tree_depth=32,
                           suffix_decoding_max_cached_requests=100, suffix_decoding_max_spec_factor=2.0,
                           suffix_decoding_min_token_prob=0.05)
MEDUSA = SpeculativeConfig(method="medusa", num_speculative_tokens=3, draft="/heads")


@pytest.mark.parametrize("spec", [SUFFIX, MEDUSA])
def test_the_served_card_round_trips(spec):
    card = speculative_config(spec)
    assert card["method"] == spec.method
    assert parse_speculative_config(json.dumps(card)) == spec


def test_the_card_is_vllms_shape():
    assert speculative_config(MEDUSA) == {"method": "medusa", "num_speculative_tokens": 3, "model": "/heads"}
    assert speculative_config(SUFFIX) == {
        "method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_cached_requests": 100, "suffix_decoding_max_spec_factor": 2.0,
        "suffix_decoding_min_token_prob": 0.05}


def test_openai_labels_take_the_cards_suffix_knobs():
    card = {"speculative_config": speculative_config(SUFFIX)}
    got = served_spec(card, None, "http://x", False, "suffix", [6], None, (1, 4), declared=True)
    assert got == SUFFIX
    assert served_spec(card, None, "http://x", False, "none", [0], None, (1, 4), declared=False) == SUFFIX
    with pytest.raises(ConfigError, match="serves suffix-k6"):
        served_spec(card, None, "http://x", False, "ngram", [6], None, (1, 4), declared=True)
    medusa = served_spec({"speculative_config": speculative_config(MEDUSA)}, None, "http://x", False, "medusa",
                         [3], None, (1, 4), declared=True)
    assert medusa == MEDUSA  # the card names the heads
