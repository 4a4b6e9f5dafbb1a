"""Drafters propose up to k tokens per row per step for the target to verify (batch-first).

One file per method: `ngram` (prompt lookup), `draft_model` (a smaller model of the same
tokenizer). `make_drafter` builds the one a `SpeculativeConfig` names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specbench.engine.drafters.base import Drafter, Proposal, StatelessDrafter
from specbench.engine.drafters.draft_model import DraftModelDrafter
from specbench.engine.drafters.ngram import NgramDrafter

if TYPE_CHECKING:
    from specbench.config import SpeculativeConfig
    from specbench.engine.engine import Engine

__all__ = ["Drafter", "Proposal", "StatelessDrafter", "DraftModelDrafter", "NgramDrafter", "make_drafter"]


def make_drafter(spec: "SpeculativeConfig", engine: "Engine") -> Drafter:
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max)
    if spec.method == "draft_model":
        return DraftModelDrafter(engine.draft_runner, spec.draft_confidence_threshold)
    raise ValueError(f"no drafter for method {spec.method!r}")
