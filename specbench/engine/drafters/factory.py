"""`make_drafter`: the drafter a `SpeculativeConfig` names, built for an engine.

Boundary: construction only; each drafter lives in its own module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specbench.engine.drafters.base import Drafter
from specbench.engine.drafters.draft_model import DraftModelDrafter
from specbench.engine.drafters.eagle3 import Eagle3Drafter
from specbench.engine.drafters.medusa import MedusaDrafter
from specbench.engine.drafters.ngram import NgramDrafter
from specbench.engine.drafters.suffix import SuffixDrafter, cache_for
from specbench.engine.drafters.tree_search import TreeShape

if TYPE_CHECKING:
    from specbench.config import SpeculativeConfig
    from specbench.engine.engine import Engine


def make_drafter(spec: "SpeculativeConfig", engine: "Engine") -> Drafter:
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max)
    if spec.method == "draft_model":
        return DraftModelDrafter(engine.draft_runner, spec.draft_confidence_threshold, TreeShape.from_spec(spec))
    if spec.method == "eagle3":
        if engine.head is None:
            raise ValueError("method eagle3 needs an engine built with an EAGLE-3 head (Engine(..., head=))")
        return Eagle3Drafter(engine.head, TreeShape.from_spec(spec))
    if spec.method == "medusa":
        if engine.head is None or not hasattr(engine.head, "num_heads"):
            raise ValueError("method medusa needs an engine built with Medusa heads (Engine(..., head=))")
        return MedusaDrafter(engine.head, engine.target_runner, TreeShape.from_spec(spec))
    if spec.method == "suffix":
        return SuffixDrafter(cache_for(engine, spec), spec.suffix_decoding_max_spec_factor,
                             spec.suffix_decoding_min_token_prob)
    raise ValueError(f"no drafter for method {spec.method!r}")
