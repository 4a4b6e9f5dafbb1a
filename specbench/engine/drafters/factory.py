"""`make_drafter`: the drafter a `SpeculativeConfig` names, built from what an engine holds
(its runners, head and suffix caches), not from the engine itself.

Boundary: construction only; each drafter lives in its own module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specbench.engine.drafters.base import Drafter
from specbench.engine.drafters.draft_model import DraftModelDrafter
from specbench.engine.drafters.eagle3 import Eagle3Drafter
from specbench.engine.drafters.medusa import MedusaDrafter
from specbench.engine.drafters.ngram import NgramDrafter
from specbench.engine.drafters.suffix import SuffixCache, SuffixDrafter
from specbench.engine.tree import TreeShape

if TYPE_CHECKING:
    from collections.abc import Callable

    from specbench.config import SpeculativeConfig
    from specbench.engine.model import ModelRunner


def make_drafter(spec: "SpeculativeConfig", *, target_runner: "ModelRunner",
                 draft_runner: "Callable[[], ModelRunner]", head: Any = None,
                 suffix_cache: "Callable[[SpeculativeConfig], SuffixCache] | None" = None) -> Drafter:
    """The drafter `spec.method` names, from what the engine holds: the target's runner
    (Medusa reads the target's last hidden state through it), the draft model's runner
    (called only for draft_model, so no other method loads one), the EAGLE-3 or Medusa
    head, and the suffix cache of this configuration (suffix)."""
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max)
    if spec.method == "draft_model":
        return DraftModelDrafter(draft_runner(), spec.draft_confidence_threshold, TreeShape.from_spec(spec))
    if spec.method == "eagle3":
        if head is None:
            raise ValueError("method eagle3 needs an engine built with an EAGLE-3 head (Engine(..., head=))")
        return Eagle3Drafter(head, TreeShape.from_spec(spec), spec.draft_confidence_threshold)
    if spec.method == "medusa":
        if head is None or not hasattr(head, "num_heads"):
            raise ValueError("method medusa needs an engine built with Medusa heads (Engine(..., head=))")
        return MedusaDrafter(head, target_runner, TreeShape.from_spec(spec))
    if spec.method == "suffix":
        if suffix_cache is None:
            raise ValueError("method suffix needs the engine's suffix cache")
        return SuffixDrafter(suffix_cache(spec), spec.suffix_decoding_max_spec_factor,
                             spec.suffix_decoding_min_token_prob)
    raise ValueError(f"no drafter for method {spec.method!r}")
